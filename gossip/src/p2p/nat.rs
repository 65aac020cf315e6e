//! What the swarm task needs for NAT traversal (see [`super::reach`]): the
//! relay service's limits, the run's rendezvous namespace, and how a
//! peer's connections are classified.

use std::collections::HashMap;
use std::time::Duration;

use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId, relay, rendezvous};

use super::reach::{ConnectionKind, Reach};

/// How long a relay keeps one circuit, and how many bytes it carries: the
/// control plane of a whole run whose hole punch failed (hellos, view
/// changes, barriers' small messages), not tensors.
const CIRCUIT_DURATION: Duration = Duration::from_secs(24 * 3600);
const CIRCUIT_BYTES: u64 = 64 << 20;

/// The relay service of a node started with `relay`; `tensors`: its
/// circuits carry any number of bytes (the operator opted in to relaying
/// tensors).
pub(crate) fn relay_config(tensors: bool) -> relay::Config {
    relay::Config {
        max_circuit_duration: CIRCUIT_DURATION,
        max_circuit_bytes: if tensors { 0 } else { CIRCUIT_BYTES },
        ..relay::Config::default()
    }
}

/// How long a direct dial goes first before the relayed addresses are
/// dialed too.
pub(crate) const RELAYED_DIAL_AFTER: Duration = Duration::from_secs(1);

/// How long a peer whose last connection was a relayed one stays
/// connected in the membership's eyes after it closed: its side of a
/// punched connection may be up before ours, and it closes the relayed one
/// then.
pub(crate) const RELAYED_CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How long a relayed dial waits when the peer's id is below ours: two
/// peers that find each other at once would each open a relayed connection
/// and start two hole punches on the same ports, which reset each other;
/// the lower id dials first, and the higher one only if that did not come.
pub(crate) const RELAYED_DIAL_YIELD: Duration = Duration::from_secs(5);

/// When to dial `peer`'s relayed addresses, from now.
pub(crate) fn relayed_dial_delay(local: &PeerId, peer: &PeerId) -> Duration {
    if peer.to_bytes() < local.to_bytes() {
        RELAYED_DIAL_YIELD
    } else {
        RELAYED_DIAL_AFTER
    }
}

/// What the swarm task needs to know about NAT traversal.
pub(crate) struct NatSetup {
    pub reach: Reach,
    /// This node serves as a relay (its listen addresses are external).
    pub relay_server: bool,
    /// Addresses the operator says we are reachable at.
    pub external: Vec<Multiaddr>,
    /// The run's rendezvous namespace ([`namespace_of`]); `None` for a
    /// stand-alone relay, which registers nowhere.
    pub namespace: Option<rendezvous::Namespace>,
}

/// The rendezvous namespace of a run: members register there on every
/// rendezvous point (relay) they reach, and find each other there from one
/// bootstrap address.
pub(crate) fn namespace_of(run_id: &str) -> rendezvous::Namespace {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(run_id.as_bytes());
    let hex = hex::encode(&digest[..16]);
    rendezvous::Namespace::new(format!("slowmo/{hex}")).expect("39 bytes is a short namespace")
}

/// How often a discovering node asks its rendezvous points for the run's
/// members, and how long a registration lasts before it is renewed.
pub(crate) const DISCOVER_EVERY: Duration = Duration::from_secs(2);
pub(crate) const REGISTER_EVERY: Duration = Duration::from_secs(3600);

/// Whether `addr` is a loopback address (it reaches only this machine).
pub(crate) fn is_loopback(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| match p {
        Protocol::Ip4(ip) => ip.is_loopback(),
        Protocol::Ip6(ip) => ip.is_loopback(),
        _ => false,
    })
}

/// The relay in a relayed address (the peer id before `/p2p-circuit`).
pub(crate) fn relay_of(addr: &Multiaddr) -> Option<PeerId> {
    let mut relay = None;
    for p in addr.iter() {
        match p {
            Protocol::P2p(id) => relay = Some(id),
            Protocol::P2pCircuit => return relay,
            _ => {}
        }
    }
    None
}

/// How `peer` is connected, from its open connections: direct if any is
/// direct (hole-punched when a relayed one was open as it came), relayed if
/// only relayed ones are.
pub(crate) fn connection_kind(
    opened: &HashMap<libp2p::swarm::ConnectionId, (PeerId, u64, bool)>,
    peer: &PeerId,
    punched: bool,
) -> Option<ConnectionKind> {
    let mut kind = None;
    for (_, _, relayed) in opened.values().filter(|(p, _, _)| p == peer) {
        if !relayed {
            return Some(if punched {
                ConnectionKind::HolePunched
            } else {
                ConnectionKind::Direct
            });
        }
        kind = Some(ConnectionKind::Relayed);
    }
    kind
}
