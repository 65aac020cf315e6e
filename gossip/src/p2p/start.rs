//! Starting a node: the swarm, the listeners and the acceptors
//! ([`P2pComm::bind`]), then the join ([`PendingJoin::join`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libp2p::Multiaddr;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, watch};

use super::addrs::parse_addrs;
use super::behaviour::{self, NetEvent};
use super::comm::{P2pComm, spawn_links, with_peer_suffix};
use super::command::SwarmCmd;
use super::config::P2pConfig;
use super::identity;
use super::inbound;
use super::lane::Lanes;
use super::membership::join::{Joined, Membership};
use super::nat::{NatSetup, namespace_of};
use super::state::{ReduceMsg, Shared, View};
use super::views::accept;
use super::views::board::Board;
use crate::CommError;
use crate::ledger::{Ledger, Mixing};
use crate::sync::lock;

impl P2pComm {
    /// Starts the node and joins the run: [`P2pComm::bind`] then
    /// [`PendingJoin::join`]. Returns once `cfg.nodes` verified peers agree
    /// on the member list; ranks are the positions in the agreed list
    /// (the admission policy's place order: sorted peer ids when open).
    pub fn start(cfg: P2pConfig) -> Result<Self, CommError> {
        Self::bind(cfg)?.join()
    }

    /// First half of [`P2pComm::start`]: builds the swarm on the node's own
    /// runtime and listens, so that the addresses are known (to print them,
    /// or hand them to other nodes) before the join waits for peers.
    pub fn bind(cfg: P2pConfig) -> Result<PendingJoin, CommError> {
        cfg.validate()
            .map_err(|e| CommError::Config(format!("p2p config: {e}")))?;
        let listen_addrs = parse_addrs("listen", &cfg.listen)?;
        let bootstrap = parse_addrs("bootstrap", &cfg.bootstrap)?;
        let external = parse_addrs("external address", &cfg.external_addrs)?;
        let keypair = identity::load_or_create(cfg.identity_file.as_deref())?;
        let local = keypair.public().to_peer_id();
        cfg.admission
            .check_self(&cfg.run.run_id, &local)
            .map_err(|e| CommError::Config(format!("admission ({}): {e}", cfg.admission.name())))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.worker_threads.max(1))
            .thread_name("slowmo-p2p")
            .enable_all()
            .build()
            .map_err(|e| CommError::Network(format!("starting the network runtime: {e}")))?;
        let (swarm_tx, swarm_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (view_tx, view_rx) = watch::channel(None);
        let (reduce_tx, reduce_rx) = mpsc::channel(1);
        let listen = Arc::new(Mutex::new(Vec::new()));
        let wanted_listeners = listen_addrs.len();
        let board = Arc::new(Board::default());
        let shared = Arc::new(Shared::new(
            cfg.clone(),
            local,
            view_rx,
            reduce_tx,
            swarm_tx,
        ));
        let membership = Arc::new(Membership::new(
            local,
            &cfg,
            listen.clone(),
            bootstrap.clone(),
            view_tx,
            shared.clone(),
            board.clone(),
        ));
        let bound = rt.block_on(async {
            let (swarm, metrics) = super::swarm::listening_swarm(keypair, &cfg, listen_addrs)?;
            let mut control = swarm.behaviour().stream.new_control();
            inbound::spawn_acceptors(&shared, &mut control).map_err(CommError::Network)?;
            membership.spawn_acceptor(&mut control)?;
            super::settings::spawn_acceptor(&shared, &mut control).map_err(CommError::Network)?;
            accept::spawn_acceptors(&shared, &board, &membership, &mut control)?;
            let lanes = Lanes::start(&shared, &mut control, listen.clone())
                .await
                .map_err(CommError::Network)?;
            if let Some(lanes) = &lanes {
                // A peer whose lane broke and whose lane port refuses
                // connections is gone: suspected at once, not after the
                // peer timeout.
                let (s, b) = (shared.clone(), board.clone());
                lanes.on_loss(Box::new(move |peer, why| b.lose(&s, peer, why)));
            }
            tokio::spawn(behaviour::run_swarm(
                swarm,
                swarm_rx,
                events_tx,
                listen.clone(),
                bootstrap,
                metrics,
                NatSetup {
                    reach: shared.reach.clone(),
                    relay_server: cfg.relay,
                    external,
                    namespace: Some(namespace_of(&cfg.run.run_id)),
                },
            ));
            // Hellos carry our addresses: wait until the listeners are up.
            let until = Instant::now() + Duration::from_secs(5);
            while lock(&listen).len() < wanted_listeners && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if let Some(lanes) = &lanes {
                membership.set_lane_addrs(lanes.announced());
            }
            Ok::<_, CommError>((control, lanes))
        });
        let (control, lanes) = match bound {
            Ok(c) => c,
            Err(e) => {
                let _ = shared.swarm.send(SwarmCmd::Shutdown);
                rt.shutdown_timeout(Duration::from_secs(1));
                return Err(e);
            }
        };
        Ok(PendingJoin {
            rt: Some(rt),
            shared,
            membership,
            board,
            lanes,
            control,
            events_rx: Some(events_rx),
            reduce_rx: Some(reduce_rx),
            listen,
        })
    }
}

/// A node that listens but has not joined yet (see [`P2pComm::bind`]).
pub struct PendingJoin {
    rt: Option<Runtime>,
    shared: Arc<Shared>,
    membership: Arc<Membership>,
    board: Arc<Board>,
    lanes: Option<Arc<Lanes>>,
    control: libp2p_stream::Control,
    events_rx: Option<mpsc::UnboundedReceiver<NetEvent>>,
    reduce_rx: Option<mpsc::Receiver<ReduceMsg>>,
    listen: Arc<Mutex<Vec<Multiaddr>>>,
}

impl PendingJoin {
    /// Our peer id (base58).
    pub fn local_peer_id(&self) -> String {
        self.shared.local.to_string()
    }

    /// Addresses we listen on, each ending in `/p2p/<our id>`.
    pub fn listen_addrs(&self) -> Vec<String> {
        with_peer_suffix(&self.listen, &self.shared.local)
    }

    /// The TCP port of our data lane (`None` when tensors take libp2p).
    pub fn lane_port(&self) -> Option<u16> {
        self.lanes.as_ref().map(|l| l.port())
    }

    /// Waits (up to the join timeout) until the run's members are present
    /// and agree on the member list, then opens the links.
    pub fn join(mut self) -> Result<P2pComm, CommError> {
        let rt = self.rt.take().expect("a pending join owns its runtime");
        let events = self.events_rx.take().expect("joined once");
        let timeout = self.shared.cfg.join_timeout;
        let joined = rt.block_on(self.membership.clone().join(
            self.control.clone(),
            events,
            timeout,
        ));
        let (view, member) = match joined {
            Ok(Joined::Member(v)) => (v, true),
            Ok(Joined::Outside(v)) => (v, false),
            Err(e) => {
                // Linger a moment so that our last answers (a refusal the
                // other side should log too) leave before the swarm goes.
                rt.block_on(async { tokio::time::sleep(Duration::from_millis(300)).await });
                let _ = self.shared.swarm.send(SwarmCmd::Shutdown);
                rt.shutdown_timeout(Duration::from_millis(500));
                return Err(e);
            }
        };
        let local = self.shared.local;
        let rank = view.rank_of(&local).filter(|_| member);
        let (push_links, reduce_links) = match rank {
            Some(_) => {
                let _guard = rt.enter();
                self.board.joined_before_install(&self.shared);
                spawn_links(&self.shared, self.lanes.as_ref(), &self.control, &view)
            }
            None => (Vec::new(), Vec::new()),
        };
        Ok(P2pComm {
            rt: Some(rt),
            shared: self.shared.clone(),
            control: self.control.clone(),
            // Outside the run, the view we know stands in until we are
            // admitted (no links: we send nothing).
            view: if member {
                view
            } else {
                Arc::new(View {
                    number: view.number,
                    members: view
                        .members
                        .iter()
                        .filter(|p| **p != local)
                        .copied()
                        .collect(),
                })
            },
            rank: rank.unwrap_or(0),
            listen: self.listen.clone(),
            push_links,
            reduce_links,
            reduce_rx: self.reduce_rx.take().expect("joined once"),
            early: Vec::new(),
            push: Ledger::new(Mixing::Arrived),
            seq: 0,
            membership: self.membership.clone(),
            board: self.board.clone(),
            lanes: self.lanes.clone(),
            pending_joiners: Vec::new(),
            lend: None,
        })
    }
}

impl Drop for PendingJoin {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            let _ = self.shared.swarm.send(SwarmCmd::Shutdown);
            rt.shutdown_background();
        }
    }
}
