//! What a node needs to know to join a run: who it is, where it listens,
//! whom it asks first, and what every member of the run must share.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::admission::Admission;
use super::run_id::check_run_id;
use crate::Rank;

/// What every member of one run shares. A peer whose identity differs in any
/// field is refused at join, with the field named on both sides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunIdentity {
    /// Name of the run (free text, chosen by the operator).
    pub run_id: String,
    /// Hash of the run configuration (hex).
    pub config_hash: String,
    /// Hash of the initial parameters x_{0,0} (hex).
    pub init_hash: String,
}

impl RunIdentity {
    /// The first field in which `theirs` differs from `self`, as
    /// `(field name, ours, theirs)`.
    pub fn first_difference(&self, theirs: &RunIdentity) -> Option<(&'static str, String, String)> {
        let fields = [
            ("run id", &self.run_id, &theirs.run_id),
            ("config hash", &self.config_hash, &theirs.config_hash),
            ("init hash", &self.init_hash, &theirs.init_hash),
        ];
        fields
            .into_iter()
            .find(|(_, ours, theirs)| ours != theirs)
            .map(|(name, ours, theirs)| (name, ours.clone(), theirs.clone()))
    }
}

/// The ranks a rank exchanges with in a view of a given size
/// ([`P2pConfig::lane_peers`]).
#[derive(Clone)]
pub struct LanePeers(pub std::sync::Arc<dyn Fn(Rank, usize) -> Vec<Rank> + Send + Sync>);

impl std::fmt::Debug for LanePeers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LanePeers(..)")
    }
}

/// Configuration of a [`P2pComm`](super::P2pComm).
///
/// Built with [`P2pConfig::new`] (defaults that work on one machine) and
/// adjusted through the public fields or the `with_*` builders.
#[derive(Debug, Clone)]
pub struct P2pConfig {
    /// Multiaddrs to listen on, e.g. `/ip4/0.0.0.0/udp/4001/quic-v1` (QUIC,
    /// preferred) and `/ip4/0.0.0.0/tcp/4001` (TCP + Noise + Yamux fallback).
    pub listen: Vec<String>,
    /// Multiaddrs of peers to contact first, with or without `/p2p/<id>`.
    pub bootstrap: Vec<String>,
    /// Where the ed25519 keypair lives (protobuf encoding). Created on the
    /// first run and reused after, so the peer id (and hence the rank order)
    /// is stable across restarts. `None`: a fresh identity each start.
    pub identity_file: Option<PathBuf>,
    /// Also discover peers on the local network by mDNS.
    pub mdns: bool,
    /// Serve as a relay (circuit relay v2) and AutoNAT server for nodes
    /// behind NATs. A relay must be reachable at its listen addresses (or
    /// at `external_addrs`); relayed connections carry the control plane
    /// and the hole punch, not tensors.
    pub relay: bool,
    /// Send tensors to a peer reachable only through a relay over the relay
    /// (off by default: a relay's bandwidth is shared, and tensors are
    /// large). As a relay (`relay`): carry such circuits without a byte
    /// limit.
    pub relay_tensors: bool,
    /// Ask the router for port mappings of the listen ports by UPnP IGD
    /// (where the router allows it): a mapped port makes the node
    /// reachable from outside, and the mapping is its external address.
    pub upnp: bool,
    /// Addresses at which this node is reachable from outside (a forwarded
    /// port, a public IP the machine does not see), taken as confirmed: they
    /// go in the hellos and in relay reservations.
    pub external_addrs: Vec<String>,
    /// The run starts once this many verified peers (including this one)
    /// agree on the same member list.
    pub nodes: usize,
    /// Fewest members the run trains with: after a view change that leaves
    /// fewer, the members wait (up to the join timeout) for joiners before
    /// they go on, and then stop with an error.
    pub min_nodes: usize,
    /// How long [`P2pComm::start`](super::P2pComm::start) waits for the
    /// members before giving up.
    pub join_timeout: Duration,
    /// How long an operation waits for a silent peer before it reports
    /// [`CommError::PeerTimeout`](crate::CommError::PeerTimeout).
    pub peer_timeout: Duration,
    /// Run id, config hash and initial-parameter hash every member must share.
    pub run: RunIdentity,
    /// Length of the flat parameter buffer this run exchanges by push-sum.
    pub payload_floats: usize,
    /// How push-sum shares are compressed ([`crate::compress`]): part of the
    /// run's settings, the same on every member, so a receiver knows the
    /// exact size of every share before reading it.
    pub compress: crate::compress::Compression,
    /// Hard cap on one message's payload, in bytes (the CBOR header has its
    /// own small cap). Must hold one push-sum share; all-reduce messages are
    /// cut to fit.
    pub max_message_bytes: u64,
    /// The round window: how many rounds ahead of ours a peer's push-sum
    /// share may be ([`DEFAULT_ROUND_WINDOW`] unless set). Shares further
    /// ahead are dropped and logged; so is a peer that buffers more than
    /// this many shares with us, or whose lane shares run more than this
    /// many ahead of the one still missing.
    pub round_window: u64,
    /// Floats per all-reduce message: the pipeline's unit, and the bound on
    /// the extra memory each ring neighbour costs (a few chunks).
    pub chunk_floats: usize,
    /// All-reduces of at most this many bytes whose segments fit in one
    /// chunk take the direct schedule ([`crate::Schedule::choose`]; 0: the
    /// ring always). Every node of a run must use the same.
    pub direct_max_bytes: usize,
    /// Rejected messages after which a peer is disconnected.
    pub max_offences: u32,
    /// Threads of the node's own tokio runtime.
    pub worker_threads: usize,
    /// How tensor bytes travel: the encrypted lane (default), the plaintext
    /// lane, or libp2p streams ([`DataLane`]).
    pub data_lane: DataLane,
    /// Lane connections per direction and peer (see
    /// [`default_connections`]).
    pub lane_connections: usize,
    /// The TCP port the data lane listens on: `Some(0)` any free port,
    /// `None` the rule of [`P2pConfig::lane_port`] (the TCP listen port
    /// plus one when a TCP listen port is given), so that a firewall can
    /// name both ports.
    pub lane_port: Option<u16>,
    /// The settings text whose SHA-256 is `run.config_hash`, served to a
    /// joiner that presents the run id and that hash (a join ticket;
    /// [`crate::p2p::settings`]); empty: not served.
    pub settings_text: String,
    /// The ranks a rank exchanges push-sum shares with in a view of the
    /// given size (the graph's neighbours, `Topology::neighbours`): lanes
    /// are set up to those (and to the all-reduce's ring neighbours) when a
    /// view begins, to anyone else only if a message goes there. `None`:
    /// to every member.
    pub lane_peers: Option<LanePeers>,
    /// Where libp2p's own metrics go (connections, protocols, bandwidth,
    /// identify and ping), for a Prometheus endpoint; `None`: not recorded.
    pub metrics: Option<MetricsRegistry>,
    /// Who may join the run ([`Admission::Open`] by default).
    pub admission: Admission,
    /// The settings behind `run.config_hash`, by name (optional): shown to
    /// admitted peers so that a config hash that differs is explained by
    /// the settings that differ.
    pub settings: BTreeMap<String, String>,
}

/// How tensor bytes travel between members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataLane {
    /// The lane, every record sealed with AEGIS-256X4 (the default).
    #[default]
    Encrypted,
    /// The lane without the cipher: the connections are still set up only
    /// by peers that hold the lane's key (for a private network one trusts).
    Plaintext,
    /// No lane: tensors go over libp2p streams like the control messages.
    Libp2p,
}

impl DataLane {
    pub fn name(self) -> &'static str {
        match self {
            DataLane::Encrypted => "encrypted",
            DataLane::Plaintext => "plaintext",
            DataLane::Libp2p => "libp2p",
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            DataLane::Encrypted => 1,
            DataLane::Plaintext => 2,
            DataLane::Libp2p => 3,
        }
    }
}

impl std::fmt::Display for DataLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DataLane {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "encrypted" => Ok(DataLane::Encrypted),
            "plaintext" => Ok(DataLane::Plaintext),
            "libp2p" => Ok(DataLane::Libp2p),
            other => Err(format!(
                "`{other}` is not a data lane: expected encrypted, plaintext or libp2p"
            )),
        }
    }
}

/// Connections per direction when the configuration does not say: one per
/// core, 2 to 8.
pub fn default_connections() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 8)
}

/// Most connections per direction a peer may open.
pub const MAX_CONNECTIONS: usize = 64;
/// The round window of a run unless its configuration sets
/// [`P2pConfig::round_window`]: a peer refuses push-sum shares more than this
/// many rounds ahead of its own. This is the one place the number lives: the
/// inbox's staleness limit and the lane's cap on shares held ahead follow
/// the configured window, and the run configuration's largest staleness
/// bound (`MAX_STALENESS` in the run spec) stays well inside it.
pub const DEFAULT_ROUND_WINDOW: u64 = 256;

/// A Prometheus registry shared between the swarm and a metrics endpoint.
pub type MetricsRegistry = std::sync::Arc<std::sync::Mutex<libp2p::metrics::Registry>>;

impl P2pConfig {
    /// Defaults for a run of `nodes` peers exchanging `payload_floats` floats:
    /// listen on 127.0.0.1 (QUIC and TCP, ephemeral ports), no bootstrap, no
    /// mDNS, fresh identity, 60 s join and peer timeouts, a size cap of one
    /// payload or one all-reduce chunk, whichever is larger.
    pub fn new(run: RunIdentity, nodes: usize, payload_floats: usize) -> Self {
        let chunk_floats = crate::CHUNK_FLOATS;
        let workers = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 4);
        Self {
            listen: vec![
                "/ip4/127.0.0.1/udp/0/quic-v1".to_string(),
                "/ip4/127.0.0.1/tcp/0".to_string(),
            ],
            bootstrap: Vec::new(),
            identity_file: None,
            mdns: false,
            relay: false,
            relay_tensors: false,
            upnp: false,
            external_addrs: Vec::new(),
            nodes,
            min_nodes: 1,
            join_timeout: Duration::from_secs(60),
            peer_timeout: Duration::from_secs(60),
            run,
            payload_floats,
            compress: crate::compress::Compression::None,
            max_message_bytes: 4 * payload_floats.max(chunk_floats) as u64,
            round_window: DEFAULT_ROUND_WINDOW,
            chunk_floats,
            direct_max_bytes: crate::DIRECT_MAX_BYTES,
            max_offences: 16,
            worker_threads: workers,
            data_lane: DataLane::default(),
            lane_connections: default_connections(),
            lane_port: None,
            settings_text: String::new(),
            lane_peers: None,
            metrics: None,
            admission: Admission::Open,
            settings: BTreeMap::new(),
        }
    }

    /// The config of a swarm that joins no run (the relay, the doctor):
    /// `listen` and the defaults, under the run id `name`.
    pub(crate) fn outside_run(name: &str, listen: &[String]) -> Self {
        let run = RunIdentity {
            run_id: name.into(),
            config_hash: String::new(),
            init_hash: String::new(),
        };
        let mut cfg = Self::new(run, 1, 1);
        cfg.listen = listen.to_vec();
        cfg
    }

    /// The data lane's TCP port: the configured one, else the first TCP
    /// listen port (not 0) plus one, else 0 (any free port). Two ports
    /// side by side are what a firewall rule names; the lane cannot share
    /// the libp2p listener's port, whose connections libp2p accepts.
    pub fn lane_port(&self) -> u16 {
        self.lane_port
            .unwrap_or_else(|| default_lane_port(&self.listen))
    }

    /// Compresses push-sum shares with `codec` ([`crate::compress`]).
    pub fn with_compression(mut self, codec: crate::compress::Compression) -> Self {
        self.compress = codec;
        self
    }

    /// Chooses how tensor bytes travel ([`DataLane`]).
    pub fn with_data_lane(mut self, lane: DataLane) -> Self {
        self.data_lane = lane;
        self
    }

    /// Sets the lane's connections per direction and peer (1 to 64).
    pub fn with_lane_connections(mut self, k: usize) -> Self {
        self.lane_connections = k;
        self
    }

    /// Replaces the listen addresses.
    pub fn with_listen<S: Into<String>>(mut self, addrs: impl IntoIterator<Item = S>) -> Self {
        self.listen = addrs.into_iter().map(Into::into).collect();
        self
    }

    /// Replaces the bootstrap addresses.
    pub fn with_bootstrap<S: Into<String>>(mut self, addrs: impl IntoIterator<Item = S>) -> Self {
        self.bootstrap = addrs.into_iter().map(Into::into).collect();
        self
    }

    /// Keeps the keypair in `path` (created if missing).
    pub fn with_identity_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.identity_file = Some(path.into());
        self
    }

    /// Turns mDNS discovery on or off.
    pub fn with_mdns(mut self, on: bool) -> Self {
        self.mdns = on;
        self
    }

    /// Sets the join timeout.
    pub fn with_join_timeout(mut self, timeout: Duration) -> Self {
        self.join_timeout = timeout;
        self
    }

    /// Sets the peer timeout.
    pub fn with_peer_timeout(mut self, timeout: Duration) -> Self {
        self.peer_timeout = timeout;
        self
    }

    /// Sets the all-reduce chunk size (floats, at least 1).
    pub fn with_chunk_floats(mut self, chunk: usize) -> Self {
        self.chunk_floats = chunk.max(1);
        self
    }

    /// The largest all-reduce message, in floats: a chunk, as far as the
    /// message cap allows.
    pub(crate) fn message_floats(&self) -> usize {
        self.chunk_floats
            .min((self.max_message_bytes / 4) as usize)
            .max(1)
    }

    /// The ranks `rank` sets up lanes to in a view of `m`: its graph
    /// neighbours ([`P2pConfig::lane_peers`]), its ring neighbours, and
    /// everyone when the all-reduce may take the direct schedule. Symmetric
    /// (so both ends agree on each pair), sorted, without `rank`.
    pub(crate) fn lane_set(&self, rank: Rank, m: usize) -> Vec<Rank> {
        if m <= 1 {
            return Vec::new();
        }
        let mut set: Vec<Rank> = match &self.lane_peers {
            Some(f) if !crate::Schedule::direct_possible(m, self.direct_max_bytes) => {
                let mut s = f.0(rank, m);
                s.extend([(rank + 1) % m, (rank + m - 1) % m]);
                s
            }
            _ => (0..m).collect(),
        };
        set.sort_unstable();
        set.dedup();
        set.retain(|r| *r != rank && *r < m);
        set
    }

    /// The schedule of an all-reduce of `n` floats over `m` ranks.
    pub fn schedule(&self, n: usize, m: usize) -> crate::Schedule {
        crate::Schedule::choose(n, m, self.message_floats(), self.direct_max_bytes)
    }

    /// Checks what [`P2pComm::start`](super::P2pComm::start) cannot work
    /// without, naming the field.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.nodes == 0 {
            return Err("nodes must be at least 1".into());
        }
        if self.min_nodes == 0 || self.min_nodes > self.nodes {
            return Err(format!(
                "min_nodes {} must be between 1 and the run's {} nodes",
                self.min_nodes, self.nodes
            ));
        }
        if self.listen.is_empty() {
            return Err("listen: at least one multiaddr is needed".into());
        }
        check_run_id(&self.run.run_id).map_err(|e| format!("run.run_id: {e}"))?;
        if self.data_lane != DataLane::Libp2p
            && !(1..=MAX_CONNECTIONS).contains(&self.lane_connections)
        {
            return Err(format!(
                "lane_connections {} is outside 1..={}",
                self.lane_connections, MAX_CONNECTIONS
            ));
        }
        if self.chunk_floats == 0 {
            return Err("chunk_floats must be at least 1".into());
        }
        if self.max_message_bytes < 4 * self.payload_floats as u64 || self.max_message_bytes < 4 {
            return Err(format!(
                "max_message_bytes {} is below one payload ({} bytes)",
                self.max_message_bytes,
                4 * self.payload_floats
            ));
        }
        Ok(())
    }
}

/// The lane port of a node listening at `listen` (or, given a peer's
/// address, that peer's) unless one is configured: the first TCP port (not
/// 0) plus one, else 0, any free port. No port follows 65535.
pub fn default_lane_port(listen: &[String]) -> u16 {
    listen
        .iter()
        .find_map(|a| tcp_port_of(a))
        .filter(|p| *p != 0)
        .map_or(0, |p| p.checked_add(1).unwrap_or(0))
}

/// The port of a plain TCP address (`/ip4/A/tcp/P`, `/ip6/...`,
/// `/dns/...`, with or without `/p2p/<id>`); `None` for QUIC, a relayed
/// address or text that is not a multiaddr.
pub fn tcp_port_of(addr: &str) -> Option<u16> {
    use libp2p::multiaddr::Protocol;
    let addr: libp2p::Multiaddr = addr.parse().ok()?;
    let mut parts = addr.iter();
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (
            Some(
                Protocol::Ip4(_)
                | Protocol::Ip6(_)
                | Protocol::Dns(_)
                | Protocol::Dns4(_)
                | Protocol::Dns6(_),
            ),
            Some(Protocol::Tcp(port)),
            None | Some(Protocol::P2p(_)),
            None,
        ) => Some(port),
        _ => None,
    }
}

#[cfg(test)]
mod lane_port_tests {
    use super::*;

    fn cfg(listen: &[&str], lane: Option<u16>) -> P2pConfig {
        let run = RunIdentity {
            run_id: "r".into(),
            config_hash: String::new(),
            init_hash: String::new(),
        };
        let mut c = P2pConfig::new(run, 2, 1);
        c.listen = listen.iter().map(|s| s.to_string()).collect();
        c.lane_port = lane;
        c
    }

    #[test]
    fn the_lane_port_follows_the_tcp_listen_port_unless_given() {
        let tcp = ["/ip4/0.0.0.0/udp/7000/quic-v1", "/ip4/0.0.0.0/tcp/7000"];
        assert_eq!(cfg(&tcp, None).lane_port(), 7001);
        assert_eq!(cfg(&tcp, Some(9000)).lane_port(), 9000);
        assert_eq!(cfg(&tcp, Some(0)).lane_port(), 0);
        // QUIC only, or an ephemeral TCP port: any free port.
        assert_eq!(cfg(&["/ip4/0.0.0.0/udp/7000/quic-v1"], None).lane_port(), 0);
        assert_eq!(cfg(&["/ip4/127.0.0.1/tcp/0"], None).lane_port(), 0);
        // No port after 65535.
        assert_eq!(cfg(&["/ip4/127.0.0.1/tcp/65535"], None).lane_port(), 0);
        // A relayed address names the relay's port, not ours.
        let relayed = "/ip4/1.2.3.4/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit";
        assert_eq!(cfg(&[relayed], None).lane_port(), 0);
    }
}
