//! `slowmo-testnet bench`: per-step wall time of a local testnet with and
//! without communication, measured side by side in one run.
//!
//! Rows: no communication, SGP, OSGP (staleness 1), OSGP with background
//! gossip, SlowMo over SGP, AllReduce-SGD (an exact average of the gradients
//! every step). Every row is a full `slowmo-testnet local` run of the same nodes, data
//! and model. The baseline is Local SGD with the outer period longer than
//! the run: the nodes join the same way but exchange nothing while they
//! train. Step times come from each node's metrics (`time` of every step),
//! skipping the first steps (streams open, caches warm) and the final
//! evaluation; a row's figure is the mean over nodes of their mean step time.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use slowmo_optim::{Base, Preset};
use slowmo_runspec::{ConfigArgs, ModelKind, StepRecord, TrainOptions};

use crate::local::{LocalArgs, Transport, launch};

/// Steps at the start of each run that are not timed.
const WARMUP_STEPS: u64 = 10;

/// Arguments of `slowmo-testnet bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Number of node processes.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Timed steps per run (after a short warm-up).
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// Model: mlp or cnn.
    #[arg(long, default_value = "mlp")]
    pub model: ModelKind,
    /// Transport between the nodes.
    #[arg(long, value_enum, default_value_t = Transport::Quic)]
    pub transport: Transport,
    /// How tensors travel: encrypted, plaintext or libp2p [default: the
    /// nodes' default, the encrypted data lane].
    #[arg(long)]
    pub data_lane: Option<String>,
    /// Folder for the runs' files [default: a new folder under testnet-runs/].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The slowmo binary [default: $SLOWMO_BIN, else `slowmo` beside this program].
    #[arg(long)]
    pub slowmo_bin: Option<PathBuf>,
    /// Reuse --out: each run's earlier files are removed first.
    #[arg(long)]
    pub force: bool,
    /// Print the figures as one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One measured configuration.
struct Row {
    label: &'static str,
    /// Mean over nodes of the mean step time, seconds.
    step: f64,
    /// The slowest node's mean step time, seconds.
    slowest: f64,
    /// Push-sum rounds node 0 started.
    rounds: u64,
}

/// Mean seconds per step after the warm-up, and the push-sum rounds started
/// by the last step, from one node's metrics.
pub fn step_seconds_and_rounds(metrics: &Path) -> anyhow::Result<(f64, u64)> {
    let text = std::fs::read_to_string(metrics)
        .with_context(|| format!("reading {}", metrics.display()))?;
    let mut times = Vec::new();
    let mut rounds = 0;
    for (i, line) in text.lines().enumerate() {
        let r: StepRecord = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not a step record", metrics.display(), i + 1))?;
        times.push((r.step, r.time));
        rounds = r.gossip_rounds;
    }
    let start = times.iter().find(|(s, _)| *s + 1 == WARMUP_STEPS);
    let end = times.last();
    match (start, end) {
        (Some(&(s0, t0)), Some(&(s1, t1))) if s1 > s0 => Ok(((t1 - t0) / (s1 - s0) as f64, rounds)),
        _ => bail!(
            "{}: fewer than {} steps recorded",
            metrics.display(),
            WARMUP_STEPS + 1
        ),
    }
}

fn options(
    steps: u64,
    model: ModelKind,
    preset: Option<Preset>,
    base: Base,
    tau: Option<u64>,
) -> TrainOptions {
    TrainOptions {
        preset,
        base: Some(base),
        tau,
        steps: Some(steps),
        eval_every: Some(0),
        model: Some(model),
        ..TrainOptions::default()
    }
}

/// `slowmo-testnet bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let model = args.model;
    let total = WARMUP_STEPS + args.steps;
    let run = |preset, base, tau| options(total, model, preset, base, tau);
    let background = TrainOptions {
        background_gossip: Some(true),
        ..run(Some(Preset::Osgp), Base::Osgp, None)
    };
    let runs: [(&'static str, TrainOptions); 6] = [
        (
            "no communication",
            run(Some(Preset::LocalSgd), Base::LocalSgd, Some(total + 1)),
        ),
        ("sgp", run(Some(Preset::Sgp), Base::Sgp, None)),
        ("osgp", run(Some(Preset::Osgp), Base::Osgp, None)),
        ("osgp background", background),
        ("slowmo-sgp", run(None, Base::Sgp, None)),
        ("ar-sgd", run(Some(Preset::ArSgd), Base::ArSgd, None)),
    ];
    let out = args.out.clone().unwrap_or_else(|| {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        PathBuf::from("testnet-runs").join(format!("bench-{stamp}"))
    });
    let mut rows = Vec::new();
    for (label, train) in runs {
        let run_dir = out.join(label.replace(' ', "-"));
        eprintln!("bench: {label} ({} nodes, {total} steps)", args.nodes);
        let local = LocalArgs {
            nodes: args.nodes,
            config: ConfigArgs {
                config: None,
                train,
            },
            out: Some(run_dir.clone()),
            slowmo_bin: args.slowmo_bin.clone(),
            transport: args.transport,
            threads: 1,
            join_timeout: 60,
            peer_timeout: 60,
            node_args: args
                .data_lane
                .iter()
                .flat_map(|lane| ["--data-lane".to_string(), lane.clone()])
                .collect(),
            quiet: true,
            force: args.force,
            stop_grace: 15,
            metrics_base_port: None,
            no_report: true,
            faults: None,
            run: Default::default(),
            resume: false,
        };
        launch(&local).with_context(|| format!("the {label} run"))?;
        let figures = (0..args.nodes)
            .map(|i| {
                step_seconds_and_rounds(&run_dir.join(format!("node-{i}")).join("metrics.jsonl"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let per_node: Vec<f64> = figures.iter().map(|f| f.0).collect();
        rows.push(Row {
            rounds: figures[0].1,
            label,
            step: per_node.iter().sum::<f64>() / per_node.len() as f64,
            slowest: per_node.iter().copied().fold(0.0, f64::max),
        });
    }
    let base = rows[0].step;
    if args.json {
        let runs: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "run": r.label,
                    "ms_per_step": r.step * 1e3,
                    "slowest_node_ms": r.slowest * 1e3,
                    "steps_per_s": 1.0 / r.step,
                    "overhead": r.step / base - 1.0,
                    "gossip_rounds": r.rounds,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "bench": "testnet",
            "nodes": args.nodes,
            "model": model.to_string(),
            "transport": format!("{:?}", args.transport).to_lowercase(),
            "data_lane": args.data_lane.as_deref().unwrap_or("encrypted"),
            "steps": args.steps,
            "out": out.display().to_string(),
            "runs": runs,
        });
        println!("{doc}");
        return Ok(());
    }
    println!(
        "{} nodes on this machine, {model}, {:?}, data lane {}, {} timed steps; files in {}",
        args.nodes,
        args.transport,
        args.data_lane.as_deref().unwrap_or("default"),
        args.steps,
        out.display()
    );
    println!(
        "{:<18} {:>12} {:>14} {:>10} {:>10} {:>14}",
        "run", "ms per step", "slowest node", "steps/s", "overhead", "gossip rounds"
    );
    for r in &rows {
        println!(
            "{:<18} {:>12.2} {:>14.2} {:>10.1} {:>9.0}% {:>14}",
            r.label,
            r.step * 1e3,
            r.slowest * 1e3,
            1.0 / r.step,
            (r.step / base - 1.0) * 100.0,
            r.rounds
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_time_skips_the_warm_up_and_rejects_short_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        // steps 0..=29 at 0.5 s apart before the warm-up ends, 0.01 s after
        let mut lines = Vec::new();
        let mut t = 0.0;
        for step in 0..30u64 {
            t += if step < WARMUP_STEPS { 0.5 } else { 0.01 };
            let record = StepRecord {
                step,
                time: t,
                loss: 1.0,
                lr: 0.1,
                bytes_sent: 0,
                bytes_received: 0,
                weight: 1.0,
                gossip_rounds: step + 1,
                consensus_distance: None,
                weight_spread: None,
                average_residual_norm: None,
                test_accuracy: None,
                train_loss: None,
            };
            lines.push(serde_json::to_string(&record).unwrap());
        }
        std::fs::write(&path, lines.join("\n")).unwrap();
        let (s, rounds) = step_seconds_and_rounds(&path).unwrap();
        assert!((s - 0.01).abs() < 1e-9, "{s}");
        assert_eq!(rounds, 30);

        std::fs::write(&path, lines[..5].join("\n")).unwrap();
        let err = step_seconds_and_rounds(&path).unwrap_err().to_string();
        assert!(err.contains("fewer than"), "{err}");
    }
}
