//! The counters every task of a node writes: traffic totals, per-peer and
//! per-reason counts (for the metrics endpoint, [`super::observe`]), and
//! when bytes last moved to or from each peer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libp2p::PeerId;

use super::wire::Reject;
use crate::CommStats;
use crate::sync::lock;

/// Traffic counters, written from many tasks.
#[derive(Default)]
pub(crate) struct Counters {
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    messages_sent: AtomicU64,
    messages_received: AtomicU64,
    messages_dropped: AtomicU64,
    parts_landed: AtomicU64,
    lane_bytes_sent: AtomicU64,
}

impl Counters {
    pub fn sent(&self, bytes: u64) {
        self.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
        self.messages_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes sent over the data lane (also counted by [`Counters::sent`]).
    pub fn sent_on_lane(&self, bytes: u64) {
        self.lane_bytes_sent.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn received(&self, bytes: u64) {
        self.bytes_received.fetch_add(bytes, Ordering::Relaxed);
        self.messages_received.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dropped(&self) {
        self.messages_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// An all-reduce part went straight into the ring's buffer.
    pub fn landed(&self) {
        self.parts_landed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> CommStats {
        CommStats {
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
            messages_sent: self.messages_sent.load(Ordering::Relaxed),
            messages_received: self.messages_received.load(Ordering::Relaxed),
            messages_dropped: self.messages_dropped.load(Ordering::Relaxed),
            parts_landed: self.parts_landed.load(Ordering::Relaxed),
            lane_bytes_sent: self.lane_bytes_sent.load(Ordering::Relaxed),
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
    pub(super) peers: Mutex<BTreeMap<PeerId, PeerTraffic>>,
    pub(super) drops: Mutex<BTreeMap<&'static str, u64>>,
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
        Reject::Membership(_) => "membership",
        Reject::NonFinite { .. } => "non_finite",
        Reject::Checksum { .. } => "checksum",
        Reject::Weight(_) => "weight",
        Reject::Coded(_) => "coded_share",
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
