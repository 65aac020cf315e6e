//! The libp2p swarm: transports and the protocols every node speaks
//! ([`super::behaviour`] drives it).
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

use std::time::Duration;

use libp2p::metrics::{Metrics, Recorder};
use libp2p::swarm::NetworkBehaviour;
use libp2p::swarm::SwarmEvent;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::{
    Multiaddr, Swarm, autonat, dcutr, identify, identity::Keypair, mdns, noise, ping, quic, relay,
    rendezvous, tcp, upnp, yamux,
};

use super::addrs::error_chain;
use super::config::P2pConfig;
use super::nat::relay_config;
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
    pub rendezvous: rendezvous::client::Behaviour,
    rendezvous_server: Toggle<rendezvous::server::Behaviour>,
    upnp: Toggle<upnp::tokio::Behaviour>,
    pub stream: libp2p_stream::Behaviour,
}

/// The protocols of a node.
fn behaviour(
    key: &Keypair,
    relay_client: relay::client::Behaviour,
    mdns_on: bool,
    relay_server: bool,
    relay_tensors: bool,
    upnp_on: bool,
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
        upnp: Toggle::from(upnp_on.then(upnp::tokio::Behaviour::default)),
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
pub(crate) fn record(metrics: &Metrics, event: &SwarmEvent<BehaviourEvent>) {
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
    let upnp_on = cfg.upnp;
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
                    behaviour(key, client, mdns_on, relay_server, relay_tensors, upnp_on)
                })
                .map_err(|e| fail("behaviour", &e))?
                .with_swarm_config(swarm_config)
                .build();
            (swarm, Some(Metrics::new(&mut registry)))
        }
        None => {
            let swarm = builder
                .with_behaviour(|key, client| {
                    behaviour(key, client, mdns_on, relay_server, relay_tensors, upnp_on)
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
    // Every address first: our own listeners, once up, would answer the
    // probe of a later address that overlaps them.
    for addr in &addrs {
        refuse_a_taken_tcp_port(addr)?;
    }
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

/// libp2p's TCP listeners set `SO_REUSEPORT` (so that dials can leave from
/// the listening port), and two processes of one user whose listeners both
/// set it share a port: a second node told to listen on a port the first
/// already holds would start, and the kernel would hand each incoming
/// connection to one of them at random. A plain bind to the port first,
/// without `SO_REUSEPORT`, fails while anyone listens there: the second
/// node stops with the address named instead. (A port taken between the
/// probe and the listen is not seen; port 0 needs no probe.)
fn refuse_a_taken_tcp_port(addr: &Multiaddr) -> Result<(), CommError> {
    use libp2p::multiaddr::Protocol;
    let mut parts = addr.iter();
    let ip: std::net::IpAddr = match parts.next() {
        Some(Protocol::Ip4(ip)) => ip.into(),
        Some(Protocol::Ip6(ip)) => ip.into(),
        _ => return Ok(()),
    };
    // Only a plain TCP listen address: a relayed one
    // (`.../tcp/PORT/p2p/RELAY/p2p-circuit`) names the relay's port.
    let port = match (parts.next(), parts.next()) {
        (Some(Protocol::Tcp(port)), None) if port != 0 => port,
        _ => return Ok(()),
    };
    match probe_bind(std::net::SocketAddr::new(ip, port)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(CommError::Network(format!(
            "listen: cannot listen on `{addr}`: TCP port {port} is in use ({e}): another node \
             or program on this machine listens there; pick another port, or port 0 for any \
             free one"
        ))),
        // Anything else (an address not on this machine, no permission) is
        // libp2p's to report, with its own words.
        Err(_) => Ok(()),
    }
}

/// Binds `addr` with the options of libp2p's TCP listeners but
/// `SO_REUSEPORT` (`SO_REUSEADDR`, and IPv6 only on an IPv6 address, so
/// that `[::]` does not collide with `0.0.0.0`), then closes the socket. A
/// bind with `SO_REUSEADDR` fails exactly where a socket listens on the
/// port; it accepts nothing itself.
fn probe_bind(addr: std::net::SocketAddr) -> std::io::Result<()> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())
}
