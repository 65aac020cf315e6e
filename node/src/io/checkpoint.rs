//! Checkpoints: everything a worker needs to continue a run bit for bit
//! (docs/algorithm.md, "Checkpoints").
//!
//! One checkpoint is one safetensors file, `step-XXXXXXXXXX.safetensors`, in
//! the worker's checkpoint folder. Its tensors are the de-biased parameters
//! under the model's layer names (so PyTorch's `safetensors.torch.load_file`
//! reads them as a `state_dict`), plus flat tensors for the SlowMo anchor and
//! momentum, each base-optimizer buffer and, when the push-sum weight is not
//! 1, the numerator itself, and the compressed average's residual when the
//! run has one (`--compress-average`). The metadata holds the counters, the push-sum
//! weight, the data-stream position, the recent losses, the run's identity
//! (config hash, run id, rank, view) and a SHA-256 over every tensor.
//!
//! Files are written atomically ([`crate::io::outputs::write_atomically`]: a
//! temporary file in the same folder, fsync, rename, fsync of the folder),
//! so a crash leaves either the old set or the new one; the newest `keep` are kept. Loading checks the format, the hash,
//! the identity and every tensor's shape and finiteness, and a resume falls
//! back to the next older checkpoint when one is refused, saying why.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};
use slowmo_optim::LoopState;

use crate::io::outputs::write_atomically;
use crate::model::ParamSpec;

/// The format written in each checkpoint's metadata.
pub const FORMAT: &str = "slowmo-checkpoint/1";

/// Checkpoint options of `slowmo simulate` and `slowmo node`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CheckpointArgs {
    /// Folder for checkpoints (simulate: one sub-folder per worker). Taken at
    /// outer boundaries, with nothing in flight.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Outer iterations between checkpoints.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every: u64,
    /// Checkpoints kept (the newest).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_keep: u64,
    /// Continue from the newest valid checkpoint in --checkpoint-dir (a
    /// refused one is reported and the next older one tried).
    #[arg(long, requires = "checkpoint_dir")]
    pub resume: bool,
}

/// Errors of writing or reading checkpoints; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    /// (The I/O error is part of the message, not a separate cause, so
    /// that an error chain does not print it twice.)
    #[error("checkpoint folder {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("no usable checkpoint in {dir}{}", if refused.is_empty() { String::new() } else { format!(": {}", refused.join("; ")) })]
    NoneUsable { dir: PathBuf, refused: Vec<String> },
}

fn invalid(path: &Path, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Invalid {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Who wrote a checkpoint: a resume must match all of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Hash of the resolved run configuration.
    pub config_hash: String,
    /// The run id (`simulate` for the simulator).
    pub run_id: String,
    /// The worker's rank and the size of the view.
    pub rank: usize,
    pub world_size: usize,
    /// The membership view the checkpoint was taken in (0 until the
    /// membership changes). Files without it are of view 0.
    pub view: u64,
    /// The run's settings ([`slowmo_runspec::RunConfig::settings`]): a
    /// resume names each one that differs, and may extend `steps` when the
    /// schedule allows. Empty: unknown (files written before it was
    /// recorded), the config hash decides alone.
    pub settings: String,
}

/// Everything a worker holds at an outer boundary.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub identity: Identity,
    /// The outer loop's state (parameters, weight, anchor, u, buffers, counters).
    pub state: LoopState,
    /// Data-stream position: epoch and position in it.
    pub epoch: u64,
    pub position: usize,
    /// The recent mini-batch losses (the reported train loss's window).
    pub losses: Vec<f32>,
}

fn le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// SHA-256 over every tensor, in name order: name, shape, bytes.
fn content_hash<'a>(tensors: impl Iterator<Item = (&'a str, &'a [usize], &'a [u8])>) -> String {
    let mut sorted: Vec<_> = tensors.collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = Sha256::new();
    for (name, shape, bytes) in sorted {
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        for d in shape {
            h.update((*d as u64).to_le_bytes());
        }
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    hex::encode(h.finalize())
}

/// The file of the checkpoint taken after `step` base steps.
pub fn file_name(step: u64) -> String {
    format!("step-{step:010}.safetensors")
}

impl Checkpoint {
    /// Serialises the checkpoint for a model with `layout`.
    pub fn to_bytes(&self, layout: &[ParamSpec]) -> Result<Vec<u8>, String> {
        let s = &self.state;
        let n = s.x.len();
        let z = s.debiased();
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = layout
            .iter()
            .map(|p| (p.name.clone(), p.shape.clone(), le_bytes(&z[p.range()])))
            .collect();
        let mut flat = |name: String, v: &[f32]| tensors.push((name, vec![n], le_bytes(v)));
        flat("slowmo.anchor".into(), &s.anchor);
        flat("slowmo.momentum".into(), &s.momentum);
        for (i, b) in s.optimizer_buffers.iter().enumerate() {
            flat(format!("optimizer.{i}"), b);
        }
        if s.w != 1.0 {
            flat("push_sum.numerator".into(), &s.x);
        }
        if !s.average_residual.is_empty() {
            flat("slowmo.average_residual".into(), &s.average_residual);
        }
        let hash = content_hash(
            tensors
                .iter()
                .map(|(a, b, c)| (a.as_str(), b.as_slice(), c.as_slice())),
        );
        let id = &self.identity;
        let meta: HashMap<String, String> = [
            ("format", FORMAT.to_string()),
            ("config_hash", id.config_hash.clone()),
            ("run_id", id.run_id.clone()),
            ("rank", id.rank.to_string()),
            ("world_size", id.world_size.to_string()),
            ("view", id.view.to_string()),
            ("settings", id.settings.clone()),
            ("steps", s.steps.to_string()),
            ("rounds", s.rounds.to_string()),
            ("outer_steps", s.outer_steps.to_string()),
            ("optimizer_steps", s.optimizer_steps.to_string()),
            ("optimizer_buffers", s.optimizer_buffers.len().to_string()),
            // Exact: the bits of the f64.
            ("weight_bits", s.w.to_bits().to_string()),
            ("epoch", self.epoch.to_string()),
            ("position", self.position.to_string()),
            (
                "losses",
                self.losses
                    .iter()
                    .map(|l| l.to_bits().to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("content_sha256", hash),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let views = tensors
            .iter()
            .map(|(name, shape, bytes)| {
                TensorView::new(Dtype::F32, shape.clone(), bytes).map(|v| (name.clone(), v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        safetensors::serialize(views, Some(meta)).map_err(|e| e.to_string())
    }

    /// Parses and checks a checkpoint against the model `layout` and the
    /// identity it must have.
    pub fn from_bytes(
        bytes: &[u8],
        layout: &[ParamSpec],
        expect: &Identity,
        path: &Path,
    ) -> Result<Self, CheckpointError> {
        let (_, header) = SafeTensors::read_metadata(bytes)
            .map_err(|e| invalid(path, format!("not a safetensors file: {e}")))?;
        let meta = header
            .metadata()
            .clone()
            .ok_or_else(|| invalid(path, "no metadata: not a slowmo checkpoint"))?;
        let get = |k: &str| {
            meta.get(k)
                .ok_or_else(|| invalid(path, format!("metadata lacks `{k}`")))
        };
        let num = |k: &str| -> Result<u64, CheckpointError> {
            get(k)?
                .parse::<u64>()
                .map_err(|e| invalid(path, format!("metadata `{k}`: {e}")))
        };
        if get("format")? != FORMAT {
            return Err(invalid(
                path,
                format!("format {:?}, this build reads {FORMAT:?}", get("format")?),
            ));
        }
        let file = SafeTensors::deserialize(bytes)
            .map_err(|e| invalid(path, format!("not a safetensors file: {e}")))?;
        let tensors = file.tensors();
        let hash = content_hash(
            tensors
                .iter()
                .map(|(name, v)| (name.as_str(), v.shape(), v.data())),
        );
        if &hash != get("content_sha256")? {
            return Err(invalid(path, "content hash mismatch: the file is corrupt"));
        }
        let identity = Identity {
            config_hash: get("config_hash")?.clone(),
            run_id: get("run_id")?.clone(),
            rank: num("rank")? as usize,
            world_size: num("world_size")? as usize,
            view: if meta.contains_key("view") {
                num("view")?
            } else {
                0
            },
            settings: meta.get("settings").cloned().unwrap_or_default(),
        };
        let differs = |what: &str, ours: &dyn std::fmt::Display, theirs: &dyn std::fmt::Display| {
            invalid(
                path,
                format!("written by a different run: {what} is {theirs}, this run's is {ours}"),
            )
        };
        if !identity.settings.is_empty() && !expect.settings.is_empty() {
            // Each setting that differs is named; a longer run is fine when
            // the schedule does not depend on the total.
            let changes = slowmo_runspec::resume_differences(&identity.settings, &expect.settings)
                .map_err(|e| invalid(path, e))?;
            if !changes.is_empty() {
                let list: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
                return Err(invalid(
                    path,
                    format!(
                        "written with other settings: {}; a resume keeps the run's settings \
                         (only `steps` may change, and only when the learning-rate schedule \
                         does not depend on the total: constant, warmup, step)",
                        list.join("; ")
                    ),
                ));
            }
        } else if identity.config_hash != expect.config_hash {
            return Err(differs(
                "the config hash",
                &expect.config_hash,
                &identity.config_hash,
            ));
        }
        if identity.run_id != expect.run_id {
            return Err(differs("the run id", &expect.run_id, &identity.run_id));
        }
        if identity.view != expect.view {
            return Err(invalid(
                path,
                format!(
                    "taken in membership view {} (peers were lost or joined), and a resume \
                     starts from view {}: only checkpoints taken before the membership \
                     changed can be resumed",
                    identity.view, expect.view
                ),
            ));
        }
        if (identity.rank, identity.world_size) != (expect.rank, expect.world_size) {
            return Err(differs(
                "rank/world size",
                &format!("{}/{}", expect.rank, expect.world_size),
                &format!("{}/{}", identity.rank, identity.world_size),
            ));
        }
        let n: usize = layout.iter().map(ParamSpec::numel).sum();
        let tensor = |name: &str, shape: &[usize]| -> Result<Vec<f32>, CheckpointError> {
            let v = file
                .tensor(name)
                .map_err(|_| invalid(path, format!("missing tensor {name:?}")))?;
            if v.dtype() != Dtype::F32 || v.shape() != shape {
                return Err(invalid(
                    path,
                    format!(
                        "tensor {name:?} is {:?} {:?}, expected F32 {shape:?}",
                        v.dtype(),
                        v.shape()
                    ),
                ));
            }
            let vals = from_le(v.data());
            if let Some(i) = vals.iter().position(|x| !x.is_finite()) {
                return Err(invalid(
                    path,
                    format!("tensor {name:?}[{i}] is {}", vals[i]),
                ));
            }
            Ok(vals)
        };
        let w = f64::from_bits(num("weight_bits")?);
        let x = if w == 1.0 {
            let mut x = vec![0f32; n];
            for p in layout {
                x[p.range()].copy_from_slice(&tensor(&p.name, &p.shape)?);
            }
            x
        } else {
            tensor("push_sum.numerator", &[n])?
        };
        let buffers = num("optimizer_buffers")? as usize;
        if buffers > 2 {
            return Err(invalid(path, format!("{buffers} optimizer buffers")));
        }
        let state = LoopState {
            x,
            w,
            anchor: tensor("slowmo.anchor", &[n])?,
            momentum: tensor("slowmo.momentum", &[n])?,
            outer_steps: num("outer_steps")?,
            optimizer_buffers: (0..buffers)
                .map(|i| tensor(&format!("optimizer.{i}"), &[n]))
                .collect::<Result<_, _>>()?,
            optimizer_steps: num("optimizer_steps")?,
            steps: num("steps")?,
            rounds: num("rounds")?,
            average_residual: if file.names().contains(&"slowmo.average_residual") {
                tensor("slowmo.average_residual", &[n])?
            } else {
                Vec::new()
            },
        };
        let losses = get("losses")?
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<u32>().map(f32::from_bits))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(path, format!("metadata `losses`: {e}")))?;
        Ok(Self {
            identity,
            state,
            epoch: num("epoch")?,
            position: num("position")? as usize,
            losses,
        })
    }

    /// Writes the checkpoint atomically into `dir` and removes all but the
    /// newest `keep` checkpoints there. Returns the file written.
    pub fn save(
        &self,
        dir: &Path,
        layout: &[ParamSpec],
        keep: u64,
    ) -> Result<PathBuf, CheckpointError> {
        let io = |error| CheckpointError::Io {
            path: dir.to_path_buf(),
            error,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let path = dir.join(file_name(self.state.steps));
        let bytes = self
            .to_bytes(layout)
            .map_err(|e| invalid(&path, format!("cannot serialise: {e}")))?;
        write_atomically(&path, &bytes).map_err(io)?;
        for (_, old) in list(dir).map_err(io)?.into_iter().skip(keep as usize) {
            std::fs::remove_file(&old).map_err(io)?;
        }
        Ok(path)
    }

    /// Reads and checks one checkpoint file.
    pub fn load(
        path: &Path,
        layout: &[ParamSpec],
        expect: &Identity,
    ) -> Result<Self, CheckpointError> {
        let bytes = std::fs::read(path).map_err(|e| invalid(path, format!("cannot read: {e}")))?;
        Self::from_bytes(&bytes, layout, expect, path)
    }
}

/// The checkpoint files in `dir`, newest (most steps) first.
pub fn list(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let step = name
            .strip_prefix("step-")
            .and_then(|s| s.strip_suffix(".safetensors"))
            .and_then(|s| s.parse::<u64>().ok());
        if let Some(step) = step {
            found.push((step, entry.path()));
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    Ok(found)
}

/// The newest checkpoint in `dir` that passes every check and was taken at
/// most `at_most` steps in (any, without a bound). Each refused one is logged
/// with its reason and the next older one is tried.
pub fn newest_valid(
    dir: &Path,
    layout: &[ParamSpec],
    expect: &Identity,
    at_most: Option<u64>,
) -> Result<Checkpoint, CheckpointError> {
    let files = list(dir).map_err(|error| CheckpointError::Io {
        path: dir.to_path_buf(),
        error,
    })?;
    let mut refused = Vec::new();
    for (step, path) in files {
        if at_most.is_some_and(|m| step > m) {
            continue;
        }
        match Checkpoint::load(&path, layout, expect) {
            Ok(c) => return Ok(c),
            Err(e) => {
                tracing::warn!("{e}; trying an older checkpoint");
                refused.push(e.to_string());
            }
        }
    }
    Err(CheckpointError::NoneUsable {
        dir: dir.to_path_buf(),
        refused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Vec<ParamSpec> {
        vec![
            ParamSpec {
                name: "fc.weight".into(),
                shape: vec![2, 2],
                offset: 0,
            },
            ParamSpec {
                name: "fc.bias".into(),
                shape: vec![2],
                offset: 4,
            },
        ]
    }

    fn identity() -> Identity {
        Identity {
            config_hash: "c0ffee".into(),
            run_id: "simulate".into(),
            rank: 1,
            world_size: 4,
            view: 0,
            settings: String::new(),
        }
    }

    fn checkpoint(w: f64, steps: u64) -> Checkpoint {
        Checkpoint {
            identity: identity(),
            state: LoopState {
                x: vec![0.5, -1.0, 2.0, 3.5, -0.25, 1e-30],
                w,
                anchor: vec![0.1; 6],
                momentum: vec![-0.2; 6],
                outer_steps: 7,
                optimizer_buffers: vec![vec![0.3; 6]],
                optimizer_steps: 84,
                steps,
                rounds: 84,
                average_residual: Vec::new(),
            },
            epoch: 2,
            position: 17,
            losses: vec![2.5, 1.25, -0.0],
        }
    }

    #[test]
    fn round_trip_is_exact_for_any_weight() {
        for w in [1.0, 0.6666666666666666] {
            let c = checkpoint(w, 84);
            let bytes = c.to_bytes(&layout()).unwrap();
            let back =
                Checkpoint::from_bytes(&bytes, &layout(), &identity(), Path::new("c")).unwrap();
            assert_eq!(back, c);
            assert_eq!(back.losses[2].to_bits(), (-0.0f32).to_bits());
        }
        let mut c = checkpoint(1.0, 84);
        c.state.average_residual = vec![1e-3, -0.0, 2.5e-7, 0.0, -4.0, 1.0];
        let bytes = c.to_bytes(&layout()).unwrap();
        let back = Checkpoint::from_bytes(&bytes, &layout(), &identity(), Path::new("c")).unwrap();
        assert_eq!(back, c, "the compressed average's residual is kept");
    }

    #[test]
    fn the_parameters_are_a_state_dict_of_the_debiased_model() {
        let c = checkpoint(0.5, 12);
        let bytes = c.to_bytes(&layout()).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let bias = from_le(st.tensor("fc.bias").unwrap().data());
        assert_eq!(bias, vec![-0.5, 2e-30]);
        assert_eq!(st.tensor("fc.weight").unwrap().shape(), &[2, 2]);
    }

    #[test]
    fn corrupt_and_mismatched_checkpoints_are_refused_with_the_reason() {
        let bytes = checkpoint(1.0, 12).to_bytes(&layout()).unwrap();
        let p = Path::new("c");
        let mut flipped = bytes.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 0x40;
        let e = Checkpoint::from_bytes(&flipped, &layout(), &identity(), p).unwrap_err();
        assert!(e.to_string().contains("content hash mismatch"), "{e}");
        let e = Checkpoint::from_bytes(&bytes[..bytes.len() / 2], &layout(), &identity(), p)
            .unwrap_err();
        assert!(e.to_string().contains("safetensors"), "{e}");
        let other = Identity {
            config_hash: "beef".into(),
            ..identity()
        };
        let e = Checkpoint::from_bytes(&bytes, &layout(), &other, p).unwrap_err();
        assert!(e.to_string().contains("config hash is c0ffee"), "{e}");
        let other = Identity {
            rank: 2,
            ..identity()
        };
        let e = Checkpoint::from_bytes(&bytes, &layout(), &other, p).unwrap_err();
        assert!(e.to_string().contains("rank/world size is 1/4"), "{e}");
        let mut bigger = layout();
        bigger[1].shape = vec![3];
        let e = Checkpoint::from_bytes(&bytes, &bigger, &identity(), p).unwrap_err();
        assert!(e.to_string().contains("fc.bias"), "{e}");
    }

    #[test]
    fn a_checkpoint_taken_after_a_membership_change_is_refused_and_an_older_one_taken() {
        let dir = tempfile::tempdir().unwrap();
        checkpoint(1.0, 24).save(dir.path(), &layout(), 3).unwrap();
        // The same worker after a view change: rank 0 of 3 in view 2.
        let mut later = checkpoint(1.0, 48);
        later.identity = Identity {
            rank: 0,
            world_size: 3,
            view: 2,
            ..identity()
        };
        later.save(dir.path(), &layout(), 3).unwrap();
        let bytes = std::fs::read(dir.path().join(file_name(48))).unwrap();
        let e = Checkpoint::from_bytes(&bytes, &layout(), &identity(), Path::new("c")).unwrap_err();
        assert!(e.to_string().contains("membership view 2"), "{e}");
        let c = newest_valid(dir.path(), &layout(), &identity(), None).unwrap();
        assert_eq!(c.state.steps, 24);
        assert_eq!(c.identity.view, 0);
    }

    #[test]
    fn save_keeps_the_newest_and_resume_falls_back_past_a_corrupt_one() {
        let dir = tempfile::tempdir().unwrap();
        for step in [12, 24, 36, 48] {
            checkpoint(1.0, step)
                .save(dir.path(), &layout(), 3)
                .unwrap();
        }
        let steps: Vec<u64> = list(dir.path()).unwrap().iter().map(|f| f.0).collect();
        assert_eq!(steps, vec![48, 36, 24]);
        let newest = dir.path().join(file_name(48));
        let mut bytes = std::fs::read(&newest).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&newest, bytes).unwrap();
        let c = newest_valid(dir.path(), &layout(), &identity(), None).unwrap();
        assert_eq!(c.state.steps, 36);
        let c = newest_valid(dir.path(), &layout(), &identity(), Some(30)).unwrap();
        assert_eq!(c.state.steps, 24);
        let other = Identity {
            run_id: "other".into(),
            ..identity()
        };
        let e = newest_valid(dir.path(), &layout(), &other, None).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("content hash mismatch") && text.contains("run id is simulate"),
            "{text}"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names.len(),
            3,
            "no temporary file is left behind: {names:?}"
        );
    }
}
