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
//! (docs/algorithm.md, "Summation order"). What happens when the membership
//! changes on the way is the elastic recovery's (`engine/elastic.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde::Serialize;
use slowmo_gossip::{CommError, CommStats, Communicator};
use slowmo_optim::OuterLoop;
use slowmo_topologies::Topology;

use crate::config::RunConfig;
use crate::data::{Batcher, Head, Samples, TrainData};
use crate::engine::exchange::{CommExchange, l2_distance, l2_norm, sum_over_workers};
use crate::engine::worker::{LossWindow, Place, Worker};
use crate::io::checkpoint::{Checkpoint, CheckpointError};
use crate::model::{Learner, ModelError};

/// The seed of worker `rank`'s batcher in the first view (the reference
/// dump draws the same batches from it).
pub fn batch_seed(seed: u64, rank: usize) -> u64 {
    seed ^ ((rank as u64 + 1) << 32)
}
pub use crate::engine::gate::StepGate;
pub use crate::engine::worker::{CheckpointPlan, LOSS_WINDOW};

/// Test samples used by intermediate evaluations (the final one uses all).
pub const EVAL_SAMPLES: usize = 2000;
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

/// What one worker needs besides its communicator.
pub struct WorkerSetup {
    pub config: RunConfig,
    /// The data: a built-in [`crate::data::Dataset`] or the caller's own.
    pub dataset: Arc<dyn TrainData>,
    /// Indices of this worker's training samples.
    pub shard: Vec<usize>,
    /// The model: a built-in [`crate::model::Model`] or the caller's own.
    pub model: Box<dyn Learner>,
    pub topology: Arc<dyn Topology>,
    /// Checked before every step; `true` stops the run cleanly.
    pub stop: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Write checkpoints at outer boundaries.
    pub checkpoints: Option<CheckpointPlan>,
    /// Continue from this checkpoint instead of the start.
    pub resume: Option<Checkpoint>,
    /// Start outside the view and wait to be admitted (a restarted or new
    /// worker): the state comes from a member.
    pub join: bool,
    /// Hold at given steps until a harness opens the gate.
    pub gate: Option<StepGate>,
}

pub use slowmo_runspec::{StepRecord, ViewEvent};

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
    /// This worker's push-sum weight at the end (after the drain, before
    /// the final average).
    pub weight: f64,
    /// The sum of this worker's de-biased parameters then: with `weight`, a
    /// digest of its share of the mass (`sum x_i = weight * params_sum`).
    pub params_sum: f64,
    pub weight_spread: f64,
    #[serde(skip)]
    pub averaged_params: Vec<f32>,
    pub stats: CommStats,
    pub wall_seconds: f64,
    /// The size of the view the worker finished in.
    pub world: usize,
    /// Membership changes on the way.
    pub view_changes: Vec<ViewEvent>,
}

fn mean_std(sum: f64, sum_sq: f64, n: f64) -> (f64, f64) {
    let mean = sum / n;
    (mean, (sum_sq / n - mean * mean).max(0.0).sqrt())
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
    model: &mut dyn Learner,
    z: &[f32],
    w: f64,
    test: &dyn Samples,
    sample_len: usize,
    train_loss: f32,
) -> Result<(Snapshot, f32), TrainError> {
    let m = comm.world_size() as f64;
    let own = model.evaluate(z, test, sample_len, EVAL_BATCH)?;
    // The push-sum estimate sum_i x_i / sum_i w_i, x_i = w_i * z_i (with
    // every w = 1 the plain mean, bit for bit).
    let mut z_bar: Vec<f32> = if w == 1.0 {
        z.to_vec()
    } else {
        z.iter().map(|v| v * w as f32).collect()
    };
    let mut count = w;
    slowmo_gossip::weighted_average(comm, &mut z_bar, &mut count)?;
    let acc = f64::from(own.accuracy);
    // A worker with no step yet has no train loss (NaN): it sends 0 and
    // is not counted, since peers refuse non-finite values.
    let (loss, losses) = if train_loss.is_finite() {
        (f64::from(train_loss), 1.0)
    } else {
        (0.0, 0.0)
    };
    let sums = sum_over_workers(
        comm,
        &[
            l2_distance(z, &z_bar),
            acc,
            acc * acc,
            w,
            w * w,
            loss,
            losses,
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
            // With every worker counted, the plain mean over m (the same
            // bits as before); NaN when no worker has a loss (`--steps 0`).
            train_loss_mean: if sums[6] == m {
                sums[5] / m
            } else if sums[6] > 0.0 {
                sums[5] / sums[6]
            } else {
                f64::NAN
            },
            z_bar,
        },
        own.accuracy,
    ))
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
        average_residual_norm: None,
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
    model: &dyn Learner,
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
    model: &mut dyn Learner,
    outer: &mut OuterLoop,
    (split, sample_len): (&dyn Samples, usize),
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
/// loop"). `on_step` sees every step's record. When the communicator reports
/// a lost member (or another member starts a view change), the live members
/// agree on a new view, return to the newest barrier all of them completed,
/// re-derive ranks, graph and data shards, and go on; a worker outside the
/// view (a partition's minority, a restart) waits to be admitted again.
pub fn run_worker(
    setup: WorkerSetup,
    comm: &mut dyn Communicator,
    on_step: &mut dyn FnMut(&StepRecord),
) -> Result<WorkerOutcome, TrainError> {
    run_worker_keeping(setup, comm, on_step).map_err(|u| u.error)
}

/// A run that ended early, with what this worker held then.
#[derive(Debug)]
pub struct Unfinished {
    pub error: TrainError,
    /// This worker's de-biased parameters when it stopped (none when it
    /// stopped before it had any).
    pub params: Option<Vec<f32>>,
    /// Base steps it had completed.
    pub steps: u64,
}

/// [`run_worker`], keeping the worker's current parameters when the run
/// ends early (a signal, a lost run): they are still worth writing.
pub fn run_worker_keeping(
    setup: WorkerSetup,
    comm: &mut dyn Communicator,
    on_step: &mut dyn FnMut(&StepRecord),
) -> Result<WorkerOutcome, Box<Unfinished>> {
    let early = |error: TrainError| {
        Box::new(Unfinished {
            error,
            params: None,
            steps: 0,
        })
    };
    let started = Instant::now();
    let WorkerSetup {
        config,
        dataset,
        shard,
        model,
        topology,
        stop,
        checkpoints,
        resume,
        join,
        gate,
    } = setup;
    let rank = comm.rank();
    let sample_len = dataset.sample_len();
    let push_sum = config.uses_push_sum();
    // x_{0,0} is the same on every worker; the machine captures the anchor
    // before any step.
    let x0 = crate::model::initial_params(&*model, config.seed).map_err(|e| early(e.into()))?;
    let grad = vec![0f32; x0.len()];
    let mut outer = OuterLoop::new(config.algorithm.clone(), &config.optimizer, x0)
        .map_err(|e| early(TrainError::Comm(CommError::Config(e.to_string()))))?;
    if !config.compress_average.is_none() {
        outer = outer.with_compressed_average();
    }
    let batcher = Batcher::new(shard, batch_seed(config.seed, rank));
    let mut w = Worker {
        place: Place {
            rank,
            world: comm.world_size(),
        },
        config,
        dataset,
        model,
        topology,
        stop,
        checkpoints,
        outer,
        batcher,
        losses: LossWindow::default(),
        grad,
        sample_len,
        push_sum,
        started,
        points: Default::default(),
        events: Vec::new(),
        on_step,
        gate,
    };
    if let Some(ck) = resume {
        w.outer
            .restore(ck.state)
            .map_err(|e| early(TrainError::Resume(e.to_string())))?;
        w.batcher.seek(ck.epoch, ck.position);
        ck.losses.into_iter().for_each(|l| w.losses.push(l));
    }
    let result = (|| {
        if join {
            w.rejoin(comm, 0)?;
        } else {
            w.record_point();
        }
        // A worker admitted later is synchronised by its admission.
        let mut together = join;
        loop {
            let attempt = if together {
                w.train(comm)
            } else {
                // Failing, it changes the view, which synchronises too.
                together = true;
                comm.start_together()
                    .map_err(TrainError::from)
                    .and_then(|()| w.train(comm))
            };
            match attempt {
                Ok(outcome) => return Ok(outcome),
                Err(TrainError::Comm(e)) if e.needs_view_change() => {
                    tracing::warn!(
                        "rank {} at step {}: {e}; changing the view",
                        w.place.rank,
                        w.outer.steps()
                    );
                    w.change_view(comm)?;
                }
                Err(e) => return Err(e),
            }
        }
    })();
    result.map_err(|error| {
        Box::new(Unfinished {
            error,
            params: Some(w.outer.params().to_vec()),
            steps: w.outer.steps(),
        })
    })
}

impl Worker<'_> {
    /// Trains from the current state to the end of the run and measures.
    fn train(&mut self, comm: &mut dyn Communicator) -> Result<WorkerOutcome, TrainError> {
        let config = self.config.clone();
        let sample_len = self.sample_len;
        let topology = self.topology.clone();
        let mut net = CommExchange::new(comm, &*topology, self.push_sum)
            .with_average_codec(config.compress_average)
            .with_unit_weights(!self.push_sum);
        let (mut images, mut labels) = (Vec::new(), Vec::new());
        if let Some(gate) = &self.gate {
            gate.member(true);
        }
        for step in self.outer.steps()..config.steps {
            if let Some(gate) = &self.gate {
                gate.hold(step, &*net.comm, self.stop.as_ref());
            }
            if self
                .stop
                .as_ref()
                .is_some_and(|f| f.load(Ordering::Relaxed))
            {
                return Err(TrainError::Interrupted { step });
            }
            let lr = config.schedule.lr(config.lr, step, config.steps);
            self.batcher.next_batch(
                self.dataset.train(),
                sample_len,
                config.batch_size,
                &mut images,
                &mut labels,
            );
            let mut loss =
                self.model
                    .loss_and_grad(self.outer.params(), &images, &labels, &mut self.grad)?;
            if !loss.is_finite() {
                return Err(TrainError::Diverged { step, loss });
            }
            net.comm.base_step(step)?;
            let report = self.outer.step(&mut net, &mut self.grad, &mut loss, lr)?;
            self.losses.push(loss);

            let mut record = new_record(step, self.started, loss, lr, &self.outer);
            if report.outer_boundary {
                record.consensus_distance = net.take_consensus();
                let residual = self.outer.average_residual();
                if !residual.is_empty() {
                    record.average_residual_norm = Some(l2_norm(residual));
                }
                if let Some(plan) = &self.checkpoints
                    && self.outer.slowmo().outer_steps().is_multiple_of(plan.every)
                {
                    let position = (self.batcher.epoch(), self.batcher.position());
                    save_checkpoint(
                        plan,
                        &mut self.outer,
                        &mut net,
                        position,
                        &self.losses,
                        &*self.model,
                    )?;
                }
                self.record_point();
                if net.comm.at_barrier(self.outer.steps())? {
                    return Err(CommError::ViewChanging("peers wait to join".into()).into());
                }
            }
            if config.eval_every > 0
                && (step + 1).is_multiple_of(config.eval_every)
                && step + 1 < config.steps
            {
                let own_only = config.algorithm.background_gossip;
                // the head of the test split, read in place
                let head = Head {
                    samples: self.dataset.test(),
                    n: EVAL_SAMPLES,
                };
                let eval = (&head as &dyn Samples, sample_len);
                evaluate_into(
                    &mut record,
                    &mut net,
                    &mut *self.model,
                    &mut self.outer,
                    eval,
                    &self.losses,
                    own_only,
                )?;
            }
            let stats = net.comm.stats();
            record.bytes_sent = stats.bytes_sent;
            record.bytes_received = stats.bytes_received;
            (self.on_step)(&record);
        }

        // Nothing may stay in flight: add every late share before measuring.
        self.outer.finish(&mut net)?;
        let comm = net.comm;
        let train_loss = self.losses.mean();
        let w = self.outer.weight();
        let params_sum = self.outer.params().iter().map(|v| f64::from(*v)).sum();
        let (snap, own_accuracy) = snapshot(
            comm,
            &mut *self.model,
            self.outer.params(),
            w,
            self.dataset.test(),
            sample_len,
            train_loss,
        )?;
        let averaged =
            self.model
                .evaluate(&snap.z_bar, self.dataset.test(), sample_len, EVAL_BATCH)?;
        Ok(WorkerOutcome {
            rank: self.place.rank,
            steps: self.outer.steps(),
            train_loss,
            mean_train_loss: snap.train_loss_mean as f32,
            test_accuracy: own_accuracy,
            worker_accuracy_mean: snap.accuracy_mean as f32,
            worker_accuracy_std: snap.accuracy_std as f32,
            averaged_accuracy: averaged.accuracy,
            averaged_loss: averaged.loss,
            consensus_distance: snap.consensus_distance,
            weight: w,
            params_sum,
            weight_spread: snap.weight_spread,
            averaged_params: snap.z_bar,
            stats: comm.stats(),
            wall_seconds: self.started.elapsed().as_secs_f64(),
            world: self.place.world,
            view_changes: self.events.clone(),
        })
    }
}
