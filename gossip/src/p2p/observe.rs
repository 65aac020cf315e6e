//! What a node's metrics endpoint reads from the communicator while it
//! runs: traffic per peer, dropped messages by reason, timeouts per peer,
//! and the current view. Read through a [`P2pObserver`], a cheap handle that
//! another thread (an HTTP server) may hold while the training thread owns
//! the [`P2pComm`](super::P2pComm).

use std::sync::Arc;

use super::counters::PeerTraffic;
use super::state::Shared;
use crate::CommStats;
use crate::sync::lock;

/// A read-only handle on a node's communication counters, usable from any
/// thread while the node runs (and after it stopped: the counts stay).
#[derive(Clone)]
pub struct P2pObserver {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for P2pObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("P2pObserver")
            .field("peer", &self.shared.local)
            .finish()
    }
}

impl P2pObserver {
    /// The totals, as [`Communicator::stats`](crate::Communicator::stats) gives them.
    pub fn stats(&self) -> CommStats {
        self.shared.counters.snapshot()
    }

    /// Traffic per peer (base58 peer id), sorted by peer id.
    pub fn peers(&self) -> Vec<(String, PeerTraffic)> {
        let mut v: Vec<(String, PeerTraffic)> = lock(&self.shared.observed.peers)
            .iter()
            .map(|(p, t)| (p.to_string(), *t))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Dropped messages by reason ([`reason_name`](super::counters::reason_name)).
    pub fn drops(&self) -> Vec<(&'static str, u64)> {
        lock(&self.shared.observed.drops)
            .iter()
            .map(|(r, n)| (*r, *n))
            .collect()
    }

    /// How this node is reached and reaches each peer (NAT traversal).
    pub fn reach(&self) -> super::reach::ReachState {
        self.shared.reach.snapshot()
    }

    /// The current view: its number and size; `None` before the join.
    pub fn view(&self) -> Option<(u64, usize)> {
        self.shared
            .view
            .borrow()
            .as_ref()
            .map(|v| (v.number, v.members.len()))
    }
}
