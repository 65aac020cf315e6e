//! The training loop of one worker, written once against [`Communicator`].
//!
//! ```text
//! batch -> forward/backward at z = x / w -> OuterLoop::step: base step,
//!          exchange, and every tau steps the outer boundary -> metrics
//! ```
//! The algorithm's state and the order of its events live in the outer-loop
//! state machine ([`OuterLoop`], in `optim`); this loop only feeds it batches
//! and gradients and observes it. The simulator runs this function in one
//! thread per worker over the in-memory communicator; `slowmo node` runs it
//! over libp2p. Both give the same bits for the same configuration and seed
//! (docs/algorithm.md, "Summation order").

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde::Serialize;
use slowmo_gossip::{CommError, CommStats, Communicator};
use slowmo_optim::OuterLoop;
use slowmo_topologies::Topology;

use crate::exchange::{CommExchange, l2_distance, sum_over_workers};

use crate::checkpoint::{Checkpoint, CheckpointError, Identity};
use crate::config::RunConfig;
use crate::data::{Batcher, Dataset, Split};
use crate::model::{Model, ModelError};

/// Test samples used by intermediate evaluations (the final one uses all).
pub const EVAL_SAMPLES: usize = 2000;
/// Steps whose mini-batch losses make up the reported train loss.
pub const LOSS_WINDOW: usize = 50;
/// Test samples per forward pass of an evaluation.
const EVAL_BATCH: usize = 500;

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
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("cannot resume: {0}")]
    Resume(String),
}

/// Where and how often a worker writes checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointPlan {
    pub dir: std::path::PathBuf,
    /// Outer iterations between checkpoints.
    pub every: u64,
    /// Checkpoints kept.
    pub keep: u64,
    pub identity: Identity,
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
    /// Write checkpoints at outer boundaries.
    pub checkpoints: Option<CheckpointPlan>,
    /// Continue from this checkpoint instead of the start.
    pub resume: Option<Checkpoint>,
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
fn snapshot(
    comm: &mut dyn Communicator,
    model: &mut Model,
    z: &[f32],
    w: f64,
    test: &Split,
    sample_len: usize,
    train_loss: f32,
) -> Result<(Snapshot, f32), TrainError> {
    let m = comm.world_size() as f64;
    let own = model.evaluate(z, test, sample_len, EVAL_BATCH)?;
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

/// The mean of the last [`LOSS_WINDOW`] mini-batch losses.
#[derive(Default)]
struct LossWindow(std::collections::VecDeque<f32>);

impl LossWindow {
    fn push(&mut self, loss: f32) {
        if self.0.len() == LOSS_WINDOW {
            self.0.pop_front();
        }
        self.0.push_back(loss);
    }

    fn mean(&self) -> f32 {
        if self.0.is_empty() {
            return f32::NAN;
        }
        self.0.iter().sum::<f32>() / self.0.len() as f32
    }
}

/// A step's record before evaluations and traffic are filled in.
fn new_record(step: u64, started: Instant, loss: f32, lr: f32, outer: &OuterLoop) -> StepRecord {
    StepRecord {
        step,
        time: started.elapsed().as_secs_f64(),
        loss,
        lr,
        bytes_sent: 0,
        bytes_received: 0,
        weight: outer.weight(),
        gossip_rounds: outer.rounds(),
        consensus_distance: None,
        weight_spread: None,
        test_accuracy: None,
        train_loss: None,
    }
}

/// Writes a checkpoint of this worker at an outer boundary. Nothing may be
/// in flight in a checkpoint: after an exact average nothing is; the
/// noaverage variant settles first.
fn save_checkpoint(
    plan: &CheckpointPlan,
    outer: &mut OuterLoop,
    net: &mut CommExchange<'_>,
    (epoch, position): (u64, usize),
    losses: &LossWindow,
    model: &Model,
) -> Result<(), TrainError> {
    if !outer.algorithm().slowmo.average {
        outer.settle(net)?;
    }
    let ck = Checkpoint {
        identity: plan.identity.clone(),
        state: outer.state(),
        epoch,
        position,
        losses: losses.0.iter().copied().collect(),
    };
    ck.save(&plan.dir, model.layout(), plan.keep)?;
    Ok(())
}

/// An intermediate evaluation: collective (mean accuracy, spread, consensus
/// distance over the workers), or with `own_only` this worker's alone, so
/// that background gossip never waits for the slowest node.
fn evaluate_into(
    record: &mut StepRecord,
    net: &mut CommExchange<'_>,
    model: &mut Model,
    outer: &mut OuterLoop,
    (split, sample_len): (&Split, usize),
    losses: &LossWindow,
    own_only: bool,
) -> Result<(), TrainError> {
    let w = outer.weight();
    let z = outer.params();
    if own_only {
        let own = model.evaluate(z, split, sample_len, EVAL_BATCH)?;
        record.test_accuracy = Some(own.accuracy);
        record.train_loss = Some(losses.mean());
    } else {
        let comm = &mut *net.comm;
        let (snap, _) = snapshot(comm, model, z, w, split, sample_len, losses.mean())?;
        record.consensus_distance = Some(snap.consensus_distance);
        record.weight_spread = Some(snap.weight_spread);
        record.test_accuracy = Some(snap.accuracy_mean as f32);
        record.train_loss = Some(snap.train_loss_mean as f32);
    }
    Ok(())
}

/// Runs one worker to the end: SlowMo's Algorithm 1 (docs/algorithm.md, "The
/// loop"). `on_step` sees every step's record.
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
        checkpoints,
        resume,
    } = setup;
    let rank = comm.rank();
    let sample_len = dataset.sample_len();
    let push_sum = config.uses_push_sum();
    // x_{0,0} is the same on every worker; the machine captures the anchor
    // before any step.
    let x0 = model.init_params(config.seed);
    let mut grad = vec![0f32; x0.len()];
    let mut outer = OuterLoop::new(config.algorithm.clone(), &config.optimizer, x0)
        .map_err(|e| TrainError::Comm(CommError::Other(e.to_string())))?;
    let mut net = CommExchange::new(comm, &*topology, push_sum);
    let mut batcher = Batcher::new(shard, config.seed ^ ((rank as u64 + 1) << 32));
    let (mut images, mut labels) = (Vec::new(), Vec::new());
    let mut losses = LossWindow::default();
    let eval_split = head(&dataset.test, sample_len, EVAL_SAMPLES);
    if let Some(ck) = resume {
        outer
            .restore(ck.state)
            .map_err(|e| TrainError::Resume(e.to_string()))?;
        batcher.seek(ck.epoch, ck.position);
        ck.losses.into_iter().for_each(|l| losses.push(l));
    }

    for step in outer.steps()..config.steps {
        if stop.as_ref().is_some_and(|f| f.load(Ordering::Relaxed)) {
            return Err(TrainError::Interrupted { step });
        }
        let lr = config.schedule.lr(config.lr, step, config.steps);
        batcher.next_batch(
            &dataset.train,
            sample_len,
            config.batch_size,
            &mut images,
            &mut labels,
        );
        let mut loss = model.loss_and_grad(outer.params(), &images, &labels, &mut grad)?;
        if !loss.is_finite() {
            return Err(TrainError::Diverged { step, loss });
        }
        net.comm.base_step(step)?;
        let report = outer.step(&mut net, &mut grad, &mut loss, lr)?;
        losses.push(loss);

        let mut record = new_record(step, started, loss, lr, &outer);
        if report.outer_boundary {
            record.consensus_distance = net.take_consensus();
            if let Some(plan) = &checkpoints
                && outer.slowmo().outer_steps().is_multiple_of(plan.every)
            {
                let position = (batcher.epoch(), batcher.position());
                save_checkpoint(plan, &mut outer, &mut net, position, &losses, &model)?;
            }
        }
        if config.eval_every > 0
            && (step + 1).is_multiple_of(config.eval_every)
            && step + 1 < config.steps
        {
            let own_only = config.algorithm.background_gossip;
            let eval = (&eval_split, sample_len);
            evaluate_into(
                &mut record,
                &mut net,
                &mut model,
                &mut outer,
                eval,
                &losses,
                own_only,
            )?;
        }
        let stats = net.comm.stats();
        record.bytes_sent = stats.bytes_sent;
        record.bytes_received = stats.bytes_received;
        on_step(&record);
    }

    // Nothing may stay in flight: add every late share before measuring.
    outer.finish(&mut net)?;
    let comm = net.comm;
    let train_loss = losses.mean();
    let w = outer.weight();
    let (snap, own_accuracy) = snapshot(
        comm,
        &mut model,
        outer.params(),
        w,
        &dataset.test,
        sample_len,
        train_loss,
    )?;
    let averaged = model.evaluate(&snap.z_bar, &dataset.test, sample_len, EVAL_BATCH)?;
    Ok(WorkerOutcome {
        rank,
        steps: outer.steps(),
        train_loss,
        mean_train_loss: snap.train_loss_mean as f32,
        test_accuracy: own_accuracy,
        worker_accuracy_mean: snap.accuracy_mean as f32,
        worker_accuracy_std: snap.accuracy_std as f32,
        averaged_accuracy: averaged.accuracy,
        averaged_loss: averaged.loss,
        consensus_distance: snap.consensus_distance,
        weight: w,
        weight_spread: snap.weight_spread,
        averaged_params: snap.z_bar,
        stats: comm.stats(),
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}
