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
//!
//! Across NATs ([`super::reach`]): every node is a relay client (it takes a
//! reservation on each relay it dials, unless it serves as one itself),
//! punches holes with DCUtR (TCP keeps port reuse, so the punch leaves from
//! the port peers observe) and asks AutoNAT v2 servers which of its
//! addresses are reachable; a node started with `relay` serves circuits and
//! AutoNAT dial-backs. A relay's default circuit (2 minutes, 128 KiB) is
//! raised to what a run's control plane needs: a peer whose punch failed
//! keeps its membership traffic on the circuit for the whole run.

use std::collections::{HashMap, HashSet};
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
    Multiaddr, PeerId, Swarm, autonat, dcutr, identify, identity::Keypair, mdns, noise, ping, quic,
    relay, rendezvous, tcp, yamux,
};
use tokio::sync::mpsc;

use super::addrs::{error_chain, log_dial_error, peer_in, quic_first, strip_peer};
use super::command::SwarmCmd;
use super::config::P2pConfig;
use super::nat::{
    DISCOVER_EVERY, NatSetup, REGISTER_EVERY, connection_kind, is_loopback, relay_config, relay_of,
    relayed_dial_delay,
};
use super::reach::{ConnectionKind, is_relayed};
use crate::CommError;
use crate::sync::lock;

/// The protocols of a slowmo node. Our own tensor protocols run on
/// `stream` (libp2p-stream), which hands us raw streams.
#[derive(NetworkBehaviour)]
pub(crate) struct Behaviour {
    identify: identify::Behaviour,
    ping: ping::Behaviour,
    mdns: Toggle<mdns::tokio::Behaviour>,
    relay_client: relay::client::Behaviour,
    relay: Toggle<relay::Behaviour>,
    dcutr: dcutr::Behaviour,
    autonat: autonat::v2::client::Behaviour,
    autonat_server: Toggle<autonat::v2::server::Behaviour>,
    rendezvous: rendezvous::client::Behaviour,
    rendezvous_server: Toggle<rendezvous::server::Behaviour>,
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

/// The protocols of a node.
fn behaviour(
    key: &Keypair,
    relay_client: relay::client::Behaviour,
    mdns_on: bool,
    relay_server: bool,
    relay_tensors: bool,
) -> Result<Behaviour, Box<dyn std::error::Error + Send + Sync>> {
    let local = key.public().to_peer_id();
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
        relay_client,
        relay: Toggle::from(
            relay_server.then(|| relay::Behaviour::new(local, relay_config(relay_tensors))),
        ),
        dcutr: dcutr::Behaviour::new(local),
        autonat: autonat::v2::client::Behaviour::default(),
        autonat_server: Toggle::from(relay_server.then(autonat::v2::server::Behaviour::default)),
        rendezvous: rendezvous::client::Behaviour::new(key.clone()),
        rendezvous_server: Toggle::from(
            relay_server
                .then(|| rendezvous::server::Behaviour::new(rendezvous::server::Config::default())),
        ),
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
        SwarmEvent::Behaviour(BehaviourEvent::Dcutr(e)) => metrics.record(e),
        SwarmEvent::Behaviour(BehaviourEvent::Relay(e)) => metrics.record(e),
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
    let relay_server = cfg.relay;
    let relay_tensors = cfg.relay_tensors;
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
        .map_err(|e| fail("dns", &e))?
        .with_relay_client(noise::Config::new, yamux::Config::default)
        .map_err(|e| fail("relay client", &e))?;
    Ok(match &cfg.metrics {
        Some(registry) => {
            let mut registry = lock(registry);
            let swarm = builder
                .with_bandwidth_metrics(&mut registry)
                .with_behaviour(|key, client| {
                    behaviour(key, client, mdns_on, relay_server, relay_tensors)
                })
                .map_err(|e| fail("behaviour", &e))?
                .with_swarm_config(swarm_config)
                .build();
            (swarm, Some(Metrics::new(&mut registry)))
        }
        None => {
            let swarm = builder
                .with_behaviour(|key, client| {
                    behaviour(key, client, mdns_on, relay_server, relay_tensors)
                })
                .map_err(|e| fail("behaviour", &e))?
                .with_swarm_config(swarm_config)
                .build();
            (swarm, None)
        }
    })
}

/// [`build_swarm`], listening on `addrs` (a failure names the address).
pub(crate) fn listening_swarm(
    keypair: Keypair,
    cfg: &P2pConfig,
    addrs: Vec<Multiaddr>,
) -> Result<(Swarm<Behaviour>, Option<Metrics>), CommError> {
    let (mut swarm, metrics) = build_swarm(keypair, cfg)?;
    for addr in addrs {
        swarm.listen_on(addr.clone()).map_err(|e| {
            CommError::Network(format!(
                "listen: cannot listen on `{addr}`: {}",
                error_chain(&e)
            ))
        })?;
    }
    Ok((swarm, metrics))
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
    nat: NatSetup,
) {
    let local = *swarm.local_peer_id();
    let NatSetup {
        reach,
        relay_server,
        external,
        namespace,
    } = nat;
    // Rendezvous points (relays) we reach, and when we last registered
    // there (with how many external addresses).
    let mut points: HashMap<PeerId, Option<(tokio::time::Instant, usize)>> = HashMap::new();
    let mut rendezvous_tick = tokio::time::interval(DISCOVER_EVERY);
    reach.update(|r| r.relay_server = relay_server);
    for addr in external {
        swarm.add_external_address(addr.clone());
        reach.update(|r| r.confirmed.push(addr));
    }
    // Relays we took (or asked for) a reservation on.
    let mut reserving: HashSet<PeerId> = HashSet::new();
    // Relayed addresses of peers we were asked to dial, tried once the
    // direct dial has had its head start.
    let mut relayed_dials: HashMap<PeerId, (tokio::time::Instant, Vec<Multiaddr>)> = HashMap::new();
    let mut sweep = tokio::time::interval(Duration::from_millis(500));
    // Direct dials tried beside a relayed connection: their failure is
    // expected, not worth a warning.
    let mut speculative: HashSet<libp2p::swarm::ConnectionId> = HashSet::new();
    let mut discovering = true;
    // Remote addresses of our outbound connections, to know which bootstrap
    // entries are reached.
    let mut dialed: HashMap<libp2p::swarm::ConnectionId, Multiaddr> = HashMap::new();
    // Open connections: the peer, the order they were established in, and
    // whether they go through a relay.
    let mut opened: HashMap<libp2p::swarm::ConnectionId, (PeerId, u64, bool)> = HashMap::new();
    let mut opened_count = 0u64;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // The last dial failure logged per address.
    let mut dial_errors: HashMap<String, String> = HashMap::new();
    loop {
        tokio::select! {
            cmd = commands.recv() => match cmd {
                None | Some(SwarmCmd::Shutdown) => break,
                Some(SwarmCmd::Dial { peer, addrs }) => {
                    dial_peer(&mut swarm, &mut relayed_dials, peer, addrs);
                }
                Some(SwarmCmd::Disconnect(peer)) => {
                    let _ = swarm.disconnect_peer_id(peer);
                }
                Some(SwarmCmd::DropStale(peer)) => {
                    let mut conns: Vec<_> = opened
                        .iter()
                        .filter(|(_, (p, _, _))| *p == peer)
                        .map(|(c, (_, n, _))| (*n, *c))
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
            _ = rendezvous_tick.tick(), if namespace.is_some() && !points.is_empty() => {
                let ns = namespace.clone().expect("checked");
                let externals = swarm.external_addresses().count();
                let now = tokio::time::Instant::now();
                for (point, registered) in points.iter_mut() {
                    let renew = match registered {
                        None => true,
                        Some((at, n)) => *n != externals || now.duration_since(*at) >= REGISTER_EVERY,
                    };
                    if renew && externals > 0 {
                        match swarm.behaviour_mut().rendezvous.register(ns.clone(), *point, None) {
                            Ok(()) => *registered = Some((now, externals)),
                            Err(e) => tracing::debug!(%point, "cannot register at {point}: {e}"),
                        }
                    }
                    if discovering {
                        swarm.behaviour_mut().rendezvous.discover(Some(ns.clone()), None, None, *point);
                    }
                }
            },
            _ = sweep.tick() => {
                // Relayed dials whose head start is over.
                let now = tokio::time::Instant::now();
                let due: Vec<PeerId> = relayed_dials
                    .iter()
                    .filter(|(_, (after, _))| *after <= now)
                    .map(|(p, _)| *p)
                    .collect();
                for peer in due {
                    let Some((_, addrs)) = relayed_dials.remove(&peer) else { continue };
                    if swarm.is_connected(&peer) {
                        continue;
                    }
                    tracing::debug!(%peer, "dialing {peer} through a relay");
                    let opts = DialOpts::peer_id(peer)
                        .addresses(addrs)
                        .condition(PeerCondition::Disconnected)
                        .build();
                    if let Err(e) = swarm.dial(opts) {
                        tracing::debug!(%peer, "relayed dial failed: {e}");
                    }
                }
                // A peer reached directly needs its relayed connection no
                // more (DCUtR has had the time to report on it): tensors
                // must not take the relay.
                let direct: HashSet<PeerId> = opened
                    .values()
                    .filter(|(_, _, relayed)| !relayed)
                    .map(|(p, _, _)| *p)
                    .collect();
                let stale: Vec<libp2p::swarm::ConnectionId> = opened
                    .iter()
                    .filter(|(_, (p, _, relayed))| *relayed && direct.contains(p))
                    .map(|(c, _)| *c)
                    .collect();
                for c in stale {
                    tracing::debug!("closing a relayed connection: a direct one is up");
                    swarm.close_connection(c);
                }
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
                SwarmEvent::NewListenAddr { address, .. } if is_relayed(&address) => {
                    // A relay holds a reservation for us: peers that cannot
                    // dial us reach us at this address.
                    tracing::info!(%address, "reachable through a relay at {address}");
                    if let Some(relay) = relay_of(&address) {
                        reach.update(|r| {
                            r.reservations.insert(relay, address.clone());
                            r.reservation_errors.remove(&relay);
                        });
                    }
                    // What we register at rendezvous points: peers that
                    // find us there can always dial this one.
                    swarm.add_external_address(address.clone());
                    lock(&listen_addrs).push(address);
                }
                SwarmEvent::NewListenAddr { address, .. } => {
                    tracing::info!(%address, "listening on {address}/p2p/{local}");
                    super::udp::raise_quic_buffers(&address);
                    if relay_server {
                        // A relay is reachable where it listens (its
                        // operator says so): reservations hand these out.
                        swarm.add_external_address(address.clone());
                        reach.update(|r| r.confirmed.push(address.clone()));
                    }
                    lock(&listen_addrs).push(address);
                }
                SwarmEvent::ExpiredListenAddr { address, .. } => {
                    if let Some(relay) = relay_of(&address).filter(|_| is_relayed(&address)) {
                        reach.update(|r| r.reservations.remove(&relay));
                        reserving.remove(&relay);
                        swarm.remove_external_address(&address);
                    }
                    lock(&listen_addrs).retain(|a| a != &address);
                }
                SwarmEvent::ConnectionEstablished { peer_id, connection_id, endpoint, .. } => {
                    speculative.remove(&connection_id);
                    let relayed = endpoint.is_relayed();
                    let remote_ip = match &endpoint {
                        ConnectedPoint::Dialer { address, .. } => super::reach::ip_of(address),
                        ConnectedPoint::Listener { send_back_addr, .. } => super::reach::ip_of(send_back_addr),
                    };
                    let dialed_addr = match endpoint {
                        ConnectedPoint::Dialer { address, .. } => Some(address),
                        ConnectedPoint::Listener { .. } => None,
                    };
                    tracing::debug!(peer = %peer_id, ?dialed_addr, relayed, "connection established");
                    if let Some(a) = &dialed_addr {
                        dialed.insert(connection_id, a.clone());
                    }
                    relayed_dials.remove(&peer_id);
                    opened_count += 1;
                    // A direct connection while a relayed one is open is
                    // the hole punch's.
                    let had_relayed = opened.values().any(|(p, _, r)| *p == peer_id && *r);
                    opened.insert(connection_id, (peer_id, opened_count, relayed));
                    let kind = connection_kind(&opened, &peer_id, had_relayed);
                    reach.update(|r| {
                        if !relayed {
                            r.relay_only.remove(&peer_id);
                        }
                        let entry = r.peers.entry(peer_id).or_default();
                        if let Some(ip) = remote_ip.filter(|ip| !relayed && !entry.remote_ips.contains(ip)) {
                            entry.remote_ips.push(ip);
                        }
                        // A direct connection beside a relayed one: a hole
                        // punch got through (either side may have dialed).
                        if !relayed && had_relayed {
                            entry.punch_attempts += 1;
                            entry.punch_successes += 1;
                            entry.punch_error = None;
                        }
                        // Once punched, a peer stays punched while a direct
                        // connection is open.
                        if !(kind == Some(ConnectionKind::Direct)
                            && entry.kind == Some(ConnectionKind::HolePunched))
                        {
                            entry.kind = kind;
                        }
                    });
                    if relayed {
                        tracing::info!(peer = %peer_id, "connected to {peer_id} through a relay; trying a direct connection (hole punch)");
                    } else if had_relayed {
                        tracing::info!(peer = %peer_id, "direct connection to {peer_id} by hole punching");
                    }
                    let _ = events.send(NetEvent::Connected { peer: peer_id, dialed: dialed_addr });
                }
                SwarmEvent::ConnectionClosed { peer_id, connection_id, num_established, cause, .. } => {
                    dialed.remove(&connection_id);
                    opened.remove(&connection_id);
                    reach.update(|r| {
                        let entry = r.peers.entry(peer_id).or_default();
                        entry.kind = match connection_kind(&opened, &peer_id, false) {
                            Some(ConnectionKind::Direct) if entry.kind == Some(ConnectionKind::HolePunched) => {
                                Some(ConnectionKind::HolePunched)
                            }
                            other => other,
                        };
                    });
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
                SwarmEvent::OutgoingConnectionError { peer_id, connection_id, error } if speculative.remove(&connection_id) => {
                    tracing::debug!(?peer_id, "no direct path beside the relay: {}", error_chain(&error));
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
                SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received { peer_id, info, connection_id })) => {
                    if super::reach::ip_of(&info.observed_addr).is_some() {
                        reach.update(|r| {
                            if !r.observed.contains(&info.observed_addr) {
                                r.observed.push(info.observed_addr.clone());
                            }
                        });
                    }
                    // A relay we dialed: take a reservation on it (a relay
                    // serves others, and needs none itself).
                    let is_relay = info.protocols.contains(&relay::HOP_PROTOCOL_NAME);
                    if is_relay
                        && !relay_server
                        && peer_id != local
                        && !reserving.contains(&peer_id)
                        && let Some(addr) = dialed.get(&connection_id).filter(|a| !is_relayed(a))
                    {
                        let circuit = strip_peer(addr)
                            .with(Protocol::P2p(peer_id))
                            .with(Protocol::P2pCircuit);
                        match swarm.listen_on(circuit.clone()) {
                            Ok(_) => {
                                tracing::debug!(%circuit, "asking {peer_id} for a relay reservation");
                                reserving.insert(peer_id);
                            }
                            Err(e) => tracing::warn!(%circuit, "cannot ask for a relay reservation: {}", error_chain(&e)),
                        }
                    }
                    // A rendezvous point: register there and ask it for
                    // the run's members.
                    if namespace.is_some()
                        && peer_id != local
                        && info.protocols.contains(&rendezvous::PROTOCOL_NAME)
                    {
                        points.entry(peer_id).or_insert(None);
                        rendezvous_tick.reset_immediately();
                    }
                    // Reached through a relay: it may be on our own LAN
                    // (behind the same NAT, which seldom hairpins), where
                    // its listen addresses answer. Elsewhere these dials
                    // fail as expected, and the hole punch is the way.
                    let through_relay = opened.get(&connection_id).is_some_and(|(_, _, r)| *r);
                    if through_relay && peer_id != local {
                        let mut direct: Vec<Multiaddr> = info
                            .listen_addrs
                            .iter()
                            .filter(|a| !is_relayed(a) && !is_loopback(a))
                            .cloned()
                            .collect();
                        if !direct.is_empty() {
                            quic_first(&mut direct);
                            let opts = DialOpts::peer_id(peer_id)
                                .addresses(direct)
                                .condition(PeerCondition::Always)
                                .build();
                            speculative.insert(opts.connection_id());
                            if let Err(e) = swarm.dial(opts) {
                                tracing::debug!(peer = %peer_id, "direct dial beside a relay failed: {e}");
                            }
                        }
                    }
                    for addr in info.listen_addrs {
                        swarm.add_peer_address(peer_id, addr);
                    }
                }
                SwarmEvent::Behaviour(BehaviourEvent::Rendezvous(rendezvous::client::Event::Discovered { registrations, .. })) => {
                    for r in registrations {
                        let peer = r.record.peer_id();
                        if peer != local && !swarm.is_connected(&peer) {
                            tracing::debug!(%peer, "found {peer} at a rendezvous point");
                            dial_peer(&mut swarm, &mut relayed_dials, peer, r.record.addresses().to_vec());
                        }
                    }
                }
                SwarmEvent::Behaviour(BehaviourEvent::Rendezvous(rendezvous::client::Event::RegisterFailed { rendezvous_node, error, .. })) => {
                    tracing::warn!(point = %rendezvous_node, "the rendezvous point {rendezvous_node} refused our registration: {error:?}");
                }
                SwarmEvent::Behaviour(BehaviourEvent::RelayClient(relay::client::Event::ReservationReqAccepted { relay_peer_id, renewal: false, .. })) => {
                    tracing::info!(relay = %relay_peer_id, "relay {relay_peer_id} accepted our reservation");
                }
                SwarmEvent::Behaviour(BehaviourEvent::Dcutr(dcutr::Event { remote_peer_id, result })) => {
                    match result {
                        Ok(_) => {
                            // (Counted and logged as the connection opened.)
                            // Streams opened from now on must not take
                            // the relay.
                            let relayed: Vec<_> = opened
                                .iter()
                                .filter(|(_, (p, _, r))| *p == remote_peer_id && *r)
                                .map(|(c, _)| *c)
                                .collect();
                            for c in relayed {
                                swarm.close_connection(c);
                            }
                            reach.update(|r| {
                                let entry = r.peers.entry(remote_peer_id).or_default();
                                entry.punch_error = None;
                                entry.kind = Some(ConnectionKind::HolePunched);
                            });
                        }
                        Err(e) => {
                            let why = error_chain(&e);
                            tracing::warn!(peer = %remote_peer_id, "no direct connection to {remote_peer_id}: the hole punch failed ({why}); it is reachable only through the relay, which carries no tensors");
                            reach.update(|r| {
                                let entry = r.peers.entry(remote_peer_id).or_default();
                                entry.punch_attempts += 1;
                                entry.punch_error = Some(why);
                            });
                        }
                    }
                }
                SwarmEvent::Behaviour(BehaviourEvent::Autonat(autonat::v2::client::Event { tested_addr, server, result, .. })) => {
                    match result {
                        Ok(()) => {
                            tracing::info!(%tested_addr, "reachable from outside at {tested_addr} (AutoNAT, confirmed by {server})");
                            reach.update(|r| {
                                r.unreachable.remove(&tested_addr);
                                if !r.confirmed.contains(&tested_addr) {
                                    r.confirmed.push(tested_addr);
                                }
                            });
                        }
                        Err(e) => {
                            let why = format!("{e:?}");
                            tracing::debug!(%tested_addr, "not reachable from outside at {tested_addr}: {why}");
                            reach.update(|r| {
                                r.unreachable.insert(tested_addr, why);
                            });
                        }
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

/// Dials `peer` at `addrs`: the direct addresses at once, QUIC first, and
/// the relayed ones after [`relayed_dial_delay`] unless a connection came
/// first (a dial to a private address behind someone else's NAT may hang
/// until its timeout).
fn dial_peer(
    swarm: &mut Swarm<Behaviour>,
    relayed_dials: &mut HashMap<PeerId, (tokio::time::Instant, Vec<Multiaddr>)>,
    peer: PeerId,
    addrs: Vec<Multiaddr>,
) {
    if peer == *swarm.local_peer_id() || swarm.is_connected(&peer) {
        return;
    }
    let (relayed, mut addrs): (Vec<_>, Vec<_>) = addrs.into_iter().partition(is_relayed);
    if !relayed.is_empty() {
        let after = tokio::time::Instant::now() + relayed_dial_delay(swarm.local_peer_id(), &peer);
        relayed_dials.insert(peer, (after, relayed));
    }
    if addrs.is_empty() {
        return;
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
