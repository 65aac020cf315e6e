//! State shared between the training thread and the node's async tasks.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use libp2p::PeerId;
use tokio::sync::{mpsc, watch};

use super::command::SwarmCmd;
use super::config::P2pConfig;
use super::counters::{Activity, Counters, Observed};
use super::payload::{BufferPool, LeBytes};
use super::throttle::Throttle;
use super::wire::{Header, Reject};
use crate::ledger::Inbox;
use crate::sync::lock;
use crate::{CommError, Interrupt, Rank};

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
    /// A view of `members` sorted by their base58 text (the fuzz harness's
    /// fixed run; a node takes the agreed list's order).
    #[cfg(feature = "fuzz")]
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

/// An all-reduce chunk that passed validation, on its way to the training
/// thread.
pub(crate) struct ReduceMsg {
    pub from: Rank,
    pub header: Header,
    pub payload: Vec<u8>,
    /// Written into the ring's buffer as it arrived ([`super::landing`]):
    /// the payload is empty.
    pub landed: bool,
}

/// Why the current view cannot go on, kept per view (see [`Shared::raise`]).
#[derive(Default)]
struct Alarm {
    /// The current view.
    view: u64,
    /// Why it cannot go on.
    raised: Option<CommError>,
    /// Collectives completed in it.
    done: u64,
    /// A change another member began after more collectives than we
    /// completed: raised once we completed `.0` (see [`Shared::raise_after`]).
    deferred: Option<(u64, String)>,
}

impl Alarm {
    fn raise(&mut self, view: u64, alarm: CommError) -> bool {
        if view != self.view || self.raised.is_some() {
            return false;
        }
        self.raised = Some(alarm);
        true
    }

    fn raise_after(&mut self, view: u64, after: u64, why: String) {
        if view != self.view {
            return;
        }
        if self.done >= after {
            self.raise(view, CommError::ViewChanging(why));
        } else if self.deferred.as_ref().is_none_or(|(n, _)| after < *n) {
            self.deferred = Some((after, why));
        }
    }

    fn collective_done(&mut self) {
        self.done += 1;
        if self.deferred.as_ref().is_some_and(|(n, _)| self.done >= *n) {
            let (_, why) = self.deferred.take().expect("checked");
            self.raise(self.view, CommError::ViewChanging(why));
        }
    }
}

/// What the tasks of one node share: configuration, counters, the current
/// view, the inboxes and the swarm's command channel. The view board and
/// the data lanes are not here: the communicator owns them and hands them
/// to the tasks that need them.
pub(crate) struct Shared {
    pub cfg: P2pConfig,
    pub local: PeerId,
    pub counters: Counters,
    /// Per-peer and per-reason counts for the metrics endpoint.
    pub observed: Observed,
    pub activity: Activity,
    /// The current view, `None` until the join completes.
    pub view: watch::Receiver<Option<Arc<View>>>,
    pub push_inbox: Inbox<LeBytes>,
    /// Recycled payload buffers (a few messages' worth).
    pub pool: BufferPool,
    pub reduce_tx: mpsc::Sender<ReduceMsg>,
    pub swarm: mpsc::UnboundedSender<SwarmCmd>,
    /// Inbound tensor streams being served, by peer: a graceful shutdown
    /// waits for the members to finish theirs, so that its runtime does not
    /// vanish before it confirms their last frames.
    pub inbound_active: Mutex<HashMap<PeerId, usize>>,
    /// Set when the node shuts down: lost connections are expected then.
    pub stopping: Arc<AtomicBool>,
    /// Raised from outside (a signal): every wait gives up.
    pub interrupt: Interrupt,
    /// Why the current view cannot go on (a member was lost, or another
    /// member started a view change), and the collectives completed in it.
    /// Every wait of the training thread gives up with it; a view change
    /// starts it afresh.
    alarm: Mutex<Alarm>,
    offences: Mutex<HashMap<PeerId, u32>>,
    /// Warnings about peer input, rate-limited by kind.
    pub warnings: Throttle,
    /// How we are reached and how we reach each peer (the swarm task keeps
    /// it).
    pub reach: super::reach::Reach,
    /// Where the lane's readers write the ring's parts as they arrive.
    pub landing: super::landing::Landing,
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
            inbound_active: Mutex::new(HashMap::new()),
            stopping: Arc::new(AtomicBool::new(false)),
            interrupt: Interrupt::new(),
            alarm: Mutex::new(Alarm::default()),
            offences: Mutex::new(HashMap::new()),
            warnings: Throttle::default(),
            reach: Default::default(),
            landing: Default::default(),
        }
    }

    /// `Err` once the node was interrupted or the view cannot go on.
    pub fn check(&self) -> Result<(), CommError> {
        self.interrupt.check()?;
        match &lock(&self.alarm).raised {
            Some(CommError::PeerLost { peer, rank, reason }) => Err(CommError::PeerLost {
                peer: peer.clone(),
                rank: *rank,
                reason: reason.clone(),
            }),
            Some(e) => Err(CommError::ViewChanging(e.to_string())),
            None => Ok(()),
        }
    }

    /// Makes every wait of the training thread give up with `why` (another
    /// member began a change of view `view`), unless an alarm is up
    /// already. An alarm about another view than the current one (a
    /// message read just before a change installed the next view) is
    /// dropped: it must not end the next view.
    pub fn raise(&self, view: u64, why: String) {
        lock(&self.alarm).raise(view, CommError::ViewChanging(why));
    }

    /// Raises `alarm` about view `view`; `true` when it is the first of
    /// that view (the caller logs it).
    pub fn raise_error(&self, view: u64, alarm: CommError) -> bool {
        lock(&self.alarm).raise(view, alarm)
    }

    /// A member of view `view` began a change after completing `after`
    /// collectives of it, without losing anyone (it admits joiners at its
    /// barrier, or waited in vain). When we completed fewer, we are inside
    /// a collective it finished, whose bytes are all on their way: the
    /// alarm waits until we complete as many, so that every member reports
    /// the same newest barrier. Otherwise it is raised now.
    pub fn raise_after(&self, view: u64, after: u64, why: String) {
        lock(&self.alarm).raise_after(view, after, why);
    }

    /// One more collective of the current view completed; raises a change
    /// that waited for it.
    pub fn collective_done(&self) {
        lock(&self.alarm).collective_done();
    }

    /// Collectives completed in the current view.
    pub fn collectives_done(&self) -> u64 {
        lock(&self.alarm).done
    }

    /// Starts view `view` with no alarm and no collective done. Called
    /// before the view is published to the node's tasks, so that an alarm
    /// they raise about it is never wiped.
    pub fn begin_view(&self, view: u64) {
        *lock(&self.alarm) = Alarm {
            view,
            ..Alarm::default()
        };
    }

    /// Drops a message: logs the peer and the reason, counts it, and
    /// disconnects a peer that keeps offending.
    pub fn reject(&self, peer: &PeerId, protocol: &str, reason: &Reject) {
        self.counters.dropped();
        self.observed.dropped(peer, reason);
        // Logged at most once per reason every few seconds; every drop is
        // counted (metrics, offences) all the same.
        if let Some(held) = self.warnings.admit(super::counters::reason_name(reason)) {
            tracing::warn!(%peer, protocol, %reason, "dropped a message from peer {peer}: {reason}{held}");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn begun(view: u64) -> Alarm {
        Alarm {
            view,
            ..Alarm::default()
        }
    }

    #[test]
    fn an_alarm_about_another_view_is_dropped() {
        // A loss read in view 3 and raised after view 4 was installed.
        let mut a = begun(4);
        assert!(!a.raise(3, CommError::ViewChanging("old".into())));
        assert!(a.raised.is_none());
        assert!(a.raise(4, CommError::ViewChanging("new".into())));
        assert!(!a.raise(4, CommError::ViewChanging("again".into())));
        assert!(matches!(&a.raised, Some(CommError::ViewChanging(w)) if w == "new"));
    }

    #[test]
    fn a_change_begun_after_more_collectives_waits_until_we_complete_them() {
        let mut a = begun(2);
        a.collective_done(); // one done; the reporter completed three
        a.raise_after(2, 3, "admits a joiner".into());
        assert!(a.raised.is_none(), "we are inside a collective it finished");
        a.collective_done();
        assert!(a.raised.is_none());
        a.collective_done();
        assert!(matches!(&a.raised, Some(CommError::ViewChanging(w)) if w == "admits a joiner"));
    }

    #[test]
    fn a_change_begun_after_no_more_collectives_than_ours_is_raised_at_once() {
        let mut a = begun(0);
        a.collective_done();
        a.collective_done();
        a.raise_after(0, 2, "behind us".into());
        assert!(a.raised.is_some());
        // Another view's deferral is ignored.
        let mut b = begun(1);
        b.raise_after(0, 0, "old view".into());
        assert!(b.raised.is_none() && b.deferred.is_none());
        // The earliest of two deferrals counts.
        b.raise_after(1, 5, "later".into());
        b.raise_after(1, 1, "sooner".into());
        b.collective_done();
        assert!(matches!(&b.raised, Some(CommError::ViewChanging(w)) if w == "sooner"));
    }
}
