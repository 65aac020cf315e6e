//! Where the lane listens, and the words that name its port: the error of
//! a port that cannot be had, the ports a warning asks to open.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use libp2p::Multiaddr;

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
/// what to open.
pub(super) fn lane_ports(addrs: &[String]) -> String {
    let mut ports: Vec<u16> = addrs
        .iter()
        .filter_map(|a| a.parse::<SocketAddr>().ok())
        .map(|a| a.port())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    match ports.as_slice() {
        [] => "its lane's TCP port".to_string(),
        [p] => format!("TCP port {p}"),
        many => format!(
            "TCP ports {}",
            many.iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
