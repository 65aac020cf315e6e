//! State shared between the training thread and the node's async tasks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libp2p::PeerId;
use tokio::sync::{mpsc, watch};

use super::behaviour::SwarmCmd;
use super::config::P2pConfig;
use super::payload::{BufferPool, LeBytes};
use super::wire::{Header, Reject};
use crate::ledger::Inbox;
use crate::{CommError, CommStats, Interrupt, Rank};

/// One membership view: who takes part, in rank order. Views are numbered so
/// that a later view (after a barrier) can change the members without any
/// message format knowing the world size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct View {
    pub number: u64,
    /// Members in rank order: sorted by their base58 text (`View::new`), or
    /// the agreed list's order at the join (the admission policy's places).
    pub members: Vec<PeerId>,
}

impl View {
    pub fn new(number: u64, mut members: Vec<PeerId>) -> Self {
        members.sort_by_key(|p| p.to_string());
        members.dedup();
        Self { number, members }
    }

    pub fn rank_of(&self, peer: &PeerId) -> Option<Rank> {
        self.members.iter().position(|p| p == peer)
    }

    pub fn names(&self) -> Vec<String> {
        self.members.iter().map(|p| p.to_string()).collect()
    }
}

/// Traffic counters, written from many tasks.
#[derive(Default)]
pub(crate) struct Counters {
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    messages_sent: AtomicU64,
    messages_received: AtomicU64,
    messages_dropped: AtomicU64,
}

impl Counters {
    pub fn sent(&self, bytes: u64) {
        self.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
        self.messages_sent.fetch_add(1, Ordering::Relaxed);
    }

    pub fn received(&self, bytes: u64) {
        self.bytes_received.fetch_add(bytes, Ordering::Relaxed);
        self.messages_received.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dropped(&self) {
        self.messages_dropped.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> CommStats {
        CommStats {
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
            messages_sent: self.messages_sent.load(Ordering::Relaxed),
            messages_received: self.messages_received.load(Ordering::Relaxed),
            messages_dropped: self.messages_dropped.load(Ordering::Relaxed),
        }
    }
}

/// When bytes last moved to or from each peer. A peer that is slow but
/// still moving data (a large share over a thin link) is not silent: every
/// wait on a peer times out only after `peer_timeout` without any progress.
#[derive(Default)]
pub(crate) struct Activity(Mutex<HashMap<PeerId, Instant>>);

impl Activity {
    /// Notes that bytes just moved to or from `peer`.
    pub fn touch(&self, peer: &PeerId) {
        lock(&self.0).insert(*peer, Instant::now());
    }

    /// When a wait on `peer` that began at `start` gives up: `timeout` after
    /// the later of its start and the peer's last activity.
    pub fn deadline(&self, peer: &PeerId, start: Instant, timeout: Duration) -> Instant {
        let last = lock(&self.0).get(peer).copied();
        last.map_or(start, |t| t.max(start)) + timeout
    }
}

/// An all-reduce chunk that passed validation, on its way to the training
/// thread.
pub(crate) struct ReduceMsg {
    pub from: Rank,
    pub header: Header,
    pub payload: Vec<u8>,
}

/// Everything the tasks of one node share.
pub(crate) struct Shared {
    pub cfg: P2pConfig,
    pub local: PeerId,
    pub counters: Counters,
    /// Per-peer and per-reason counts for the metrics endpoint.
    pub observed: super::observe::Observed,
    pub activity: Activity,
    /// The current view, `None` until the join completes.
    pub view: watch::Receiver<Option<Arc<View>>>,
    pub push_inbox: Inbox<LeBytes>,
    /// Recycled payload buffers (a few messages' worth).
    pub pool: BufferPool,
    pub reduce_tx: mpsc::Sender<ReduceMsg>,
    pub swarm: mpsc::UnboundedSender<SwarmCmd>,
    /// Inbound tensor streams being served: a graceful shutdown waits for
    /// the peers to finish theirs, so that its runtime does not vanish
    /// before it confirms their last frames.
    pub inbound_active: AtomicUsize,
    /// Set when the node shuts down: lost connections are expected then.
    pub stopping: Arc<AtomicBool>,
    /// Raised from outside (a signal): every wait gives up.
    pub interrupt: Interrupt,
    /// Why the current view cannot go on: a member was lost, or another
    /// member started a view change. Every wait of the training thread
    /// gives up with it; a view change clears it.
    pub alarm: Mutex<Option<CommError>>,
    /// What the view protocol heard ([`super::views`]).
    pub views: super::views::Board,
    offences: Mutex<HashMap<PeerId, u32>>,
    /// The data lane, set once it listens (none with `--data-lane libp2p`).
    pub lanes: std::sync::OnceLock<Arc<super::lane::Lanes>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking task poisons nothing we cannot still read.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(
        cfg: P2pConfig,
        local: PeerId,
        view: watch::Receiver<Option<Arc<View>>>,
        reduce_tx: mpsc::Sender<ReduceMsg>,
        swarm: mpsc::UnboundedSender<SwarmCmd>,
    ) -> Self {
        let push_inbox = Inbox::new(cfg.round_window);
        let largest = 4 * cfg.payload_floats.max(cfg.chunk_floats);
        let pool = BufferPool::new(8, 4 * largest);
        Self {
            cfg,
            local,
            counters: Counters::default(),
            observed: Default::default(),
            activity: Activity::default(),
            view,
            push_inbox,
            pool,
            reduce_tx,
            swarm,
            inbound_active: AtomicUsize::new(0),
            stopping: Arc::new(AtomicBool::new(false)),
            interrupt: Interrupt::new(),
            alarm: Mutex::new(None),
            views: Default::default(),
            offences: Mutex::new(HashMap::new()),
            lanes: std::sync::OnceLock::new(),
        }
    }

    /// `Err` once the node was interrupted or the view cannot go on.
    pub fn check(&self) -> Result<(), CommError> {
        self.interrupt.check()?;
        match &*lock(&self.alarm) {
            Some(CommError::PeerLost { peer, rank, reason }) => Err(CommError::PeerLost {
                peer: peer.clone(),
                rank: *rank,
                reason: reason.clone(),
            }),
            Some(e) => Err(CommError::ViewChanging(e.to_string())),
            None => Ok(()),
        }
    }

    /// Drops a message: logs the peer and the reason, counts it, and
    /// disconnects a peer that keeps offending.
    pub fn reject(&self, peer: &PeerId, protocol: &str, reason: &Reject) {
        self.counters.dropped();
        self.observed.dropped(peer, reason);
        tracing::warn!(%peer, protocol, %reason, "dropped a message from peer {peer}: {reason}");
        let offences = {
            let mut map = lock(&self.offences);
            let n = map.entry(*peer).or_insert(0);
            *n += 1;
            *n
        };
        if offences == self.cfg.max_offences {
            tracing::warn!(%peer, offences, "disconnecting peer {peer} after {offences} rejected messages");
            let _ = self.swarm.send(SwarmCmd::Disconnect(*peer));
        }
    }
}
