//! The training loop of one worker, written once against [`Communicator`].
//!
//! ```text
//! batch -> forward/backward at z = x / w -> base step on x
//!       -> push-sum exchange (sgp, osgp) | gradient all-reduce (ar-sgd)
//!       -> every tau steps: drain, exact average (unless noaverage), slow-momentum step
//! ```
//! The simulator runs this function in one thread per worker over the
//! in-memory communicator; `slowmo node` runs it over libp2p. Both give the
//! same parameters for the same configuration and seed.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use slowmo_gossip::{CommError, CommStats, Communicator, PushSumRound, exact_average};
use slowmo_optim::{Base, BufferPolicy, Optimizer, PushSum, SlowMo};
use slowmo_topologies::Topology;

use crate::config::RunConfig;
use crate::data::{Batcher, Dataset, Split};
use crate::model::{Model, ModelError};

/// Test samples used by intermediate evaluations (the final one uses all).
pub const EVAL_SAMPLES: usize = 2000;
/// Steps whose mini-batch losses make up the reported train loss.
pub const LOSS_WINDOW: usize = 50;

/// Errors of a training run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("training diverged at step {step}: loss is {loss}")]
    Diverged { step: u64, loss: f32 },
    #[error("stopped at step {step} on request")]
    Interrupted { step: u64 },
}

/// What one worker needs besides its communicator.
pub struct WorkerSetup {
    pub config: RunConfig,
    pub dataset: Arc<Dataset>,
    /// Indices of this worker's training samples.
    pub shard: Vec<usize>,
    pub model: Model,
    pub topology: Arc<dyn Topology>,
    /// Checked before every step; `true` stops the run cleanly.
    pub stop: Option<Arc<std::sync::atomic::AtomicBool>>,
}

pub use slowmo_runspec::StepRecord;

/// The outcome of one worker's run; the `mean_*`, `averaged_*` and
/// `consensus_distance` fields are the same on every worker.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerOutcome {
    pub rank: usize,
    pub steps: u64,
    /// This worker's train loss (mean over the last steps).
    pub train_loss: f32,
    /// Mean over workers of their train loss.
    pub mean_train_loss: f32,
    /// This worker's test accuracy with its own de-biased parameters.
    pub test_accuracy: f32,
    pub worker_accuracy_mean: f32,
    pub worker_accuracy_std: f32,
    /// Test accuracy and loss of the exactly averaged parameters.
    pub averaged_accuracy: f32,
    pub averaged_loss: f32,
    /// Mean over workers of ||z_i - z_bar|| at the end, before averaging.
    pub consensus_distance: f64,
    pub weight: f64,
    pub weight_spread: f64,
    #[serde(skip)]
    pub averaged_params: Vec<f32>,
    pub stats: CommStats,
    pub wall_seconds: f64,
}

/// Sums small statistics over workers.
fn sum_over_workers(comm: &mut dyn Communicator, values: &[f64]) -> Result<Vec<f64>, CommError> {
    // f32 transport, f64 scalar: enough for means of losses and accuracies.
    let mut buf: Vec<f32> = values.iter().map(|v| *v as f32).collect();
    let mut extra = 0.0;
    comm.all_reduce_sum(&mut buf, &mut extra)?;
    Ok(buf.into_iter().map(f64::from).collect())
}

fn l2_distance(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = f64::from(*x - *y);
            d * d
        })
        .sum::<f64>()
        .sqrt()
}

fn mean_std(sum: f64, sum_sq: f64, n: f64) -> (f64, f64) {
    let mean = sum / n;
    (mean, (sum_sq / n - mean * mean).max(0.0).sqrt())
}

/// A view of the first `n` samples of a split.
fn head(split: &Split, sample_len: usize, n: usize) -> Split {
    let n = n.min(split.len());
    Split {
        images: split.images[..n * sample_len].to_vec(),
        labels: split.labels[..n].to_vec(),
    }
}

struct Snapshot {
    consensus_distance: f64,
    weight_spread: f64,
    accuracy_mean: f64,
    accuracy_std: f64,
    train_loss_mean: f64,
    z_bar: Vec<f32>,
}

/// Collective evaluation: every worker evaluates its own de-biased parameters,
/// then all agree on the mean, spread and consensus distance.
#[allow(clippy::too_many_arguments)] // one call site per evaluation kind; a struct would only rename them
fn snapshot(
    comm: &mut dyn Communicator,
    model: &mut Model,
    z: &[f32],
    w: f64,
    test: &Split,
    sample_len: usize,
    batch: usize,
    train_loss: f32,
) -> Result<(Snapshot, f32), TrainError> {
    let m = comm.world_size() as f64;
    let own = model.evaluate(z, test, sample_len, batch)?;
    let mut z_bar = z.to_vec();
    let mut count = 1.0;
    comm.all_reduce_sum(&mut z_bar, &mut count)?;
    let inv = (1.0 / count) as f32;
    z_bar.iter_mut().for_each(|v| *v *= inv);
    let acc = f64::from(own.accuracy);
    let sums = sum_over_workers(
        comm,
        &[
            l2_distance(z, &z_bar),
            acc,
            acc * acc,
            w,
            w * w,
            f64::from(train_loss),
        ],
    )?;
    let (accuracy_mean, accuracy_std) = mean_std(sums[1], sums[2], m);
    let (_, weight_spread) = mean_std(sums[3], sums[4], m);
    Ok((
        Snapshot {
            consensus_distance: sums[0] / m,
            weight_spread,
            accuracy_mean,
            accuracy_std,
            train_loss_mean: sums[5] / m,
            z_bar,
        },
        own.accuracy,
    ))
}

/// One push-sum round with this round's peers.
fn gossip(
    comm: &mut dyn Communicator,
    topology: &dyn Topology,
    round: u64,
    staleness: u64,
    state: &mut PushSum,
) -> Result<(), CommError> {
    let rank = comm.rank();
    let out_peers = topology.out_peers(rank, round);
    let in_peers = topology.in_peers(rank, round);
    comm.push_sum(
        &PushSumRound {
            round,
            out_peers: &out_peers,
            in_peers: &in_peers,
            staleness,
        },
        &mut state.x,
        &mut state.w,
    )
}

/// Background gossip: brings every worker to the same number of started
/// rounds (the largest), so that a drain afterwards waits for exactly the
/// shares that were sent. Round counts travel as two exact 24-bit halves.
fn catch_up(
    comm: &mut dyn Communicator,
    topology: &dyn Topology,
    rounds: &mut u64,
    state: &mut PushSum,
) -> Result<(), CommError> {
    const HALF: u64 = 1 << 24;
    if *rounds >= HALF * HALF {
        return Err(CommError::Other(format!(
            "{rounds} gossip rounds: more than this loop can count"
        )));
    }
    let m = comm.world_size();
    let rank = comm.rank();
    let mut counts = vec![0f32; 2 * m];
    counts[2 * rank] = (*rounds / HALF) as f32;
    counts[2 * rank + 1] = (*rounds % HALF) as f32;
    let mut unused = 0.0;
    comm.all_reduce_sum(&mut counts, &mut unused)?;
    let target = counts
        .chunks_exact(2)
        .map(|c| c[0] as u64 * HALF + c[1] as u64)
        .max()
        .unwrap_or(0);
    while *rounds < target {
        gossip(comm, topology, *rounds, 1, state)?;
        *rounds += 1;
    }
    Ok(())
}

/// Runs one worker to the end. `on_step` sees every step's record.
pub fn run_worker(
    setup: WorkerSetup,
    comm: &mut dyn Communicator,
    on_step: &mut dyn FnMut(&StepRecord),
) -> Result<WorkerOutcome, TrainError> {
    let started = Instant::now();
    let WorkerSetup {
        config,
        dataset,
        shard,
        mut model,
        topology,
        stop,
    } = setup;
    let rank = comm.rank();
    let m = comm.world_size();
    let alg = &config.algorithm;
    let tau = alg.slowmo.tau;
    let sample_len = dataset.sample_len();
    let push_sum = alg.base.uses_push_sum();
    let background = push_sum && alg.background_gossip;
    // Push-sum rounds started so far: one per step unless gossip runs in
    // the background.
    let mut rounds = 0u64;

    // x_{0,0}: the same on every worker; the anchor is captured before any step.
    let x0 = model.init_params(config.seed);
    let n = x0.len();
    let mut slowmo = SlowMo::new(alg.slowmo.clone(), &x0);
    let mut state = PushSum::new(x0);
    let mut opt = Optimizer::new(&config.optimizer, n)
        .map_err(|e| TrainError::Comm(CommError::Other(e.to_string())))?;
    let mut batcher = Batcher::new(shard, config.seed ^ ((rank as u64 + 1) << 32));
    let mut z = vec![0f32; n];
    let mut grad = vec![0f32; n];
    let mut images = Vec::new();
    let mut labels = Vec::new();
    let mut losses: std::collections::VecDeque<f32> = Default::default();
    let eval_split = head(&dataset.test, sample_len, EVAL_SAMPLES);
    let eval_batch = 500;

    let mut steps_done = 0;
    for step in 0..config.steps {
        if let Some(flag) = &stop
            && flag.load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(TrainError::Interrupted { step });
        }
        if step > 0 && step.is_multiple_of(tau) && alg.slowmo.buffer_policy == BufferPolicy::Reset {
            opt.reset();
        }
        let lr = config.schedule.lr(config.lr, step, config.steps);
        batcher.next_batch(
            &dataset.train,
            sample_len,
            config.batch_size,
            &mut images,
            &mut labels,
        );
        // z = x / w; without push-sum (w stays 1) that is x itself, uncopied.
        let params: &[f32] = if state.w == 1.0 {
            &state.x
        } else {
            state.debiased_into(&mut z);
            &z
        };
        let mut loss = model.loss_and_grad(params, &images, &labels, &mut grad)?;
        if !loss.is_finite() {
            return Err(TrainError::Diverged { step, loss });
        }
        if alg.base == Base::ArSgd && m > 1 {
            let mut loss_sum = f64::from(loss);
            comm.all_reduce_sum(&mut grad, &mut loss_sum)?;
            let inv = 1.0 / m as f32;
            grad.iter_mut().for_each(|g| *g *= inv);
            loss = (loss_sum / m as f64) as f32;
        }
        // With background gossip a round stays in flight for many steps, and
        // meanwhile w is below 1: a step of lr on the numerator would move
        // z = x / w by lr / w. Scaling it by w keeps z's step at lr.
        let step_lr = if background { lr * state.w as f32 } else { lr };
        opt.step(&mut state.x, &grad, step_lr);
        if push_sum {
            if !background {
                gossip(comm, &*topology, step, alg.staleness, &mut state)?;
                rounds = step + 1;
            } else if rounds == 0 || comm.shares_arrived(rounds - 1)? {
                // Round `rounds - 1` is complete: mix it in, start the next.
                gossip(comm, &*topology, rounds, 1, &mut state)?;
                rounds += 1;
            }
        }

        let mut record = StepRecord {
            step,
            time: started.elapsed().as_secs_f64(),
            loss,
            lr,
            bytes_sent: 0,
            bytes_received: 0,
            weight: state.w,
            gossip_rounds: rounds,
            consensus_distance: None,
            weight_spread: None,
            test_accuracy: None,
            train_loss: None,
        };
        if losses.len() == LOSS_WINDOW {
            losses.pop_front();
        }
        losses.push_back(loss);

        if (step + 1).is_multiple_of(tau) {
            if alg.slowmo.average {
                let before = push_sum.then(|| {
                    state.debiased_into(&mut z);
                    z.clone()
                });
                if background {
                    catch_up(comm, &*topology, &mut rounds, &mut state)?;
                }
                // AR-SGD keeps every worker identical: nothing to average.
                if alg.base != Base::ArSgd {
                    exact_average(comm, &mut state.x, &mut state.w)?;
                }
                if let Some(before) = before {
                    let d = sum_over_workers(comm, &[l2_distance(&before, &state.x)])?;
                    record.consensus_distance = Some(d[0] / m as f64);
                }
                if alg.slowmo.buffer_policy == BufferPolicy::Average && m > 1 {
                    let inv = 1.0 / m as f32;
                    for buf in opt.state_buffers_mut() {
                        let mut unused = 0.0;
                        comm.all_reduce_sum(buf, &mut unused)?;
                        buf.iter_mut().for_each(|v| *v *= inv);
                    }
                }
                slowmo.outer_step(&mut state.x, lr);
            } else {
                // noaverage: each worker steps its own de-biased parameters
                // with its own anchor and momentum.
                slowmo.outer_step_push_sum(&mut state, lr);
            }
        }

        let window_loss = losses.iter().sum::<f32>() / losses.len() as f32;
        if config.eval_every > 0
            && (step + 1).is_multiple_of(config.eval_every)
            && step + 1 < config.steps
        {
            state.debiased_into(&mut z);
            if background {
                // A collective evaluation would make every node wait for the
                // slowest, which background gossip exists to avoid: evaluate
                // this node's own parameters only.
                let own = model.evaluate(&z, &eval_split, sample_len, eval_batch)?;
                record.test_accuracy = Some(own.accuracy);
                record.train_loss = Some(window_loss);
            } else {
                let (snap, _) = snapshot(
                    comm,
                    &mut model,
                    &z,
                    state.w,
                    &eval_split,
                    sample_len,
                    eval_batch,
                    window_loss,
                )?;
                record.consensus_distance = Some(snap.consensus_distance);
                record.weight_spread = Some(snap.weight_spread);
                record.test_accuracy = Some(snap.accuracy_mean as f32);
                record.train_loss = Some(snap.train_loss_mean as f32);
            }
        }
        let stats = comm.stats();
        record.bytes_sent = stats.bytes_sent;
        record.bytes_received = stats.bytes_received;
        on_step(&record);
        steps_done = step + 1;
    }

    // Nothing may stay in flight: add every late share before measuring.
    if background {
        catch_up(comm, &*topology, &mut rounds, &mut state)?;
    }
    if push_sum {
        comm.drain(&mut state.x, &mut state.w)?;
    }
    state.debiased_into(&mut z);
    let train_loss = if losses.is_empty() {
        f32::NAN
    } else {
        losses.iter().sum::<f32>() / losses.len() as f32
    };
    let (snap, own_accuracy) = snapshot(
        comm,
        &mut model,
        &z,
        state.w,
        &dataset.test,
        sample_len,
        eval_batch,
        train_loss,
    )?;
    let averaged = model.evaluate(&snap.z_bar, &dataset.test, sample_len, eval_batch)?;
    Ok(WorkerOutcome {
        rank,
        steps: steps_done,
        train_loss,
        mean_train_loss: snap.train_loss_mean as f32,
        test_accuracy: own_accuracy,
        worker_accuracy_mean: snap.accuracy_mean as f32,
        worker_accuracy_std: snap.accuracy_std as f32,
        averaged_accuracy: averaged.accuracy,
        averaged_loss: averaged.loss,
        consensus_distance: snap.consensus_distance,
        weight: state.w,
        weight_spread: snap.weight_spread,
        averaged_params: snap.z_bar,
        stats: comm.stats(),
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}
