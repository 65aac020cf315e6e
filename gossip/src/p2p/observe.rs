//! What a node's metrics endpoint reads from the communicator while it
//! runs: traffic per peer, dropped messages by reason, timeouts per peer,
//! and the current view. Read through a [`P2pObserver`], a cheap handle that
//! another thread (an HTTP server) may hold while the training thread owns
//! the [`P2pComm`](super::P2pComm).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;

use libp2p::PeerId;

use super::state::{Shared, lock};
use super::wire::Reject;
use crate::CommStats;

/// Traffic with one peer since the node started: tensor frames (push-sum
/// shares, all-reduce chunks, collective blocks), header and payload bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerTraffic {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
    /// Messages from this peer that validation refused.
    pub messages_dropped: u64,
    /// Waits on this peer that gave up after the peer timeout of silence.
    pub timeouts: u64,
}

/// The per-peer and per-reason counters, written from many tasks.
#[derive(Default)]
pub(crate) struct Observed {
    peers: Mutex<BTreeMap<PeerId, PeerTraffic>>,
    drops: Mutex<BTreeMap<&'static str, u64>>,
}

impl Observed {
    fn with(&self, peer: &PeerId, f: impl FnOnce(&mut PeerTraffic)) {
        f(lock(&self.peers).entry(*peer).or_default());
    }

    pub fn sent(&self, peer: &PeerId, bytes: u64) {
        self.with(peer, |t| {
            t.bytes_sent += bytes;
            t.messages_sent += 1;
        });
    }

    pub fn received(&self, peer: &PeerId, bytes: u64) {
        self.with(peer, |t| {
            t.bytes_received += bytes;
            t.messages_received += 1;
        });
    }

    pub fn dropped(&self, peer: &PeerId, reason: &Reject) {
        self.with(peer, |t| t.messages_dropped += 1);
        *lock(&self.drops).entry(reason_name(reason)).or_default() += 1;
    }

    pub fn timed_out(&self, peer: &PeerId) {
        self.with(peer, |t| t.timeouts += 1);
    }
}

/// A short, stable name for each kind of refusal (a metrics label).
pub fn reason_name(reason: &Reject) -> &'static str {
    match reason {
        Reject::MalformedHeader(_) => "malformed_header",
        Reject::Version { .. } => "version",
        Reject::RunId { .. } => "run_id",
        Reject::View { .. } => "view",
        Reject::Sender { .. } => "sender",
        Reject::NotMember { .. } => "not_member",
        Reject::WrongKind { .. } => "wrong_kind",
        Reject::WrongDType { .. } => "wrong_dtype",
        Reject::Shape { .. } => "shape",
        Reject::Layout { .. } => "layout",
        Reject::TooLarge { .. } => "too_large",
        Reject::RoundWindow { .. } => "round_window",
        Reject::TooManyBuffered { .. } => "too_many_buffered",
        Reject::Duplicate { .. } => "duplicate",
        Reject::Truncated { .. } => "truncated",
        Reject::NonFinite { .. } => "non_finite",
        Reject::Checksum { .. } => "checksum",
        Reject::Weight(_) => "weight",
    }
}

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

    /// Dropped messages by reason ([`reason_name`]).
    pub fn drops(&self) -> Vec<(&'static str, u64)> {
        lock(&self.shared.observed.drops)
            .iter()
            .map(|(r, n)| (*r, *n))
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_peer_and_reason() {
        let o = Observed::default();
        let (a, b) = (PeerId::random(), PeerId::random());
        o.sent(&a, 100);
        o.sent(&a, 50);
        o.received(&b, 7);
        o.dropped(&b, &Reject::Duplicate { round: 3 });
        o.dropped(&b, &Reject::Weight(f64::NAN));
        o.dropped(&a, &Reject::Duplicate { round: 4 });
        o.timed_out(&b);
        let peers = lock(&o.peers);
        assert_eq!(
            peers[&a],
            PeerTraffic {
                bytes_sent: 150,
                messages_sent: 2,
                messages_dropped: 1,
                ..Default::default()
            }
        );
        assert_eq!(
            peers[&b],
            PeerTraffic {
                bytes_received: 7,
                messages_received: 1,
                messages_dropped: 2,
                timeouts: 1,
                ..Default::default()
            }
        );
        let drops = lock(&o.drops);
        assert_eq!(drops["duplicate"], 2);
        assert_eq!(drops["weight"], 1);
    }
}
