//! The run configuration: one TOML file, overridable by flags.
//!
//! Resolution order: the preset's algorithm settings, then the TOML file given
//! by `--config`, then command-line flags. The resolved [`RunConfig`] is what
//! every node of a run must share: its hash is checked when a peer joins.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest, Sha256};
use slowmo_optim::{
    Algorithm, Base, BufferPolicy, OptimizerConfig, OptimizerKind, Preset, Schedule,
};
use slowmo_topologies::GraphSpec;

use crate::data::{DatasetKind, Partition};
use crate::model::ModelKind;

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
}

fn invalid(field: &'static str, message: impl Into<String>) -> ConfigError {
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
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// Base steps per outer iteration [default: 12].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tau: Option<u64>,
    /// Slow learning rate [default: 1].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alpha: Option<f32>,
    /// Slow momentum [default: 0.5 for slowmo, 0 for the plain bases].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beta: Option<f32>,
    /// Skip the exact average at outer iterations (the noaverage variant).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_average: Option<bool>,
    /// Use the Nesterov form of the outer step.
    #[arg(long)]
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
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staleness: Option<u64>,
    /// OSGP: gossip rounds run at their own pace; a step never waits for a
    /// peer and mixes in a round once all its shares arrived [default: false].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background_gossip: Option<bool>,
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
    #[arg(long)]
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
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<f32>,
    /// Base momentum (sgd) [default: 0.9].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f32>,
    /// Nesterov base momentum (sgd).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nesterov: Option<bool>,
    /// Weight decay [default: 0 for sgd/adam, 0.01 for adamw].
    #[arg(long)]
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
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<usize>,
    /// Base steps per worker [default: 600].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// Evaluate every N steps; 0 evaluates only at the end [default: 100].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_every: Option<u64>,
    /// Model: mlp, cnn [default: mlp].
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelKind>,
    /// Hidden layer widths of the MLP, comma separated [default: 256].
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Vec<usize>>,
    /// Dataset: synthetic, fashion-mnist, mnist, cifar10 [default: synthetic].
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<DatasetKind>,
    /// Directory of the dataset files [default: the Debian path for fashion-mnist].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Per-worker shards: iid, by-class, dirichlet:A [default: iid].
    #[arg(long)]
    #[serde(
        default,
        deserialize_with = "opt_from_str",
        serialize_with = "opt_display"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<Partition>,
    /// Seed of everything random [default: 1].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

macro_rules! overlay {
    ($dst:ident, $src:ident; $($f:ident),* $(,)?) => {
        $( if $src.$f.is_some() { $dst.$f = $src.$f.clone(); } )*
    };
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
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("training options serialise to TOML")
    }

    /// `self` with every field that `over` sets replaced.
    pub fn overlaid(mut self, over: &TrainOptions) -> Self {
        overlay!(self, over; preset, base, workers, tau, alpha, beta, no_average, nesterov_outer,
            buffer_policy, staleness, background_gossip, graph, peers, optimizer, lr, momentum, nesterov, weight_decay,
            schedule, batch_size, steps, eval_every, model, hidden, dataset, data_dir, partition, seed);
        self
    }

    /// Fills defaults and validates.
    pub fn resolve(&self) -> Result<RunConfig, ConfigError> {
        let base = self.base.unwrap_or(Base::LocalSgd);
        let preset = self.preset.unwrap_or(Preset::Slowmo);
        let mut algorithm: Algorithm = preset.algorithm(base);
        if self.base.is_some() && self.preset.is_some() && algorithm.base != base {
            return Err(invalid(
                "base",
                format!(
                    "preset `{preset}` runs base `{}`, but --base {base} was given; drop one of them",
                    algorithm.base
                ),
            ));
        }
        let s = &mut algorithm.slowmo;
        if let Some(v) = self.tau {
            s.tau = v;
        }
        if let Some(v) = self.alpha {
            s.alpha = v;
        }
        if let Some(v) = self.beta {
            s.beta = v;
        }
        if let Some(v) = self.no_average {
            s.average = !v;
        }
        if let Some(v) = self.nesterov_outer {
            s.nesterov = v;
        }
        if let Some(v) = self.buffer_policy {
            s.buffer_policy = v;
        }
        s.validate().map_err(|e| invalid("slowmo", e.to_string()))?;
        if let Some(v) = self.staleness {
            algorithm.staleness = v;
        }
        if algorithm.staleness > 0 && algorithm.base != Base::Osgp {
            return Err(invalid(
                "staleness",
                format!("a staleness bound needs base osgp, not {}", algorithm.base),
            ));
        }
        if let Some(v) = self.background_gossip {
            algorithm.background_gossip = v;
        }
        if algorithm.background_gossip && algorithm.base != Base::Osgp {
            return Err(invalid(
                "background_gossip",
                format!("background gossip needs base osgp, not {}", algorithm.base),
            ));
        }

        let kind = self.optimizer.unwrap_or(OptimizerKind::Sgd);
        let mut optimizer = OptimizerConfig {
            kind,
            ..OptimizerConfig::default()
        };
        if let Some(v) = self.momentum {
            optimizer.momentum = v;
        }
        if let Some(v) = self.nesterov {
            optimizer.nesterov = v;
        }
        optimizer.weight_decay = self.weight_decay.unwrap_or(match kind {
            OptimizerKind::Adamw => 0.01,
            _ => 0.0,
        });
        optimizer
            .validate()
            .map_err(|e| invalid("optimizer", e.to_string()))?;
        let lr = self.lr.unwrap_or(match kind {
            OptimizerKind::Sgd => 0.01,
            _ => 0.001,
        });
        if !(lr.is_finite() && lr > 0.0) {
            return Err(invalid(
                "lr",
                format!("must be a positive number, got {lr}"),
            ));
        }

        let workers = self.workers.unwrap_or(8);
        if workers == 0 {
            return Err(invalid("workers", "must be at least 1"));
        }
        let batch_size = self.batch_size.unwrap_or(32);
        if batch_size == 0 {
            return Err(invalid("batch_size", "must be at least 1"));
        }
        let hidden = self.hidden.clone().unwrap_or_else(|| vec![256]);
        if hidden.contains(&0) {
            return Err(invalid("hidden", "layer widths must be at least 1"));
        }
        let mut graph = self
            .graph
            .clone()
            .unwrap_or_else(|| "exponential".parse().expect("built-in graph name"));
        if let Some(p) = self.peers {
            if p == 0 {
                return Err(invalid("peers", "must be at least 1"));
            }
            graph.peers = p;
        }
        let seed = self.seed.unwrap_or(1);
        graph.seed = seed;
        Ok(RunConfig {
            algorithm,
            preset,
            optimizer,
            lr,
            schedule: self.schedule.clone().unwrap_or(Schedule::Constant),
            workers,
            batch_size,
            steps: self.steps.unwrap_or(600),
            eval_every: self.eval_every.unwrap_or(100),
            model: self.model.unwrap_or(ModelKind::Mlp),
            hidden,
            dataset: self.dataset.unwrap_or(DatasetKind::Synthetic),
            data_dir: self.data_dir.clone(),
            partition: self.partition.unwrap_or(Partition::Iid),
            graph,
            seed,
        })
    }
}

/// A fully resolved run configuration, shared by every node of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunConfig {
    pub preset: Preset,
    pub algorithm: Algorithm,
    pub optimizer: OptimizerConfig,
    pub lr: f32,
    #[serde(serialize_with = "as_display")]
    pub schedule: Schedule,
    pub workers: usize,
    pub batch_size: usize,
    pub steps: u64,
    pub eval_every: u64,
    pub model: ModelKind,
    pub hidden: Vec<usize>,
    pub dataset: DatasetKind,
    pub data_dir: Option<PathBuf>,
    #[serde(serialize_with = "as_display")]
    pub partition: Partition,
    #[serde(serialize_with = "as_display")]
    pub graph: GraphSpec,
    pub seed: u64,
}

fn as_display<S: serde::Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

impl RunConfig {
    /// SHA-256 of the settings that must agree between peers (everything but
    /// the data directory, which is per-machine).
    pub fn hash(&self) -> String {
        let mut shared = serde_json::to_value(self).expect("config serialises");
        if let Some(map) = shared.as_object_mut() {
            map.remove("data_dir");
        }
        hex::encode(Sha256::digest(shared.to_string().as_bytes()))
    }

    /// Whether the base exchanges parameters by push-sum every step.
    pub fn uses_push_sum(&self) -> bool {
        self.algorithm.base.uses_push_sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_slowmo_over_local_sgd() {
        let c = TrainOptions::default().resolve().unwrap();
        assert_eq!(c.algorithm.base, Base::LocalSgd);
        assert!(c.algorithm.slowmo.beta > 0.0);
        assert!(c.algorithm.slowmo.average);
        assert_eq!(c.workers, 8);
    }

    #[test]
    fn flags_override_file_and_preset() {
        let file = TrainOptions::from_toml(
            "preset = \"osgp\"\nbeta = 0.2\nsteps = 50\nschedule = \"warmup:10\"\n",
        )
        .unwrap();
        let flags = TrainOptions {
            beta: Some(0.4),
            ..TrainOptions::default()
        };
        let c = file.overlaid(&flags).resolve().unwrap();
        assert_eq!(c.algorithm.base, Base::Osgp);
        assert_eq!(c.algorithm.slowmo.beta, 0.4);
        assert_eq!(c.steps, 50);
        assert_eq!(c.schedule, Schedule::Warmup { steps: 10 });
    }

    #[test]
    fn toml_round_trip() {
        let text = "preset = \"slowmo\"\nbase = \"sgp\"\nbeta = 0.6\nschedule = \"warmup:10\"\nhidden = [64, 32]\n";
        let a = TrainOptions::from_toml(text).unwrap();
        let b = TrainOptions::from_toml(&a.to_toml()).unwrap();
        assert_eq!(a.resolve().unwrap(), b.resolve().unwrap());
        assert_eq!(b.hidden, Some(vec![64, 32]));
    }

    #[test]
    fn unknown_key_and_bad_values_are_named() {
        let e = TrainOptions::from_toml("betta = 0.3").unwrap_err();
        assert!(e.contains("betta"), "{e}");
        let e = TrainOptions::from_toml("base = \"sgd\"").unwrap_err();
        assert!(e.contains("sgd"), "{e}");
        let opts = TrainOptions {
            staleness: Some(2),
            base: Some(Base::Sgp),
            ..Default::default()
        };
        let e = opts.resolve().unwrap_err().to_string();
        assert!(e.contains("staleness"), "{e}");
        let opts = TrainOptions {
            lr: Some(-1.0),
            ..Default::default()
        };
        assert!(opts.resolve().unwrap_err().to_string().contains("lr"));
    }

    #[test]
    fn hash_ignores_data_dir_but_not_training_settings() {
        let a = TrainOptions::default().resolve().unwrap();
        let mut b = a.clone();
        b.data_dir = Some("/elsewhere".into());
        assert_eq!(a.hash(), b.hash());
        b.lr = 0.1;
        assert_ne!(a.hash(), b.hash());
    }
}
