//! `slowmo doctor`: before a long run, what a node would see of the
//! network. Listens as a node would, dials the bootstrap addresses, takes a
//! relay reservation where one is offered, asks AutoNAT which of its
//! addresses are reachable, and (given a peer's address) tries to reach
//! that peer directly, by hole punching if need be. Joins no run.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libp2p::{Multiaddr, PeerId};
use tokio::sync::mpsc;

use super::addrs::{parse_addrs, peer_in, strip_peer};
use super::behaviour;
use super::command::SwarmCmd;
use super::config::P2pConfig;
use super::identity;
use super::nat::NatSetup;
use super::reach::{ConnectionKind, Reach, ReachState};
use crate::CommError;
use crate::sync::lock;

/// What to check.
#[derive(Debug, Clone)]
pub struct DoctorConfig {
    pub listen: Vec<String>,
    pub bootstrap: Vec<String>,
    pub external: Vec<String>,
    /// A peer to reach (a multiaddr ending in `/p2p/<id>`, direct or
    /// relayed).
    pub peer: Option<String>,
    /// How long to watch (with `upnp`, at least [`UPNP_WAIT`]).
    pub wait: Duration,
    /// Ask the router for port mappings by UPnP, as the node would.
    pub upnp: bool,
}

/// How long the doctor waits for the router's answer to UPnP (its search
/// gives up after 10 s).
pub const UPNP_WAIT: Duration = Duration::from_secs(12);

/// What the check found.
#[derive(Debug, Clone)]
pub struct DoctorReport {
    pub peer_id: String,
    /// UPnP was asked for.
    pub upnp: bool,
    pub listen: Vec<String>,
    pub reach: ReachState,
    /// The bootstrap addresses and whether a connection to each opened.
    pub bootstrap: Vec<(String, bool)>,
    /// The peer asked about: how it was reached (`None`: not at all), and
    /// why its hole punch failed, if it did.
    pub peer: Option<PeerCheck>,
}

/// The peer `slowmo doctor` was asked to reach.
#[derive(Debug, Clone)]
pub struct PeerCheck {
    pub peer: String,
    pub kind: Option<ConnectionKind>,
    pub punch_error: Option<String>,
}

/// Runs the check (blocking, about `cfg.wait`).
pub fn check(cfg: &DoctorConfig) -> Result<DoctorReport, CommError> {
    let listen_addrs = parse_addrs("listen", &cfg.listen)?;
    let bootstrap = parse_addrs("bootstrap", &cfg.bootstrap)?;
    let external = parse_addrs("external address", &cfg.external)?;
    let peer = match &cfg.peer {
        Some(p) => {
            let addr: Multiaddr = p
                .parse()
                .map_err(|e| CommError::Config(format!("peer: `{p}` is not a multiaddr: {e}")))?;
            let id = peer_of(&addr).ok_or_else(|| {
                CommError::Config(format!("peer: `{p}` does not end in /p2p/<peer id>"))
            })?;
            Some((id, addr))
        }
        None => None,
    };
    let keypair = identity::load_or_create(None)?;
    let local = keypair.public().to_peer_id();
    let mut p2p = P2pConfig::outside_run("doctor", &cfg.listen);
    p2p.upnp = cfg.upnp;
    let wait = if cfg.upnp {
        cfg.wait.max(UPNP_WAIT)
    } else {
        cfg.wait
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CommError::Network(format!("starting the network runtime: {e}")))?;
    let (swarm_tx, swarm_rx) = mpsc::unbounded_channel();
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let listen = Arc::new(Mutex::new(Vec::new()));
    let reach = Reach::default();
    let report = rt.block_on(async {
        let (swarm, metrics) = super::swarm::listening_swarm(keypair, &p2p, listen_addrs)?;
        tokio::spawn(behaviour::run_swarm(
            swarm,
            swarm_rx,
            events_tx,
            listen.clone(),
            bootstrap.clone(),
            metrics,
            NatSetup {
                reach: reach.clone(),
                relay_server: false,
                external,
                namespace: None,
            },
        ));
        let started = Instant::now();
        // The peer, once the bootstrap had its head start.
        let mut asked = false;
        let mut reached: Vec<Multiaddr> = Vec::new();
        let mut connected: Vec<PeerId> = Vec::new();
        while started.elapsed() < wait {
            if !asked
                && started.elapsed() >= wait / 4
                && let Some((id, addr)) = &peer
            {
                let _ = swarm_tx.send(SwarmCmd::Dial {
                    peer: *id,
                    addrs: vec![addr.clone()],
                });
                asked = true;
            }
            match tokio::time::timeout(Duration::from_millis(100), events_rx.recv()).await {
                Ok(Some(behaviour::NetEvent::Connected { peer, dialed })) => {
                    connected.push(peer);
                    if let Some(a) = dialed {
                        reached.push(strip_peer(&a));
                    }
                }
                Ok(None) => break,
                _ => {}
            }
            // Done early once the peer is reached directly.
            if let Some((id, _)) = &peer
                && matches!(
                    reach.kind_of(id),
                    Some(ConnectionKind::Direct | ConnectionKind::HolePunched)
                )
                && started.elapsed() >= wait / 2
                && (!cfg.upnp || reach.snapshot().upnp.is_some())
            {
                break;
            }
        }
        let _ = swarm_tx.send(SwarmCmd::Shutdown);
        let bootstrap = bootstrap
            .iter()
            .map(|b| {
                let ok = reached.contains(&strip_peer(b))
                    || peer_in(b).is_some_and(|p| connected.contains(&p));
                (b.to_string(), ok)
            })
            .collect();
        Ok::<_, CommError>(DoctorReport {
            peer_id: local.to_string(),
            upnp: cfg.upnp,
            listen: lock(&listen).iter().map(|a| a.to_string()).collect(),
            reach: reach.snapshot(),
            bootstrap,
            peer: peer.map(|(id, _)| PeerCheck {
                peer: id.to_string(),
                kind: reach.kind_of(&id),
                punch_error: reach.peer(&id).punch_error,
            }),
        })
    });
    rt.shutdown_timeout(Duration::from_millis(200));
    report
}

/// The peer id at the end of `addr` (the last `/p2p/`: a relayed address
/// names the relay first).
fn peer_of(addr: &Multiaddr) -> Option<PeerId> {
    match addr.iter().last() {
        Some(libp2p::multiaddr::Protocol::P2p(id)) => Some(id),
        _ => None,
    }
}
