//! Filling defaults into [`TrainOptions`], validating them, and the
//! resolved [`RunConfig`] every node of a run must share: its hash is
//! checked when a peer joins.

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest, Sha256};
use slowmo_optim::{Algorithm, Base, OptimizerConfig, OptimizerKind, Preset, Schedule};
use slowmo_topologies::GraphSpec;

use crate::compression::Compression;
use crate::kinds::{DatasetKind, ModelKind, Partition, TransformerShape};
use crate::options::{ConfigError, TrainOptions, invalid};

/// The largest staleness bound accepted: well inside the round window over
/// which peers accept shares (`slowmo_gossip::p2p::DEFAULT_ROUND_WINDOW`,
/// where the window is documented), since a worker can run up to about the
/// staleness times the graph's diameter rounds ahead of another.
pub const MAX_STALENESS: u64 = 64;

/// The largest per-worker mini-batch accepted.
pub const MAX_BATCH_SIZE: usize = 1 << 16;

impl TrainOptions {
    /// The paths among the options can be recorded: run files and summaries
    /// are UTF-8 (JSON, TOML), so a path that is not is refused by name.
    pub fn check_paths(&self) -> Result<(), ConfigError> {
        match &self.data_dir {
            Some(dir) if dir.to_str().is_none() => Err(invalid(
                "data_dir",
                format!(
                    "--data-dir {} is not valid UTF-8; the run's settings and summaries \
                     record it, so give a UTF-8 path (a link with a UTF-8 name will do)",
                    dir.display()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Fills defaults and validates.
    pub fn resolve(&self) -> Result<RunConfig, ConfigError> {
        self.check_paths()?;
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
        if algorithm.staleness > MAX_STALENESS {
            return Err(invalid(
                "staleness",
                format!(
                    "{} is above {MAX_STALENESS}: a peer refuses shares more than the round \
                     window ahead of its own, and a worker may run up to about \
                     staleness times the graph's diameter rounds ahead of another",
                    algorithm.staleness
                ),
            ));
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
        if algorithm.background_gossip && algorithm.staleness == 0 {
            return Err(invalid(
                "staleness",
                "background gossip keeps up to `staleness` rounds in flight and needs at least \
                 1 (staleness 0 is synchronous gossip: drop --background-gossip)"
                    .to_string(),
            ));
        }

        let compress = self.compress.unwrap_or_default();
        if !compress.is_none() && !algorithm.base.uses_push_sum() {
            return Err(invalid(
                "compress",
                format!(
                    "compresses push-sum shares, and base {} sends none (use sgp or osgp, or \
                     --compress-average for the exact averages)",
                    algorithm.base
                ),
            ));
        }
        let compress_average = self.compress_average.unwrap_or_default();
        let averages = algorithm.slowmo.average && algorithm.base != Base::ArSgd;
        if !compress_average.is_none() && !averages {
            let why = if algorithm.base == Base::ArSgd {
                "ar-sgd keeps the workers identical and averages gradients, not parameters"
            } else {
                "this run takes no exact average (--no-average)"
            };
            return Err(invalid(
                "compress_average",
                format!("compresses the exact averages at the outer boundaries, and {why}"),
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
        if batch_size > MAX_BATCH_SIZE {
            return Err(invalid(
                "batch_size",
                format!(
                    "{batch_size} is above {MAX_BATCH_SIZE} samples per worker and step \
                     (a batch's inputs and activations must fit in memory)"
                ),
            ));
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
        // `build` would refuse it too, but only once the run has started.
        graph
            .validate()
            .map_err(|e| invalid("peers", e.to_string()))?;
        let (dataset, data_dir) = self.dataset_and_dir()?;
        let model = self.model.unwrap_or(ModelKind::Mlp);
        let transformer = self.transformer_shape(model, dataset)?;
        let partition = self.partition.unwrap_or(match dataset {
            DatasetKind::Text => Partition::Contiguous,
            _ => Partition::Iid,
        });
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
            model,
            hidden,
            transformer,
            dataset,
            data_dir,
            partition,
            graph,
            seed,
            compress,
            compress_average,
        })
    }
}

impl TrainOptions {
    /// The dataset and its path: `--dataset text:PATH` is `--dataset text
    /// --data-dir PATH`; both given must agree.
    fn dataset_and_dir(&self) -> Result<(DatasetKind, Option<PathBuf>), ConfigError> {
        let Some(arg) = &self.dataset else {
            return Ok((DatasetKind::Synthetic, self.data_dir.clone()));
        };
        let dir = match (&arg.path, &self.data_dir) {
            (Some(a), Some(b)) if a != b => {
                return Err(invalid(
                    "dataset",
                    format!(
                        "--dataset {arg} and --data-dir {} name different paths; give one",
                        b.display()
                    ),
                ));
            }
            (Some(a), _) => Some(a.clone()),
            (None, b) => b.clone(),
        };
        if arg.kind == DatasetKind::Text && dir.is_none() {
            return Err(invalid(
                "dataset",
                "text needs the file or folder to read: --dataset text:PATH",
            ));
        }
        Ok((arg.kind, dir))
    }

    /// The transformer's shape when the model is the transformer (which
    /// trains on text only, as text trains only the transformer); `None`
    /// for the other models, which refuse the transformer's settings.
    fn transformer_shape(
        &self,
        model: ModelKind,
        dataset: DatasetKind,
    ) -> Result<Option<TransformerShape>, ConfigError> {
        let given = [
            ("layers", self.layers),
            ("heads", self.heads),
            ("width", self.width),
            ("context", self.context),
        ];
        if model != ModelKind::Transformer {
            if dataset == DatasetKind::Text {
                return Err(invalid(
                    "model",
                    format!("--dataset text trains --model transformer, not {model}"),
                ));
            }
            if let Some((name, _)) = given.iter().find(|(_, v)| v.is_some()) {
                return Err(invalid(
                    name,
                    format!("--{name} shapes the transformer; --model is {model}"),
                ));
            }
            return Ok(None);
        }
        if dataset != DatasetKind::Text {
            return Err(invalid(
                "dataset",
                format!("--model transformer trains on --dataset text:PATH, not {dataset}"),
            ));
        }
        let d = TransformerShape::default();
        let shape = TransformerShape {
            layers: self.layers.unwrap_or(d.layers),
            heads: self.heads.unwrap_or(d.heads),
            width: self.width.unwrap_or(d.width),
            context: self.context.unwrap_or(d.context),
        };
        shape
            .validate()
            .map_err(|(name, message)| invalid(name, message))?;
        Ok(Some(shape))
    }
}

/// A fully resolved run configuration, shared by every node of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub preset: Preset,
    pub algorithm: Algorithm,
    pub optimizer: OptimizerConfig,
    pub lr: f32,
    #[serde(serialize_with = "as_display", deserialize_with = "from_str")]
    pub schedule: Schedule,
    pub workers: usize,
    pub batch_size: usize,
    pub steps: u64,
    pub eval_every: u64,
    pub model: ModelKind,
    pub hidden: Vec<usize>,
    /// The transformer's shape (`Some` exactly when `model` is the
    /// transformer; absent from the settings of the other models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformer: Option<TransformerShape>,
    pub dataset: DatasetKind,
    pub data_dir: Option<PathBuf>,
    #[serde(serialize_with = "as_display", deserialize_with = "from_str")]
    pub partition: Partition,
    #[serde(serialize_with = "as_display", deserialize_with = "from_str")]
    pub graph: GraphSpec,
    pub seed: u64,
    /// Push-sum share encoding; absent from the settings when none, so an
    /// uncompressed run's settings and hash are those of earlier versions.
    #[serde(default, skip_serializing_if = "Compression::is_none")]
    pub compress: Compression,
    /// Exact-average encoding at the outer boundaries; absent when none.
    #[serde(default, skip_serializing_if = "Compression::is_none")]
    pub compress_average: Compression,
}

/// A setting that differs between a run's earlier part (its checkpoints)
/// and its resume: its dotted name in [`RunConfig::settings`] and both
/// values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingChange {
    pub name: String,
    pub earlier: String,
    pub now: String,
}

impl std::fmt::Display for SettingChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` was {}, is {}", self.name, self.earlier, self.now)
    }
}

/// The settings of `now` a resume of a run with the settings `earlier`
/// cannot take (both as [`RunConfig::settings`] JSON): every one that
/// differs, except `steps` while the learning-rate schedule does not depend
/// on the total (constant, warmup, step), since a longer or shorter run
/// computes the steps already taken with the same bits. Empty: the resume
/// may go on. `Err` when `earlier` is not such a JSON text.
pub fn resume_differences(earlier: &str, now: &str) -> Result<Vec<SettingChange>, String> {
    let parse = |text: &str| serde_json::from_str::<serde_json::Value>(text);
    let earlier = parse(earlier).map_err(|e| format!("the recorded settings: {e}"))?;
    let now = parse(now).map_err(|e| format!("the settings: {e}"))?;
    let mut flat_earlier = Vec::new();
    let mut flat_now = Vec::new();
    flatten("", &earlier, &mut flat_earlier);
    flatten("", &now, &mut flat_now);
    let total_free = now
        .get("schedule")
        .and_then(|s| s.as_str())
        .and_then(|s| s.parse::<Schedule>().ok())
        .is_some_and(|s| !s.depends_on_total())
        && earlier.get("schedule") == now.get("schedule");
    let lookup = |flat: &[(String, String)], name: &str| {
        flat.iter()
            .find(|(n, _)| n == name)
            .map_or_else(|| "(unset)".to_string(), |(_, v)| v.clone())
    };
    let mut names: Vec<&String> = flat_earlier
        .iter()
        .chain(&flat_now)
        .map(|(n, _)| n)
        .collect();
    names.sort();
    names.dedup();
    Ok(names
        .into_iter()
        .filter(|name| !(name.as_str() == "steps" && total_free))
        .filter_map(|name| {
            let (e, n) = (lookup(&flat_earlier, name), lookup(&flat_now, name));
            (e != n).then(|| SettingChange {
                name: name.clone(),
                earlier: e,
                now: n,
            })
        })
        .collect())
}

/// A settings document's leaves as (dotted name, value): `algorithm.slowmo.beta`
/// and its JSON text, f32 settings shown as the f32 they are.
pub fn flat_settings(value: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    flatten("", value, &mut out);
    out
}

/// `value`'s leaves as (dotted name, JSON text).
fn flatten(prefix: &str, value: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let name = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&name, v, out);
            }
        }
        // Settings held as f32 read back as their f64 widening: shown as
        // the f32 they are (0.01, not 0.009999999776482582).
        serde_json::Value::Number(n)
            if n.is_f64() && n.as_f64().is_some_and(|f| f64::from(f as f32) == f) =>
        {
            let f = n.as_f64().expect("checked") as f32;
            out.push((prefix.to_string(), f.to_string()));
        }
        leaf => out.push((prefix.to_string(), leaf.to_string())),
    }
}

fn as_display<S: serde::Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn from_str<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: std::fmt::Display,
{
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

impl RunConfig {
    /// When `--peers` asks for more out-peers per round than the graph of
    /// the run's nodes has, a note saying what each round sends to (runs
    /// log it; see `slowmo_topologies::peers_clamped`).
    pub fn peers_clamped(&self) -> Option<String> {
        slowmo_topologies::peers_clamped(&self.graph, self.workers)
    }

    /// SHA-256 of the settings that must agree between peers (everything but
    /// the data directory, which is per-machine): of [`RunConfig::settings`].
    pub fn hash(&self) -> String {
        hex::encode(Sha256::digest(self.settings().as_bytes()))
    }

    /// The settings that must agree between peers, as JSON (everything but
    /// the data directory). Checkpoints record it, so that a resume can name
    /// each setting that differs ([`resume_differences`]).
    pub fn settings(&self) -> String {
        let mut shared = serde_json::to_value(self).expect("config serialises");
        if let Some(map) = shared.as_object_mut() {
            map.remove("data_dir");
        }
        shared.to_string()
    }

    /// Whether the base exchanges parameters by push-sum every step.
    pub fn uses_push_sum(&self) -> bool {
        self.algorithm.base.uses_push_sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(toml: &str) -> String {
        TrainOptions::from_toml(toml)
            .unwrap()
            .resolve()
            .unwrap()
            .settings()
    }

    #[test]
    fn a_resume_may_extend_steps_unless_the_schedule_depends_on_the_total() {
        for schedule in ["constant", "warmup:10", "step:100:0.5"] {
            let at = |steps| settings(&format!("steps = {steps}\nschedule = \"{schedule}\"\n"));
            assert_eq!(resume_differences(&at(600), &at(1200)).unwrap(), vec![]);
        }
        let cosine = |steps| settings(&format!("steps = {steps}\nschedule = \"cosine\"\n"));
        let d = resume_differences(&cosine(600), &cosine(1200)).unwrap();
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].to_string(), "`steps` was 600, is 1200");
        // Any other setting is named with both values, however deep.
        let d =
            resume_differences(&settings("tau = 12\nlr = 0.05\n"), &settings("tau = 6\n")).unwrap();
        let text: Vec<String> = d.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            text,
            [
                "`algorithm.slowmo.tau` was 12, is 6",
                "`lr` was 0.05, is 0.01"
            ],
            "{d:?}"
        );
        assert!(resume_differences("not json", &cosine(1)).is_err());
    }

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
        let c = file.overlaid(&flags).unwrap().resolve().unwrap();
        assert_eq!(c.algorithm.base, Base::Osgp);
        assert_eq!(c.algorithm.slowmo.beta, 0.4);
        assert_eq!(c.steps, 50);
        assert_eq!(c.schedule, Schedule::Warmup { steps: 10 });
    }

    #[test]
    fn toml_round_trip() {
        let text = "preset = \"slowmo\"\nbase = \"sgp\"\nbeta = 0.6\nschedule = \"warmup:10\"\nhidden = [64, 32]\nno_average = true\n";
        let a = TrainOptions::from_toml(text).unwrap();
        let b = TrainOptions::from_toml(&a.to_toml().unwrap()).unwrap();
        assert_eq!(a.resolve().unwrap(), b.resolve().unwrap());
        assert_eq!(b.hidden, Some(vec![64, 32]));
        assert!(!b.resolve().unwrap().algorithm.slowmo.average);
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
        for staleness in [MAX_STALENESS + 1, 300, u64::MAX] {
            let opts = TrainOptions {
                staleness: Some(staleness),
                base: Some(Base::Osgp),
                ..Default::default()
            };
            let e = opts.resolve().unwrap_err().to_string();
            assert!(e.contains("staleness") && e.contains("round window"), "{e}");
        }
        let ok = TrainOptions {
            staleness: Some(MAX_STALENESS),
            base: Some(Base::Osgp),
            ..Default::default()
        };
        assert_eq!(ok.resolve().unwrap().algorithm.staleness, MAX_STALENESS);
        for batch_size in [MAX_BATCH_SIZE + 1, 100_000_000, usize::MAX] {
            let opts = TrainOptions {
                batch_size: Some(batch_size),
                ..Default::default()
            };
            let e = opts.resolve().unwrap_err().to_string();
            assert!(e.contains("batch_size") && e.contains("memory"), "{e}");
        }
    }

    #[test]
    fn overlay_keeps_non_finite_values_for_validation_and_refuses_what_toml_cannot_hold() {
        let nan = TrainOptions {
            lr: Some(f32::NAN),
            ..Default::default()
        };
        let file = TrainOptions::from_toml("lr = 0.1\nseed = 3\n").unwrap();
        let e = file
            .overlaid(&nan)
            .unwrap()
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("lr") && e.contains("NaN"), "{e}");
        let huge = TrainOptions {
            seed: Some(u64::MAX),
            ..Default::default()
        };
        assert_eq!(huge.resolve().unwrap().seed, u64::MAX);
        for e in [
            file.overlaid(&huge).unwrap_err(),
            huge.to_toml().unwrap_err(),
        ] {
            assert!(matches!(e, ConfigError::NotToml(_)), "{e}");
        }
    }

    #[test]
    fn peers_on_a_graph_without_them_is_refused_before_the_run() {
        let opts = TrainOptions::from_toml("graph = \"ring\"\npeers = 2\n").unwrap();
        let e = opts.resolve().unwrap_err().to_string();
        assert!(e.contains("peers") && e.contains("ring"), "{e}");
    }

    /// Peers check this hash when they join: it must not change for the same
    /// settings (these values were computed before the types moved here).
    #[test]
    fn hash_of_known_settings_is_stable() {
        let cases = [
            (
                "",
                "9b654a4897279a34e651c8a34ec674f51e6ca19f1c2c5408e17b9a7a7b9f42a7",
            ),
            (
                "base = \"osgp\"\nschedule = \"step:10:0.5\"\ngraph = \"exponential\"\npeers = 2\n\
                 partition = \"dirichlet:0.3\"\nlr = 0.05\nbeta = 0.6\nno_average = true\n",
                "4ce4e1b1abe70d00ebcdd0109461a0f82761866e1f402f0afa311d7b3acafc42",
            ),
            (
                "preset = \"sgp\"\noptimizer = \"adamw\"\nmodel = \"cnn\"\n\
                 dataset = \"fashion-mnist\"\nhidden = [64, 32]\n",
                "3bcbb0566bb5f4272fb8698352193045d9cebe0f6d9e52aa0cae3c461611aca9",
            ),
        ];
        for (text, hash) in cases {
            let c = TrainOptions::from_toml(text).unwrap().resolve().unwrap();
            assert_eq!(c.hash(), hash, "{text}");
        }
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

    #[test]
    fn resolved_config_round_trips_through_json() {
        let opts = TrainOptions::from_toml(
            "base = \"osgp\"\nschedule = \"step:10:0.5\"\ngraph = \"exponential\"\npeers = 2\npartition = \"dirichlet:0.3\"\ndata_dir = \"/d\"\n",
        )
        .unwrap();
        let c = opts.resolve().unwrap();
        let back: RunConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.hash(), c.hash());
    }
}
