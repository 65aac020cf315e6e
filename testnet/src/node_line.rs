//! The command line of a `slowmo node`, one builder for local processes and
//! compose services alike, and the one name of node i.

use std::ffi::OsString;
use std::path::PathBuf;

/// The name of node `index`: its folder in a local run, its service,
/// hostname and results folder in a compose testnet, its target in event
/// and chaos logs.
pub fn node_name(index: usize) -> String {
    format!("node-{index}")
}

/// The index of a node named `node-N`.
pub fn node_index(name: &str) -> Option<usize> {
    name.strip_prefix("node-")?.parse().ok()
}

/// The folder of a node's step gates, in its data folder.
pub fn gate_dir(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("gate")
}

/// The node flags a testnet passes to every node, declared once for
/// `slowmo-testnet local` and `slowmo-testnet compose`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NodeRunFlags {
    /// Passed to every node: the fewest members the run trains with.
    #[arg(long)]
    pub min_nodes: Option<usize>,
    /// Every node writes checkpoints into `checkpoints` of its folder
    /// (node-N/ locally, the /data volume under compose; implied by the
    /// other checkpoint flags).
    #[arg(long)]
    pub checkpoints: bool,
    /// Outer iterations between checkpoints [node default: 1].
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<u64>,
    /// Checkpoints each node keeps [node default: 3].
    #[arg(long, value_name = "K")]
    pub checkpoint_keep: Option<u64>,
}

impl NodeRunFlags {
    /// Checks `--min-nodes` against the run's `nodes`.
    pub fn check(&self, nodes: usize) -> Result<(), String> {
        match self.min_nodes {
            Some(m) if m == 0 || m > nodes => Err(format!(
                "--min-nodes {m}: must be between 1 and --nodes {nodes}"
            )),
            _ => Ok(()),
        }
    }

    /// The nodes' checkpoint settings: on when asked (or `also_on`, a
    /// resume) or implied by either value.
    pub fn checkpoint_flags(&self, also_on: bool) -> Option<CheckpointFlags> {
        CheckpointFlags::wanted(
            self.checkpoints || also_on,
            self.checkpoint_every,
            self.checkpoint_keep,
        )
    }
}

/// Checkpoints a node writes into `checkpoints` of its data folder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointFlags {
    /// Outer iterations between checkpoints [node default].
    pub every: Option<u64>,
    /// Checkpoints kept [node default].
    pub keep: Option<u64>,
}

impl CheckpointFlags {
    /// The checkpoint settings of a testnet's flags: on when asked (`on`)
    /// or implied by either value.
    pub fn wanted(on: bool, every: Option<u64>, keep: Option<u64>) -> Option<Self> {
        (on || every.is_some() || keep.is_some()).then_some(Self { every, keep })
    }
}

/// Everything a node is started with, besides the binary.
#[derive(Debug, Clone, Default)]
pub struct NodeLine {
    /// The run configuration file, if any.
    pub config: Option<PathBuf>,
    pub nodes: usize,
    /// [default: the node's own]
    pub run_id: Option<String>,
    pub listen: String,
    /// The data lane's port (`--lane-port`): `Some(0)` any free one, for
    /// nodes that share a machine, where the TCP listen port plus one (a
    /// node's default) may be another's; `None` the node's default.
    pub lane_port: Option<u16>,
    pub bootstrap: Vec<String>,
    pub threads: usize,
    pub join_timeout: u64,
    pub peer_timeout: u64,
    /// The node's folder: identity.key, metrics.jsonl, summary.json,
    /// params.safetensors (and checkpoints/).
    pub data_dir: PathBuf,
    /// Where it serves its Prometheus metrics.
    pub metrics_addr: Option<String>,
    pub min_nodes: Option<usize>,
    pub checkpoints: Option<CheckpointFlags>,
    /// Continue from its checkpoints.
    pub resume: bool,
    /// Hold before these base steps until the harness opens the gate (its
    /// files in `gate` of the data folder; `slowmo_runspec::gate`).
    pub hold_at: Vec<u64>,
    /// More arguments, passed last.
    pub extra: Vec<String>,
}

impl NodeLine {
    /// The arguments: `node`, then the flags.
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["node".into()];
        let mut flag = |k: &str, v: OsString| {
            a.push(k.into());
            a.push(v);
        };
        let dir = &self.data_dir;
        if let Some(config) = &self.config {
            flag("--config", config.into());
        }
        flag("--nodes", self.nodes.to_string().into());
        if let Some(id) = &self.run_id {
            flag("--run-id", id.into());
        }
        flag("--listen", (&self.listen).into());
        if let Some(port) = self.lane_port {
            flag("--lane-port", port.to_string().into());
        }
        flag("--threads", self.threads.to_string().into());
        flag("--join-timeout", self.join_timeout.to_string().into());
        flag("--peer-timeout", self.peer_timeout.to_string().into());
        flag("--identity", dir.join("identity.key").into());
        flag("--metrics-jsonl", dir.join("metrics.jsonl").into());
        flag("--summary-json", dir.join("summary.json").into());
        flag("--save-params", dir.join("params.safetensors").into());
        for peer in &self.bootstrap {
            flag("--bootstrap", peer.into());
        }
        if let Some(addr) = &self.metrics_addr {
            flag("--metrics-addr", addr.into());
        }
        if let Some(m) = self.min_nodes {
            flag("--min-nodes", m.to_string().into());
        }
        if let Some(c) = &self.checkpoints {
            flag("--checkpoint-dir", dir.join("checkpoints").into());
            if let Some(n) = c.every {
                flag("--checkpoint-every", n.to_string().into());
            }
            if let Some(k) = c.keep {
                flag("--checkpoint-keep", k.to_string().into());
            }
        }
        if self.resume {
            a.push("--resume".into());
        }
        if !self.hold_at.is_empty() {
            a.push("--gate-dir".into());
            a.push(gate_dir(dir).into());
            let steps: Vec<String> = self.hold_at.iter().map(u64::to_string).collect();
            a.push("--hold-at".into());
            a.push(steps.join(",").into());
        }
        a.extend(self.extra.iter().map(OsString::from));
        a
    }

    /// The arguments as text, for a compose file (whose paths are the
    /// container's, plain text).
    pub fn text_args(&self) -> Vec<String> {
        self.args()
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_indices_round_trip() {
        assert_eq!(node_name(3), "node-3");
        assert_eq!(node_index(&node_name(12)), Some(12));
        assert_eq!(node_index("node3"), None);
        assert_eq!(node_index("node-x"), None);
    }

    #[test]
    fn min_nodes_must_lie_between_one_and_the_node_count() {
        let with = |m| NodeRunFlags {
            min_nodes: m,
            ..Default::default()
        };
        assert!(with(None).check(4).is_ok());
        assert!(with(Some(1)).check(4).is_ok());
        assert!(with(Some(4)).check(4).is_ok());
        for bad in [0, 5] {
            let err = with(Some(bad)).check(4).unwrap_err();
            assert_eq!(
                err,
                format!("--min-nodes {bad}: must be between 1 and --nodes 4")
            );
        }
    }

    #[test]
    fn the_line_holds_every_setting_and_the_extras_last() {
        let line = NodeLine {
            nodes: 4,
            listen: "/ip4/127.0.0.1/udp/0/quic-v1".into(),
            bootstrap: vec!["/ip4/127.0.0.1/udp/9/quic-v1".into()],
            threads: 2,
            join_timeout: 60,
            peer_timeout: 30,
            data_dir: "/data".into(),
            min_nodes: Some(3),
            checkpoints: Some(CheckpointFlags {
                every: Some(2),
                keep: None,
            }),
            extra: vec!["--steps".into(), "7".into()],
            hold_at: vec![30, 60],
            ..NodeLine::default()
        };
        let a = line.text_args();
        let value = |k: &str| {
            a.windows(2)
                .find(|w| w[0] == k)
                .map(|w| w[1].clone())
                .unwrap_or_default()
        };
        assert_eq!(a[0], "node");
        assert_eq!(value("--peer-timeout"), "30");
        assert_eq!(value("--identity"), "/data/identity.key");
        assert_eq!(value("--checkpoint-dir"), "/data/checkpoints");
        assert_eq!(value("--min-nodes"), "3");
        assert_eq!(value("--gate-dir"), "/data/gate");
        assert_eq!(value("--hold-at"), "30,60");
        assert!(
            !a.iter()
                .any(|x| x == "--config" || x == "--run-id" || x == "--resume")
        );
        assert!(!a.iter().any(|x| x == "--checkpoint-keep"));
        assert_eq!(&a[a.len() - 2..], ["--steps", "7"]);
    }
}
