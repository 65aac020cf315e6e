//! The task that drives the libp2p swarm ([`super::swarm`] builds it):
//! connection events to the membership task, dials (direct addresses first,
//! relayed ones after), bootstrap re-dials and rendezvous discovery until
//! the view is settled, and the NAT traversal's bookkeeping.
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
use libp2p::metrics::Metrics;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{DialError, ListenError, SwarmEvent};
use libp2p::{Multiaddr, PeerId, Swarm, autonat, dcutr, identify, mdns, relay, rendezvous, upnp};
use tokio::sync::mpsc;

use super::addrs::{error_chain, log_dial_error, peer_in, quic_first, strip_peer};
use super::command::SwarmCmd;
use super::nat::{
    DISCOVER_EVERY, NatSetup, REGISTER_EVERY, RELAYED_CLOSE_GRACE, connection_kind, is_loopback,
    relay_of, relayed_dial_delay,
};
use super::reach::{ConnectionKind, Reach, Upnp, is_relayed};
use super::swarm::{Behaviour, BehaviourEvent, record};
use crate::sync::lock;

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
    // Peers whose last connection, a relayed one, closed: lost unless a
    // connection is back by then.
    let mut relayed_closes: HashMap<PeerId, tokio::time::Instant> = HashMap::new();
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
                let now = tokio::time::Instant::now();
                relayed_closes.retain(|peer, at| {
                    if *at > now {
                        return true;
                    }
                    if !swarm.is_connected(peer) {
                        let _ = events.send(NetEvent::Disconnected { peer: *peer });
                    }
                    false
                });
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
                    relayed_closes.remove(&peer_id);
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
                        match remote_ip {
                            Some(ip) if !relayed && !entry.remote_ips.contains(&ip) => entry.remote_ips.push(ip),
                            None if !relayed => entry.unresolved = true,
                            _ => {}
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
                    let was_relayed = opened.remove(&connection_id).is_some_and(|(_, _, r)| r);
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
                    if num_established == 0 && was_relayed {
                        // The peer may have closed the relayed connection
                        // because the punched one is up on its side and
                        // not yet on ours: the peer is lost only if no
                        // connection comes back soon.
                        let at = tokio::time::Instant::now() + RELAYED_CLOSE_GRACE;
                        relayed_closes.insert(peer_id, at);
                    } else if num_established == 0 {
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
                                r.confirm(tested_addr);
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
                SwarmEvent::Behaviour(BehaviourEvent::Upnp(e)) => on_upnp(&reach, e),
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
    // The head start runs from the first request: asked again before it
    // is over (a rendezvous point answers every few seconds), the dial
    // keeps its time, or a head start longer than the asking would put it
    // off for ever.
    if !relayed.is_empty() {
        let after = tokio::time::Instant::now() + relayed_dial_delay(swarm.local_peer_id(), &peer);
        relayed_dials
            .entry(peer)
            .and_modify(|(_, addrs)| *addrs = relayed.clone())
            .or_insert((after, relayed));
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

/// Records and logs what the router answered to UPnP (the behaviour has
/// already told the swarm of a mapped address, which goes in our hellos).
fn on_upnp(reach: &Reach, event: upnp::Event) {
    match event {
        upnp::Event::NewExternalAddr {
            local_addr,
            external_addr,
        } => {
            tracing::info!(%external_addr, "the router maps {local_addr} at {external_addr} (UPnP): reachable from outside there");
            reach.update(|r| {
                r.confirm(external_addr.clone());
                match &mut r.upnp {
                    Some(Upnp::Mapped(m)) => {
                        m.insert(local_addr, external_addr);
                    }
                    other => *other = Some(Upnp::Mapped([(local_addr, external_addr)].into())),
                }
            });
        }
        upnp::Event::ExpiredExternalAddr {
            local_addr,
            external_addr,
        } => {
            tracing::warn!(%external_addr, "the router no longer maps {local_addr} at {external_addr} (UPnP: the renewal failed)");
            reach.update(|r| {
                r.confirmed.retain(|a| *a != external_addr);
                if let Some(Upnp::Mapped(m)) = &mut r.upnp {
                    m.remove(&local_addr);
                }
            });
        }
        upnp::Event::GatewayNotFound => {
            tracing::warn!(
                "UPnP: no gateway answered on this network; no port is mapped (--upnp needs a router with UPnP IGD on)"
            );
            reach.update(|r| r.upnp = Some(Upnp::NoGateway));
        }
        upnp::Event::NonRoutableGateway => {
            tracing::warn!(
                "UPnP: the gateway's external address is private (it is behind another NAT): a mapping there would not make this node reachable"
            );
            reach.update(|r| r.upnp = Some(Upnp::NonRoutable));
        }
    }
}
