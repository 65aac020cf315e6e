//! `slowmo simulate --dump-reference DIR`: what a replay of the same run in
//! another implementation needs (tools/reference/ replays it through
//! fairscale's SlowMo and compares).
//!
//! `DIR` receives:
//! - `config.json`: the resolved run configuration;
//! - `init.safetensors`: `x_{0,0}`, named like a PyTorch `state_dict`;
//! - `data.safetensors`: `batches` (i64, `[workers, steps, batch]`, indices
//!   into the training split), and the samples they use: `index` (i64,
//!   sorted), `images` (f32, `[n, sample_len]`), `labels` (i64);
//! - `outer/step-N.safetensors`: rank 0's parameters after the outer step
//!   that ends base step N (the exact average after the slow step; with
//!   the noaverage variant, rank 0's own de-biased parameters).
//!
//! The batch indices come from the very batchers the workers draw from
//! (same shards, same seeds); the parameters from checkpoints taken at
//! every outer boundary.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context;
use safetensors::Dtype;
use safetensors::tensor::TensorView;

use crate::config::RunConfig;
use crate::data::{self, Batcher, Split};
use crate::engine::setup::{build_model, load_dataset};
use crate::engine::simulate::Simulation;
use crate::io::checkpoint::{self, Checkpoint, CheckpointArgs, Identity};

/// Every worker's batch indices for every step, in the order the worker
/// draws them.
pub fn batch_indices(
    config: &RunConfig,
    labels: &[u32],
    classes: usize,
) -> anyhow::Result<Vec<Vec<Vec<usize>>>> {
    let shards = data::shard_indices(
        labels,
        classes,
        config.workers,
        config.partition,
        config.seed,
    )?;
    // A split whose label of sample i is i, with no pixels: the batcher's
    // labels are then the indices it drew.
    let positions = Split {
        images: Vec::new().into(),
        labels: (0..labels.len() as u32).collect(),
    };
    let (mut images, mut drawn) = (Vec::new(), Vec::new());
    let mut all = Vec::with_capacity(config.workers);
    for (rank, shard) in shards.into_iter().enumerate() {
        let mut batcher = Batcher::new(shard, crate::engine::train::batch_seed(config.seed, rank));
        let mut steps = Vec::with_capacity(config.steps as usize);
        for _ in 0..config.steps {
            batcher.next_batch(&positions, 0, config.batch_size, &mut images, &mut drawn);
            steps.push(drawn.iter().map(|&i| i as usize).collect());
        }
        all.push(steps);
    }
    Ok(all)
}

fn le_bytes<T: Copy, const N: usize>(values: &[T], to: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| to(v)).collect()
}

fn write_tensors(
    path: &Path,
    tensors: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)>,
) -> anyhow::Result<()> {
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            Ok((
                name.to_string(),
                TensorView::new(*dtype, shape.clone(), bytes)?,
            ))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, None, path)
        .with_context(|| format!("writing {}", path.display()))
}

/// Refuses settings the dump cannot describe.
pub fn check_combinable(
    checkpoints: &CheckpointArgs,
    others: &[(&str, bool)],
) -> anyhow::Result<()> {
    if checkpoints.checkpoint_dir.is_some() || checkpoints.resume {
        anyhow::bail!("--dump-reference cannot be combined with --checkpoint-dir or --resume");
    }
    if let Some((flag, _)) = others.iter().find(|(_, given)| *given) {
        anyhow::bail!("--dump-reference cannot be combined with {flag}");
    }
    Ok(())
}

/// Runs the simulation and writes the dump into `dir` (created if missing).
pub fn dump(config: &RunConfig, dir: &Path, quiet: bool) -> anyhow::Result<()> {
    let fail = |what: &str| format!("--dump-reference {}: {what}", dir.display());
    std::fs::create_dir_all(dir.join("outer")).with_context(|| fail("cannot create the folder"))?;
    let dataset = load_dataset(config)?;
    let model = build_model(config, &dataset, &candle_core::Device::Cpu)?;
    let sample_len = dataset.sample_len();

    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(config)?)
        .with_context(|| fail("cannot write config.json"))?;
    model
        .save_safetensors(
            &model.init_params(config.seed),
            &dir.join("init.safetensors"),
        )
        .with_context(|| fail("cannot write init.safetensors"))?;

    let batches = batch_indices(config, &dataset.train.labels, dataset.classes)?;
    let used: BTreeSet<usize> = batches.iter().flatten().flatten().copied().collect();
    let used: Vec<usize> = used.into_iter().collect();
    let mut images = Vec::with_capacity(used.len() * sample_len);
    for &i in &used {
        dataset.train.image_into(i, sample_len, &mut images);
    }
    let labels: Vec<i64> = used
        .iter()
        .map(|&i| i64::from(dataset.train.labels[i]))
        .collect();
    let index: Vec<i64> = used.iter().map(|&i| i as i64).collect();
    let flat: Vec<i64> = batches
        .iter()
        .flatten()
        .flatten()
        .map(|&i| i as i64)
        .collect();
    write_tensors(
        &dir.join("data.safetensors"),
        vec![
            (
                "batches",
                Dtype::I64,
                vec![config.workers, config.steps as usize, config.batch_size],
                le_bytes(&flat, i64::to_le_bytes),
            ),
            (
                "index",
                Dtype::I64,
                vec![used.len()],
                le_bytes(&index, i64::to_le_bytes),
            ),
            (
                "images",
                Dtype::F32,
                vec![used.len(), sample_len],
                le_bytes(&images, f32::to_le_bytes),
            ),
            (
                "labels",
                Dtype::I64,
                vec![used.len()],
                le_bytes(&labels, i64::to_le_bytes),
            ),
        ],
    )?;

    // The run itself, with a checkpoint at every outer boundary.
    let ck_dir: PathBuf = dir.join("checkpoints");
    let checkpoints = CheckpointArgs {
        checkpoint_dir: Some(ck_dir.clone()),
        checkpoint_every: 1,
        checkpoint_keep: u64::MAX,
        resume: false,
    };
    let summary = Simulation::new(config).checkpoints(checkpoints).run()?;
    let rank0 = ck_dir.join("worker-0");
    let expect = Identity {
        config_hash: config.hash(),
        settings: config.settings(),
        run_id: "simulate".into(),
        rank: 0,
        world_size: config.workers,
        view: 0,
    };
    let mut written = 0;
    for (step, path) in checkpoint::list(&rank0).with_context(|| fail("reading the checkpoints"))? {
        let ck = Checkpoint::load(&path, model.layout(), &expect)?;
        let w = ck.state.w as f32;
        let z: Vec<f32> = ck.state.x.iter().map(|v| v / w).collect();
        model.save_safetensors(
            &z,
            &dir.join("outer").join(format!("step-{step}.safetensors")),
        )?;
        written += 1;
    }
    std::fs::remove_dir_all(&ck_dir).with_context(|| fail("removing the checkpoints"))?;
    if !quiet {
        println!(
            "wrote {}: {} workers x {} steps of batch indices ({} samples), {} outer steps; \
             test accuracy {:.4}",
            dir.display(),
            config.workers,
            config.steps,
            used.len(),
            written,
            summary.test_accuracy
        );
    }
    Ok(())
}
