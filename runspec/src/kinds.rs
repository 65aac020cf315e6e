//! The kinds a run's options name besides the algorithm: model, dataset and
//! how the data is split among workers.

use std::fmt;
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
}

/// An unparsable `--partition` value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "invalid partition {input:?}: {reason}; expected iid, by-class or dirichlet:<alpha> with alpha > 0"
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
        assert_eq!(ModelKind::NAMES, "mlp, cnn");
        let err = "imagenet".parse::<DatasetKind>().unwrap_err().to_string();
        assert!(
            err.contains("imagenet") && err.contains("fashion-mnist"),
            "{err}"
        );
        let err = "resnet".parse::<ModelKind>().unwrap_err().to_string();
        assert!(err.contains("resnet") && err.contains("mlp, cnn"), "{err}");
    }

    #[test]
    fn partition_parse_display_and_serde_round_trip() {
        for p in [
            Partition::Iid,
            Partition::ByClass,
            Partition::Dirichlet(0.5),
            Partition::Dirichlet(1.0),
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
