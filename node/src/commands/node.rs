//! `slowmo node`: one real peer of a run, training on its own device and
//! exchanging parameters over libp2p with exactly the simulator's loop.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::builder::TypedValueParser as _;
use sha2::{Digest, Sha256};
use slowmo_gossip::p2p::{LanePeers, P2pComm, P2pConfig, RunIdentity};
use slowmo_gossip::{CommStats, Communicator};
use slowmo_runspec::NodeSummary;

use crate::commands::join::{RunPlan, announce, ticket_of};
use crate::config::{ConfigArgs, RunConfig};
use crate::data;
use crate::engine::setup::Workload;
use crate::engine::stopping::Stopper;
use crate::engine::train::{
    CheckpointPlan, StepGate, StepRecord, Unfinished, WorkerOutcome, WorkerSetup,
    run_worker_keeping,
};
use crate::io::checkpoint::{self, Checkpoint, CheckpointArgs, Identity};
use crate::io::metrics::Progress;
use crate::io::node_outputs::{FinalParams, NodeOutputs, failed_summary_bytes};
use crate::io::outputs::OutputPaths;
use crate::model::ParamSpec;

/// Arguments of `slowmo node`.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    #[command(
        flatten,
        next_help_heading = "Training (the same on every node; --join brings them)"
    )]
    pub config: ConfigArgs,
    /// Number of nodes of the run: it starts when all are present.
    #[arg(long, help_heading = "Run", value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize), conflicts_with = "join")]
    pub nodes: Option<usize>,
    /// Name of the run (at most 256 bytes); peers with another run id are
    /// refused [default: slowmo].
    #[arg(long, help_heading = "Run", value_parser = crate::commands::run::parse_run_id, conflicts_with = "join")]
    pub run_id: Option<String>,
    /// Join the run a join ticket describes (the `slowmo1...` string a
    /// node of the run prints): the run id, the peers to reach, and the
    /// settings, fetched from that peer and checked against the ticket's
    /// hash. Only --data-dir among the training flags may be given with it.
    #[arg(long, help_heading = "Run", value_name = "TICKET", conflicts_with_all = ["config", "bootstrap", "data_lane"])]
    pub join: Option<String>,
    /// Multiaddr to listen on (repeatable), e.g. /ip4/0.0.0.0/tcp/4001 or
    /// /ip4/0.0.0.0/udp/4001/quic-v1 [default: this machine only
    /// (127.0.0.1), QUIC and TCP on ports the system picks].
    #[arg(long, help_heading = "Network", default_values_t = vec!["/ip4/127.0.0.1/udp/0/quic-v1".to_string(), "/ip4/127.0.0.1/tcp/0".to_string()], hide_default_value = true)]
    pub listen: Vec<String>,
    /// TCP port of the data lane, the connections that carry tensors;
    /// open it to the run's other machines beside the listen port
    /// [default: the TCP listen port plus one; any free port when no TCP
    /// port is given].
    #[arg(long, help_heading = "Network", value_name = "PORT")]
    pub lane_port: Option<u16>,
    /// Multiaddr of a peer to join through (repeatable).
    #[arg(long, help_heading = "Network")]
    pub bootstrap: Vec<String>,
    /// Key file of this node's identity, created on first run [default: a
    /// new identity each run].
    #[arg(long, help_heading = "Network")]
    pub identity: Option<PathBuf>,
    /// Discover peers on the local network with mDNS.
    #[arg(long, help_heading = "Network")]
    pub mdns: bool,
    /// Also serve as a relay for nodes behind NATs (they take a reservation
    /// here, and their hole punches start from connections relayed here).
    /// The node must be reachable at its listen addresses (or at
    /// --external-address).
    #[arg(long, help_heading = "Network")]
    pub relay: bool,
    /// An address this node is reachable at besides its listen addresses
    /// (repeatable): a public IP the machine does not see, a forwarded port.
    #[arg(long, help_heading = "Network")]
    pub external_address: Vec<String>,
    /// Send tensors over a relay to a peer that no direct connection
    /// reaches (its hole punch failed), instead of going on without it. A
    /// relay's bandwidth is shared and every step's tensors cross it twice;
    /// the relay must allow it (`slowmo relay --carry-tensors`, or
    /// --relay with this flag).
    #[arg(long, help_heading = "Network")]
    pub relay_tensors: bool,
    /// Ask the router for port mappings of the listen ports by UPnP (where
    /// it allows it): a mapped port makes this node reachable from outside
    /// without a relay. The log says what the router answered.
    #[arg(long, help_heading = "Network")]
    pub upnp: bool,
    /// Seconds to wait for all nodes to join (and, below --min-nodes, for
    /// joiners).
    #[arg(long, help_heading = "Network", default_value_t = 120)]
    pub join_timeout: u64,
    /// Fewest members to train with: when lost peers leave fewer, the run
    /// pauses at its barrier until nodes join (up to --join-timeout), then
    /// stops with an error.
    #[arg(long, help_heading = "Network", default_value_t = 1)]
    pub min_nodes: usize,
    /// Seconds a peer may stay silent during an exchange.
    #[arg(long, help_heading = "Network", default_value_t = 60)]
    pub peer_timeout: u64,
    /// How tensors travel between nodes: encrypted (a bulk-data lane of TCP
    /// connections sealed with AEGIS-256X4), plaintext (the same lane
    /// without the cipher, still set up only between members; for a private
    /// network you trust) or libp2p (the control plane's own streams).
    /// Every node of a run must use the same; a join ticket carries it
    /// [default: encrypted].
    #[arg(long, help_heading = "Network")]
    pub data_lane: Option<slowmo_gossip::p2p::DataLane>,
    /// Data-lane connections per direction and peer [default: one per core,
    /// 2 to 8].
    #[arg(long, help_heading = "Network")]
    pub lane_connections: Option<usize>,
    /// Compute device: cpu or cuda:N.
    #[arg(long, help_heading = "Compute", default_value = "cpu")]
    pub device: String,
    /// Compute threads; the network runtime takes as many, at most 4
    /// [default: every core the process may use; give 1 to each of several
    /// nodes that share a machine].
    #[arg(long, help_heading = "Compute")]
    pub threads: Option<usize>,
    /// Write per-step metrics as JSON lines.
    #[arg(long, help_heading = "Outputs")]
    pub metrics_jsonl: Option<PathBuf>,
    /// Write the final summary as JSON.
    #[arg(long, help_heading = "Outputs")]
    pub summary_json: Option<PathBuf>,
    /// Write the final averaged parameters as safetensors.
    #[arg(long, help_heading = "Outputs")]
    pub save_params: Option<PathBuf>,
    /// Write the join ticket to FILE as well as printing it (for scripts).
    #[arg(long, help_heading = "Outputs", value_name = "FILE")]
    pub ticket_file: Option<PathBuf>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics.
    #[arg(long, help_heading = "Outputs", value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    #[command(flatten, next_help_heading = "Checkpoints")]
    pub checkpoints: CheckpointArgs,
    #[command(flatten, next_help_heading = "Admission")]
    pub admission: crate::commands::run::AdmissionArgs,
    /// Hold before these base steps until a harness opens the gate (the
    /// local testnet's exact step faults; see --gate-dir).
    #[arg(long, value_delimiter = ',', hide = true, requires = "gate_dir")]
    pub hold_at: Vec<u64>,
    /// The folder of the step gates' files.
    #[arg(long, hide = true)]
    pub gate_dir: Option<PathBuf>,
}

/// Parses `--device`; CUDA needs a build with the `cuda` feature.
pub fn parse_device(spec: &str) -> anyhow::Result<candle_core::Device> {
    if spec == "cpu" {
        return Ok(candle_core::Device::Cpu);
    }
    let Some(index) = spec
        .strip_prefix("cuda:")
        .or(if spec == "cuda" { Some("0") } else { None })
    else {
        bail!("--device {spec}: expected `cpu` or `cuda:N`");
    };
    let index: usize = index
        .parse()
        .with_context(|| format!("--device {spec}: `{index}` is not a GPU index"))?;
    if !candle_core::utils::cuda_is_available() {
        bail!(
            "--device {spec}: this slowmo was built without CUDA support; rebuild with \
             `cargo build --release -p slowmo-node --features cuda` on a machine with the CUDA toolkit"
        );
    }
    candle_core::Device::new_cuda(index).with_context(|| {
        format!("--device {spec}: GPU {index} could not be opened (is there a GPU {index}, and the CUDA driver?)")
    })
}

/// SHA-256 of the initial parameters, checked when peers join.
pub fn params_hash(params: &[f32]) -> String {
    let mut h = Sha256::new();
    for v in params {
        h.update(v.to_le_bytes());
    }
    hex::encode(h.finalize())
}

/// The checkpoint every member resumes from: the newest step that all of
/// them hold a valid checkpoint for. Collective; every member fails alike
/// when one of them cannot load it.
fn agree_on_checkpoint(
    comm: &mut P2pComm,
    dir: &std::path::Path,
    layout: &[ParamSpec],
    identity: &Identity,
) -> anyhow::Result<Checkpoint> {
    let newest = checkpoint::newest_valid(dir, layout, identity, None);
    if let Err(e) = &newest {
        tracing::error!("{e}");
    }
    // Steps travel as step + 1, so that 0 says "none".
    let mine = newest.as_ref().map_or(0, |c| c.state.steps + 1);
    let all: Vec<u64> = comm.all_gather_u64(&[mine])?.concat();
    let common = *all.iter().min().unwrap_or(&0);
    if common == 0 {
        let without: Vec<String> = (0..all.len())
            .filter(|r| all[*r] == 0)
            .map(|r| r.to_string())
            .collect();
        bail!(
            "cannot resume: rank(s) {} have no usable checkpoint",
            without.join(", ")
        );
    }
    let step = common - 1;
    let found = match newest {
        Ok(c) if c.state.steps == step => Ok(c),
        _ => checkpoint::newest_valid(dir, layout, identity, Some(step))
            .map_err(anyhow::Error::from)
            .and_then(|c| {
                if c.state.steps == step {
                    Ok(c)
                } else {
                    Err(anyhow::anyhow!(
                        "no usable checkpoint of step {step} in {} (the newest all members hold)",
                        dir.display()
                    ))
                }
            }),
    };
    let ok: Vec<u64> = comm.all_gather_u64(&[u64::from(found.is_ok())])?.concat();
    if let Some(r) = ok.iter().position(|v| *v == 0) {
        return Err(found.err().unwrap_or_else(|| {
            anyhow::anyhow!("rank {r} cannot load the checkpoint of step {step}")
        }))
        .context("resuming");
    }
    tracing::info!(step, "resuming from a checkpoint");
    found
}

/// `slowmo node`. Returns an error (non-zero exit) when the run did not
/// finish or an output could not be written.
pub fn run(args: NodeArgs) -> anyhow::Result<()> {
    run_with(args, None)
}

/// `slowmo node` training `workload` (a caller's own model and data, see
/// `node/examples/custom_model.rs`) instead of the configuration's
/// (`None`). Every node of a run must train the same workload: the run
/// refuses a node whose initial parameters differ.
pub fn run_with(args: NodeArgs, workload: Option<Workload>) -> anyhow::Result<()> {
    // The outputs' paths before the ticket's peer is asked for anything.
    let paths = OutputPaths {
        summary_json: args.summary_json.clone(),
        metrics_jsonl: args.metrics_jsonl.clone(),
        save_params: args.save_params.clone(),
        checkpoint_dir: args.checkpoints.checkpoint_dir.clone(),
    };
    paths.check()?;
    if let Some(path) = &args.ticket_file {
        crate::io::outputs::check("--ticket-file", path, crate::io::outputs::OutputKind::File)?;
    }
    let plan = RunPlan::from_args(&args)?;
    let config = plan.config.clone();
    if let Some(note) = config.peers_clamped() {
        tracing::warn!("{note}");
    }
    let admission = plan.admission.policy()?;
    let device = parse_device(&args.device)?;
    // Every output is checked before the node loads anything or joins anyone.
    let mut outputs = NodeOutputs::open(paths)?;
    let workload = match workload {
        Some(w) => w,
        None => Workload::from_config(&config)?,
    };
    let dataset = workload.dataset.clone();
    let model = workload.build(&device)?;
    outputs.prepare_saver(model.layout());
    let x0 = crate::model::initial_params(&*model, config.seed)?;
    let run = RunIdentity {
        run_id: plan.run_id.clone(),
        config_hash: config.hash(),
        init_hash: params_hash(&x0),
    };
    let mut p2p = P2pConfig::new(run, config.workers, x0.len());
    p2p.listen = args.listen.clone();
    p2p.bootstrap = plan.bootstrap.clone();
    p2p.identity_file = args.identity.clone();
    p2p.mdns = args.mdns;
    p2p.relay = args.relay;
    p2p.relay_tensors = args.relay_tensors;
    p2p.upnp = args.upnp;
    p2p.external_addrs = args.external_address.clone();
    p2p.join_timeout = Duration::from_secs(args.join_timeout);
    p2p.min_nodes = args.min_nodes;
    p2p.peer_timeout = Duration::from_secs(args.peer_timeout);
    p2p.data_lane = plan.data_lane;
    p2p.lane_port = args.lane_port;
    p2p.compress = config.compress;
    // Lanes to the graph's neighbours in each view (and the ring's), not to
    // every member: a node's connections stay bounded as runs grow.
    let graph = config.graph.clone();
    p2p.lane_peers = Some(LanePeers(Arc::new(move |rank, world| {
        slowmo_topologies::build(&graph, world)
            .map(|t| t.neighbours(rank))
            .unwrap_or_default()
    })));
    // The network runtime shares the node's thread budget: --threads caps
    // its workers too (by default one per core the process may use, which
    // counts a container's CPU quota, 2 to 4).
    if let Some(n) = args.threads {
        p2p.worker_threads = n.clamp(1, 4);
    }
    if let Some(k) = args.lane_connections {
        p2p.lane_connections = k;
    }
    let endpoint = args
        .metrics_addr
        .as_deref()
        .map(crate::io::observe::Endpoint::start)
        .transpose()?;
    p2p.metrics = endpoint.as_ref().map(|e| e.registry());
    p2p.admission = admission;
    p2p.settings = crate::commands::run::config_settings(&config);
    p2p.settings_text = config.settings();

    let joining_summary = match outputs.summary_path() {
        Some(path) => {
            let why = "stopped by a signal while joining the run".to_string();
            let bytes = failed_summary_bytes(&config, why, Some("signal"))
                .map_err(|e| anyhow::anyhow!("--summary-json: {e}"))?;
            Some((path.to_path_buf(), bytes))
        }
        None => None,
    };
    let stopper = Stopper::install(joining_summary)?;
    let gate = match &args.gate_dir {
        Some(dir) => Some(
            StepGate::new(dir.clone(), args.hold_at.iter().copied())
                .with_context(|| format!("--gate-dir {}", dir.display()))?,
        ),
        None => None,
    };

    let run_key = p2p.admission.run_key_text();
    let joined = P2pComm::bind(p2p).and_then(|pending| {
        let ticket = ticket_of(&pending, &plan, run_key, &args.external_address);
        if let Err(e) = announce(&pending, &ticket, &args) {
            tracing::warn!("{e:#}");
        }
        tracing::info!(nodes = config.workers, "joining the run");
        pending.join()
    });
    let mut comm = match joined {
        Ok(c) => c,
        Err(e) => {
            let e = anyhow::Error::new(e).context("joining the run");
            outputs.write_failed_summary(&config, format!("{e:#}"));
            return Err(e);
        }
    };
    stopper.training(comm.interrupt_handle());
    if let Some(e) = &endpoint {
        e.attach(comm.observer());
    }
    let rank = comm.rank();
    tracing::info!(rank, peer = %comm.local_peer_id(), "run started");
    let shards = data::shard_indices(
        &dataset.train().labels(),
        dataset.classes(),
        config.workers,
        config.partition,
        config.seed,
    )?;
    let shard = shards.into_iter().nth(rank).expect("one shard per rank");
    let topology: Arc<dyn slowmo_topologies::Topology> =
        Arc::from(slowmo_topologies::build(&config.graph, config.workers)?);
    let identity = Identity {
        config_hash: config.hash(),
        settings: config.settings(),
        run_id: plan.run_id.clone(),
        rank,
        world_size: config.workers,
        view: 0,
    };
    let resume = match (&args.checkpoints.checkpoint_dir, args.checkpoints.resume) {
        (Some(dir), true) if comm.is_member() => Some(agree_on_checkpoint(
            &mut comm,
            dir,
            model.layout(),
            &identity,
        )?),
        _ => None,
    };
    let checkpoints = args
        .checkpoints
        .checkpoint_dir
        .as_ref()
        .map(|dir| CheckpointPlan {
            dir: dir.clone(),
            every: args.checkpoints.checkpoint_every,
            keep: args.checkpoints.checkpoint_keep,
            identity,
        });
    let setup = WorkerSetup {
        config: config.clone(),
        dataset: dataset.clone(),
        shard,
        model,
        topology,
        stop: Some(stopper.flag()),
        checkpoints,
        resume,
        // A new node, or a restart of a member, while the run is under way:
        // it is admitted at a barrier and receives the state.
        join: !comm.is_member(),
        gate,
    };

    let progress = Progress::new(config.steps, &format!("node {rank}"));
    let mut last: Option<StepRecord> = None;
    let result = run_worker_keeping(setup, &mut comm, &mut |r: &StepRecord| {
        progress.step(r);
        if let Some(e) = &endpoint {
            e.record(r);
        }
        if !outputs.record(r) {
            stopper.stop_for_output_error();
        }
        last = Some(r.clone());
    });
    progress.finish();
    let stats = comm.stats();
    let peer_id = comm.local_peer_id();
    // Outputs before the network goes: a graceful shutdown may wait on peers.
    // Rank and members of the view the run ended in.
    let mut summary = summarize(
        &config,
        comm.rank(),
        peer_id,
        comm.members(),
        &result,
        last.as_ref(),
        stats,
    );
    summary.connections = Some(connections_summary(&comm.observer().reach()));
    let (params, error) = match result {
        Ok(o) => (
            Some(FinalParams {
                params: o.averaged_params,
                is_final: true,
                steps: o.steps,
            }),
            None,
        ),
        Err(u) => {
            let why = stopper.reason().unwrap_or("error");
            summary.stopped = Some(why.into());
            if why == "output error"
                && let Some(first) = outputs.errors().first()
            {
                summary.error = Some(first.clone());
            }
            let params = u.params.map(|params| FinalParams {
                params,
                is_final: false,
                steps: u.steps,
            });
            (params, Some(u.error))
        }
    };
    let done = format!(
        "finished {} steps, train loss {:.4}, test accuracy {:.4} (averaged model), {:.1} steps/s",
        summary.steps,
        summary.final_train_loss.unwrap_or(f32::NAN),
        summary.test_accuracy.unwrap_or(f32::NAN),
        summary.steps_per_second
    );
    let steps = summary.steps;
    let failures = outputs.finish(params, summary);
    stopper.outputs_written();
    match error {
        None => comm.shutdown(),
        // Nothing more to deliver: leave without waiting on silent peers.
        Some(_) => drop(comm),
    }
    let failed = || failures.join("\n  ");
    match (error, stopper.reason()) {
        (Some(e), Some("signal")) => {
            bail!("node {rank} stopped by a signal after step {steps}: {e}")
        }
        (Some(_), Some("output error")) => bail!(
            "node {rank} stopped after step {steps}: an output could not be written:\n  {}",
            failed()
        ),
        (Some(e), _) => {
            Err(anyhow::Error::new(e).context(format!("node {rank} did not finish the run")))
        }
        (None, _) if !failures.is_empty() => bail!(
            "node {rank} {done}, but {} output(s) could not be written:\n  {}",
            failures.len(),
            failed()
        ),
        (None, _) => {
            eprintln!("node {rank}: {done}");
            Ok(())
        }
    }
}

/// How the node reached its peers, for the summary.
fn connections_summary(
    reach: &slowmo_gossip::p2p::reach::ReachState,
) -> slowmo_runspec::ConnectionsSummary {
    use slowmo_gossip::p2p::reach::ConnectionKind;
    let kinds = reach.kinds();
    let count = |k| kinds.get(&k).copied().unwrap_or(0);
    let (punch_attempts, punch_successes) = reach.punches();
    slowmo_runspec::ConnectionsSummary {
        direct: count(ConnectionKind::Direct),
        hole_punched: count(ConnectionKind::HolePunched),
        relayed: count(ConnectionKind::Relayed),
        punch_attempts,
        punch_successes,
        relay_reservations: reach.reservations.keys().map(|p| p.to_string()).collect(),
        relay_only: reach
            .relay_only
            .iter()
            .map(|(p, why)| format!("{p}: {why}"))
            .collect(),
    }
}

fn summarize(
    config: &RunConfig,
    rank: usize,
    peer_id: String,
    members: Vec<String>,
    result: &Result<WorkerOutcome, Box<Unfinished>>,
    last: Option<&StepRecord>,
    stats: CommStats,
) -> NodeSummary {
    let wall = last.map(|r| r.time).unwrap_or(0.0);
    let steps = last.map(|r| r.step + 1).unwrap_or(0);
    let mut s = NodeSummary::failed(config, String::new());
    s.rank = Some(rank);
    s.peer_id = Some(peer_id);
    s.members = members;
    s.completed = result.is_ok();
    s.error = result.as_ref().err().map(|u| u.error.to_string());
    s.steps = steps;
    s.bytes_sent = stats.bytes_sent;
    s.lane_bytes_sent = stats.lane_bytes_sent;
    s.bytes_received = stats.bytes_received;
    s.messages_dropped = stats.messages_dropped;
    s.wall_seconds = wall;
    s.steps_per_second = if wall > 0.0 { steps as f64 / wall } else { 0.0 };
    if let Ok(o) = result {
        s.final_train_loss = Some(o.mean_train_loss);
        s.test_accuracy = Some(o.averaged_accuracy);
        s.own_test_accuracy = Some(o.test_accuracy);
        s.worker_accuracy_mean = Some(o.worker_accuracy_mean);
        s.worker_accuracy_std = Some(o.worker_accuracy_std);
        s.consensus_distance = Some(o.consensus_distance);
        s.push_sum_weight = Some(o.weight);
        s.params_sum = Some(o.params_sum);
        s.view_changes = o.view_changes.clone();
        s.wall_seconds = o.wall_seconds;
        s.steps_per_second = o.steps as f64 / o.wall_seconds.max(1e-9);
        if let Some(shape) = config.transformer {
            s.test_loss = Some(o.averaged_loss);
            s.test_perplexity = Some(f64::from(o.averaged_loss).exp());
            s.tokens_per_second =
                Some(s.steps_per_second * (config.batch_size * shape.context) as f64);
        }
    }
    s
}
