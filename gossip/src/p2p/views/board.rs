//! What the view protocol has heard, for the training thread: the board
//! the acceptors write and the communicator reads, and the hooks that mark
//! a member lost or suspect (from the membership task and the view client).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use libp2p::PeerId;

use super::msg::{Report, ViewDecision};
use crate::CommError;
use crate::p2p::command::SwarmCmd;
use crate::p2p::state::Shared;
use crate::sync::lock;

/// What the view protocol has heard, for the training thread.
#[derive(Default)]
pub(crate) struct BoardState {
    /// Peers of the current view this node believes lost.
    pub suspects: HashSet<PeerId>,
    /// Reports by view, then sender.
    pub(super) reports: BTreeMap<u64, HashMap<PeerId, Report>>,
    /// Decisions heard, with their sender.
    pub(super) decided: Vec<(PeerId, ViewDecision)>,
    /// The view we were told to leave, and why.
    pub(super) excluded: Option<(u64, String)>,
    /// The view whose members were told to stop, and why.
    pub(super) stopped: Option<(u64, String)>,
    /// Nodes outside the view that asked to join, with their addresses.
    pub(super) joiners: BTreeMap<PeerId, Vec<String>>,
    /// Peers admitted in the current view (a join request they repeated
    /// before they heard of it is no restart).
    pub fresh: HashSet<PeerId>,
    /// The decision that made the current view.
    pub(super) last: Option<ViewDecision>,
    /// A state received while joining: (view, sender, bytes).
    pub(super) state_in: Option<(u64, PeerId, Vec<u8>)>,
    /// When the last bytes of a state transfer to us arrived.
    pub(super) state_heard: Option<Instant>,
}

/// See [`BoardState`].
#[derive(Default)]
pub(crate) struct Board(pub Mutex<BoardState>);

impl Board {
    /// `peer` (a member of the current view) is gone: suspect it and make
    /// every wait give up, so that the view changes.
    pub fn lose(&self, shared: &Shared, peer: &PeerId, reason: &str) {
        if shared.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let Some(view) = shared.view.borrow().clone() else {
            return;
        };
        let Some(rank) = view.rank_of(peer) else {
            return;
        };
        if *peer == shared.local {
            return;
        }
        lock(&self.0).suspects.insert(*peer);
        let alarm = CommError::PeerLost {
            peer: peer.to_string(),
            rank,
            reason: reason.to_string(),
        };
        if shared.raise_error(view.number, alarm) {
            tracing::warn!(%peer, rank, "member {peer} (rank {rank}) is lost: {reason}");
        }
    }

    /// A new process runs behind member `peer`'s identity: the old one is
    /// lost, and its connection (which may look alive for a while, QUIC
    /// sees no close from a killed process) is dropped so that streams go
    /// to the new one. Only connections older than the newest go: by then
    /// the new process may already be admitted again over its own.
    pub fn restarted(&self, shared: &Shared, peer: &PeerId, reason: &str) {
        self.lose(shared, peer, reason);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (swarm, peer) = (shared.swarm.clone(), *peer);
            rt.spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = swarm.send(SwarmCmd::DropStale(peer));
            });
        }
    }

    /// Our first view is installed: a member of it that asked to join
    /// before (we had no view to check the request against) is a new
    /// process behind that member's identity, since only a node the
    /// started run left out asks. Without this the request was kept as a
    /// joiner's, and a joiner already in the view is never admitted.
    pub fn joined_before_install(&self, shared: &Shared) {
        let Some(view) = shared.view.borrow().clone() else {
            return;
        };
        let asked: Vec<PeerId> = {
            let b = lock(&self.0);
            b.joiners
                .keys()
                .filter(|p| view.rank_of(p).is_some() && !b.fresh.contains(p))
                .copied()
                .collect()
        };
        for peer in asked {
            self.restarted(
                shared,
                &peer,
                "it asked to join before we installed the view (restarted)",
            );
        }
    }

    /// `peer` (a coordinator) stayed silent during a view change: the next
    /// member coordinates. (A timed-out data-plane wait suspects nobody: the
    /// peer waited for may itself wait on the one that is gone; whoever does
    /// not report during the change is left out.)
    pub fn suspect(&self, shared: &Shared, peer: &PeerId) {
        if *peer != shared.local {
            lock(&self.0).suspects.insert(*peer);
        }
    }
}
