//! `slowmo simulate`: a simulated run from the command line, with its
//! progress lines, summary and output files.

use std::path::PathBuf;

use slowmo_runspec::faults::{FaultScript, SimScript};

use crate::config::ConfigArgs;
use crate::engine::setup::{build_model, load_dataset};
use crate::engine::simulate::{EveryWorker, Simulation, load_network};
use crate::engine::train::StepRecord;
use crate::io::checkpoint::CheckpointArgs;
use crate::io::outputs::{OutputErrors, OutputPaths, write_atomically};

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
    /// Write what a replay in a reference implementation needs into this
    /// folder: the initial parameters, every worker's batch indices and
    /// rank 0's parameters after every outer step (see tools/reference/).
    #[arg(long, value_name = "DIR")]
    pub dump_reference: Option<PathBuf>,
}

/// Reads `--faults`: a script, or the name of a file holding one, and
/// takes the simulator's part of it (refusing what it cannot play).
pub fn load_faults(arg: &str, workers: usize) -> anyhow::Result<SimScript> {
    FaultScript::load(arg, workers)
        .and_then(|s| s.for_simulator())
        .map_err(|e| anyhow::anyhow!("--faults {e}"))
}

/// `slowmo simulate`.
pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let config = args.config.resolve()?;
    config.check_workers(&slowmo_runspec::Resources::of_this_machine())?;
    if let Some(note) = config.peers_clamped() {
        tracing::warn!("{note}");
    }
    OutputPaths {
        summary_json: args.summary_json.clone(),
        metrics_jsonl: args.metrics_jsonl.clone(),
        save_params: args.save_params.clone(),
        checkpoint_dir: args.checkpoints.checkpoint_dir.clone(),
    }
    .check()?;
    if let Some(dir) = &args.dump_reference {
        crate::io::reference_dump::check_combinable(
            &args.checkpoints,
            &[
                ("--network", args.network.is_some()),
                ("--faults", args.faults.is_some()),
            ],
        )?;
        return crate::io::reference_dump::dump(&config, dir, args.quiet);
    }
    let network = args
        .network
        .as_deref()
        .map(|path| load_network(path, &config))
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
        .map(crate::io::metrics::MetricsWriter::create)
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
    let mut simulation = Simulation::new(&config)
        .checkpoints(args.checkpoints.clone())
        .observer(&mut progress);
    if let Some(network) = &network {
        simulation = simulation.network(network);
    }
    if let Some(faults) = &faults {
        simulation = simulation.faults(faults);
    }
    if writer.is_some() {
        simulation = simulation.every_worker(&every as EveryWorker<'_>);
    }
    let mut summary = simulation.run()?;
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
