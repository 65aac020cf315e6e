//! `slowmo-testnet compose`: writes the docker-compose file of an N-node
//! testnet.
//!
//! Every node is one service on a private, internal bridge network with a
//! fixed address (node i at the subnet's .10+i), told the multiaddrs of all
//! other nodes (there is no mDNS in Docker), with its own named volume at
//! /data for its identity, metrics, summary and final parameters, a CPU limit
//! and thread count, and its link emulation handed to the image's entrypoint
//! through SLOWMO_* variables (see docker/entrypoint.sh). The run config is
//! embedded in the file, so the file alone describes the testnet.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use crate::node_line::{CheckpointFlags, NodeLine, node_name};
use crate::profile::{NodeShape, Profile, host_cpus, shapes_table};
use crate::yaml::Yaml;

/// Where a node keeps its files inside the container.
pub const DATA_DIR: &str = "/data";
/// Label holding a node's index.
pub const NODE_LABEL: &str = "org.slowmo.testnet.node";
/// Label holding a node's address on the testnet network.
pub const ADDRESS_LABEL: &str = "org.slowmo.testnet.address";
/// Label holding a one-line description of a node's shaping.
pub const SHAPE_LABEL: &str = "org.slowmo.testnet.shape";
/// Name of the testnet network in the compose file.
pub const NETWORK: &str = "testnet";

/// Errors of writing a compose file.
#[derive(Debug, thiserror::Error)]
pub enum ComposeError {
    #[error("--nodes {0}: a testnet needs at least 1 node")]
    NoNodes(usize),
    #[error("--subnet {subnet}: {message}")]
    Subnet { subnet: String, message: String },
    #[error("cannot read run config {path}: {source}")]
    ReadConfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("run config {path} is not valid TOML: {message}")]
    ParseConfig { path: PathBuf, message: String },
    #[error("{0}")]
    MinNodes(String),
    #[error("--image must not be empty")]
    NoImage,
    #[error("{0}")]
    Metrics(String),
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
}

/// The transport nodes listen and dial on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// QUIC over UDP (libp2p's quic-v1).
    Quic,
    /// TCP with Noise and Yamux.
    Tcp,
}

impl Transport {
    /// The multiaddr of `ip:port` on this transport.
    pub fn multiaddr(self, ip: Ipv4Addr, port: u16) -> String {
        match self {
            Transport::Quic => format!("/ip4/{ip}/udp/{port}/quic-v1"),
            Transport::Tcp => format!("/ip4/{ip}/tcp/{port}"),
        }
    }
}

/// Arguments of `slowmo-testnet compose`.
#[derive(Debug, Clone, clap::Args)]
pub struct ComposeArgs {
    /// Number of nodes.
    #[arg(long)]
    pub nodes: usize,
    /// Run config TOML every node trains with (base, steps, beta, ...).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Heterogeneity profile: lan, wan, mixed, or a profile TOML file
    /// (`slowmo-testnet profile mixed` shows the format).
    #[arg(long, default_value = "lan")]
    pub profile: String,
    /// Image the nodes run (docker/build-image.sh builds `slowmo:local`).
    #[arg(long, default_value = "slowmo:local")]
    pub image: String,
    /// Private IPv4 subnet of the testnet network; node i gets host .10+i.
    #[arg(long, default_value = "10.213.0.0/24")]
    pub subnet: String,
    /// Transport the nodes listen and dial on.
    #[arg(long, value_enum, default_value = "quic")]
    pub transport: Transport,
    /// Port every node listens on.
    #[arg(long, default_value_t = 4001)]
    pub port: u16,
    /// CPU cores shared out to nodes whose profile sets no `cpus`
    /// [default: this machine's cores].
    #[arg(long)]
    pub host_cpus: Option<f64>,
    /// Seconds a node waits for all others to join.
    #[arg(long, default_value_t = 180)]
    pub join_timeout: u64,
    /// Seconds a peer may stay silent.
    #[arg(long, default_value_t = 60)]
    pub peer_timeout: u64,
    #[command(flatten)]
    pub run: crate::node_line::NodeRunFlags,
    /// RUST_LOG of the nodes.
    #[arg(long, default_value = "info")]
    pub log: String,
    /// Write the file here instead of to stdout.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Publish each node's Prometheus endpoint on this host: node i at
    /// 127.0.0.1:(PORT + i) [default with --prometheus-config: 9100].
    #[arg(long, value_name = "PORT")]
    pub metrics_port: Option<u16>,
    /// Also write a Prometheus scrape configuration for those endpoints.
    #[arg(long, value_name = "FILE")]
    pub prometheus_config: Option<PathBuf>,
    /// More `slowmo node` arguments for every node, after `--`
    /// (e.g. `-- --steps 50 --staleness 2`).
    #[arg(last = true)]
    pub node_args: Vec<String>,
}

/// Everything a compose file is made from.
#[derive(Debug, Clone)]
pub struct TestnetSpec {
    pub image: String,
    pub network: Ipv4Net,
    pub transport: Transport,
    pub port: u16,
    /// TOML text of the run config, if any.
    pub run_config: Option<String>,
    pub profile: Profile,
    pub shapes: Vec<NodeShape>,
    pub join_timeout: u64,
    pub peer_timeout: u64,
    pub min_nodes: Option<usize>,
    pub checkpoints: Option<CheckpointFlags>,
    pub log: String,
    pub node_args: Vec<String>,
    /// Host ports of the nodes' metrics endpoints, if published.
    pub metrics_ports: Option<Vec<u16>>,
}

/// An IPv4 network, `address/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Net {
    pub base: Ipv4Addr,
    pub prefix: u8,
}

impl Ipv4Net {
    /// Parses `A.B.C.D/P`, requiring a private (RFC 1918) range: testnet
    /// traffic must stay on this machine.
    pub fn parse(text: &str) -> Result<Self, ComposeError> {
        let err = |message: &str| ComposeError::Subnet {
            subnet: text.to_string(),
            message: message.to_string(),
        };
        let (addr, prefix) = text
            .split_once('/')
            .ok_or_else(|| err("expected ADDRESS/PREFIX, e.g. 10.213.0.0/24"))?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| err("not an IPv4 address"))?;
        let prefix: u8 = prefix.parse().map_err(|_| err("prefix is not a number"))?;
        if !(8..=28).contains(&prefix) {
            return Err(err("prefix must be between 8 and 28"));
        }
        if !addr.is_private() {
            return Err(err(
                "must be a private range (10/8, 172.16/12, 192.168/16) so traffic stays on this machine",
            ));
        }
        let mask = u32::MAX << (32 - prefix);
        let base = Ipv4Addr::from(u32::from(addr) & mask);
        Ok(Ipv4Net { base, prefix })
    }

    /// How many nodes fit (hosts .10 up to the last before broadcast).
    pub fn capacity(&self) -> usize {
        (1usize << (32 - self.prefix)) - 11
    }

    /// Address of node `index`.
    pub fn node_ip(&self, index: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + 10 + index as u32)
    }
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

impl TestnetSpec {
    /// Builds the spec from the command-line arguments (reads the config
    /// and profile files).
    pub fn from_args(args: &ComposeArgs) -> Result<Self, ComposeError> {
        if args.nodes == 0 {
            return Err(ComposeError::NoNodes(args.nodes));
        }
        if args.image.trim().is_empty() {
            return Err(ComposeError::NoImage);
        }
        let network = Ipv4Net::parse(&args.subnet)?;
        if args.nodes > network.capacity() {
            return Err(ComposeError::Subnet {
                subnet: args.subnet.clone(),
                message: format!(
                    "holds {} nodes (hosts .10 and up), {} asked for",
                    network.capacity(),
                    args.nodes
                ),
            });
        }
        let run_config = match &args.config {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| ComposeError::ReadConfig {
                        path: path.clone(),
                        source,
                    })?;
                toml::from_str::<toml::Table>(&text).map_err(|e| ComposeError::ParseConfig {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                Some(text)
            }
            None => None,
        };
        args.run.check(args.nodes).map_err(ComposeError::MinNodes)?;
        let profile = Profile::load(&args.profile)?;
        let default_cpus = args.host_cpus.unwrap_or_else(host_cpus) / args.nodes as f64;
        let shapes = profile.resolve(args.nodes, default_cpus)?;
        let base = args
            .metrics_port
            .or(args.prometheus_config.as_ref().map(|_| 9100));
        let metrics_ports = base
            .map(|p| crate::observe::metrics_ports("--metrics-port", p, args.nodes))
            .transpose()
            .map_err(|e| ComposeError::Metrics(e.to_string()))?;
        Ok(TestnetSpec {
            metrics_ports,
            image: args.image.clone(),
            network,
            transport: args.transport,
            port: args.port,
            run_config,
            profile,
            shapes,
            join_timeout: args.join_timeout,
            peer_timeout: args.peer_timeout,
            min_nodes: args.run.min_nodes,
            checkpoints: args.run.checkpoint_flags(false),
            log: args.log.clone(),
            node_args: args.node_args.clone(),
        })
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.shapes.len()
    }

    /// The multiaddr node `index` listens on.
    pub fn listen_addr(&self, index: usize) -> String {
        self.transport
            .multiaddr(self.network.node_ip(index), self.port)
    }

    /// The `slowmo` arguments of node `index` (after the image's
    /// entrypoint): every other node is a bootstrap peer, the files are in
    /// its volume at [`DATA_DIR`].
    pub fn node_command(&self, index: usize) -> Vec<String> {
        NodeLine {
            config: self
                .run_config
                .as_ref()
                .map(|_| format!("{DATA_DIR}/run.toml").into()),
            nodes: self.nodes(),
            run_id: None,
            listen: self.listen_addr(index),
            // Each container has its own addresses: the default (the TCP
            // listen port plus one) is free there.
            lane_port: None,
            bootstrap: (0..self.nodes())
                .filter(|&j| j != index)
                .map(|j| self.listen_addr(j))
                .collect(),
            threads: self.shapes[index].threads as usize,
            join_timeout: self.join_timeout,
            peer_timeout: self.peer_timeout,
            data_dir: DATA_DIR.into(),
            metrics_addr: self
                .metrics_ports
                .as_ref()
                .map(|_| format!("0.0.0.0:{}", crate::observe::CONTAINER_METRICS_PORT)),
            min_nodes: self.min_nodes,
            checkpoints: self.checkpoints.clone(),
            resume: false,
            hold_at: Vec::new(),
            extra: self.node_args.clone(),
        }
        .text_args()
    }

    /// The compose file as a YAML tree.
    pub fn to_yaml_tree(&self) -> Yaml {
        let mut services = Yaml::map();
        let mut volumes = Yaml::map();
        for shape in &self.shapes {
            let name = node_name(shape.index);
            let ip = self.network.node_ip(shape.index);
            let mut env = Yaml::map()
                .with("RAYON_NUM_THREADS", shape.threads.to_string())
                .with("RUST_LOG", escape_dollars(&self.log));
            if let Some(text) = &self.run_config {
                env.insert("SLOWMO_RUN_CONFIG", escape_dollars(text));
            }
            let link = [
                ("SLOWMO_DELAY_MS", shape.delay_ms),
                ("SLOWMO_JITTER_MS", shape.jitter_ms),
                ("SLOWMO_LOSS_PERCENT", shape.loss_percent),
                ("SLOWMO_RATE_MBIT", shape.rate_mbit.unwrap_or(0.0)),
            ];
            for (key, value) in link {
                if value > 0.0 {
                    env.insert(key, format_number(value));
                }
            }
            let mut service = Yaml::map()
                .with("image", self.image.as_str())
                .with("hostname", name.as_str())
                .with("command", self.node_command(shape.index))
                .with("environment", env)
                .with("cap_add", vec!["NET_ADMIN"])
                .with("init", true)
                .with("restart", "no")
                .with("stop_grace_period", "10s")
                .with("cpus", shape.cpus);
            if let Some(set) = &shape.cpuset {
                service.insert("cpuset", set.as_str());
            }
            if let Some(shares) = shape.cpu_shares {
                service.insert("cpu_shares", i64::from(shares));
            }
            let mut networks =
                Yaml::map().with(NETWORK, Yaml::map().with("ipv4_address", ip.to_string()));
            if let Some(ports) = &self.metrics_ports {
                crate::observe::publish(&mut service, &mut networks, ports[shape.index]);
            }
            service.insert("networks", networks);
            service.insert("volumes", vec![format!("{name}-data:{DATA_DIR}")]);
            service.insert(
                "labels",
                Yaml::map()
                    .with(NODE_LABEL, shape.index.to_string())
                    .with(ADDRESS_LABEL, ip.to_string())
                    .with(SHAPE_LABEL, describe_shape(shape)),
            );
            services.insert(&name, service);
            volumes.insert(&format!("{name}-data"), Yaml::map());
        }
        let network = Yaml::map()
            .with("driver", "bridge")
            .with("internal", true)
            .with(
                "ipam",
                Yaml::map().with(
                    "config",
                    Yaml::List(vec![Yaml::map().with("subnet", self.network.to_string())]),
                ),
            );
        let mut networks = Yaml::map().with(NETWORK, network);
        if self.metrics_ports.is_some() {
            crate::observe::add_metrics_network(&mut networks);
        }
        Yaml::map()
            .with("version", "2.4")
            .with("services", services)
            .with("networks", networks)
            .with("volumes", volumes)
    }

    /// The compose file's text: a comment header describing the testnet,
    /// then the YAML.
    pub fn to_compose_file(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# slowmo testnet: {} nodes, profile `{}` ({}), {:?} on {}, image {}",
            self.nodes(),
            self.profile.name,
            if self.profile.description.is_empty() {
                "no description"
            } else {
                &self.profile.description
            },
            self.transport,
            self.network,
            self.image
        );
        out.push_str("# Written by `slowmo-testnet compose`; start it with `slowmo-testnet up -f FILE -p PROJECT --wait`.\n#\n");
        for line in shapes_table(&self.shapes).lines() {
            let _ = writeln!(out, "# {line}");
        }
        out.push('\n');
        out.push_str(&self.to_yaml_tree().to_yaml());
        out
    }
}

/// A short description of a node's limits, for labels and tables.
pub fn describe_shape(shape: &NodeShape) -> String {
    let mut parts = vec![format!("cpus={}", format_number(shape.cpus))];
    if let Some(set) = &shape.cpuset {
        parts.push(format!("cpuset={set}"));
    }
    if shape.delay_ms > 0.0 || shape.jitter_ms > 0.0 {
        parts.push(format!(
            "delay={}±{}ms",
            format_number(shape.delay_ms),
            format_number(shape.jitter_ms)
        ));
    }
    if shape.loss_percent > 0.0 {
        parts.push(format!("loss={}%", format_number(shape.loss_percent)));
    }
    if let Some(rate) = shape.rate_mbit {
        parts.push(format!("rate={}Mbit", format_number(rate)));
    }
    parts.join(" ")
}

/// A number without trailing zeros ("20", "0.5", "0.17").
fn format_number(v: f64) -> String {
    let s = format!("{:.3}", v);
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Compose substitutes `$VAR` in values; `$$` is a literal dollar.
fn escape_dollars(text: &str) -> String {
    text.replace('$', "$$")
}

/// `slowmo-testnet compose`: writes the file to stdout or `--output`.
pub fn run(args: ComposeArgs) -> anyhow::Result<()> {
    let spec = TestnetSpec::from_args(&args)?;
    let text = spec.to_compose_file();
    match &args.output {
        Some(path) => {
            std::fs::write(path, text)
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
            eprintln!(
                "wrote {} ({} nodes, profile {})",
                path.display(),
                spec.nodes(),
                spec.profile.name
            );
        }
        None => print!("{text}"),
    }
    if let (Some(path), Some(ports)) = (&args.prometheus_config, &spec.metrics_ports) {
        crate::observe::write_prometheus_config(path, ports)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nodes: usize, profile: &str) -> ComposeArgs {
        ComposeArgs {
            nodes,
            config: None,
            profile: profile.into(),
            image: "slowmo:test".into(),
            subnet: "10.213.0.0/24".into(),
            transport: Transport::Quic,
            port: 4001,
            host_cpus: Some(2.0),
            join_timeout: 60,
            peer_timeout: 45,
            run: Default::default(),
            log: "info".into(),
            output: None,
            metrics_port: None,
            prometheus_config: None,
            node_args: vec!["--steps".into(), "7".into()],
        }
    }

    #[test]
    fn every_node_gets_a_fixed_address_and_all_others_as_bootstrap() {
        let spec = TestnetSpec::from_args(&args(4, "lan")).unwrap();
        let cmd = spec.node_command(1);
        let values = |flag: &str| -> Vec<String> {
            cmd.windows(2)
                .filter(|w| w[0] == flag)
                .map(|w| w[1].clone())
                .collect()
        };
        assert_eq!(
            values("--listen"),
            vec!["/ip4/10.213.0.11/udp/4001/quic-v1"]
        );
        assert_eq!(
            values("--bootstrap"),
            vec![
                "/ip4/10.213.0.10/udp/4001/quic-v1",
                "/ip4/10.213.0.12/udp/4001/quic-v1",
                "/ip4/10.213.0.13/udp/4001/quic-v1"
            ]
        );
        assert_eq!(values("--nodes"), vec!["4"]);
        assert_eq!(values("--peer-timeout"), vec!["45"]);
        assert_eq!(values("--identity"), vec!["/data/identity.key"]);
        assert!(
            values("--config").is_empty(),
            "no config given, none passed"
        );
        assert_eq!(&cmd[cmd.len() - 2..], ["--steps", "7"]);
        let tree = spec.to_yaml_tree();
        let ip = tree.at(&["services", "node-3", "networks", NETWORK, "ipv4_address"]);
        assert_eq!(ip.and_then(Yaml::as_str), Some("10.213.0.13"));
        assert_eq!(
            tree.at(&["services", "node-3", "cpus"]),
            Some(&Yaml::Float(0.5)),
            "two host cores shared by four nodes"
        );
        assert_eq!(
            tree.at(&["networks", NETWORK, "internal"]),
            Some(&Yaml::Bool(true))
        );
        assert_eq!(tree.at(&["volumes"]).unwrap().keys().len(), 4);
        let tcp = TestnetSpec::from_args(&ComposeArgs {
            transport: Transport::Tcp,
            ..args(2, "lan")
        })
        .unwrap();
        assert_eq!(tcp.listen_addr(1), "/ip4/10.213.0.11/tcp/4001");
    }

    #[test]
    fn mixed_profile_reaches_limits_and_entrypoint_variables() {
        let spec = TestnetSpec::from_args(&args(4, "mixed")).unwrap();
        let tree = spec.to_yaml_tree();
        let env = |node: &str, key: &str| {
            tree.at(&["services", node, "environment", key])
                .and_then(Yaml::as_str)
                .map(str::to_string)
        };
        assert_eq!(env("node-2", "SLOWMO_RATE_MBIT").as_deref(), Some("20"));
        assert_eq!(env("node-0", "SLOWMO_RATE_MBIT"), None);
        assert_eq!(env("node-3", "RAYON_NUM_THREADS").as_deref(), Some("1"));
        assert_eq!(
            tree.at(&["services", "node-3", "cpus"]),
            Some(&Yaml::Float(0.17))
        );
        let text = spec.to_compose_file();
        assert!(text.contains("# node-3"), "{text}");
        assert!(text.contains("slow-cpu"));
    }

    #[test]
    fn run_config_is_embedded_with_dollars_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(&path, "base = \"sgp\"\nsteps = 200\nrun = \"a$b\"\n").unwrap();
        let spec = TestnetSpec::from_args(&ComposeArgs {
            config: Some(path.clone()),
            ..args(2, "lan")
        })
        .unwrap();
        let tree = spec.to_yaml_tree();
        let config = tree
            .at(&["services", "node-0", "environment", "SLOWMO_RUN_CONFIG"])
            .and_then(Yaml::as_str)
            .unwrap();
        assert_eq!(config, "base = \"sgp\"\nsteps = 200\nrun = \"a$$b\"\n");
        assert!(
            spec.node_command(0)
                .windows(2)
                .any(|w| w == ["--config", "/data/run.toml"])
        );

        std::fs::write(&path, "base = ").unwrap();
        let err = TestnetSpec::from_args(&ComposeArgs {
            config: Some(path.clone()),
            ..args(2, "lan")
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("run.toml") && err.contains("TOML"), "{err}");
    }

    #[test]
    fn bad_arguments_are_refused_with_the_flag_named() {
        let cases = [
            (
                ComposeArgs {
                    nodes: 0,
                    ..args(1, "lan")
                },
                "--nodes",
            ),
            (
                ComposeArgs {
                    subnet: "8.8.8.0/24".into(),
                    ..args(2, "lan")
                },
                "private",
            ),
            (
                ComposeArgs {
                    subnet: "10.0.0.0".into(),
                    ..args(2, "lan")
                },
                "ADDRESS/PREFIX",
            ),
            (
                ComposeArgs {
                    subnet: "10.0.0.0/28".into(),
                    ..args(6, "lan")
                },
                "holds 5 nodes",
            ),
            (
                ComposeArgs {
                    image: " ".into(),
                    ..args(2, "lan")
                },
                "--image",
            ),
            (args(2, "moon"), "unknown profile `moon`"),
        ];
        for (a, needle) in cases {
            let err = TestnetSpec::from_args(&a).unwrap_err().to_string();
            assert!(err.contains(needle), "expected `{needle}` in: {err}");
        }
    }

    #[test]
    fn shape_descriptions_are_short() {
        let spec = TestnetSpec::from_args(&args(4, "wan")).unwrap();
        assert_eq!(
            describe_shape(&spec.shapes[0]),
            "cpus=0.5 delay=30±3ms rate=100Mbit"
        );
    }
}
