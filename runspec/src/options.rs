//! Training settings as given by a TOML file or by flags, and how the two
//! are layered.
//!
//! Resolution order: the preset's algorithm settings, then the TOML file
//! given by `--config`, then command-line flags (see [`crate::ConfigArgs`]).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};
use slowmo_optim::{Base, BufferPolicy, OptimizerKind, Preset, Schedule};
use slowmo_topologies::GraphSpec;

use crate::compression::Compression;
use crate::kinds::{DatasetArg, ModelKind, Partition};

/// Errors of configuration loading and validation.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting `{field}`: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("the settings cannot be written as TOML: {0}")]
    NotToml(String),
}

pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        message: message.into(),
    }
}

/// Deserialises an optional value through its `FromStr` (so TOML uses the
/// same spelling as the flags: `schedule = "warmup:100"`).
fn opt_from_str<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: std::fmt::Display,
{
    match Option::<toml::Value>::deserialize(d)? {
        None => Ok(None),
        Some(v) => {
            let s = match v {
                toml::Value::String(s) => s,
                other => other.to_string(),
            };
            s.parse::<T>().map(Some).map_err(serde::de::Error::custom)
        }
    }
}

fn opt_display<S: serde::Serializer, T: std::fmt::Display>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

/// Training settings as given by a TOML file or flags: every field optional.
/// Field names are the flags' names with `_` for `-`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct TrainOptions {
    /// Named algorithm: ar-sgd, local-sgd, sgp, osgp, bmuf, lookahead, slowmo.
    /// Without a preset the run is SlowMo over `--base`.
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,
    /// Base algorithm: ar-sgd, local-sgd, sgp, osgp [default: local-sgd].
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<Base>,
    /// Number of workers (simulate) [default: 8].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// Base steps per outer iteration [default: 12].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tau: Option<u64>,
    /// Slow learning rate [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alpha: Option<f32>,
    /// Slow momentum [default: 0.5 for slowmo, 0 for the plain bases].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beta: Option<f32>,
    /// Skip the exact average at outer iterations (the noaverage variant).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_average: Option<bool>,
    /// Use the Nesterov form of the outer step.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nesterov_outer: Option<bool>,
    /// Base-optimizer buffers at an outer iteration: maintain, reset, average.
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buffer_policy: Option<BufferPolicy>,
    /// Staleness bound of OSGP (0 is synchronous SGP) [default: 1 for osgp].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staleness: Option<u64>,
    /// OSGP: gossip rounds run at their own pace; a step never waits for a
    /// peer and mixes in a round once all its shares arrived [default: false].
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background_gossip: Option<bool>,
    /// Push-sum share encoding on the wire: none, bf16, int8 (block-scaled,
    /// 3.9x fewer bytes) or topk:F (the fraction F of largest values, as
    /// bfloat16 with 2-byte indices). The weight travels exactly and the
    /// sender keeps the compression error [default: none].
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compress: Option<Compression>,
    /// Exact-average encoding at each outer boundary: none, bf16, int8 or
    /// topk:F. Each worker sends its compressed `anchor - x` (plus the error
    /// it kept from the last boundary, which it keeps again); all decode and
    /// sum the same bytes in rank order, so every worker ends with the same
    /// bits [default: none].
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compress_average: Option<Compression>,
    /// Communication graph for sgp/osgp (see `slowmo topology`) [default: exponential].
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphSpec>,
    /// Peers per round for graphs that take it [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peers: Option<usize>,
    /// Base optimizer: sgd, adam, adamw [default: sgd].
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<OptimizerKind>,
    /// Base learning rate [default: 0.01 for sgd, 0.001 for adam/adamw].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<f32>,
    /// Base momentum (sgd) [default: 0.9].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f32>,
    /// Nesterov base momentum (sgd).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nesterov: Option<bool>,
    /// Weight decay [default: 0 for sgd/adam, 0.01 for adamw].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f32>,
    /// Learning-rate schedule: constant, warmup:N, step:EVERY:FACTOR, cosine[:MIN], warmup-cosine:N.
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// Per-worker mini-batch size [default: 32].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<usize>,
    /// Base steps per worker [default: 600].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// Evaluate every N steps; 0 evaluates only at the end [default: 100].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_every: Option<u64>,
    /// Model: mlp, cnn, transformer [default: mlp].
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelKind>,
    /// Hidden layer widths of the MLP, comma separated [default: 256].
    #[arg(long, allow_negative_numbers = true, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Vec<usize>>,
    /// Transformer blocks [default: 4].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<usize>,
    /// Transformer attention heads; divides --width [default: 4].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heads: Option<usize>,
    /// Transformer embedding width [default: 256].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<usize>,
    /// Transformer context length in tokens [default: 64].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<usize>,
    /// Dataset: synthetic, fashion-mnist, mnist, cifar10, text:PATH (a file
    /// or a folder of files, byte-level) [default: synthetic].
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<DatasetArg>,
    /// Directory of the dataset files [default: the Debian path for fashion-mnist].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Per-worker shards: iid, by-class, contiguous, dirichlet:A [default:
    /// iid; contiguous for text].
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<Partition>,
    /// Seed of everything random [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl TrainOptions {
    /// Reads a TOML file; unknown keys are errors naming the key.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The settings as TOML text, readable by [`TrainOptions::from_toml`].
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        Ok(self.to_table()?.to_string())
    }

    /// The fields that are set, by their config key.
    pub fn to_table(&self) -> Result<toml::Table, ConfigError> {
        toml::Table::try_from(self).map_err(|e| ConfigError::NotToml(e.to_string()))
    }

    /// `self` with every field that `over` sets replaced. Goes through the
    /// fields' config keys, so no field can be left out of the overlay, and
    /// through TOML, so what it gives can be written to a run file.
    pub fn overlaid(&self, over: &TrainOptions) -> Result<Self, ConfigError> {
        let mut merged = self.to_table()?;
        merged.extend(over.to_table()?);
        toml::Value::Table(merged)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::NotToml(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use clap::{Args, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        train: TrainOptions,
    }

    /// Every key, each with a value other than the flags' below.
    const FILE: &str = r#"
preset = "bmuf"
base = "sgp"
workers = 3
tau = 4
alpha = 0.5
beta = 0.2
no_average = false
nesterov_outer = false
buffer_policy = "reset"
staleness = 2
background_gossip = false
compress = "int8"
compress_average = "bf16"
graph = "ring"
peers = 2
optimizer = "adam"
lr = 0.1
momentum = 0.5
nesterov = false
weight_decay = 0.1
schedule = "warmup:10"
batch_size = 8
steps = 10
eval_every = 5
model = "cnn"
hidden = [8]
layers = 2
heads = 2
width = 8
context = 16
dataset = "mnist"
data_dir = "/a"
partition = "by-class"
seed = 3
"#;

    const FLAGS: &[&str] = &[
        "--preset=slowmo",
        "--base=osgp",
        "--workers=5",
        "--tau=6",
        "--alpha=0.7",
        "--beta=0.3",
        "--no-average",
        "--nesterov-outer",
        "--buffer-policy=average",
        "--staleness=1",
        "--background-gossip",
        "--compress=topk:0.1",
        "--compress-average=int8",
        "--graph=exponential",
        "--peers=1",
        "--optimizer=sgd",
        "--lr=0.2",
        "--momentum=0.6",
        "--nesterov",
        "--weight-decay=0.2",
        "--schedule=cosine",
        "--batch-size=16",
        "--steps=20",
        "--eval-every=0",
        "--model=mlp",
        "--hidden=16,4",
        "--layers=3",
        "--heads=1",
        "--width=4",
        "--context=8",
        "--dataset=synthetic",
        "--data-dir=/b",
        "--partition=iid",
        "--seed=4",
    ];

    #[test]
    fn every_flag_overrides_the_file_and_every_unset_flag_keeps_it() {
        let file = TrainOptions::from_toml(FILE).unwrap();
        let flags = Cli::try_parse_from(std::iter::once("slowmo").chain(FLAGS.iter().copied()))
            .unwrap()
            .train;
        let (file_keys, flag_keys) = (file.to_table().unwrap(), flags.to_table().unwrap());
        // Every option is a flag and a config key of the same name, and this
        // test sets each one, so a new option cannot escape it.
        let command = TrainOptions::augment_args(clap::Command::new("slowmo"));
        let ids: Vec<String> = command
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .collect();
        assert_eq!(ids.len(), file_keys.len(), "{ids:?}");
        for id in &ids {
            let (a, b) = (&file_keys[id.as_str()], &flag_keys[id.as_str()]);
            assert_ne!(a, b, "`{id}`: give the file and the flags different values");
        }
        assert_eq!(
            file.overlaid(&flags).unwrap().to_table().unwrap(),
            flag_keys
        );
        for id in &ids {
            let mut some_flags = flag_keys.clone();
            some_flags.remove(id.as_str());
            let some_flags: TrainOptions = toml::Value::Table(some_flags).try_into().unwrap();
            let merged = file.overlaid(&some_flags).unwrap().to_table().unwrap();
            assert_eq!(merged[id.as_str()], file_keys[id.as_str()], "`{id}`");
        }
    }
}
