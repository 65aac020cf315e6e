//! `slowmo relay`: a public peer that trains nothing and lets nodes behind
//! NATs take part (relay reservations, AutoNAT dial-backs, and the relayed
//! connections their hole punches start from).

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use slowmo_gossip::p2p::RelayServer;

/// Arguments of `slowmo relay`.
#[derive(Debug, clap::Args)]
pub struct RelayArgs {
    /// Multiaddr to listen on (repeatable); the relay must be reachable
    /// there by every node.
    #[arg(long, default_values_t = vec!["/ip4/0.0.0.0/udp/4001/quic-v1".to_string(), "/ip4/0.0.0.0/tcp/4001".to_string()])]
    pub listen: Vec<String>,
    /// Key file of the relay's identity, created on first run (its peer id
    /// then stays the same across restarts, and so do the addresses nodes
    /// are given).
    #[arg(long)]
    pub identity: Option<PathBuf>,
    /// An address the relay is reachable at besides its listen addresses
    /// (repeatable): a public IP the machine does not see, a forwarded port.
    #[arg(long)]
    pub external_address: Vec<String>,
    /// Let circuits carry any number of bytes, for nodes that send tensors
    /// over the relay by choice (--relay-tensors); by default a circuit
    /// carries 64 MiB, a run's control plane.
    #[arg(long)]
    pub carry_tensors: bool,
    /// Stop after this many seconds (default: until a signal).
    #[arg(long)]
    pub seconds: Option<u64>,
}

pub fn run(args: RelayArgs) -> anyhow::Result<()> {
    let relay = RelayServer::start(
        &args.listen,
        args.identity.as_deref(),
        &args.external_address,
        args.carry_tensors,
    )
    .context("starting the relay")?;
    println!("relay {} listening; give nodes one of:", relay.peer_id());
    for addr in relay.listen_addrs() {
        println!("  --bootstrap {addr}");
    }
    let (tx, rx) = mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })
    .context("installing the signal handler")?;
    match args.seconds {
        Some(s) => {
            let _ = rx.recv_timeout(Duration::from_secs(s));
        }
        None => {
            let _ = rx.recv();
        }
    }
    let reach = relay.reach();
    let kinds = reach.kinds();
    eprintln!(
        "relay stopping: {} peers connected ({} directly, {} through relays)",
        kinds.values().sum::<usize>(),
        kinds
            .get(&slowmo_gossip::p2p::reach::ConnectionKind::Direct)
            .unwrap_or(&0),
        kinds
            .get(&slowmo_gossip::p2p::reach::ConnectionKind::Relayed)
            .unwrap_or(&0)
    );
    Ok(())
}
