//! Reachability across NATs: what this node knows of how it is reached and
//! how it reaches each peer.
//!
//! A node behind a NAT cannot be dialed. It takes a reservation on a relay
//! (any member started with `relay`, or a stand-alone `slowmo relay`) and
//! announces the relayed address (`.../p2p/<relay>/p2p-circuit`) in its
//! hellos; a peer that cannot dial it directly dials that address, and
//! DCUtR then punches a direct connection through both NATs (TCP
//! simultaneous open, or QUIC), which replaces the relayed one. Tensors go
//! over direct connections only: relayed connections carry the control
//! plane, and a peer reachable only through a relay is named as such.
//!
//! [`Reach`] is the state the swarm task keeps of all this, for the log,
//! the metrics, the summary and `slowmo doctor`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};

use crate::sync::lock;

/// How we are connected to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConnectionKind {
    /// A connection one side dialed straight to the other's address.
    Direct,
    /// A direct connection opened by hole punching (DCUtR) from a relayed
    /// one.
    HolePunched,
    /// Only through a relay.
    Relayed,
}

impl ConnectionKind {
    pub fn name(self) -> &'static str {
        match self {
            ConnectionKind::Direct => "direct",
            ConnectionKind::HolePunched => "hole-punched",
            ConnectionKind::Relayed => "relayed",
        }
    }
}

/// One peer's connection as [`Reach`] records it.
#[derive(Debug, Clone, Default)]
pub struct PeerReach {
    /// `None` while no connection is open.
    pub kind: Option<ConnectionKind>,
    /// Hole punches tried with this peer, and how many succeeded.
    pub punch_attempts: u64,
    pub punch_successes: u64,
    /// Why the last punch failed.
    pub punch_error: Option<String>,
    /// The IPs our direct connections with the peer went to or came from:
    /// where the peer is reachable from here. A peer behind a NAT
    /// announces private addresses; its connections come from its NAT's.
    pub remote_ips: Vec<std::net::IpAddr>,
    /// A direct connection went to a name (`/dns4/...`), whose IP libp2p
    /// does not report: where the peer is reachable is not known, and its
    /// lane addresses are all tried.
    pub unresolved: bool,
}

impl PeerReach {
    /// Of the peer's lane addresses, those to dial ([`dialable_lane_addrs`],
    /// or all when a connection to it went to a name).
    pub(crate) fn lane_addrs(&self, announced: &[String]) -> Result<Vec<String>, String> {
        if self.unresolved {
            return Ok(announced.to_vec());
        }
        dialable_lane_addrs(announced, &self.remote_ips)
    }
}

/// What this node knows of its reachability.
#[derive(Debug, Clone, Default)]
pub struct ReachState {
    /// This node serves as a relay (and AutoNAT server) for others.
    pub relay_server: bool,
    /// Relays holding a reservation for us, with the address peers reach us
    /// through.
    pub reservations: BTreeMap<PeerId, Multiaddr>,
    /// Reservations a relay refused, with the reason.
    pub reservation_errors: BTreeMap<PeerId, String>,
    /// Our addresses as peers observe them (identify), the NAT's side.
    pub observed: Vec<Multiaddr>,
    /// External addresses confirmed reachable (AutoNAT v2 dial-backs, or
    /// given by the operator).
    pub confirmed: Vec<Multiaddr>,
    /// Addresses AutoNAT v2 found unreachable, with the reason.
    pub unreachable: BTreeMap<Multiaddr, String>,
    /// Per peer: its connection and its hole punches.
    pub peers: BTreeMap<PeerId, PeerReach>,
    /// Peers reachable only through a relay, whose lane port cannot be
    /// dialed either: no tensor can go there, so they are left out of the
    /// run (their join requests refused) until a direct connection opens.
    pub relay_only: BTreeMap<PeerId, String>,
    /// What the router said to UPnP (`upnp` on); `None` before it answered
    /// (the search gives up after 10 s).
    pub upnp: Option<Upnp>,
}

/// The router's answer to UPnP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upnp {
    /// Listen addresses the router maps, with the external address of each.
    Mapped(BTreeMap<Multiaddr, Multiaddr>),
    /// No UPnP gateway answered on this network.
    NoGateway,
    /// The gateway's own external address is private (it sits behind
    /// another NAT): its mappings would not make us reachable.
    NonRoutable,
}

impl ReachState {
    /// Records `addr` as confirmed reachable from outside (once).
    pub(crate) fn confirm(&mut self, addr: Multiaddr) {
        if !self.confirmed.contains(&addr) {
            self.confirmed.push(addr);
        }
    }

    /// Per connection kind, the peers connected that way.
    pub fn kinds(&self) -> BTreeMap<ConnectionKind, usize> {
        let mut out = BTreeMap::new();
        for kind in self.peers.values().filter_map(|p| p.kind) {
            *out.entry(kind).or_insert(0) += 1;
        }
        out
    }

    /// Per peer (base58), the kind of its open connection.
    pub fn peer_kinds(&self) -> Vec<(String, ConnectionKind)> {
        self.peers
            .iter()
            .filter_map(|(p, r)| r.kind.map(|k| (p.to_string(), k)))
            .collect()
    }

    /// Hole punches tried and succeeded, over all peers.
    pub fn punches(&self) -> (u64, u64) {
        self.peers.values().fold((0, 0), |(a, s), p| {
            (a + p.punch_attempts, s + p.punch_successes)
        })
    }
}

/// Shared between the swarm task and whoever reports.
#[derive(Debug, Clone, Default)]
pub struct Reach(Arc<Mutex<ReachState>>);

impl Reach {
    pub fn snapshot(&self) -> ReachState {
        lock(&self.0).clone()
    }

    pub(crate) fn update<T>(&self, f: impl FnOnce(&mut ReachState) -> T) -> T {
        f(&mut lock(&self.0))
    }

    /// The kind of our connection to `peer`, if one is open.
    pub fn kind_of(&self, peer: &PeerId) -> Option<ConnectionKind> {
        lock(&self.0).peers.get(peer).and_then(|p| p.kind)
    }

    /// What we know of `peer` (nothing yet: the default).
    pub fn peer(&self, peer: &PeerId) -> PeerReach {
        lock(&self.0).peers.get(peer).cloned().unwrap_or_default()
    }

    /// Why `peer` is left out as reachable only through a relay, if it is.
    pub fn relay_only(&self, peer: &PeerId) -> Option<String> {
        lock(&self.0).relay_only.get(peer).cloned()
    }
}

/// The IP of a direct address (`None` for a relayed one: its IP is the
/// relay's).
pub(crate) fn ip_of(addr: &Multiaddr) -> Option<std::net::IpAddr> {
    if is_relayed(addr) {
        return None;
    }
    addr.iter().find_map(|p| match p {
        Protocol::Ip4(ip) => Some(ip.into()),
        Protocol::Ip6(ip) => Some(ip.into()),
        _ => None,
    })
}

/// Of a peer's lane addresses (`IP:port`), those at an IP we already reach
/// it at; `Err` names the addresses and those IPs when none is.
pub(crate) fn dialable_lane_addrs(
    announced: &[String],
    remote_ips: &[std::net::IpAddr],
) -> Result<Vec<String>, String> {
    let ok: Vec<String> = announced
        .iter()
        .filter(|a| {
            a.parse::<std::net::SocketAddr>()
                .is_ok_and(|s| remote_ips.contains(&s.ip()))
        })
        .cloned()
        .collect();
    if ok.is_empty() && !announced.is_empty() {
        let ips: Vec<String> = remote_ips.iter().map(|ip| ip.to_string()).collect();
        return Err(format!(
            "its lane addresses ({}) are not where we reach it ({}): it is behind a NAT",
            announced.join(", "),
            if ips.is_empty() {
                "only through a relay".to_string()
            } else {
                ips.join(", ")
            }
        ));
    }
    Ok(ok)
}

/// Whether `addr` goes through a relay (`/p2p-circuit`).
pub(crate) fn is_relayed(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| matches!(p, Protocol::P2pCircuit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_circuit_address_is_relayed_and_a_plain_one_is_not() {
        let relayed: Multiaddr = "/ip4/192.0.2.1/tcp/4001/p2p/12D3KooWLRPJAA5o6XxYT6eQhw7H6E1W6mgAy5K3Ty2TBcKTEBhc/p2p-circuit"
            .parse()
            .unwrap();
        let plain: Multiaddr = "/ip4/192.0.2.1/udp/4001/quic-v1".parse().unwrap();
        assert!(is_relayed(&relayed));
        assert!(!is_relayed(&plain));
    }

    #[test]
    fn lane_addresses_are_dialed_only_where_the_peer_is_reached() {
        let lan: std::net::IpAddr = "192.168.1.2".parse().unwrap();
        let nat: std::net::IpAddr = "203.0.113.7".parse().unwrap();
        let announced = vec!["192.168.1.2:4100".to_string(), "127.0.0.1:4100".to_string()];
        assert_eq!(
            dialable_lane_addrs(&announced, &[lan]).unwrap(),
            vec!["192.168.1.2:4100".to_string()]
        );
        let behind_nat = dialable_lane_addrs(&announced, &[nat]).unwrap_err();
        assert!(behind_nat.contains("behind a NAT") && behind_nat.contains("203.0.113.7"));
        assert!(
            dialable_lane_addrs(&announced, &[])
                .unwrap_err()
                .contains("only through a relay")
        );
        assert!(dialable_lane_addrs(&[], &[lan]).unwrap().is_empty());
        // Reached at a name: every announced address is tried.
        let named = PeerReach {
            unresolved: true,
            ..Default::default()
        };
        assert_eq!(named.lane_addrs(&announced).unwrap(), announced);
    }

    #[test]
    fn kinds_and_punches_sum_over_peers() {
        let reach = Reach::default();
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        reach.update(|s| {
            s.peers.insert(
                a,
                PeerReach {
                    kind: Some(ConnectionKind::HolePunched),
                    punch_attempts: 2,
                    punch_successes: 1,
                    ..Default::default()
                },
            );
            s.peers.insert(
                b,
                PeerReach {
                    kind: Some(ConnectionKind::Relayed),
                    punch_attempts: 3,
                    ..Default::default()
                },
            );
            s.peers.insert(c, PeerReach::default());
        });
        let state = reach.snapshot();
        assert_eq!(state.punches(), (5, 1));
        let kinds = state.kinds();
        assert_eq!(kinds.get(&ConnectionKind::HolePunched), Some(&1));
        assert_eq!(kinds.get(&ConnectionKind::Relayed), Some(&1));
        assert_eq!(kinds.get(&ConnectionKind::Direct), None);
        assert_eq!(reach.kind_of(&b), Some(ConnectionKind::Relayed));
        assert_eq!(reach.kind_of(&c), None);
    }
}
