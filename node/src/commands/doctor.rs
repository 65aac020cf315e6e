//! `slowmo doctor`: before a long run, what this machine's network lets a
//! node do: its addresses as peers see them, whether it is reachable from
//! outside (AutoNAT), whether a relay holds a reservation for it, and
//! whether a given peer can be reached directly, by hole punching if need
//! be (tensors go over direct connections only). Ends with what to change.

use std::time::Duration;

use anyhow::Context;
use slowmo_gossip::p2p::doctor::{DoctorConfig, DoctorReport, check};
use slowmo_gossip::p2p::reach::{ConnectionKind, Upnp};

/// Arguments of `slowmo doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Multiaddr to listen on (repeatable), as the node will.
    #[arg(long, default_values_t = vec!["/ip4/0.0.0.0/udp/0/quic-v1".to_string(), "/ip4/0.0.0.0/tcp/0".to_string()])]
    pub listen: Vec<String>,
    /// Multiaddr of a peer or relay to reach first (repeatable), as the
    /// node will be given.
    #[arg(long, required = true)]
    pub bootstrap: Vec<String>,
    /// An address this node is reachable at besides its listen addresses.
    #[arg(long)]
    pub external_address: Vec<String>,
    /// A peer to reach (a multiaddr ending in /p2p/<id>; a relayed one,
    /// .../p2p/<relay>/p2p-circuit/p2p/<id>, for a peer behind a NAT).
    #[arg(long)]
    pub peer: Option<String>,
    /// Seconds to watch (with --upnp, at least 12: the router's answer).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Ask the router for port mappings by UPnP, as `slowmo node --upnp`
    /// would, and report its answer.
    #[arg(long)]
    pub upnp: bool,
    /// The data lane port the node will be given (`slowmo node
    /// --lane-port`) [default: the node's rule, the TCP listen port plus
    /// one].
    #[arg(long, value_name = "PORT")]
    pub lane_port: Option<u16>,
    /// The data lane port of --peer [default: its TCP port plus one].
    #[arg(long, value_name = "PORT", requires = "peer")]
    pub peer_lane_port: Option<u16>,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let report = check(&DoctorConfig {
        listen: args.listen.clone(),
        bootstrap: args.bootstrap.clone(),
        external: args.external_address.clone(),
        peer: args.peer.clone(),
        wait: Duration::from_secs(args.seconds.max(2)),
        upnp: args.upnp,
    })
    .context("checking the network")?;
    print!("{}", render(&report));
    print!("{}", lane_check(&args));
    Ok(())
}

/// The data lane's ports: whether ours is free, and whether the peer's
/// can be dialed from here (a TCP connection to it; a firewall that drops
/// it leaves the peer's tensors on the slower libp2p connection).
pub fn lane_check(args: &DoctorArgs) -> String {
    use slowmo_gossip::p2p::{default_lane_port, tcp_port_of};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    let mut out = String::new();
    let tcp = args
        .listen
        .iter()
        .find_map(|a| tcp_port_of(a))
        .filter(|p| *p != 0);
    let (ours, origin) = match (args.lane_port, tcp) {
        (Some(p), _) => (p, "--lane-port".to_string()),
        (None, Some(t)) => (
            default_lane_port(&args.listen),
            format!("the TCP listen port {t} plus one"),
        ),
        (None, None) => (0, String::new()),
    };
    if ours == 0 {
        out.push_str(
            "data lane        any free TCP port: no firewall rule can name it; listen on a TCP \
             port (--listen /ip4/0.0.0.0/tcp/PORT) or give --lane-port\n",
        );
    } else {
        match TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], ours))) {
            Ok(_) => out.push_str(&format!(
                "data lane        TCP port {ours} ({origin}): free; open it inbound to the run's \
                 other machines{}\n",
                tcp.map_or(String::new(), |t| format!(", beside TCP {t}"))
            )),
            Err(e) => out.push_str(&format!(
                "data lane        TCP port {ours} ({origin}): NOT free ({e}); give the node \
                 another --lane-port\n"
            )),
        }
    }
    if let Some(addr) = args.peer.as_deref() {
        let parts: Vec<&str> = addr.split('/').collect();
        let ip = parts
            .windows(2)
            .find(|w| w[0] == "ip4" || w[0] == "ip6")
            .and_then(|w| w[1].parse::<std::net::IpAddr>().ok());
        let port = args
            .peer_lane_port
            .or_else(|| Some(default_lane_port(&[addr.to_string()])).filter(|p| *p != 0));
        match (ip, port, addr.contains("p2p-circuit")) {
            (_, _, true) => out.push_str(
                "peer's lane      behind a relay: its tensors take the hole-punched connection\n",
            ),
            (Some(ip), Some(port), false) => {
                let at = SocketAddr::new(ip, port);
                match TcpStream::connect_timeout(&at, std::time::Duration::from_secs(3)) {
                    Ok(_) => out.push_str(&format!("peer's lane      {at}: reachable\n")),
                    Err(e) => out.push_str(&format!(
                        "peer's lane      {at}: NOT reachable ({e}): open TCP {port} on the peer's \
                         machine to this one; until then its tensors take the libp2p \
                         connection, several times slower\n"
                    )),
                }
            }
            _ => out.push_str(
                "peer's lane      unknown port: give --peer-lane-port (a QUIC address names no \
                 TCP port)\n",
            ),
        }
    }
    out
}

/// The report and the advice, as text.
pub fn render(r: &DoctorReport) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!("peer id          {}", r.peer_id));
    for a in &r.listen {
        line(format!("listening on     {a}"));
    }
    for (b, ok) in &r.bootstrap {
        line(format!(
            "bootstrap        {b}: {}",
            if *ok { "reached" } else { "NOT reached" }
        ));
    }
    let reach = &r.reach;
    for a in &reach.observed {
        line(format!("seen by peers at {a}"));
    }
    for a in &reach.confirmed {
        line(format!("reachable at     {a} (confirmed from outside)"));
    }
    for (a, why) in &reach.unreachable {
        line(format!("NOT reachable at {a}: {why}"));
    }
    for (relay, a) in &reach.reservations {
        line(format!(
            "relay            {relay} holds a reservation: peers reach us at {a}"
        ));
    }
    let mut advice: Vec<String> = Vec::new();
    match &reach.upnp {
        None if r.upnp => line("UPnP             no answer from a gateway in time".into()),
        None => {}
        Some(Upnp::Mapped(m)) if m.is_empty() => {
            line("UPnP             the router's mappings expired".into())
        }
        Some(Upnp::Mapped(m)) => {
            for (local, external) in m {
                line(format!(
                    "UPnP             the router maps {local} at {external}"
                ));
            }
        }
        Some(Upnp::NoGateway) => {
            line("UPnP             no gateway answered".into());
            advice.push(
                "no UPnP gateway answered: the router has UPnP IGD off, or there is none on \
                 this network; forward the ports by hand, or rely on a relay and hole punching"
                    .into(),
            );
        }
        Some(Upnp::NonRoutable) => {
            line("UPnP             the gateway is behind another NAT (its external address is private)".into());
            advice.push(
                "the UPnP gateway is itself behind a NAT (carrier-grade NAT, or a second \
                 router): its mappings do not make this node reachable; rely on a relay and \
                 hole punching"
                    .into(),
            );
        }
    }
    if r.bootstrap.iter().all(|(_, ok)| !ok) {
        advice.push(
            "no bootstrap address answered: check the address (with its /p2p/<id>), that the \
             node or relay there runs, and that this machine may open outgoing connections to it"
                .into(),
        );
    }
    let quic = |a: &String| a.contains("/quic-v1");
    let confirmed: Vec<String> = reach.confirmed.iter().map(|a| a.to_string()).collect();
    if confirmed.is_empty() {
        if reach.reservations.is_empty() {
            advice.push(
                "not reachable from outside and no relay holds a reservation: peers behind other \
                 NATs cannot reach this node. Start a relay on a public machine (`slowmo relay`, \
                 or a public member with --relay) and bootstrap through it, or forward a port to \
                 this machine and give it as --external-address"
                    .into(),
            );
        } else {
            advice.push(
                "behind a NAT, reachable through a relay: peers will hole-punch a direct \
                 connection (works behind most home routers; not behind a symmetric NAT)"
                    .into(),
            );
        }
    } else {
        let transports: Vec<&str> = [("QUIC", true), ("TCP", false)]
            .iter()
            .filter(|(_, q)| confirmed.iter().any(|a| quic(a) == *q))
            .map(|(n, _)| *n)
            .collect();
        advice.push(format!(
            "reachable from outside over {}: peers can dial this node, and it can serve others \
             as a relay (--relay)",
            transports.join(" and ")
        ));
    }
    if let Some(check) = &r.peer {
        let peer = &check.peer;
        match check.kind {
            Some(ConnectionKind::Direct) => {
                line(format!("peer             {peer}: direct connection"));
                advice.push("the peer is reached directly: tensors take that path".into());
            }
            Some(ConnectionKind::HolePunched) => {
                line(format!(
                    "peer             {peer}: direct connection by hole punching"
                ));
                advice.push(
                    "the peer is reached by hole punching: tensors take the punched connection \
                     (the data lane's own TCP port cannot be dialed behind a NAT)"
                        .into(),
                );
            }
            Some(ConnectionKind::Relayed) => {
                let why = check
                    .punch_error
                    .clone()
                    .unwrap_or_else(|| "no hole punch succeeded".into());
                line(format!(
                    "peer             {peer}: ONLY through a relay ({why})"
                ));
                advice.push(
                    "the peer is reachable only through a relay, which carries no tensors: one of \
                     you is likely behind a symmetric NAT. Forward a port to one side (and give it \
                     as --external-address), or run that node on a reachable machine"
                        .into(),
                );
            }
            None => {
                line(format!("peer             {peer}: NOT reached"));
                advice.push(
                    "the peer could not be reached at all: check its address, and that both \
                     sides reach the same relay"
                        .into(),
                );
            }
        }
    }
    for a in advice {
        line(format!("- {a}"));
    }
    out
}
