//! The simulator: m workers in one process, one thread each, over the
//! in-memory communicator ([`Simulation`]). Deterministic given the seed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use slowmo_gossip::memory::MemoryNetwork;
use slowmo_gossip::simnet::SimNetwork;
use slowmo_runspec::faults::SimScript;

use crate::config::RunConfig;
use crate::data::{self, Dataset};
use crate::engine::setup::{Workload, load_dataset};
use crate::engine::train::{CheckpointPlan, StepRecord, WorkerOutcome, WorkerSetup, run_worker};
use crate::io::checkpoint::{self, Checkpoint, CheckpointArgs, Identity};
use crate::model::ParamSpec;

mod network;
pub use network::{NetworkSummary, WorkerPace, load as load_network};

/// The result of a simulated run.
#[derive(Debug, Clone, Serialize)]
pub struct SimulationSummary {
    pub config: RunConfig,
    pub workers: usize,
    pub steps: u64,
    /// Mean over workers of the train loss over the last steps.
    pub final_train_loss: f32,
    /// Test accuracy and loss of the exactly averaged model.
    pub test_accuracy: f32,
    pub test_loss: f32,
    /// Mean and standard deviation over workers of their own test accuracy.
    pub worker_accuracy_mean: f32,
    pub worker_accuracy_std: f32,
    /// Mean over workers of ||z_i - z_bar|| at the end.
    pub consensus_distance: f64,
    pub weight_spread: f64,
    /// Bytes each worker sent (mean over workers).
    pub bytes_sent_per_worker: u64,
    pub wall_seconds: f64,
    /// Base steps per second of the whole simulation (all workers advance together).
    pub steps_per_second: f64,
    /// The transformer: perplexity of the averaged model on the held-out
    /// text, `exp(test_loss)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_perplexity: Option<f64>,
    /// The transformer: training tokens per second, all workers together
    /// (`steps_per_second * workers * batch_size * context`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
    /// With `--network`: each worker's pace in virtual time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSummary>,
    /// With `--faults`: the script, and the membership changes rank 0 of
    /// the final view went through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub view_changes: Vec<crate::engine::train::ViewEvent>,
    /// Outputs that could not be written (the parameter file), each with
    /// its flag, path and reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output_errors: Vec<String>,
    #[serde(skip)]
    pub averaged_params: Vec<f32>,
}

impl SimulationSummary {
    /// Human-readable summary.
    pub fn print(&self) {
        let a = &self.config.algorithm;
        println!("summary");
        println!(
            "  algorithm        {} (base {}, tau {}, alpha {}, beta {}, {}{})",
            self.config.preset,
            a.base,
            a.slowmo.tau,
            a.slowmo.alpha,
            a.slowmo.beta,
            if a.slowmo.average {
                "exact average"
            } else {
                "noaverage"
            },
            if a.staleness > 0 {
                format!(", staleness {}", a.staleness)
            } else {
                String::new()
            }
        );
        println!("  workers          {}", self.workers);
        println!("  steps            {}", self.steps);
        println!("  train loss       {:.4}", self.final_train_loss);
        println!(
            "  test accuracy    {:.4} (averaged model)",
            self.test_accuracy
        );
        println!(
            "  worker accuracy  {:.4} +- {:.4}",
            self.worker_accuracy_mean, self.worker_accuracy_std
        );
        if let Some(ppl) = self.test_perplexity {
            println!(
                "  test loss        {:.4} (perplexity {ppl:.3}, averaged model)",
                self.test_loss
            );
        }
        println!("  consensus dist.  {:.3e}", self.consensus_distance);
        println!("  bytes sent/worker {}", self.bytes_sent_per_worker);
        println!(
            "  wall time        {:.2} s ({:.1} steps/s)",
            self.wall_seconds, self.steps_per_second
        );
        if let Some(tps) = self.tokens_per_second {
            println!("  tokens/s         {tps:.0} (all workers)");
        }
        if let Some(network) = &self.network {
            network.print();
        }
        for v in &self.view_changes {
            println!(
                "  view {:<3}        at step {} back to step {}: {} workers (lost {:?}, joined {:?})",
                v.view, v.at_step, v.resumed_from, v.world, v.lost, v.joined
            );
        }
    }
}

/// Sees every worker's step records: (worker index at the start, record).
pub type EveryWorker<'a> = &'a (dyn Fn(usize, &StepRecord) + Sync);

/// A simulated run: m workers in one process, one thread each, over the
/// in-memory communicator (optionally a simulated network, or a fault
/// script). Deterministic given the seed.
///
/// ```no_run
/// # use slowmo_node::config::TrainOptions;
/// # use slowmo_node::engine::simulate::Simulation;
/// let config = TrainOptions::from_toml("workers = 4\nsteps = 24\n")
///     .map_err(anyhow::Error::msg)?
///     .resolve()?;
/// let mut losses = Vec::new();
/// let summary = Simulation::new(&config)
///     .observer(&mut |r| losses.push(r.loss))
///     .run()?;
/// println!("test accuracy {}", summary.test_accuracy);
/// # Ok::<(), anyhow::Error>(())
/// ```
pub struct Simulation<'a> {
    config: &'a RunConfig,
    dataset: Option<Arc<Dataset>>,
    workload: Option<Workload>,
    checkpoints: CheckpointArgs,
    network: Option<&'a SimNetwork>,
    faults: Option<&'a SimScript>,
    on_step: Option<&'a mut (dyn FnMut(&StepRecord) + Send)>,
    every: Option<EveryWorker<'a>>,
}

impl<'a> Simulation<'a> {
    /// A simulation of `config`: the dataset it names, no checkpoints, no
    /// simulated network, no faults, nobody watching.
    pub fn new(config: &'a RunConfig) -> Self {
        Self {
            config,
            dataset: None,
            workload: None,
            checkpoints: CheckpointArgs::default(),
            network: None,
            faults: None,
            on_step: None,
            every: None,
        }
    }

    /// Trains on a dataset already in memory (the study trains on a
    /// training split with a validation part held out of it): the workers
    /// train on `dataset.train` and are measured on `dataset.test`.
    pub fn dataset(mut self, dataset: Arc<Dataset>) -> Self {
        self.dataset = Some(dataset);
        self
    }

    /// Trains the caller's own model and data (see
    /// `node/examples/custom_model.rs`) instead of the configuration's.
    pub fn workload(mut self, workload: Workload) -> Self {
        self.workload = Some(workload);
        self
    }

    /// Writes checkpoints and, with `resume`, starts from them.
    pub fn checkpoints(mut self, checkpoints: CheckpointArgs) -> Self {
        self.checkpoints = checkpoints;
        self
    }

    /// Runs over a simulated network (latency, bandwidth, slow nodes, loss).
    pub fn network(mut self, network: &'a SimNetwork) -> Self {
        self.network = Some(network);
        self
    }

    /// Plays a membership fault script (kills, restarts, joins, partitions).
    pub fn faults(mut self, faults: &'a SimScript) -> Self {
        self.faults = Some(faults);
        self
    }

    /// Sees rank 0's step records.
    pub fn observer(mut self, on_step: &'a mut (dyn FnMut(&StepRecord) + Send)) -> Self {
        self.on_step = Some(on_step);
        self
    }

    /// Sees every worker's step records: (worker index at the start, record).
    pub fn every_worker(mut self, every: EveryWorker<'a>) -> Self {
        self.every = Some(every);
        self
    }

    /// Runs the simulation: loads the dataset unless one was given, trains
    /// every worker in its own thread, and measures the averaged model.
    pub fn run(self) -> anyhow::Result<SimulationSummary> {
        let started = Instant::now();
        let workload = match (self.workload.clone(), self.dataset.clone()) {
            (Some(w), _) => w,
            (None, Some(d)) => Workload::configured(self.config, d),
            (None, None) => Workload::configured(self.config, load_dataset(self.config)?),
        };
        let dataset = workload.dataset.clone();
        let workload = &workload;
        if self.faults.is_some() && self.network.is_some() {
            anyhow::bail!("--faults and --network cannot be combined yet");
        }
        let Simulation {
            config,
            checkpoints,
            network,
            faults,
            on_step,
            every,
            ..
        } = self;
        let m = config.workers;
        let mut resume: Vec<Option<Checkpoint>> = vec![None; m];
        if let (true, Some(dir)) = (checkpoints.resume, &checkpoints.checkpoint_dir) {
            let layout = workload.build(&candle_core::Device::Cpu)?.layout().to_vec();
            let found = resume_all(config, dir, &layout)?;
            tracing::info!("resuming every worker at step {}", found[0].state.steps);
            resume = found.into_iter().map(Some).collect();
        }
        let shards = data::shard_indices(
            &dataset.train().labels(),
            dataset.classes(),
            m,
            config.partition,
            config.seed,
        )?;
        let topology: Arc<dyn slowmo_topologies::Topology> =
            Arc::from(slowmo_topologies::build(&config.graph, m)?);
        let (comms, joiners) = match (network, faults) {
            (Some(net), _) => (
                MemoryNetwork::with_network(Duration::from_secs(600), net.clone()),
                Vec::new(),
            ),
            (None, Some(script)) => {
                MemoryNetwork::with_faults(m, Duration::from_secs(600), script.clone())
            }
            (None, None) => (MemoryNetwork::new(m, Duration::from_secs(600)), Vec::new()),
        };
        // Restarted workers start outside the view and wait to be admitted.
        let starts = comms
            .into_iter()
            .zip(shards)
            .zip(resume)
            .map(|((c, shard), resume)| (c, shard, resume, false))
            .chain(joiners.into_iter().map(|c| (c, Vec::new(), None, true)));
        type Finished = (WorkerOutcome, Option<slowmo_gossip::VirtualTime>);
        let outcomes: Vec<anyhow::Result<Finished>> = std::thread::scope(|scope| {
            let mut handles = Vec::new();
            let mut on_step = on_step;
            for (worker, (mut comm, shard, resume, join)) in starts.enumerate() {
                comm.set_compression(config.compress);
                let rank = slowmo_gossip::Communicator::rank(&comm);
                let plan = checkpoints
                    .checkpoint_dir
                    .as_ref()
                    .map(|dir| CheckpointPlan {
                        dir: dir.join(format!("worker-{rank}")),
                        every: checkpoints.checkpoint_every,
                        keep: checkpoints.checkpoint_keep,
                        identity: identity(config, rank),
                    });
                let dataset = dataset.clone();
                let topology = topology.clone();
                let observer = if rank == 0 && !join {
                    on_step.take()
                } else {
                    None
                };
                handles.push(scope.spawn(move || -> anyhow::Result<Finished> {
                    let model = workload.build(&candle_core::Device::Cpu)?;
                    let setup = WorkerSetup {
                        config: config.clone(),
                        dataset,
                        shard,
                        model,
                        topology,
                        stop: None,
                        checkpoints: plan,
                        resume,
                        join,
                        gate: None,
                    };
                    let mut ignore = |_: &StepRecord| {};
                    let observer: &mut dyn FnMut(&StepRecord) = match observer {
                        Some(f) => f,
                        None => &mut ignore,
                    };
                    let mut both = |r: &StepRecord| {
                        observer(r);
                        if let Some(every) = every {
                            every(worker, r);
                        }
                    };
                    run_worker(setup, &mut comm, &mut both)
                        .map(|o| (o, slowmo_gossip::Communicator::virtual_time(&comm)))
                        .with_context(|| format!("worker {rank}"))
                }));
            }
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker thread panicked")))
                })
                .collect()
        });
        // A worker the script killed (and never brought back) has no outcome.
        let (outcomes, times): (Vec<_>, Vec<_>) = outcomes
            .into_iter()
            .filter(|r| {
                !r.as_ref()
                    .is_err_and(|e| faults.is_some() && killed_by_script(e))
            })
            .collect::<anyhow::Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        let dropped: Vec<u64> = outcomes.iter().map(|o| o.stats.messages_dropped).collect();
        let first = outcomes
            .iter()
            .find(|o| o.rank == 0)
            .context("no worker finished the run")?;
        let m = first.world;
        let wall = started.elapsed().as_secs_f64();
        let steps_per_second = first.steps as f64 / wall;
        let context = config.transformer.map(|t| t.context);
        Ok(SimulationSummary {
            config: config.clone(),
            workers: m,
            steps: first.steps,
            final_train_loss: first.mean_train_loss,
            test_accuracy: first.averaged_accuracy,
            test_loss: first.averaged_loss,
            worker_accuracy_mean: first.worker_accuracy_mean,
            worker_accuracy_std: first.worker_accuracy_std,
            consensus_distance: first.consensus_distance,
            weight_spread: first.weight_spread,
            bytes_sent_per_worker: outcomes.iter().map(|o| o.stats.bytes_sent).sum::<u64>()
                / m as u64,
            wall_seconds: wall,
            steps_per_second,
            test_perplexity: context.map(|_| f64::from(first.averaged_loss).exp()),
            tokens_per_second: context
                .map(|t| steps_per_second * (m * config.batch_size * t) as f64),
            network: NetworkSummary::new(&times, &dropped),
            faults: faults.map(|f| f.to_string()),
            view_changes: run_view_changes(&outcomes),
            output_errors: Vec::new(),
            averaged_params: first.averaged_params.clone(),
        })
    }
}

/// The checkpoint identity of simulated worker `rank`.
fn identity(config: &RunConfig, rank: usize) -> Identity {
    Identity {
        config_hash: config.hash(),
        settings: config.settings(),
        run_id: "simulate".into(),
        rank,
        world_size: config.workers,
        view: 0,
    }
}

/// The checkpoints of every worker at the newest step that all of them have
/// a valid checkpoint for (each worker writes its own, into `dir/worker-R`).
fn resume_all(
    config: &RunConfig,
    dir: &std::path::Path,
    layout: &[ParamSpec],
) -> anyhow::Result<Vec<Checkpoint>> {
    let mut at_most = None;
    loop {
        let found = (0..config.workers)
            .map(|r| {
                checkpoint::newest_valid(
                    &dir.join(format!("worker-{r}")),
                    layout,
                    &identity(config, r),
                    at_most,
                )
            })
            .collect::<Result<Vec<_>, _>>()
            .context("resuming")?;
        let oldest = found.iter().map(|c| c.state.steps).min().unwrap_or(0);
        if found.iter().all(|c| c.state.steps == oldest) {
            return Ok(found);
        }
        at_most = Some(oldest);
    }
}

/// A worker the fault script killed (and did not bring back itself).
fn killed_by_script(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.to_string().contains("killed by the fault script"))
}

/// The run's view changes: one event per view, as a member that stayed saw
/// it (a worker outside the view only sees the change that admitted it).
fn run_view_changes(outcomes: &[WorkerOutcome]) -> Vec<crate::engine::train::ViewEvent> {
    let mut by_view: std::collections::BTreeMap<u64, crate::engine::train::ViewEvent> =
        Default::default();
    let mut ranked: Vec<&WorkerOutcome> = outcomes.iter().collect();
    ranked.sort_by_key(|o| o.rank);
    for event in ranked.iter().flat_map(|o| &o.view_changes) {
        match by_view.get(&event.view) {
            Some(kept) if !kept.rejoined || event.rejoined => {}
            _ => {
                by_view.insert(event.view, event.clone());
            }
        }
    }
    by_view.into_values().collect()
}
