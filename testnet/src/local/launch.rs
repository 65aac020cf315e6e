//! Starting a local run: the checks, the run folder (`testnet.json`,
//! `run.toml`, a `node-N` folder per node), every node's command line and
//! the first lives.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use slowmo_runspec::RunConfig;

use super::args::{LocalArgs, TestnetRecord, default_out, free_port, multiaddr, slowmo_binary};
use super::nodes::{Nodes, Slot};
use crate::events::EventLog;
use crate::faults::{FaultAction, ScriptedFault, Trigger};
use crate::node_line::{NodeLine, node_name};

/// A run checked and its folder written, before any node starts.
pub(super) struct Prepared {
    pub(super) out: PathBuf,
    pub(super) bin: PathBuf,
    pub(super) config: RunConfig,
    /// Node slots: the first nodes, then those the script adds mid-run.
    slots: usize,
    record: TestnetRecord,
    run_toml: PathBuf,
    metrics_ports: Option<Vec<u16>>,
    /// Node 0's address, every other first node's bootstrap peer.
    pub(super) bootstrap: String,
    /// The steps of the script's step faults: every node holds there until
    /// the fault is carried out.
    pub(super) hold_at: Vec<u64>,
}

impl Prepared {
    /// Checks the arguments and the machine, and writes (or, with
    /// `--resume`, checks) `testnet.json` and `run.toml`.
    pub(super) fn new(args: &LocalArgs, script: &[ScriptedFault]) -> anyhow::Result<Self> {
        if args.nodes == 0 {
            bail!("--nodes must be at least 1");
        }
        let mut options = args.config.options()?;
        options.workers = Some(args.nodes);
        let config = options.resolve().context("the run configuration")?;
        if let Some(note) = config.peers_clamped() {
            eprintln!("warning: {note}");
        }
        // Before anything starts: every node is a process holding a model and a
        // dataset.
        // Nodes the script adds mid-run come after the first ones.
        let joins = script
            .iter()
            .filter(|f| f.action == FaultAction::Join)
            .count();
        let slots = args.nodes + joins;
        config.check_local_nodes(slots, &slowmo_runspec::Resources::of_this_machine())?;
        let bin = slowmo_binary(args.slowmo_bin.as_deref())?;
        args.run.check(args.nodes).map_err(anyhow::Error::msg)?;
        let out = args.out.clone().unwrap_or_else(default_out);
        let metrics_ports = args
            .metrics_base_port
            .map(|p| crate::observe::metrics_ports("--metrics-base-port", p, slots))
            .transpose()?;
        let run_toml = out.join("run.toml");
        let toml_text = options.to_toml()?;
        let record_path = out.join("testnet.json");
        let record = if args.resume {
            let text = std::fs::read_to_string(&record_path).with_context(|| {
                format!(
                    "--resume: no earlier run in --out {} ({} is missing)",
                    out.display(),
                    record_path.display()
                )
            })?;
            let record: TestnetRecord = serde_json::from_str(&text)
                .with_context(|| format!("--resume: {} is not readable", record_path.display()))?;
            if record.nodes != args.nodes {
                bail!(
                    "--resume: the earlier run in {} had {} nodes, --nodes is {}",
                    out.display(),
                    record.nodes,
                    args.nodes
                );
            }
            check_resumable(&run_toml, &config, args.nodes)?;
            // The settings may differ where a resume allows it (a longer
            // run): the nodes read the new ones.
            std::fs::write(&run_toml, &toml_text)
                .with_context(|| format!("writing {}", run_toml.display()))?;
            record
        } else {
            crate::outdir::prepare(&out, args.force)?;
            let record = TestnetRecord {
                run_id: format!("local-{}", std::process::id()),
                nodes: args.nodes,
                transport: format!("{:?}", args.transport).to_lowercase(),
            };
            std::fs::write(&record_path, serde_json::to_string_pretty(&record)?)
                .with_context(|| format!("writing {}", record_path.display()))?;
            std::fs::write(&run_toml, &toml_text)
                .with_context(|| format!("writing {}", run_toml.display()))?;
            record
        };
        let bootstrap = multiaddr(args.transport, free_port(args.transport)?);
        let hold_at: BTreeSet<u64> = script
            .iter()
            .filter_map(|f| match f.at {
                Trigger::Step(s) => Some(s),
                Trigger::Seconds(_) => None,
            })
            .collect();
        Ok(Prepared {
            hold_at: hold_at.into_iter().collect(),
            out,
            bin,
            config,
            slots,
            record,
            run_toml,
            metrics_ports,
            bootstrap,
        })
    }

    /// The command line of node `i` (a joiner's bootstrap peers are added
    /// when it starts).
    fn node_line(&self, args: &LocalArgs, i: usize, dir: PathBuf) -> NodeLine {
        NodeLine {
            config: Some(self.run_toml.clone()),
            nodes: args.nodes,
            run_id: Some(self.record.run_id.clone()),
            listen: if i == 0 {
                self.bootstrap.clone()
            } else {
                multiaddr(args.transport, 0)
            },
            // The nodes share this machine: node 0's TCP port plus one may
            // be another program's.
            lane_port: Some(0),
            bootstrap: if i > 0 && i < args.nodes {
                vec![self.bootstrap.clone()]
            } else {
                Vec::new()
            },
            threads: args.threads,
            join_timeout: args.join_timeout,
            peer_timeout: args.peer_timeout,
            data_dir: dir,
            metrics_addr: self
                .metrics_ports
                .as_ref()
                .map(|ports| format!("127.0.0.1:{}", ports[i])),
            min_nodes: args.run.min_nodes,
            checkpoints: args.run.checkpoint_flags(args.resume),
            resume: args.resume,
            hold_at: self.hold_at.clone(),
            extra: args.node_args.clone(),
        }
    }

    /// Readies every node's folder and starts the first nodes.
    pub(super) fn start(&self, args: &LocalArgs) -> anyhow::Result<Nodes> {
        let events = EventLog::open(&self.out.join("events.jsonl"))?;
        let mut nodes = Nodes::new(events, Duration::from_secs(args.stop_grace));
        for i in 0..self.slots {
            let joiner = i >= args.nodes;
            let name = node_name(i);
            let dir = self.out.join(&name);
            std::fs::create_dir_all(&dir)?;
            if joiner {
                // A new node: a new identity, nothing from an earlier run.
                for stale in [
                    "identity.key",
                    "summary.json",
                    "metrics.jsonl",
                    "params.safetensors",
                ] {
                    let _ = std::fs::remove_file(dir.join(stale));
                }
                std::fs::File::create(dir.join("node.log"))?;
            } else if args.resume {
                crate::life::keep_in_place(&dir)?;
            } else {
                let _ = std::fs::remove_file(dir.join("summary.json"));
                std::fs::File::create(dir.join("node.log"))?;
            }
            let line = self.node_line(args, i, dir.clone());
            nodes.slots.push(Slot::new(name, dir, line.args(), joiner));
        }
        let note = if args.resume {
            "resumed from its checkpoints"
        } else {
            ""
        };
        for i in 0..args.nodes {
            nodes.spawn(i, &self.bin, note)?;
        }
        Ok(nodes)
    }
}

/// Whether a run with `config` can resume the one whose settings are in
/// `run_toml`: every setting the same, except `steps` when the schedule does
/// not depend on the total (as the nodes check their checkpoints); else an
/// error naming each that differs, with both values.
fn check_resumable(
    run_toml: &std::path::Path,
    config: &RunConfig,
    nodes: usize,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(run_toml)
        .with_context(|| format!("--resume: reading {}", run_toml.display()))?;
    let mut earlier = slowmo_runspec::TrainOptions::from_toml(&text)
        .map_err(|e| anyhow::anyhow!("--resume: {} is not valid: {e}", run_toml.display()))?;
    earlier.workers = Some(nodes);
    let earlier = earlier
        .resolve()
        .with_context(|| format!("--resume: the settings in {}", run_toml.display()))?;
    let changes = slowmo_runspec::resume_differences(&earlier.settings(), &config.settings())
        .map_err(|e| anyhow::anyhow!("--resume: {e}"))?;
    if !changes.is_empty() {
        let list: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
        bail!(
            "--resume: the settings differ from the earlier run's ({}): {}; its checkpoints \
             would be refused. Give the same settings (only --steps may change, and only when \
             the learning-rate schedule does not depend on the total: constant, warmup, step)",
            run_toml.display(),
            list.join("; ")
        );
    }
    Ok(())
}
