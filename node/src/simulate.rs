//! `slowmo simulate`: m workers in one process, one thread each, over the
//! in-memory communicator. Deterministic given the seed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use slowmo_gossip::memory::{FaultScript, MemoryNetwork};

use crate::checkpoint::{self, Checkpoint, CheckpointArgs, Identity};
use crate::config::{ConfigArgs, RunConfig};
use crate::data::{self, Dataset};
use crate::model::Model;
use crate::model::ParamSpec;
use crate::outputs::{OutputErrors, OutputKind, write_atomically};
use crate::train::{CheckpointPlan, StepRecord, WorkerOutcome, WorkerSetup, run_worker};

mod network;
pub use network::{NetworkSummary, WorkerPace, load as load_network};

/// Arguments of `slowmo simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Write the summary as JSON to this file.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Write the final averaged parameters as safetensors.
    #[arg(long)]
    pub save_params: Option<PathBuf>,
    /// Write every worker's per-step metrics as JSON lines (each with a
    /// `worker` field) to this file.
    #[arg(long)]
    pub metrics_jsonl: Option<PathBuf>,
    /// Print no progress lines.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub checkpoints: CheckpointArgs,
    /// Run over a simulated network described by this TOML profile (links,
    /// node slowdowns, faults; see docs/network-example.toml).
    #[arg(long, value_name = "FILE.toml")]
    pub network: Option<PathBuf>,
    /// Membership faults at given base steps, e.g. `kill 3@200; restart
    /// 3@400` or `partition 0-3|4-7@300..500` (or a file holding such
    /// lines); see docs/algorithm.md, "Membership".
    #[arg(long, value_name = "SCRIPT")]
    pub faults: Option<String>,
}

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
    /// With `--network`: each worker's pace in virtual time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSummary>,
    /// With `--faults`: the script, and the membership changes rank 0 of
    /// the final view went through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub view_changes: Vec<crate::train::ViewEvent>,
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
        println!("  consensus dist.  {:.3e}", self.consensus_distance);
        println!("  bytes sent/worker {}", self.bytes_sent_per_worker);
        println!(
            "  wall time        {:.2} s ({:.1} steps/s)",
            self.wall_seconds, self.steps_per_second
        );
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

/// Loads the dataset a configuration names.
pub fn load_dataset(config: &RunConfig) -> anyhow::Result<Arc<Dataset>> {
    let ds = data::load(config.dataset, config.data_dir.as_deref(), config.seed)
        .with_context(|| format!("loading dataset {}", config.dataset))?;
    Ok(Arc::new(ds))
}

/// Builds the model for a configuration and dataset on the CPU.
pub fn build_model(
    config: &RunConfig,
    ds: &Dataset,
    device: &candle_core::Device,
) -> anyhow::Result<Model> {
    Ok(Model::new(
        config.model,
        &config.hidden,
        ds.channels,
        ds.height,
        ds.width,
        ds.classes,
        device,
    )?)
}

/// Runs a simulation; `on_step` sees rank 0's records.
pub fn simulate(
    config: &RunConfig,
    on_step: &mut (dyn FnMut(&StepRecord) + Send),
) -> anyhow::Result<SimulationSummary> {
    simulate_with(config, &CheckpointArgs::default(), on_step)
}

/// The checkpoint identity of simulated worker `rank`.
fn identity(config: &RunConfig, rank: usize) -> Identity {
    Identity {
        config_hash: config.hash(),
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

/// [`simulate`] with checkpoints written and, with `--resume`, read.
pub fn simulate_with(
    config: &RunConfig,
    checkpoints: &CheckpointArgs,
    on_step: &mut (dyn FnMut(&StepRecord) + Send),
) -> anyhow::Result<SimulationSummary> {
    simulate_over(config, checkpoints, None, None, on_step)
}

/// Reads `--faults`: a script, or the name of a file holding one.
pub fn load_faults(arg: &str, workers: usize) -> anyhow::Result<FaultScript> {
    let path = std::path::Path::new(arg);
    let text = if !arg.contains('@') && path.is_file() {
        std::fs::read_to_string(path).with_context(|| format!("reading --faults {arg}"))?
    } else {
        arg.to_string()
    };
    FaultScript::parse(&text, workers).map_err(|e| anyhow::anyhow!("--faults: {e}"))
}

/// A worker the fault script killed (and did not bring back itself).
fn killed_by_script(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.to_string().contains("killed by the fault script"))
}

/// [`simulate_with`], over a simulated network if one is given.
pub fn simulate_over(
    config: &RunConfig,
    checkpoints: &CheckpointArgs,
    network: Option<&slowmo_gossip::simnet::SimNetwork>,
    faults: Option<&FaultScript>,
    on_step: &mut (dyn FnMut(&StepRecord) + Send),
) -> anyhow::Result<SimulationSummary> {
    simulate_observed(config, checkpoints, network, faults, on_step, None)
}

/// Sees every worker's step records: (worker index at the start, record).
pub type EveryWorker<'a> = &'a (dyn Fn(usize, &StepRecord) + Sync);

/// [`simulate_over`], with `every` seeing every worker's records too.
pub fn simulate_observed(
    config: &RunConfig,
    checkpoints: &CheckpointArgs,
    network: Option<&slowmo_gossip::simnet::SimNetwork>,
    faults: Option<&FaultScript>,
    on_step: &mut (dyn FnMut(&StepRecord) + Send),
    every: Option<EveryWorker<'_>>,
) -> anyhow::Result<SimulationSummary> {
    let started = Instant::now();
    let dataset = load_dataset(config)?;
    let mut summary = simulate_dataset(
        config,
        dataset,
        checkpoints,
        network,
        faults,
        on_step,
        every,
    )?;
    // the wall time includes loading the data, as it always has
    summary.wall_seconds = started.elapsed().as_secs_f64();
    summary.steps_per_second = summary.steps as f64 / summary.wall_seconds;
    Ok(summary)
}

/// [`simulate_observed`] on a dataset already in memory (the study trains
/// on a training split with a validation part held out of it). The
/// workers train on `dataset.train` and are measured on `dataset.test`.
pub fn simulate_dataset(
    config: &RunConfig,
    dataset: Arc<Dataset>,
    checkpoints: &CheckpointArgs,
    network: Option<&slowmo_gossip::simnet::SimNetwork>,
    faults: Option<&FaultScript>,
    on_step: &mut (dyn FnMut(&StepRecord) + Send),
    every: Option<EveryWorker<'_>>,
) -> anyhow::Result<SimulationSummary> {
    if faults.is_some() && network.is_some() {
        anyhow::bail!("--faults and --network cannot be combined yet");
    }
    let started = Instant::now();
    let m = config.workers;
    let mut resume: Vec<Option<Checkpoint>> = vec![None; m];
    if let (true, Some(dir)) = (checkpoints.resume, &checkpoints.checkpoint_dir) {
        let layout = build_model(config, &dataset, &candle_core::Device::Cpu)?
            .layout()
            .to_vec();
        let found = resume_all(config, dir, &layout)?;
        tracing::info!("resuming every worker at step {}", found[0].state.steps);
        resume = found.into_iter().map(Some).collect();
    }
    let shards = data::shard_indices(
        &dataset.train.labels,
        dataset.classes,
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
        let mut on_step = Some(on_step);
        for (worker, (mut comm, shard, resume, join)) in starts.enumerate() {
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
                let model = build_model(config, &dataset, &candle_core::Device::Cpu)?;
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
        bytes_sent_per_worker: outcomes.iter().map(|o| o.stats.bytes_sent).sum::<u64>() / m as u64,
        wall_seconds: wall,
        steps_per_second: first.steps as f64 / wall,
        network: NetworkSummary::new(&times, &dropped),
        faults: faults.map(|f| f.to_string()),
        view_changes: run_view_changes(&outcomes),
        output_errors: Vec::new(),
        averaged_params: first.averaged_params.clone(),
    })
}

/// The run's view changes: one event per view, as a member that stayed saw
/// it (a worker outside the view only sees the change that admitted it).
fn run_view_changes(outcomes: &[WorkerOutcome]) -> Vec<crate::train::ViewEvent> {
    let mut by_view: std::collections::BTreeMap<u64, crate::train::ViewEvent> = Default::default();
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

/// `slowmo simulate`.
pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let config = args.config.resolve()?;
    config.check_workers(&slowmo_runspec::Resources::of_this_machine())?;
    crate::outputs::check_all(&[
        (
            "--summary-json",
            args.summary_json.as_deref(),
            OutputKind::File,
        ),
        (
            "--save-params",
            args.save_params.as_deref(),
            OutputKind::File,
        ),
        (
            "--checkpoint-dir",
            args.checkpoints.checkpoint_dir.as_deref(),
            OutputKind::Folder,
        ),
        (
            "--metrics-jsonl",
            args.metrics_jsonl.as_deref(),
            OutputKind::Stream,
        ),
    ])?;
    let network = args
        .network
        .as_deref()
        .map(|path| network::load(path, &config))
        .transpose()?;
    let quiet = args.quiet;
    if !quiet {
        println!(
            "simulating {} workers: {} over {}, {} steps, dataset {}, model {}",
            config.workers,
            config.preset,
            config.algorithm.base,
            config.steps,
            config.dataset,
            config.model
        );
    }
    let mut progress = |r: &StepRecord| {
        if quiet {
            return;
        }
        if let Some(acc) = r.test_accuracy {
            println!(
                "step {:>6}  loss {:.4}  test acc {:.4}  consensus {:.3e}  weight spread {:.2e}  lr {:.4}  {:.1}s",
                r.step + 1,
                r.train_loss.unwrap_or(r.loss),
                acc,
                r.consensus_distance.unwrap_or(0.0),
                r.weight_spread.unwrap_or(0.0),
                r.lr,
                r.time
            );
        }
    };
    let faults = args
        .faults
        .as_deref()
        .map(|f| load_faults(f, config.workers))
        .transpose()?;
    let writer = args
        .metrics_jsonl
        .as_deref()
        .map(crate::metrics::MetricsWriter::create)
        .transpose()?
        .map(std::sync::Mutex::new);
    let write_error = std::sync::Mutex::new(None);
    let every = |worker: usize, r: &StepRecord| {
        if let Some(w) = &writer {
            let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = w.write_worker(worker, r) {
                write_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(e);
            }
        }
    };
    let mut summary = simulate_observed(
        &config,
        &args.checkpoints,
        network.as_ref(),
        faults.as_ref(),
        &mut progress,
        writer.as_ref().map(|_| &every as EveryWorker<'_>),
    )?;
    if !quiet {
        summary.print();
    }
    // The parameters first; a failure never keeps the summary from being
    // written, and the summary records it.
    let mut errors = OutputErrors::default();
    if let (Some(path), Some(e)) = (
        &args.metrics_jsonl,
        write_error.into_inner().unwrap_or_else(|e| e.into_inner()),
    ) {
        errors.note("--metrics-jsonl", path, Err(format!("{e:#}")));
    }
    if let Some(path) = &args.save_params {
        let dataset = load_dataset(&config)?;
        let model = build_model(&config, &dataset, &candle_core::Device::Cpu)?;
        let written = model.save_safetensors(&summary.averaged_params, path);
        errors.note("--save-params", path, written);
    }
    summary.output_errors = errors.0.clone();
    if let Some(path) = &args.summary_json {
        let written = serde_json::to_vec_pretty(&summary)
            .map_err(|e| e.to_string())
            .and_then(|b| write_atomically(path, &b).map_err(|e| e.to_string()));
        errors.note("--summary-json", path, written);
    }
    if !errors.is_empty() {
        anyhow::bail!(
            "the run finished, but {} output(s) could not be written:\n  {}",
            errors.0.len(),
            errors.0.join("\n  ")
        );
    }
    Ok(())
}
