//! The kinds a run's options name besides the algorithm: model, dataset and
//! how the data is split among workers.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

slowmo_optim::named_enum! {
    /// Which network to train.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum ModelKind: "model" {
        /// Multi-layer perceptron on the flattened image.
        Mlp = "mlp",
        /// LeNet-5-style convolutional network.
        Cnn = "cnn",
        /// Decoder-only transformer language model (byte-level text).
        Transformer = "transformer",
    }
}

slowmo_optim::named_enum! {
    /// Which dataset to train on.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum DatasetKind: "dataset" {
        /// Seeded synthetic 28x28 images in 10 classes; needs no files.
        Synthetic = "synthetic",
        /// Fashion-MNIST (IDX files).
        FashionMnist = "fashion-mnist",
        /// MNIST (IDX files).
        Mnist = "mnist",
        /// CIFAR-10 (binary batches).
        Cifar10 = "cifar10",
        /// Byte-level text from a file or a folder of files
        /// (`--dataset text:PATH`).
        Text = "text",
    }
}

/// A `--dataset` value: a dataset name, and for `text` the path of the file
/// or folder (`text:PATH`, the same as `--dataset text --data-dir PATH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetArg {
    /// Which dataset.
    pub kind: DatasetKind,
    /// The path given after `text:`, if any.
    pub path: Option<PathBuf>,
}

impl From<DatasetKind> for DatasetArg {
    fn from(kind: DatasetKind) -> Self {
        DatasetArg { kind, path: None }
    }
}

impl fmt::Display for DatasetArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}:{}", self.kind, p.display()),
            None => write!(f, "{}", self.kind),
        }
    }
}

impl FromStr for DatasetArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("text:") {
            if path.is_empty() {
                return Err(
                    "`text:` needs a path: --dataset text:PATH (a file or a folder)".into(),
                );
            }
            return Ok(DatasetArg {
                kind: DatasetKind::Text,
                path: Some(PathBuf::from(path)),
            });
        }
        s.parse::<DatasetKind>()
            .map(DatasetArg::from)
            .map_err(|e| format!("{e} (text takes a path: text:PATH)"))
    }
}

/// The shape of the transformer language model (`--model transformer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TransformerShape {
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads per block; divides `width`.
    pub heads: usize,
    /// Embedding width (d_model).
    pub width: usize,
    /// Context length in tokens: each training sample is `context + 1`
    /// tokens, inputs and next-token targets.
    pub context: usize,
}

impl Default for TransformerShape {
    /// 4 blocks, width 256, 4 heads, context 64: about 3.2M parameters,
    /// small enough to train on one CPU core (see README).
    fn default() -> Self {
        TransformerShape {
            layers: 4,
            heads: 4,
            width: 256,
            context: 64,
        }
    }
}

impl TransformerShape {
    /// Byte-level vocabulary size of the built-in text data.
    pub const BYTE_VOCAB: usize = 256;

    /// Checks the shape: every size at least 1 and `heads` dividing `width`.
    /// The error names the setting.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (name, v) in [
            ("layers", self.layers),
            ("heads", self.heads),
            ("width", self.width),
            ("context", self.context),
        ] {
            if v == 0 {
                return Err((name, "must be at least 1".into()));
            }
        }
        if !self.width.is_multiple_of(self.heads) {
            return Err((
                "heads",
                format!(
                    "{} heads do not divide width {}; each head takes width / heads features",
                    self.heads, self.width
                ),
            ));
        }
        for (name, v, max) in [
            ("layers", self.layers, 1 << 10),
            ("width", self.width, 1 << 14),
            ("context", self.context, 1 << 14),
        ] {
            if v > max {
                return Err((name, format!("{v} is above the limit of {max}")));
            }
        }
        Ok(())
    }

    /// Number of parameters for a vocabulary of `vocab` tokens (the output
    /// head is tied to the token embedding, so it adds none).
    pub fn param_count(&self, vocab: usize) -> u64 {
        let (d, l) = (self.width as u64, self.layers as u64);
        let block =
            2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d);
        (vocab as u64 + self.context as u64) * d + l * block + 2 * d
    }
}

/// How the training set is divided among workers.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Partition {
    /// Uniformly random, equal shards.
    Iid,
    /// Label-sorted contiguous shards.
    ByClass,
    /// Per-class Dirichlet(alpha) proportions, alpha > 0.
    Dirichlet(f64),
    /// Equal contiguous runs of samples in their stored order (the default
    /// for text: each worker reads its own stretch of the corpus).
    Contiguous,
}

/// An unparsable `--partition` value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "invalid partition {input:?}: {reason}; expected iid, by-class, contiguous or dirichlet:<alpha> with alpha > 0"
)]
pub struct PartitionError {
    /// The value as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Partition::Iid => f.write_str("iid"),
            Partition::ByClass => f.write_str("by-class"),
            Partition::Dirichlet(a) => write!(f, "dirichlet:{a}"),
            Partition::Contiguous => f.write_str("contiguous"),
        }
    }
}

impl FromStr for Partition {
    type Err = PartitionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| PartitionError {
            input: s.to_string(),
            reason,
        };
        match s {
            "iid" => Ok(Partition::Iid),
            "by-class" => Ok(Partition::ByClass),
            "contiguous" => Ok(Partition::Contiguous),
            _ => {
                let alpha = s
                    .strip_prefix("dirichlet:")
                    .ok_or_else(|| bad("unknown name"))?;
                let alpha: f64 = alpha.parse().map_err(|_| bad("alpha is not a number"))?;
                if alpha.is_finite() && alpha > 0.0 {
                    Ok(Partition::Dirichlet(alpha))
                } else {
                    Err(bad("alpha must be finite and > 0"))
                }
            }
        }
    }
}

impl TryFrom<String> for Partition {
    type Error = PartitionError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Partition> for String {
    fn from(p: Partition) -> String {
        p.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip_through_text_and_serde() {
        for k in DatasetKind::ALL {
            assert_eq!(k.to_string().parse::<DatasetKind>().unwrap(), k);
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{k}\""));
        }
        for k in ModelKind::ALL {
            assert_eq!(k.to_string().parse::<ModelKind>().unwrap(), k);
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(serde_json::from_str::<ModelKind>(&json).unwrap(), k);
        }
        assert_eq!(ModelKind::NAMES, "mlp, cnn, transformer");
        let err = "imagenet".parse::<DatasetKind>().unwrap_err().to_string();
        assert!(
            err.contains("imagenet") && err.contains("fashion-mnist"),
            "{err}"
        );
        let err = "resnet".parse::<ModelKind>().unwrap_err().to_string();
        assert!(err.contains("resnet") && err.contains("mlp, cnn"), "{err}");
        let text: DatasetArg = "text:/a/b c.txt".parse().unwrap();
        assert_eq!(text.kind, DatasetKind::Text);
        assert_eq!(text.to_string().parse::<DatasetArg>().unwrap(), text);
        assert_eq!(
            "mnist".parse::<DatasetArg>().unwrap(),
            DatasetKind::Mnist.into()
        );
        assert!(
            "text:"
                .parse::<DatasetArg>()
                .unwrap_err()
                .contains("text:PATH")
        );
    }

    #[test]
    fn partition_parse_display_and_serde_round_trip() {
        for p in [
            Partition::Iid,
            Partition::ByClass,
            Partition::Dirichlet(0.5),
            Partition::Dirichlet(1.0),
            Partition::Contiguous,
        ] {
            assert_eq!(p.to_string().parse::<Partition>().unwrap(), p);
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{p}\""));
            assert_eq!(serde_json::from_str::<Partition>(&json).unwrap(), p);
        }
        assert_eq!(Partition::Dirichlet(0.5).to_string(), "dirichlet:0.5");
        for bad in [
            "dirichlet:",
            "dirichlet:-1",
            "dirichlet:inf",
            "random",
            "dirichlet:x",
        ] {
            let err = bad.parse::<Partition>().unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
        assert!(serde_json::from_str::<Partition>("\"nope\"").is_err());
    }
}
