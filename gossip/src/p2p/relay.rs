//! A stand-alone relay (`slowmo relay`): a public peer that trains nothing
//! and serves nodes behind NATs: circuit relay v2 reservations, AutoNAT v2
//! dial-backs, and the relayed connections DCUtR turns into direct ones.
//! Nodes bootstrap through it like through any member; it speaks none of
//! the run's protocols, so it never becomes a member.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libp2p::Multiaddr;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::addrs::parse_addrs;
use super::behaviour;
use super::comm::with_peer_suffix;
use super::command::SwarmCmd;
use super::config::P2pConfig;
use super::identity;
use super::nat::NatSetup;
use super::reach::{Reach, ReachState};
use crate::CommError;
use crate::sync::lock;

/// A running relay; dropping it stops it.
pub struct RelayServer {
    rt: Option<Runtime>,
    swarm: mpsc::UnboundedSender<SwarmCmd>,
    local: libp2p::PeerId,
    listen: Arc<Mutex<Vec<Multiaddr>>>,
    reach: Reach,
}

impl RelayServer {
    /// Listens on `listen` (multiaddrs) with the identity in
    /// `identity_file` (created if missing) and serves until dropped.
    /// `external`: addresses it is reachable at besides its listen
    /// addresses (a forwarded port, a public IP the machine does not see).
    /// `tensors`: circuits carry any number of bytes, for nodes that relay
    /// tensors by choice (`--relay-tensors`).
    pub fn start(
        listen: &[String],
        identity_file: Option<&std::path::Path>,
        external: &[String],
        tensors: bool,
    ) -> Result<Self, CommError> {
        let listen_addrs = parse_addrs("listen", listen)?;
        if listen_addrs.is_empty() {
            return Err(CommError::Config(
                "listen: at least one multiaddr is needed".into(),
            ));
        }
        let external = parse_addrs("external address", external)?;
        let keypair = identity::load_or_create(identity_file)?;
        let local = keypair.public().to_peer_id();
        let mut cfg = P2pConfig::outside_run("relay", listen);
        cfg.relay = true;
        cfg.relay_tensors = tensors;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("slowmo-relay")
            .enable_all()
            .build()
            .map_err(|e| CommError::Network(format!("starting the network runtime: {e}")))?;
        let (swarm_tx, swarm_rx) = mpsc::unbounded_channel();
        // The relay takes part in no run: connection events go nowhere.
        let (events_tx, _) = mpsc::unbounded_channel();
        let listen = Arc::new(Mutex::new(Vec::new()));
        let reach = Reach::default();
        let wanted = listen_addrs.len();
        rt.block_on(async {
            let (swarm, metrics) = super::swarm::listening_swarm(keypair, &cfg, listen_addrs)?;
            tokio::spawn(behaviour::run_swarm(
                swarm,
                swarm_rx,
                events_tx,
                listen.clone(),
                Vec::new(),
                metrics,
                NatSetup {
                    reach: reach.clone(),
                    relay_server: true,
                    external,
                    namespace: None,
                },
            ));
            let until = Instant::now() + Duration::from_secs(5);
            while lock(&listen).len() < wanted && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, CommError>(())
        })?;
        Ok(Self {
            rt: Some(rt),
            swarm: swarm_tx,
            local,
            listen,
            reach,
        })
    }

    /// The relay's peer id.
    pub fn peer_id(&self) -> String {
        self.local.to_string()
    }

    /// The addresses nodes bootstrap through, each ending in `/p2p/<id>`.
    pub fn listen_addrs(&self) -> Vec<String> {
        with_peer_suffix(&self.listen, &self.local)
    }

    /// What the relay knows of the peers connected to it.
    pub fn reach(&self) -> ReachState {
        self.reach.snapshot()
    }
}

impl Drop for RelayServer {
    fn drop(&mut self) {
        let _ = self.swarm.send(SwarmCmd::Shutdown);
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_millis(200));
        }
    }
}
