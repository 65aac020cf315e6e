//! `slowmo bench simulator`: what the in-process simulator costs on top of
//! the arithmetic of training.
//!
//! Three rates are measured in one run, on the same data and model, in
//! worker-steps per second (one worker's forward, backward and base step):
//!
//! - **single**: one worker on one thread, compute only (batch, forward,
//!   backward, optimizer step), no communicator at all;
//! - **compute-only x m**: m such workers on m threads at once, still without
//!   any communication: what the machine can do with m busy threads;
//! - **simulator**: `simulate` with m workers, the real loop over the
//!   in-memory communicator (push-sum rounds, barriers, exact averages).
//!
//! The simulator's overhead is `compute-only x m / simulator - 1`. Against
//! the single-worker rate the ideal is `single x min(m, cores)`; that ratio
//! also includes what the machine loses by running threads side by side
//! (shared caches and memory bandwidth), which no simulator can avoid.
//! Startup (data, model construction) and the final evaluation are outside
//! every timed window.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use anyhow::{Context, Result};
use slowmo_optim::{Base, Optimizer};

use crate::config::{RunConfig, TrainOptions};
use crate::data::{self, Batcher};
use crate::engine::setup::{build_model, load_dataset};
use crate::engine::simulate::Simulation;
use crate::model::ModelKind;

/// Steps not timed at the start of each measurement (threads start, caches warm).
const WARMUP_STEPS: u64 = 10;

fn config(base: Base, workers: usize, steps: u64, model: ModelKind) -> Result<RunConfig> {
    let opts = TrainOptions {
        base: Some(base),
        workers: Some(workers),
        steps: Some(steps),
        eval_every: Some(0),
        model: Some(model),
        ..TrainOptions::default()
    };
    Ok(opts.resolve()?)
}

/// Worker-steps per second of `threads` workers computing side by side with
/// no communication, each on its own shard, timed after a common warm-up.
fn compute_only(config: &RunConfig, threads: usize, steps: u64) -> Result<f64> {
    let dataset = load_dataset(config)?;
    let shards = data::shard_indices(
        &dataset.train.labels,
        dataset.classes,
        threads,
        config.partition,
        config.seed,
    )?;
    let barrier = Arc::new(Barrier::new(threads));
    let results: Vec<Result<f64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = shards
            .into_iter()
            .enumerate()
            .map(|(rank, shard)| {
                let dataset = dataset.clone();
                let barrier = barrier.clone();
                scope.spawn(move || -> Result<f64> {
                    let mut model = build_model(config, &dataset, &candle_core::Device::Cpu)?;
                    let mut x = model.init_params(config.seed);
                    let mut opt = Optimizer::new(&config.optimizer, x.len())?;
                    let mut grad = vec![0f32; x.len()];
                    let mut batcher = Batcher::new(shard, config.seed ^ rank as u64);
                    let (mut images, mut labels) = (Vec::new(), Vec::new());
                    let sample_len = dataset.sample_len();
                    let mut started = Instant::now();
                    for step in 0..WARMUP_STEPS + steps {
                        if step == WARMUP_STEPS {
                            barrier.wait();
                            started = Instant::now();
                        }
                        batcher.next_batch(
                            &dataset.train,
                            sample_len,
                            config.batch_size,
                            &mut images,
                            &mut labels,
                        );
                        model.loss_and_grad(&x, &images, &labels, &mut grad)?;
                        opt.step(&mut x, &grad, config.lr);
                    }
                    Ok(started.elapsed().as_secs_f64())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a compute thread panicked")))
            })
            .collect()
    });
    let slowest = results
        .into_iter()
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .fold(0.0, f64::max);
    Ok((threads as u64 * steps) as f64 / slowest)
}

/// Worker-steps per second of the simulator, from rank 0's step times
/// between the end of the warm-up and the last step.
fn simulator_rate(config: &RunConfig) -> Result<f64> {
    let mut times = Vec::with_capacity(config.steps as usize);
    let mut record = |r: &crate::engine::train::StepRecord| times.push(r.time);
    Simulation::new(config).observer(&mut record).run()?;
    let first = times[WARMUP_STEPS as usize - 1];
    let last = *times.last().context("the simulation ran no step")?;
    let timed = config.steps - WARMUP_STEPS;
    Ok((config.workers as u64 * timed) as f64 / (last - first))
}

/// The best of `repeats` measurements: on a shared machine noise only slows
/// a run down, so the fastest is the closest to what the code costs.
fn best(repeats: usize, mut measure: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut top = 0f64;
    for _ in 0..repeats.max(1) {
        top = top.max(measure()?);
    }
    Ok(top)
}

/// `slowmo bench simulator`.
pub fn run(
    workers: &[usize],
    steps: u64,
    bases: &[Base],
    model: ModelKind,
    repeats: usize,
) -> Result<()> {
    anyhow::ensure!(!workers.is_empty(), "--workers: give at least one count");
    anyhow::ensure!(!bases.is_empty(), "--bases: give at least one base");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let probe = config(bases[0], 1, steps, model)?;
    let dataset = load_dataset(&probe)?;
    let params = build_model(&probe, &dataset, &candle_core::Device::Cpu)?.num_params();
    let single = best(repeats, || compute_only(&probe, 1, steps))?;
    println!(
        "{model} on {} ({params} parameters), batch {}, {steps} timed steps per worker, {cores} cores, \
         one compute thread per worker, best of {repeats}",
        probe.dataset, probe.batch_size
    );
    println!(
        "single worker, compute only: {single:.1} steps/s ({:.2} ms per step)",
        1e3 / single
    );
    println!("SlowMo (default tau and beta) over each base; rates in worker-steps per second");
    println!(
        "{:>7} {:>10} {:>16} {:>10} {:>10} {:>14}",
        "workers", "base", "compute-only x m", "simulator", "overhead", "of single x cores"
    );
    for &m in workers {
        anyhow::ensure!(m >= 1, "--workers: {m} is not a worker count");
        let cfg = config(bases[0], m, steps, model)?;
        let parallel = best(repeats, || compute_only(&cfg, m, steps))?;
        for &base in bases {
            let cfg = config(base, m, WARMUP_STEPS + steps, model)?;
            let sim = best(repeats, || simulator_rate(&cfg))?;
            let ideal = single * m.min(cores) as f64;
            println!(
                "{:>7} {:>10} {:>16.1} {:>10.1} {:>9.1}% {:>13.0}%",
                m,
                base.as_str(),
                parallel,
                sim,
                (parallel / sim - 1.0) * 100.0,
                sim / ideal * 100.0
            );
        }
    }
    Ok(())
}
