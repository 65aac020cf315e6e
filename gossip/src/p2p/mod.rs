//! The libp2p communicator: real peers in real processes.
//!
//! A [`P2pComm`] owns a tokio runtime on background threads that drives a
//! libp2p swarm (QUIC first, TCP + Noise + Yamux as fallback; identify,
//! ping, optional mDNS). Its [`Communicator`] methods block the calling
//! (training) thread only as far as the algorithm demands: push-sum shares
//! are copied once and written by background tasks.
//!
//! Protocols (`/slowmo/<name>/<major>`):
//! - `membership/1`: join handshake and view agreement ([`membership`]);
//! - `push-sum/1`: push-sum shares (added by the crate's push-sum ledger);
//! - `all-reduce/1`: ring all-reduce chunks, also the barrier ([`allreduce`]),
//!   and the blocks of the typed collectives ([`gather`]);
//! - `lane/2`: offers of the data lane ([`lane`]), one per view, which then carries the
//!   frames of `push-sum/1` and `all-reduce/1` over its own TCP connections
//!   (unless [`DataLane::Libp2p`]).
//!
//! Tensor frames are a CBOR header and a raw little-endian payload
//! ([`wire`]); every inbound frame is checked ([`inbound`]).
//!
//! ```no_run
//! use slowmo_gossip::p2p::{P2pComm, P2pConfig, RunIdentity};
//! use slowmo_gossip::Communicator;
//! let run = RunIdentity { run_id: "demo".into(), config_hash: "c0ffee".into(), init_hash: "5eed".into() };
//! let cfg = P2pConfig::new(run, 2, 1000).with_bootstrap(["/ip4/127.0.0.1/udp/4001/quic-v1"]);
//! let mut comm = P2pComm::start(cfg)?;
//! let mut x = vec![1.0f32; 1000];
//! let mut w = 1.0;
//! comm.all_reduce_sum(&mut x, &mut w)?;
//! comm.shutdown();
//! # Ok::<(), slowmo_gossip::CommError>(())
//! ```

mod admission;
mod allreduce;
mod behaviour;
mod config;
#[doc(hidden)]
pub mod fuzz;
mod fuzz_knock;
mod gather;
mod identity;
mod inbound;
pub mod lane;
mod links;
mod membership;
mod observe;
mod payload;
mod state;
mod udp;
mod views;
pub mod wire;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{AsyncReadExt, AsyncWriteExt};
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, watch};

pub use admission::{
    Admission, Invitation, RunKey, parse_public_key, peer_id_of_identity, public_key_text,
    read_allowlist,
};
pub use config::{MetricsRegistry, P2pConfig, RunIdentity};
pub use lane::DataLane;
pub use observe::{P2pObserver, PeerTraffic, reason_name};

use crate::ledger::{Ledger, Mixing, ShareSink, Waiting, check_round, send_half};
use allreduce::Ring;
use behaviour::{SwarmCmd, parse_addrs};
use links::{Link, Outgoing};
use membership::Membership;
use state::{ReduceMsg, Shared, View, lock};
use wire::{ALL_REDUCE_PROTOCOL, DType, Header, Kind, PUSH_SUM_PROTOCOL, WIRE_VERSION};

use crate::{CommError, CommStats, Communicator, PushSumMass, PushSumRound, Rank};

/// Frames a push-sum link may queue before the training thread waits.
const PUSH_QUEUE: usize = 16;
/// Frames an all-reduce link may queue (chunks in flight to one rank: a
/// direct schedule sends at most two per collective).
const RING_QUEUE: usize = 4;

/// A node of a run over libp2p. See the [module docs](self).
///
/// Its methods block the calling thread on the node's own runtime, so call
/// them from a plain thread (the training thread), not from inside an async
/// task of another tokio runtime.
pub struct P2pComm {
    rt: Option<Runtime>,
    shared: Arc<Shared>,
    control: libp2p_stream::Control,
    view: Arc<View>,
    rank: Rank,
    listen: Arc<Mutex<Vec<Multiaddr>>>,
    /// Push-sum links by rank (`None` for ourselves).
    push_links: Vec<Option<Link>>,
    /// All-reduce links by rank (`None` for ourselves); the ring uses the
    /// right neighbour's, a direct schedule every one.
    reduce_links: Vec<Option<Link>>,
    reduce_rx: mpsc::Receiver<ReduceMsg>,
    /// Frames of the next collective that came while this one ran.
    early: Vec<ReduceMsg>,
    push: Ledger,
    /// All-reduce sequence number (also counts barriers).
    seq: u64,
    membership: Arc<Membership>,
    /// Joiners of the view just installed, waiting for the state.
    pending_joiners: Vec<PeerId>,
}

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
            .map_err(|e| CommError::Other(format!("p2p config: {e}")))?;
        let listen_addrs = parse_addrs("listen", &cfg.listen)?;
        let bootstrap = parse_addrs("bootstrap", &cfg.bootstrap)?;
        let keypair = identity::load_or_create(cfg.identity_file.as_deref())?;
        let local = keypair.public().to_peer_id();
        cfg.admission
            .check_self(&cfg.run.run_id, &local)
            .map_err(|e| CommError::Other(format!("admission ({}): {e}", cfg.admission.name())))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.worker_threads.max(1))
            .thread_name("slowmo-p2p")
            .enable_all()
            .build()
            .map_err(|e| CommError::Other(format!("starting the network runtime: {e}")))?;
        let (swarm_tx, swarm_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (view_tx, view_rx) = watch::channel(None);
        let (reduce_tx, reduce_rx) = mpsc::channel(1);
        let listen = Arc::new(Mutex::new(Vec::new()));
        let wanted_listeners = listen_addrs.len();
        let shared = Arc::new(Shared::new(
            cfg.clone(),
            local,
            view_rx,
            reduce_tx,
            swarm_tx.clone(),
        ));
        let membership = Arc::new(Membership::new(
            local,
            &cfg,
            listen.clone(),
            bootstrap.clone(),
            swarm_tx,
            view_tx,
            shared.clone(),
        ));
        let bound = rt.block_on(async {
            let (mut swarm, metrics) = behaviour::build_swarm(keypair, &cfg)?;
            for addr in listen_addrs {
                swarm.listen_on(addr.clone()).map_err(|e| {
                    CommError::Other(format!(
                        "listen: cannot listen on `{addr}`: {}",
                        behaviour::error_chain(&e)
                    ))
                })?;
            }
            let mut control = swarm.behaviour().stream.new_control();
            inbound::spawn_acceptors(&shared, &mut control).map_err(CommError::Other)?;
            membership.spawn_acceptor(&mut control)?;
            views::spawn_acceptors(&shared, &membership, &mut control)?;
            if let Some(lanes) = lane::Lanes::start(&shared, &mut control, listen.clone())
                .await
                .map_err(CommError::Other)?
            {
                let _ = shared.lanes.set(lanes);
            }
            tokio::spawn(behaviour::run_swarm(
                swarm,
                swarm_rx,
                events_tx,
                listen.clone(),
                bootstrap,
                metrics,
            ));
            // Hellos carry our addresses: wait until the listeners are up.
            let until = Instant::now() + Duration::from_secs(5);
            while lock(&listen).len() < wanted_listeners && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, CommError>(control)
        });
        let control = match bound {
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
            control,
            events_rx: Some(events_rx),
            reduce_rx: Some(reduce_rx),
            listen,
        })
    }

    /// Our peer id (base58).
    pub fn local_peer_id(&self) -> String {
        self.shared.local.to_string()
    }

    /// A handle on this node's counters for another thread (a metrics
    /// endpoint); see [`P2pObserver`].
    pub fn observer(&self) -> P2pObserver {
        P2pObserver {
            shared: self.shared.clone(),
        }
    }

    /// Peer ids of the current view in rank order.
    pub fn members(&self) -> Vec<String> {
        self.view.names()
    }

    /// Number of the current membership view.
    pub fn view_number(&self) -> u64 {
        self.view.number
    }

    /// Addresses we listen on, each ending in `/p2p/<our id>` so that they
    /// can be handed to other nodes as bootstrap addresses.
    pub fn listen_addrs(&self) -> Vec<String> {
        with_peer_suffix(&self.listen, &self.shared.local)
    }

    /// The handle that interrupts this node's blocked operations (for a
    /// signal handler): they return [`CommError::Interrupted`] promptly.
    pub fn interrupt_handle(&self) -> crate::Interrupt {
        self.shared.interrupt.clone()
    }

    /// Sends `bytes` as they are on one of our protocols to `peer`: for
    /// conformance tests and fuzzing (a peer that speaks our protocols by
    /// hand). Waits for the receiver to take the stream and, briefly, for it
    /// to finish with it.
    pub fn send_raw(&self, peer: &str, protocol: &str, bytes: &[u8]) -> Result<(), CommError> {
        let peer: PeerId = peer
            .parse()
            .map_err(|e| CommError::Other(format!("`{peer}` is not a peer id: {e}")))?;
        let protocol = StreamProtocol::try_from_owned(protocol.to_string())
            .map_err(|e| CommError::Other(format!("`{protocol}` is not a protocol name: {e}")))?;
        let mut control = self.control.clone();
        let rt = self
            .rt
            .as_ref()
            .ok_or_else(|| CommError::Closed("node stopped".into()))?;
        rt.block_on(async move {
            let io = |e: std::io::Error| CommError::Other(format!("raw stream to {peer}: {e}"));
            let mut s = control
                .open_stream(peer, protocol)
                .await
                .map_err(|e| CommError::Other(format!("raw stream to {peer}: {e}")))?;
            let mut ready = [0u8; 1];
            s.read_exact(&mut ready).await.map_err(io)?;
            s.write_all(bytes).await.map_err(io)?;
            let _ = s.close().await;
            let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut ready)).await;
            Ok(())
        })
    }

    /// Stops the node after the links have delivered what they hold (each
    /// waits for its receiver's confirmation, at most the peer timeout).
    pub fn shutdown(mut self) {
        self.stop(true);
    }

    fn stop(&mut self, graceful: bool) {
        let Some(rt) = self.rt.take() else { return };
        self.shared
            .stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let mut tasks = Vec::new();
        for link in self
            .push_links
            .drain(..)
            .flatten()
            .chain(self.reduce_links.drain(..).flatten())
        {
            drop(link.queue);
            tasks.push(link.task);
        }
        if graceful {
            // Our links finish (each receiver confirms our last frame), and
            // the peers' links to us finish too: leaving earlier would cut
            // their confirmations off.
            let wait = self.shared.cfg.peer_timeout.min(Duration::from_secs(10));
            let shared = self.shared.clone();
            rt.block_on(async move {
                let until = tokio::time::Instant::now() + wait;
                let _ = tokio::time::timeout_at(until, futures::future::join_all(tasks)).await;
                while shared
                    .inbound_active
                    .load(std::sync::atomic::Ordering::SeqCst)
                    > 0
                    && tokio::time::Instant::now() < until
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
        }
        let _ = self.shared.swarm.send(SwarmCmd::Shutdown);
        rt.shutdown_timeout(Duration::from_millis(if graceful { 500 } else { 0 }));
    }

    fn runtime(&self) -> Result<&Runtime, CommError> {
        if !self.is_member() {
            return Err(CommError::Other(format!(
                "this node ({}) is outside the run's view {}: it must be admitted first",
                self.shared.local, self.view.number
            )));
        }
        self.rt
            .as_ref()
            .ok_or_else(|| CommError::Closed("node stopped".into()))
    }

    fn collect(
        &mut self,
        wait_up_to: Option<u64>,
        x: &mut [f32],
        w: &mut f64,
        op: &'static str,
    ) -> Result<(), CommError> {
        let view = self.view.clone();
        let name = move |r: Rank| {
            view.members
                .get(r)
                .map(|p| p.to_string())
                .unwrap_or_default()
        };
        let members = self.view.clone();
        let shared = self.shared.clone();
        let timeout = shared.cfg.peer_timeout;
        let deadline = move |r: Rank, started: std::time::Instant| match members.members.get(r) {
            Some(peer) => shared.activity.deadline(peer, started, timeout),
            None => started + timeout,
        };
        let check_shared = self.shared.clone();
        let check = move || check_shared.check();
        let waiting = Waiting {
            timeout,
            deadline: &deadline,
            peer_name: &name,
            check: &check,
        };
        let pool = &self.shared.pool;
        let result = self.push.collect(
            &self.shared.push_inbox,
            &waiting,
            wait_up_to,
            x,
            w,
            op,
            &mut |share| share.recycle(pool),
        );
        if let Err(CommError::PeerTimeout { rank, .. }) = &result
            && let Some(peer) = self.view.members.get(*rank)
        {
            self.shared.observed.timed_out(peer);
        }
        result
    }
    /// Runs `f` on the ring of the next collective; `None` in a run of one.
    fn on_ring<T>(
        &mut self,
        operation: &'static str,
        f: impl FnOnce(&mut Ring<'_>) -> Result<T, CommError>,
    ) -> Result<Option<T>, CommError> {
        self.runtime()?;
        self.seq += 1;
        let rt = self
            .rt
            .as_ref()
            .ok_or_else(|| CommError::Closed("node stopped".into()))?;
        if self.view.members.len() <= 1 || self.reduce_links.is_empty() {
            return Ok(None);
        }
        let mut ring = Ring {
            rt,
            shared: &self.shared,
            view: &self.view,
            rank: self.rank,
            links: &self.reduce_links,
            inbox: &mut self.reduce_rx,
            early: &mut self.early,
            seq: self.seq,
            operation,
        };
        f(&mut ring).map(Some)
    }

    fn all_reduce(
        &mut self,
        buf: &mut [f32],
        scalar: &mut f64,
        operation: &'static str,
    ) -> Result<(), CommError> {
        // A run of one has nothing to add.
        self.on_ring(operation, |ring| ring.run(buf, scalar))
            .map(drop)
    }
}

/// A node that listens but has not joined yet (see [`P2pComm::bind`]).
pub struct PendingJoin {
    rt: Option<Runtime>,
    shared: Arc<Shared>,
    membership: Arc<Membership>,
    control: libp2p_stream::Control,
    events_rx: Option<mpsc::UnboundedReceiver<behaviour::NetEvent>>,
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
            Ok(membership::Joined::Member(v)) => (v, true),
            Ok(membership::Joined::Outside(v)) => (v, false),
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
                spawn_links(&self.shared, &self.control, &view)
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
            pending_joiners: Vec::new(),
        })
    }
}

/// Our links in `view`: push-sum and all-reduce to every
/// member, over the data lane when the node has one. (A link opens its
/// stream with its first frame: the ring only ever uses the right
/// neighbour's all-reduce link.)
/// Call inside the node's runtime.
pub(crate) fn spawn_links(
    shared: &Arc<Shared>,
    control: &libp2p_stream::Control,
    view: &View,
) -> (Vec<Option<Link>>, Vec<Option<Link>>) {
    let local = shared.local;
    let lanes = shared.lanes.get().cloned();
    if let Some(lanes) = &lanes {
        lanes.connect_view(shared, control, view);
    }
    let spawn = |peer: PeerId, protocol: &'static str, depth: usize| match &lanes {
        Some(lanes) => lane::spawn_link(shared.clone(), lanes.clone(), peer, view.number, depth),
        None => Link::spawn(
            shared.clone(),
            control.clone(),
            peer,
            StreamProtocol::new(protocol),
            depth,
        ),
    };
    let to_others = |protocol: &'static str, depth: usize| {
        view.members
            .iter()
            .map(|peer| (*peer != local).then(|| spawn(*peer, protocol, depth)))
            .collect()
    };
    (
        to_others(PUSH_SUM_PROTOCOL, PUSH_QUEUE),
        to_others(ALL_REDUCE_PROTOCOL, RING_QUEUE),
    )
}

impl Drop for PendingJoin {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            let _ = self.shared.swarm.send(SwarmCmd::Shutdown);
            rt.shutdown_background();
        }
    }
}

/// Why [`block_on_active`] gave up.
pub(crate) enum Stopped {
    /// `limit` passed without bytes moving to or from the peer.
    Silent,
    /// Interrupted, or the view cannot go on ([`Shared::check`]).
    Alarm(CommError),
}

/// Runs `fut` on the node's runtime from a plain thread, giving up only
/// after `limit` without any bytes moving to or from `peer` (see
/// [`state::Activity`]), counted from `started` at the earliest: a slow
/// transfer that progresses is waited for. An interrupt or a membership
/// alarm ends the wait within [`crate::POLL`]. (The timer must be created
/// inside the runtime, hence the wrapper.)
pub(crate) fn block_on_active<F: std::future::Future>(
    rt: &Runtime,
    shared: &Shared,
    peer: &PeerId,
    started: std::time::Instant,
    limit: Duration,
    fut: F,
) -> Result<F::Output, Stopped> {
    rt.block_on(async move {
        let mut fut = std::pin::pin!(fut);
        loop {
            shared.check().map_err(Stopped::Alarm)?;
            let deadline = shared.activity.deadline(peer, started, limit);
            let slice = deadline.min(std::time::Instant::now() + crate::POLL);
            match tokio::time::timeout_at(slice.into(), fut.as_mut()).await {
                Ok(out) => return Ok(out),
                Err(_) => {
                    if shared.activity.deadline(peer, started, limit) <= std::time::Instant::now() {
                        shared.observed.timed_out(peer);
                        return Err(Stopped::Silent);
                    }
                }
            }
        }
    })
}

fn with_peer_suffix(listen: &Mutex<Vec<Multiaddr>>, local: &PeerId) -> Vec<String> {
    lock(listen)
        .iter()
        .map(|a| format!("{a}/p2p/{local}"))
        .collect()
}

impl Drop for P2pComm {
    fn drop(&mut self) {
        self.stop(false);
    }
}

/// The network's half of the shared push-sum send path: the share is scaled
/// and encoded in one pass into a pooled buffer (the payload every out-peer
/// gets, behind one `Arc`), and queued on each peer's link.
impl ShareSink for P2pComm {
    type Share = Outgoing;

    fn ledger(&mut self) -> &mut Ledger {
        &mut self.push
    }

    fn scale_and_encode(&mut self, round: u64, x: &mut [f32], p: f32, w: f64) -> Outgoing {
        let lane = self.shared.lanes.get().is_some();
        let buf = self.shared.pool.take(4 * x.len());
        let (payload, sum) = payload::scale_and_encode(lane, x, p, buf);
        let header = wire::encode_header(&Header {
            version: WIRE_VERSION,
            run_id: self.shared.cfg.run.run_id.clone(),
            view: self.view.number,
            sender: self.shared.local.to_string(),
            round,
            kind: Kind::PushSum,
            dtype: DType::F32,
            len: x.len() as u64,
            weight: w,
            checksum: sum,
            step: 0,
            offset: 0,
            total: x.len() as u64,
        });
        Outgoing {
            header,
            payload: Arc::new(payload),
        }
    }

    fn send_share(
        &mut self,
        peer: Rank,
        round: u64,
        msg: Outgoing,
        _w: f64,
    ) -> Result<(), CommError> {
        let rt = self.runtime()?;
        let link = self.push_links[peer]
            .as_ref()
            .expect("checked: not ourselves");
        let timeout = self.shared.cfg.peer_timeout;
        let send = link.queue.send(msg);
        let now = std::time::Instant::now();
        match block_on_active(rt, &self.shared, &link.peer, now, timeout, send) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(CommError::Closed(format!("link to rank {peer} is gone"))),
            Err(Stopped::Alarm(e)) => Err(e),
            Err(Stopped::Silent) => Err(CommError::PeerTimeout {
                peer: link.peer.to_string(),
                rank: peer,
                round,
                operation: "push-sum send",
                timeout,
            }),
        }
    }
}

impl Communicator for P2pComm {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.view.members.len()
    }

    /// A member lost, or a change another member began, is noticed as the
    /// next base step begins, not only at the next exchange: a local-SGD
    /// run does not compute on to its barrier in a view that is over, and
    /// the step a change begins at is the simulator's.
    fn base_step(&mut self, _step: u64) -> Result<(), CommError> {
        self.shared.check()
    }

    fn push_sum(
        &mut self,
        round: &PushSumRound<'_>,
        x: &mut [f32],
        w: &mut f64,
    ) -> Result<(), CommError> {
        let expected = self.shared.cfg.payload_floats;
        if x.len() != expected {
            return Err(CommError::ShapeMismatch {
                expected,
                got: x.len(),
            });
        }
        check_round(round, self.rank, self.view.members.len())?;
        self.runtime()?;
        self.push
            .begin(&self.shared.push_inbox, round.round, round.in_peers)?;
        send_half(round, x, w, self)?;
        let wait = round.round.checked_sub(round.staleness);
        self.collect(wait, x, w, "push-sum")
    }

    fn shares_arrived(&mut self, up_to: u64) -> Result<bool, CommError> {
        Ok(self.push.arrived(&self.shared.push_inbox, up_to))
    }

    fn drain(&mut self, x: &mut [f32], w: &mut f64) -> Result<(), CommError> {
        let expected = self.shared.cfg.payload_floats;
        if x.len() != expected {
            return Err(CommError::ShapeMismatch {
                expected,
                got: x.len(),
            });
        }
        self.runtime()?;
        self.collect(Some(u64::MAX), x, w, "drain")
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32], scalar: &mut f64) -> Result<(), CommError> {
        self.all_reduce(buf, scalar, "all-reduce")
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.all_reduce(&mut [], &mut 0.0, "barrier")
    }

    fn all_gather_u64(&mut self, values: &[u64]) -> Result<Vec<Vec<u64>>, CommError> {
        let gathered = self.on_ring("all-gather", |ring| ring.gather(values))?;
        Ok(gathered.unwrap_or_else(|| vec![values.to_vec()]))
    }

    fn change_view(&mut self, last_barrier: u64) -> Result<crate::ViewChange, CommError> {
        self.change_view_p2p(last_barrier)
    }

    fn at_barrier(&mut self, _round: u64) -> Result<bool, CommError> {
        self.at_barrier_p2p()
    }

    fn send_state(&mut self, state: &[u8]) -> Result<(), CommError> {
        self.send_state_p2p(state)
    }

    fn rejoin(&mut self) -> Result<crate::Admission, CommError> {
        self.rejoin_p2p()
    }

    fn interrupt_handle(&self) -> Option<crate::Interrupt> {
        Some(self.shared.interrupt.clone())
    }

    fn stats(&self) -> CommStats {
        self.shared.counters.snapshot()
    }

    fn push_sum_mass(&self) -> PushSumMass {
        self.push.mass()
    }
}
