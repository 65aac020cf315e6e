//! The command line of `slowmo-testnet local`, and what the run folder
//! records about the run.

use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use slowmo_runspec::ConfigArgs;

use crate::faults::ScriptedFault;

/// Transport the local nodes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Quic,
    Tcp,
}

/// Arguments of `slowmo-testnet local`.
#[derive(Debug, Clone, clap::Args)]
pub struct LocalArgs {
    /// Number of node processes.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Folder for every node's files [default: a new folder under testnet-runs/].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The slowmo binary [default: $SLOWMO_BIN, else `slowmo` beside this program].
    #[arg(long)]
    pub slowmo_bin: Option<PathBuf>,
    /// Transport between the nodes.
    #[arg(long, value_enum, default_value_t = Transport::Quic)]
    pub transport: Transport,
    /// Compute threads per node.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Seconds for all nodes to join.
    #[arg(long, default_value_t = 60)]
    pub join_timeout: u64,
    /// Seconds a peer may stay silent.
    #[arg(long, default_value_t = 60)]
    pub peer_timeout: u64,
    /// Extra flag passed to every node (repeatable), e.g. --node-arg=--mdns.
    #[arg(long = "node-arg", allow_hyphen_values = true)]
    pub node_args: Vec<String>,
    /// Print no combined progress.
    #[arg(long)]
    pub quiet: bool,
    /// Use an --out folder that is not empty: the earlier run's files
    /// (run.toml, node-N folders) are removed first.
    #[arg(long)]
    pub force: bool,
    /// Seconds each node has to write its outputs after SIGTERM before it
    /// is killed.
    #[arg(long, default_value_t = 15)]
    pub stop_grace: u64,
    /// Serve each node's Prometheus metrics: node i at
    /// http://127.0.0.1:(PORT + i)/metrics.
    #[arg(long, value_name = "PORT")]
    pub metrics_base_port: Option<u16>,
    /// Write no report.html at the end.
    #[arg(long)]
    pub no_report: bool,
    /// Scripted faults, e.g. `kill 2@5s; restart 2@12s; pause 1@40; resume
    /// 1@60; join 4@300` (`@Ns`: seconds after the start; `@N`: at exactly
    /// step N, every node holding there until the fault is carried out;
    /// `join I` with I >= --nodes starts a new node mid-run), or a file
    /// holding such lines.
    #[arg(long, value_name = "SCRIPT")]
    pub faults: Option<String>,
    #[command(flatten)]
    pub run: crate::node_line::NodeRunFlags,
    /// Continue the earlier run in --out from its checkpoints: same run id,
    /// identities and folders; logs are appended to, earlier metrics kept as
    /// metrics.K.jsonl.
    #[arg(long, conflicts_with = "force")]
    pub resume: bool,
}

/// Finds the slowmo binary.
pub fn slowmo_binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_owned(),
        None => match std::env::var_os("SLOWMO_BIN") {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()
                .context("locating this program")?
                .with_file_name(format!("slowmo{}", std::env::consts::EXE_SUFFIX)),
        },
    };
    if !path.is_file() {
        bail!(
            "slowmo binary not found at {} (build it with `cargo build -p slowmo-node`, or pass --slowmo-bin / set SLOWMO_BIN)",
            path.display()
        );
    }
    Ok(path)
}

pub(super) fn free_port(transport: Transport) -> anyhow::Result<u16> {
    Ok(match transport {
        Transport::Quic => UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port(),
        Transport::Tcp => TcpListener::bind("127.0.0.1:0")?.local_addr()?.port(),
    })
}

pub(super) fn multiaddr(transport: Transport, port: u16) -> String {
    match transport {
        Transport::Quic => format!("/ip4/127.0.0.1/udp/{port}/quic-v1"),
        Transport::Tcp => format!("/ip4/127.0.0.1/tcp/{port}"),
    }
}

/// What the run folder records about the run itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestnetRecord {
    pub run_id: String,
    pub nodes: usize,
    pub transport: String,
}

/// A new folder under testnet-runs/.
pub(super) fn default_out() -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    PathBuf::from("testnet-runs").join(format!("local-{stamp}-{}", std::process::id()))
}

/// The fault script: the text itself, or the file it names.
pub(super) fn fault_script(args: &LocalArgs) -> anyhow::Result<Vec<ScriptedFault>> {
    match &args.faults {
        Some(arg) => crate::faults::load_script(arg, args.nodes).map_err(|e| anyhow::anyhow!(e)),
        None => Ok(Vec::new()),
    }
}
