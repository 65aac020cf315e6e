//! Where the lane listens, and the words that name its port: the error of
//! a port that cannot be had, the ports a warning asks to open.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use libp2p::{Multiaddr, PeerId};

use super::super::reach::ip_of;

/// The IP our libp2p listeners use, for the lane's listener.
pub(super) fn listen_ip(addrs: &[String]) -> IpAddr {
    addrs
        .iter()
        .filter_map(|a| a.parse::<Multiaddr>().ok())
        .find_map(|a| ip_of(&a))
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// Why the lane's listener could not be had, naming the port and where it
/// came from (`given`: configured, else the TCP listen port plus one).
pub(super) fn bind_error(ip: IpAddr, port: u16, given: bool, e: &std::io::Error) -> String {
    let origin = if given {
        "the configured lane port"
    } else {
        "the TCP listen port plus one, the lane's default"
    };
    if e.kind() == std::io::ErrorKind::AddrInUse {
        format!(
            "data lane: cannot listen on {ip} TCP port {port} ({origin}): it is in use ({e}); \
             choose a free port with --lane-port (0 for any free one)"
        )
    } else {
        format!("data lane: cannot listen on {ip} TCP port {port} ({origin}): {e}")
    }
}

/// The TCP port(s) of a peer's lane addresses, for the warning that names
/// what to open; `None` when none was dialed (a peer behind a NAT).
fn lane_ports(addrs: &[String]) -> Option<String> {
    let mut ports: Vec<u16> = addrs
        .iter()
        .filter_map(|a| a.parse::<SocketAddr>().ok())
        .map(|a| a.port())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    match ports.len() {
        0 => None,
        1 => Some(format!("TCP port {}", ports[0])),
        _ => Some(format!("TCP ports {}", ports.join(", "))),
    }
}

/// Says that `peer`'s frames take the libp2p connection because its lane
/// (at `addrs`, empty behind a NAT) cannot be dialed: the first time with a
/// warning naming what to open, later in the debug log only.
pub(super) fn log_fallback(peer: &PeerId, why: &str, addrs: &[String], first: bool) {
    match (first, lane_ports(addrs)) {
        // Its addresses were dialed and did not answer: a firewall.
        (true, Some(ports)) => {
            tracing::warn!(%peer, "the data lane to {peer} cannot be dialed ({why}); its frames take the direct libp2p connection, several times slower than the lane: open {ports} on {peer}'s machine to the run's other machines (`slowmo doctor --peer` checks it)")
        }
        // Behind a NAT: no lane address of it is dialable at all.
        (true, None) => {
            tracing::warn!(%peer, "the data lane to {peer} cannot be dialed ({why}); its frames take the direct libp2p connection, several times slower than the lane")
        }
        (false, _) => {
            tracing::debug!(%peer, "{peer}'s lane port cannot be dialed ({why}); its frames take the direct libp2p connection")
        }
    }
}
