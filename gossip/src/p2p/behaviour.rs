//! The libp2p swarm: transports, the protocols every node speaks, and the
//! task that drives it.
//!
//! QUIC is the primary transport and TCP + Noise + Yamux the fallback (dials
//! try QUIC addresses first). The defaults of several libp2p parts assume
//! small messages and are raised here:
//! - the swarm closes a connection after 10 s without streams: a node that
//!   spends minutes in a forward pass would lose its peers, so the idle
//!   timeout is an hour (ping and QUIC keep-alives keep links warm);
//! - QUIC's 10 s idle timeout becomes the peer timeout (at least 3 s) with a
//!   keep-alive every second: a live peer never goes idle, a dead one's
//!   connection closes after the peer timeout (a suspicion); its 10 MB
//!   stream / 15 MB connection windows become 32 / 128 MiB, so a
//!   model-sized share streams at link speed;
//! - yamux 0.14 already auto-tunes stream windows up to 1 GiB per connection
//!   (there is nothing to raise; the old fixed 256 KiB window is gone).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use libp2p::core::ConnectedPoint;
use libp2p::metrics::{Metrics, Recorder};
use libp2p::multiaddr::Protocol;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{DialError, ListenError, NetworkBehaviour, SwarmEvent};
use libp2p::{
    Multiaddr, PeerId, Swarm, identify, identity::Keypair, mdns, noise, ping, quic, tcp, yamux,
};
use tokio::sync::mpsc;

use super::command::SwarmCmd;
use super::config::P2pConfig;
use crate::CommError;
use crate::sync::lock;

/// The protocols of a slowmo node. Our own tensor protocols run on
/// `stream` (libp2p-stream), which hands us raw streams.
#[derive(NetworkBehaviour)]
pub(crate) struct Behaviour {
    identify: identify::Behaviour,
    ping: ping::Behaviour,
    mdns: Toggle<mdns::tokio::Behaviour>,
    pub stream: libp2p_stream::Behaviour,
}

/// What the swarm task tells the membership task.
#[derive(Debug, Clone)]
pub(crate) enum NetEvent {
    /// A connection was established; `dialed` is the address we dialed when
    /// the connection is outbound.
    Connected {
        peer: PeerId,
        dialed: Option<Multiaddr>,
    },
    /// The last connection to a peer closed.
    Disconnected { peer: PeerId },
    /// A connection authenticated as our own peer id: another process
    /// holds our key (`outbound`: we dialed `address`).
    SameIdentity { address: Multiaddr, outbound: bool },
}

/// `addr` without a trailing `/p2p/<id>`.
pub(crate) fn strip_peer(addr: &Multiaddr) -> Multiaddr {
    addr.iter()
        .filter(|p| !matches!(p, Protocol::P2p(_)))
        .collect()
}

/// The peer id in `addr`, if it ends with `/p2p/<id>`.
pub(crate) fn peer_in(addr: &Multiaddr) -> Option<PeerId> {
    addr.iter().find_map(|p| match p {
        Protocol::P2p(id) => Some(id),
        _ => None,
    })
}

/// QUIC addresses first: dials try addresses in order, one at a time.
pub(crate) fn quic_first(addrs: &mut [Multiaddr]) {
    addrs.sort_by_key(|a| !a.iter().any(|p| matches!(p, Protocol::QuicV1)));
}

/// Parses a list of multiaddrs, naming the first bad one.
pub(crate) fn parse_addrs(what: &str, addrs: &[String]) -> Result<Vec<Multiaddr>, CommError> {
    addrs
        .iter()
        .map(|s| {
            s.parse::<Multiaddr>()
                .map_err(|e| CommError::Config(format!("{what}: `{s}` is not a multiaddr: {e}")))
        })
        .collect()
}

/// An error and its sources, `: `-separated, on one line. libp2p's transport errors
/// display nothing themselves and keep the reason (the OS error) in their
/// sources.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        // On one line (some errors list their causes on lines of their own).
        let text = err
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    if parts.is_empty() {
        "no reason given".into()
    } else {
        parts.join(": ")
    }
}

/// Logs a failed dial: each address with its reason (a refused bootstrap
/// dial says `Connection refused`). A reason already logged for an address
/// goes to the debug log, so that re-dials once a second do not flood the
/// warnings.
fn log_dial_error(peer: Option<PeerId>, error: &DialError, logged: &mut HashMap<String, String>) {
    let mut report = |target: String, reason: String| {
        if logged.get(&target) == Some(&reason) {
            tracing::debug!(?peer, "cannot reach {target}: {reason}");
        } else {
            tracing::warn!(?peer, "cannot reach {target}: {reason}");
            logged.insert(target, reason);
        }
    };
    match error {
        // Our own doing (a disconnect, a dial superseded), not the peer's.
        DialError::Aborted | DialError::DialPeerConditionFalse(_) => {
            tracing::debug!(?peer, "dial given up: {error}");
        }
        DialError::Transport(errors) => {
            for (addr, e) in errors {
                report(addr.to_string(), error_chain(e));
            }
        }
        other => {
            let target = peer.map_or_else(|| "a peer".to_string(), |p| format!("peer {p}"));
            report(target, error_chain(other));
        }
    }
}

/// The protocols of a node.
fn behaviour(
    key: &Keypair,
    mdns_on: bool,
) -> Result<Behaviour, Box<dyn std::error::Error + Send + Sync>> {
    let mdns = if mdns_on {
        Some(mdns::tokio::Behaviour::new(
            mdns::Config::default(),
            key.public().to_peer_id(),
        )?)
    } else {
        None
    };
    Ok(Behaviour {
        identify: identify::Behaviour::new(identify::Config::new("/slowmo/1".into(), key.public())),
        ping: ping::Behaviour::new(ping::Config::new()),
        mdns: Toggle::from(mdns),
        stream: libp2p_stream::Behaviour::new(),
    })
}

/// How often QUIC pings a peer it has not heard from.
const QUIC_KEEP_ALIVE: Duration = Duration::from_secs(1);

fn swarm_config(c: libp2p::swarm::Config) -> libp2p::swarm::Config {
    c.with_idle_connection_timeout(Duration::from_secs(3600))
        .with_dial_concurrency_factor(std::num::NonZeroU8::MIN)
}

/// Records libp2p's connection, protocol, identify and ping metrics.
fn record(metrics: &Metrics, event: &SwarmEvent<BehaviourEvent>) {
    match event {
        SwarmEvent::Behaviour(BehaviourEvent::Identify(e)) => metrics.record(e),
        SwarmEvent::Behaviour(BehaviourEvent::Ping(e)) => metrics.record(e),
        _ => {}
    }
    metrics.record(event);
}

/// Builds the swarm (must run inside the node's tokio runtime), with
/// libp2p's metrics when `cfg.metrics` names a registry.
pub(crate) fn build_swarm(
    keypair: Keypair,
    cfg: &P2pConfig,
) -> Result<(Swarm<Behaviour>, Option<Metrics>), CommError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        CommError::Network(format!("building the libp2p swarm ({what}): {e}"))
    };
    // A peer silent for the peer timeout is gone: its QUIC connection
    // closes then, and the close makes it a suspect (while its process
    // runs, keep-alives every second keep the connection up however long
    // a step computes).
    let idle_ms = cfg.peer_timeout.max(Duration::from_secs(3)).as_millis();
    let idle_ms = idle_ms.min(u32::MAX as u128) as u32;
    let mdns_on = cfg.mdns;
    let builder = libp2p::SwarmBuilder::with_existing_identity(keypair)
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            yamux::Config::default,
        )
        .map_err(|e| fail("tcp", &e))?
        .with_quic_config(move |mut q: quic::Config| {
            q.max_idle_timeout = idle_ms;
            q.keep_alive_interval = QUIC_KEEP_ALIVE;
            q.max_stream_data = 32 << 20;
            q.max_connection_data = 128 << 20;
            match std::env::var("SLOWMO_QUIC_MTU")
                .ok()
                .and_then(|v| v.parse::<u16>().ok())
            {
                Some(mtu) => q.mtu_upper_bound(mtu),
                None => q,
            }
        })
        .with_dns()
        .map_err(|e| fail("dns", &e))?;
    Ok(match &cfg.metrics {
        Some(registry) => {
            let mut registry = lock(registry);
            let swarm = builder
                .with_bandwidth_metrics(&mut registry)
                .with_behaviour(|key| behaviour(key, mdns_on))
                .map_err(|e| fail("behaviour", &e))?
                .with_swarm_config(swarm_config)
                .build();
            (swarm, Some(Metrics::new(&mut registry)))
        }
        None => {
            let swarm = builder
                .with_behaviour(|key| behaviour(key, mdns_on))
                .map_err(|e| fail("behaviour", &e))?
                .with_swarm_config(swarm_config)
                .build();
            (swarm, None)
        }
    })
}

/// Drives the swarm until the command channel closes: forwards connection
/// events, records listen addresses, dials what it is asked to, and re-dials
/// bootstrap addresses every second until the view is settled (peers may
/// start in any order).
pub(crate) async fn run_swarm(
    mut swarm: Swarm<Behaviour>,
    mut commands: mpsc::UnboundedReceiver<SwarmCmd>,
    events: mpsc::UnboundedSender<NetEvent>,
    listen_addrs: Arc<Mutex<Vec<Multiaddr>>>,
    bootstrap: Vec<Multiaddr>,
    metrics: Option<Metrics>,
) {
    let local = *swarm.local_peer_id();
    let mut discovering = true;
    // Remote addresses of our outbound connections, to know which bootstrap
    // entries are reached.
    let mut dialed: HashMap<libp2p::swarm::ConnectionId, Multiaddr> = HashMap::new();
    // Open connections: the peer and the order they were established in.
    let mut opened: HashMap<libp2p::swarm::ConnectionId, (PeerId, u64)> = HashMap::new();
    let mut opened_count = 0u64;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // The last dial failure logged per address.
    let mut dial_errors: HashMap<String, String> = HashMap::new();
    loop {
        tokio::select! {
            cmd = commands.recv() => match cmd {
                None | Some(SwarmCmd::Shutdown) => break,
                Some(SwarmCmd::Dial { peer, mut addrs }) => {
                    if peer == local || swarm.is_connected(&peer) {
                        continue;
                    }
                    quic_first(&mut addrs);
                    for a in &addrs {
                        swarm.add_peer_address(peer, a.clone());
                    }
                    let opts = DialOpts::peer_id(peer)
                        .addresses(addrs)
                        .condition(PeerCondition::DisconnectedAndNotDialing)
                        .build();
                    if let Err(e) = swarm.dial(opts) {
                        tracing::debug!(%peer, "dial failed: {e}");
                    }
                }
                Some(SwarmCmd::Disconnect(peer)) => {
                    let _ = swarm.disconnect_peer_id(peer);
                }
                Some(SwarmCmd::DropStale(peer)) => {
                    let mut conns: Vec<_> = opened
                        .iter()
                        .filter(|(_, (p, _))| *p == peer)
                        .map(|(c, (_, n))| (*n, *c))
                        .collect();
                    conns.sort_by_key(|(n, _)| *n);
                    conns.pop();
                    for (_, c) in conns {
                        tracing::debug!(%peer, "closing a stale connection to {peer}");
                        swarm.close_connection(c);
                    }
                }
                Some(SwarmCmd::StopDiscovery) => discovering = false,
            },
            _ = tick.tick(), if discovering => {
                // Addresses of one known peer form one dial, QUIC first;
                // addresses without a peer id are dialed one by one.
                let mut by_peer: HashMap<PeerId, Vec<Multiaddr>> = HashMap::new();
                for addr in &bootstrap {
                    match peer_in(addr) {
                        // Our own peer id at an address that is not ours:
                        // dial it plainly, so that both processes learn
                        // that they share one identity.
                        Some(p) if p == local => {
                            let plain = strip_peer(addr);
                            if !lock(&listen_addrs).contains(&plain)
                                && let Err(e) = swarm.dial(plain)
                            {
                                tracing::debug!(%addr, "bootstrap dial failed: {e}");
                            }
                        }
                        Some(p) if swarm.is_connected(&p) => {}
                        Some(p) => by_peer.entry(p).or_default().push(addr.clone()),
                        None => {
                            let plain = strip_peer(addr);
                            let reached = dialed.values().any(|a| strip_peer(a) == plain)
                                || lock(&listen_addrs).contains(&plain);
                            if !reached && let Err(e) = swarm.dial(addr.clone()) {
                                tracing::debug!(%addr, "bootstrap dial failed: {e}");
                            }
                        }
                    }
                }
                for (peer, mut addrs) in by_peer {
                    quic_first(&mut addrs);
                    let opts = DialOpts::peer_id(peer)
                        .addresses(addrs)
                        .condition(PeerCondition::DisconnectedAndNotDialing)
                        .build();
                    if let Err(e) = swarm.dial(opts) {
                        tracing::debug!(%peer, "bootstrap dial failed: {e}");
                    }
                }
            },
            event = swarm.select_next_some() => {
            if let Some(m) = &metrics {
                record(m, &event);
            }
            match event {
                SwarmEvent::NewListenAddr { address, .. } => {
                    tracing::info!(%address, "listening on {address}/p2p/{local}");
                    raise_quic_buffers(&address);
                    lock(&listen_addrs).push(address);
                }
                SwarmEvent::ExpiredListenAddr { address, .. } => {
                    lock(&listen_addrs).retain(|a| a != &address);
                }
                SwarmEvent::ConnectionEstablished { peer_id, connection_id, endpoint, .. } => {
                    let dialed_addr = match endpoint {
                        ConnectedPoint::Dialer { address, .. } => Some(address),
                        ConnectedPoint::Listener { .. } => None,
                    };
                    tracing::debug!(peer = %peer_id, ?dialed_addr, "connection established");
                    if let Some(a) = &dialed_addr {
                        dialed.insert(connection_id, a.clone());
                    }
                    opened_count += 1;
                    opened.insert(connection_id, (peer_id, opened_count));
                    let _ = events.send(NetEvent::Connected { peer: peer_id, dialed: dialed_addr });
                }
                SwarmEvent::ConnectionClosed { peer_id, connection_id, num_established, cause, .. } => {
                    dialed.remove(&connection_id);
                    opened.remove(&connection_id);
                    tracing::debug!(peer = %peer_id, ?cause, "connection closed");
                    if num_established == 0 {
                        let _ = events.send(NetEvent::Disconnected { peer: peer_id });
                    }
                }
                SwarmEvent::OutgoingConnectionError { error: DialError::LocalPeerId { address }, .. } => {
                    if lock(&listen_addrs).contains(&strip_peer(&address)) {
                        tracing::debug!(%address, "dialed our own listen address");
                    } else {
                        let _ = events.send(NetEvent::SameIdentity { address, outbound: true });
                    }
                }
                SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                    log_dial_error(peer_id, &error, &mut dial_errors);
                }
                SwarmEvent::IncomingConnectionError { error: ListenError::LocalPeerId { address }, send_back_addr, .. } => {
                    tracing::debug!(%address, %send_back_addr, "an inbound connection carries our own peer id");
                    // (From one of our own sockets: we dialed ourselves.)
                    if !lock(&listen_addrs).contains(&send_back_addr) {
                        let _ = events.send(NetEvent::SameIdentity { address: send_back_addr, outbound: false });
                    }
                }
                SwarmEvent::ListenerClosed { addresses, reason: Err(e), .. } => {
                    for address in &addresses {
                        lock(&listen_addrs).retain(|a| a != address);
                    }
                    tracing::warn!(?addresses, "a listener closed: {}", error_chain(&e));
                }
                SwarmEvent::ListenerError { error, .. } => {
                    tracing::warn!("a listener failed: {}", error_chain(&error));
                }
                SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received { peer_id, info, .. })) => {
                    for addr in info.listen_addrs {
                        swarm.add_peer_address(peer_id, addr);
                    }
                }
                SwarmEvent::Behaviour(BehaviourEvent::Mdns(mdns::Event::Discovered(found))) => {
                    for (peer, addr) in found {
                        swarm.add_peer_address(peer, addr.clone());
                        if discovering && peer != local && !swarm.is_connected(&peer) {
                            let opts = DialOpts::peer_id(peer)
                                .addresses(vec![addr])
                                .condition(PeerCondition::DisconnectedAndNotDialing)
                                .build();
                            let _ = swarm.dial(opts);
                        }
                    }
                }
                _ => {}
            }},
        }
    }
    tracing::debug!("swarm task finished");
}

/// Raises the kernel buffers of a QUIC listener's UDP socket (see
/// [`super::udp`]).
fn raise_quic_buffers(address: &Multiaddr) {
    let mut port = None;
    let mut quic = false;
    for p in address.iter() {
        match p {
            Protocol::Udp(p) => port = Some(p),
            Protocol::QuicV1 => quic = true,
            _ => {}
        }
    }
    let (Some(port), true) = (port, quic) else {
        return;
    };
    let want = super::udp::buffer_bytes();
    if want == 0 {
        return;
    }
    for got in super::udp::raise(port, want) {
        if got.receive < want {
            tracing::info!(
                "QUIC socket on UDP port {port}: receive buffer {} bytes, send {} (asked {want}; \
                 the kernel caps unprivileged sockets at net.core.rmem_max / wmem_max)",
                got.receive,
                got.send
            );
        } else {
            tracing::debug!(
                "QUIC socket on UDP port {port}: receive buffer {} bytes, send {}",
                got.receive,
                got.send
            );
        }
    }
}
