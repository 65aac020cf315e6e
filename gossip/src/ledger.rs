//! The push-sum ledger, written once for every transport (docs/algorithm.md,
//! "Push-sum").
//!
//! Two halves meet in an [`Inbox`]:
//! - the receiving side (the in-memory sender itself, or a libp2p receive
//!   task) [`Inbox::admit`]s and [`Inbox::deliver`]s shares: a sender's
//!   rounds only increase (a repeat is refused), a share may be at most the
//!   window ahead of our latest round, and a sender may buffer at most that
//!   many shares with us;
//! - the training thread's [`Ledger`] registers each round's in-peers,
//!   waits until every share of rounds `<= k - s` has arrived (a timeout
//!   names the missing peer; the pluggable deadline lets a transport count
//!   silence, not slowness), then adds shares in `(round, sender)` order, so
//!   the bits never depend on the order in which shares arrived, and keeps
//!   count of the mass that went in and out.

use crate::sync::lock;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{CommError, PushSumMass, Rank};

mod send;
pub(crate) use send::{ShareSink, check_round, send_half};

/// A share's values, in whatever form the transport holds them.
pub(crate) trait SharePayload: Send {
    /// Number of `f32` values.
    fn floats(&self) -> usize;
    /// `x[i] += self[i]`.
    fn add_into(&self, x: &mut [f32]);
    /// `x[i] = p * x[i] + self[i]`, rounded as `x[i] *= p` then
    /// [`SharePayload::add_into`] round (no fused multiply-add).
    fn scale_add_into(&self, p: f32, x: &mut [f32]) {
        scale(x, p);
        self.add_into(x);
    }
}

/// `x[i] *= p`.
pub(crate) fn scale(x: &mut [f32], p: f32) {
    for v in x.iter_mut() {
        *v *= p;
    }
}

impl SharePayload for Vec<f32> {
    fn floats(&self) -> usize {
        self.len()
    }

    fn add_into(&self, x: &mut [f32]) {
        for (a, b) in x.iter_mut().zip(self) {
            *a += *b;
        }
    }
}

/// Why an inbox refused a share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The sender already delivered this round or a later one.
    Duplicate { round: u64 },
    /// The round is more than `window` ahead of ours.
    RoundWindow { round: u64, ours: u64, window: u64 },
    /// The sender already has `buffered` shares waiting with us.
    TooManyBuffered { buffered: usize, limit: u64 },
    /// The share belongs to an earlier membership view: the view changed
    /// while it travelled (dropped without blame).
    Stale { epoch: u64, ours: u64 },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Duplicate { round } => write!(f, "duplicate share of round {round}"),
            Refusal::RoundWindow {
                round,
                ours,
                window,
            } => write!(
                f,
                "round {round} is more than {window} rounds ahead of our round {ours}"
            ),
            Refusal::TooManyBuffered { buffered, limit } => write!(
                f,
                "sender already has {buffered} shares buffered with us (limit {limit})"
            ),
            Refusal::Stale { epoch, ours } => {
                write!(f, "share of view {epoch}, ours is view {ours}")
            }
        }
    }
}

struct Share<P> {
    weight: f64,
    payload: P,
}

struct InboxState<P> {
    /// (round, sender) -> share.
    shares: BTreeMap<(u64, Rank), Share<P>>,
    /// The round of the training thread's latest call (None before the first).
    current: Option<u64>,
    /// Highest round received per sender.
    last_round: HashMap<Rank, u64>,
    /// Shares buffered per sender.
    buffered: HashMap<Rank, usize>,
    /// The membership view the shares belong to ([`Inbox::reset`]).
    epoch: u64,
}

/// Where shares wait for the training thread.
pub(crate) struct Inbox<P> {
    state: Mutex<InboxState<P>>,
    arrived: Condvar,
    window: u64,
}

impl<P: SharePayload> Inbox<P> {
    /// An inbox that takes shares up to `window` rounds ahead of ours and at
    /// most `window` (at least 1) buffered per sender.
    pub fn new(window: u64) -> Self {
        Self {
            state: Mutex::new(InboxState {
                shares: BTreeMap::new(),
                current: None,
                last_round: HashMap::new(),
                buffered: HashMap::new(),
                epoch: 0,
            }),
            arrived: Condvar::new(),
            window,
        }
    }

    /// Whether a share of `round` from `from` would be taken (checked before
    /// its payload is read, and again on delivery). Only the fuzz harness
    /// and the tests ask before delivering.
    #[cfg(any(test, feature = "fuzz"))]
    pub fn admit(&self, round: u64, from: Rank) -> Result<(), Refusal> {
        let st = lock(&self.state);
        self.admit_locked(&st, round, from)
    }

    /// Empties the inbox for a new membership view `epoch`: ranks and
    /// rounds start afresh, and a share of another view is refused by
    /// [`Inbox::deliver_in`]. Returns the payloads dropped.
    pub fn reset(&self, epoch: u64) -> Vec<P> {
        let mut st = lock(&self.state);
        st.epoch = epoch;
        st.current = None;
        st.last_round.clear();
        st.buffered.clear();
        let dropped = std::mem::take(&mut st.shares);
        drop(st);
        self.arrived.notify_all();
        dropped.into_values().map(|s| s.payload).collect()
    }

    /// [`Inbox::admit`] for a share of view `epoch`.
    pub fn admit_in(&self, epoch: u64, round: u64, from: Rank) -> Result<(), Refusal> {
        let st = lock(&self.state);
        Self::same_epoch(&st, epoch)?;
        self.admit_locked(&st, round, from)
    }

    /// [`Inbox::deliver`] for a share of view `epoch`.
    pub fn deliver_in(
        &self,
        epoch: u64,
        round: u64,
        from: Rank,
        weight: f64,
        payload: P,
    ) -> Result<(), Refusal> {
        let mut st = lock(&self.state);
        Self::same_epoch(&st, epoch)?;
        self.admit_locked(&st, round, from)?;
        Self::store(&mut st, round, from, weight, payload);
        drop(st);
        self.arrived.notify_all();
        Ok(())
    }

    fn same_epoch(st: &InboxState<P>, epoch: u64) -> Result<(), Refusal> {
        if st.epoch == epoch {
            Ok(())
        } else {
            Err(Refusal::Stale {
                epoch,
                ours: st.epoch,
            })
        }
    }

    fn store(st: &mut InboxState<P>, round: u64, from: Rank, weight: f64, payload: P) {
        st.last_round.insert(from, round);
        *st.buffered.entry(from).or_insert(0) += 1;
        st.shares.insert((round, from), Share { weight, payload });
    }

    fn admit_locked(&self, st: &InboxState<P>, round: u64, from: Rank) -> Result<(), Refusal> {
        let window = self.window;
        if st.last_round.get(&from).is_some_and(|last| round <= *last) {
            return Err(Refusal::Duplicate { round });
        }
        if let Some(ours) = st.current
            && round > ours.saturating_add(window)
        {
            return Err(Refusal::RoundWindow {
                round,
                ours,
                window,
            });
        }
        let buffered = st.buffered.get(&from).copied().unwrap_or(0);
        if buffered as u64 >= window.max(1) {
            return Err(Refusal::TooManyBuffered {
                buffered,
                limit: window,
            });
        }
        Ok(())
    }

    /// Stores a checked share and wakes the training thread.
    pub fn deliver(&self, round: u64, from: Rank, weight: f64, payload: P) -> Result<(), Refusal> {
        let mut st = lock(&self.state);
        self.admit_locked(&st, round, from)?;
        Self::store(&mut st, round, from, weight, payload);
        drop(st);
        self.arrived.notify_all();
        Ok(())
    }

    fn set_current(&self, round: u64) {
        lock(&self.state).current = Some(round);
    }
}

/// Which arrived shares a push-sum call adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mixing {
    /// Exactly the shares due (rounds `<= k - s`): a share is added in the
    /// same round whenever it arrived, so the result is deterministic.
    Due,
    /// Every share of rounds `<= k` that has arrived: fresher, but with
    /// `s > 0` it depends on timing. With `s = 0` both are the same.
    Arrived,
}

/// How a wait gives up and names the peer it waited for.
pub(crate) struct Waiting<'a> {
    /// The timeout reported in [`CommError::PeerTimeout`].
    pub timeout: Duration,
    /// When a wait on a rank that began at the given instant gives up. A
    /// transport that sees bytes moving counts from the peer's last
    /// progress, so a slow share still arriving is not silence.
    pub deadline: &'a dyn Fn(Rank, Instant) -> Instant,
    pub peer_name: &'a dyn Fn(Rank) -> String,
    /// Looked at before each wait and every [`crate::POLL`]: an error ends
    /// the wait (an interrupt, a lost member).
    pub check: &'a dyn Fn() -> Result<(), CommError>,
}

/// The training thread's side of push-sum.
pub(crate) struct Ledger {
    /// Round -> in-peers whose share of that round has not been added yet.
    expected: BTreeMap<u64, BTreeSet<Rank>>,
    /// Round of the latest call.
    last: Option<u64>,
    mixing: Mixing,
    mass: PushSumMass,
}

impl Ledger {
    pub fn new(mixing: Mixing) -> Self {
        Self {
            expected: BTreeMap::new(),
            last: None,
            mixing,
            mass: PushSumMass::default(),
        }
    }

    /// Records the start of round `round` and whom it expects shares from.
    pub fn begin<P: SharePayload>(
        &mut self,
        inbox: &Inbox<P>,
        round: u64,
        in_peers: &[Rank],
    ) -> Result<(), CommError> {
        if let Some(last) = self.last
            && round <= last
        {
            return Err(CommError::Misuse(format!(
                "push-sum round {round} after round {last}: rounds must increase (the receiver \
                 tells repeated shares apart by their round)"
            )));
        }
        self.last = Some(round);
        inbox.set_current(round);
        if !in_peers.is_empty() {
            self.expected
                .entry(round)
                .or_default()
                .extend(in_peers.iter().copied());
        }
        Ok(())
    }

    /// Counts `copies` shares of weight `weight` each that this rank sent.
    pub fn sent(&mut self, copies: usize, weight: f64) {
        self.mass.shares_sent += copies as u64;
        self.mass.weight_sent += copies as f64 * weight;
    }

    /// Mass that went out and came in so far.
    pub fn mass(&self) -> PushSumMass {
        self.mass
    }

    /// The expected shares of rounds `<= up_to` not added yet, in `(round,
    /// sender)` order.
    pub fn pending(&self, up_to: u64) -> Vec<(u64, Rank)> {
        self.expected
            .range(..=up_to)
            .flat_map(|(round, senders)| senders.iter().map(move |from| (*round, *from)))
            .collect()
    }

    /// Stops expecting the share of `round` from `from`: it will never come
    /// (lost on a simulated link, or its sender crashed). It adds no mass;
    /// the mass it carried is gone.
    pub fn forgo(&mut self, round: u64, from: Rank) {
        if let Some(set) = self.expected.get_mut(&round) {
            set.remove(&from);
            if set.is_empty() {
                self.expected.remove(&round);
            }
        }
    }

    /// Whether every expected share of rounds `<= up_to` is in the inbox.
    /// Never blocks.
    pub fn arrived<P: SharePayload>(&self, inbox: &Inbox<P>, up_to: u64) -> bool {
        let st = lock(&inbox.state);
        self.first_missing(&st, up_to).is_none()
    }

    fn first_missing<P>(&self, st: &InboxState<P>, up_to: u64) -> Option<(u64, Rank)> {
        self.expected.range(..=up_to).find_map(|(round, senders)| {
            senders
                .iter()
                .find(|from| !st.shares.contains_key(&(*round, **from)))
                .map(|from| (*round, *from))
        })
    }

    /// Waits until every expected share of rounds `<= up_to` is in the inbox.
    pub fn wait_arrived<P: SharePayload>(
        &self,
        inbox: &Inbox<P>,
        up_to: u64,
        waiting: &Waiting<'_>,
        operation: &'static str,
    ) -> Result<(), CommError> {
        self.wait_locked(inbox, up_to, waiting, operation).map(drop)
    }

    fn wait_locked<'a, P: SharePayload>(
        &self,
        inbox: &'a Inbox<P>,
        up_to: u64,
        waiting: &Waiting<'_>,
        operation: &'static str,
    ) -> Result<MutexGuard<'a, InboxState<P>>, CommError> {
        let started = Instant::now();
        let mut st = lock(&inbox.state);
        while let Some((round, from)) = self.first_missing(&st, up_to) {
            (waiting.check)()?;
            let deadline = (waiting.deadline)(from, started);
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::PeerTimeout {
                    peer: (waiting.peer_name)(from),
                    rank: from,
                    round,
                    operation,
                    timeout: waiting.timeout,
                });
            }
            st = inbox
                .arrived
                .wait_timeout(st, (deadline - now).min(crate::POLL))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(st)
    }

    /// Waits until nothing expected of rounds `<= wait_up_to` is missing,
    /// then adds the shares the mixing rule takes, in `(round, sender)`
    /// order, handing each payload to `recycle` afterwards. `None` waits for
    /// nothing. Shares of rounds after our latest call stay in the inbox.
    #[allow(clippy::too_many_arguments)] // the call's inputs, each used once
    pub fn collect<P: SharePayload>(
        &mut self,
        inbox: &Inbox<P>,
        waiting: &Waiting<'_>,
        wait_up_to: Option<u64>,
        x: &mut [f32],
        w: &mut f64,
        operation: &'static str,
        recycle: &mut dyn FnMut(P),
    ) -> Result<(), CommError> {
        self.collect_scaling(inbox, waiting, wait_up_to, None, x, w, operation, recycle)
    }

    /// [`Ledger::collect`] into an `x` whose kept share is `p * x` (a
    /// round whose sends scaled as they copied, `scale_first = Some(p)`):
    /// `x` is scaled in the first share's add, or on its own if none is
    /// added, on every way out, errors included. The same bits as scaling
    /// `x` first.
    #[allow(clippy::too_many_arguments)] // the call's inputs, each used once
    pub fn collect_scaling<P: SharePayload>(
        &mut self,
        inbox: &Inbox<P>,
        waiting: &Waiting<'_>,
        wait_up_to: Option<u64>,
        mut scale_first: Option<f32>,
        x: &mut [f32],
        w: &mut f64,
        operation: &'static str,
        recycle: &mut dyn FnMut(P),
    ) -> Result<(), CommError> {
        // Every way out of the collection below scales `x` if no add did.
        let result = (|| -> Result<(), CommError> {
            let Some(last) = self.last else {
                return Ok(()); // no round begun: nothing is ours to add yet
            };
            let mut st = match wait_up_to {
                Some(up_to) => self.wait_locked(inbox, up_to, waiting, operation)?,
                None => lock(&inbox.state),
            };
            let take_up_to = match (self.mixing, wait_up_to) {
                (Mixing::Arrived, _) => last,
                (Mixing::Due, Some(up_to)) => up_to.min(last),
                (Mixing::Due, None) => return Ok(()),
            };
            let range = ..=(take_up_to, Rank::MAX);
            if let Some((&(round, from), share)) = st
                .shares
                .range(range)
                .find(|(_, s)| s.payload.floats() != x.len())
            {
                return Err(CommError::Protocol(format!(
                    "push-sum share of round {round} from {} holds {} floats where this rank has {}",
                    (waiting.peer_name)(from),
                    share.payload.floats(),
                    x.len()
                )));
            }
            let keys: Vec<(u64, Rank)> = st.shares.range(range).map(|(k, _)| *k).collect();
            let mut taken = Vec::with_capacity(keys.len());
            for key in keys {
                let share = st.shares.remove(&key).expect("key listed above");
                if let Some(n) = st.buffered.get_mut(&key.1) {
                    *n = n.saturating_sub(1);
                }
                taken.push((key, share));
            }
            drop(st);
            // BTreeMap order: (round, sender).
            for ((round, from), share) in taken {
                match scale_first.take() {
                    Some(p) => share.payload.scale_add_into(p, x),
                    None => share.payload.add_into(x),
                }
                *w += share.weight;
                self.mass.shares_added += 1;
                self.mass.weight_added += share.weight;
                recycle(share.payload);
                self.forgo(round, from);
            }
            Ok(())
        })();
        if let Some(p) = scale_first {
            scale(x, p);
        }
        result
    }
}

#[cfg(test)]
mod tests;
