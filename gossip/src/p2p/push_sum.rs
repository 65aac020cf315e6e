//! Push-sum over the network (SGP and OSGP).
//!
//! A share sent in round r is added by its receiver whenever it has arrived,
//! at the receiver's first call with a round >= r (shares of rounds ahead of
//! ours wait in the inbox). A call for round k blocks until every share of
//! rounds <= k - s has arrived, where the in-peers of each round say whom to
//! expect. Shares are added in (round, sender) order, so with s = 0 the
//! result is bit for bit that of the in-memory communicator.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use super::payload::{BufferPool, add_bytes};
use super::state::lock;
use super::wire::Reject;
use crate::{CommError, Rank};

/// A share that arrived and waits to be added.
struct Share {
    weight: f64,
    payload: Vec<u8>,
}

#[derive(Default)]
struct InboxState {
    /// (round, sender) -> share.
    shares: BTreeMap<(u64, Rank), Share>,
    /// The round of the training thread's latest call (None before the first).
    current: Option<u64>,
    /// Highest round received per sender: a sender's rounds only increase,
    /// so anything at or below it is a repeat (a link re-sends after a
    /// broken stream).
    last_round: HashMap<Rank, u64>,
    /// Shares buffered per sender.
    buffered: HashMap<Rank, usize>,
}

/// Where the receive tasks leave push-sum shares for the training thread.
pub(crate) struct PushInbox {
    state: Mutex<InboxState>,
    arrived: Condvar,
    window: u64,
}

impl PushInbox {
    pub fn new(window: u64) -> Self {
        Self {
            state: Mutex::new(InboxState::default()),
            arrived: Condvar::new(),
            window,
        }
    }

    /// Whether a share of `round` from `from` would be taken (checked before
    /// its payload is read, and again on delivery).
    pub fn admit(&self, round: u64, from: Rank) -> Result<(), Reject> {
        let st = lock(&self.state);
        Self::admit_locked(&st, self.window, round, from)
    }

    fn admit_locked(st: &InboxState, window: u64, round: u64, from: Rank) -> Result<(), Reject> {
        if st.last_round.get(&from).is_some_and(|last| round <= *last) {
            return Err(Reject::Duplicate { round });
        }
        if let Some(ours) = st.current
            && round > ours.saturating_add(window)
        {
            return Err(Reject::RoundWindow {
                round,
                ours,
                window,
            });
        }
        let buffered = st.buffered.get(&from).copied().unwrap_or(0);
        if buffered as u64 >= window.max(1) {
            return Err(Reject::TooManyBuffered {
                buffered,
                limit: window,
            });
        }
        Ok(())
    }

    /// Stores a checked share.
    pub fn deliver(
        &self,
        round: u64,
        from: Rank,
        weight: f64,
        payload: Vec<u8>,
    ) -> Result<(), Reject> {
        let mut st = lock(&self.state);
        Self::admit_locked(&st, self.window, round, from)?;
        st.last_round.insert(from, round);
        *st.buffered.entry(from).or_insert(0) += 1;
        st.shares.insert((round, from), Share { weight, payload });
        drop(st);
        self.arrived.notify_all();
        Ok(())
    }

    fn set_current(&self, round: u64) {
        lock(&self.state).current = Some(round);
    }
}

/// The training thread's side of push-sum.
#[derive(Default)]
pub(crate) struct PushState {
    /// Round -> in-peers whose share of that round has not been added yet.
    expected: BTreeMap<u64, BTreeSet<Rank>>,
    /// Round of the latest call.
    last: Option<u64>,
}

/// What [`PushState::collect`] needs from the node.
pub(crate) struct CollectCtx<'a> {
    pub inbox: &'a PushInbox,
    pub pool: &'a BufferPool,
    pub timeout: std::time::Duration,
    /// When a wait on a rank that began at the given instant gives up: the
    /// timeout counts from the later of that start and the peer's last
    /// progress, so a slow share still arriving is not silence.
    pub deadline: &'a dyn Fn(Rank, Instant) -> Instant,
    pub peer_name: &'a dyn Fn(Rank) -> String,
}

impl PushState {
    /// Checks and records the start of round `round`, returns nothing to
    /// send if the round is not new.
    pub fn begin(
        &mut self,
        inbox: &PushInbox,
        round: u64,
        in_peers: &[Rank],
    ) -> Result<(), CommError> {
        if let Some(last) = self.last
            && round <= last
        {
            return Err(CommError::Other(format!(
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

    /// Whether every expected share of rounds `<= up_to` is in the inbox.
    pub fn arrived(&self, inbox: &PushInbox, up_to: u64) -> bool {
        let st = lock(&inbox.state);
        self.expected.range(..=up_to).all(|(round, senders)| {
            senders
                .iter()
                .all(|from| st.shares.contains_key(&(*round, *from)))
        })
    }

    /// Adds every share of rounds <= the latest call's round that has
    /// arrived, and waits until nothing of rounds <= `wait_up_to` is missing.
    pub fn collect(
        &mut self,
        ctx: &CollectCtx<'_>,
        wait_up_to: Option<u64>,
        x: &mut [f32],
        w: &mut f64,
        operation: &'static str,
    ) -> Result<(), CommError> {
        let take_up_to = self.last.unwrap_or(0);
        let started = Instant::now();
        let mut st = lock(&ctx.inbox.state);
        loop {
            let keys: Vec<(u64, Rank)> = st
                .shares
                .range(..=(take_up_to, Rank::MAX))
                .map(|(k, _)| *k)
                .collect();
            if !keys.is_empty() {
                let mut taken = Vec::with_capacity(keys.len());
                for key in keys {
                    let share = st.shares.remove(&key).expect("key listed above");
                    if let Some(n) = st.buffered.get_mut(&key.1) {
                        *n = n.saturating_sub(1);
                    }
                    taken.push((key, share));
                }
                drop(st);
                // BTreeMap order: (round, sender), as the in-memory network.
                for ((round, from), share) in taken {
                    add_bytes(x, &share.payload);
                    *w += share.weight;
                    ctx.pool.give(share.payload);
                    if let Some(set) = self.expected.get_mut(&round) {
                        set.remove(&from);
                        if set.is_empty() {
                            self.expected.remove(&round);
                        }
                    }
                }
                st = lock(&ctx.inbox.state);
                continue;
            }
            let Some(up_to) = wait_up_to else {
                return Ok(());
            };
            let missing = self
                .expected
                .range(..=up_to)
                .find_map(|(round, set)| set.iter().next().map(|from| (*round, *from)));
            let Some((round, from)) = missing else {
                return Ok(());
            };
            let deadline = (ctx.deadline)(from, started);
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::PeerTimeout {
                    peer: (ctx.peer_name)(from),
                    rank: from,
                    round,
                    operation,
                    timeout: ctx.timeout,
                });
            }
            st = ctx
                .inbox
                .arrived
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::p2p::wire::f32_to_bytes;

    const TIMEOUT: std::time::Duration = std::time::Duration::from_millis(50);
    static POOL: std::sync::LazyLock<BufferPool> =
        std::sync::LazyLock::new(|| BufferPool::new(2, 64));

    fn ctx<'a>(inbox: &'a PushInbox, name: &'a dyn Fn(Rank) -> String) -> CollectCtx<'a> {
        CollectCtx {
            inbox,
            pool: &POOL,
            timeout: TIMEOUT,
            deadline: &|_, started| started + TIMEOUT,
            peer_name: name,
        }
    }

    #[test]
    fn repeats_far_rounds_and_floods_are_refused() {
        let inbox = PushInbox::new(4);
        inbox.deliver(3, 1, 0.5, f32_to_bytes(&[1.0])).unwrap();
        assert_eq!(inbox.admit(3, 1), Err(Reject::Duplicate { round: 3 }));
        assert_eq!(inbox.admit(2, 1), Err(Reject::Duplicate { round: 2 }));
        inbox.set_current(10);
        assert!(matches!(
            inbox.admit(15, 2),
            Err(Reject::RoundWindow { .. })
        ));
        for r in 11..14 {
            inbox.deliver(r, 2, 0.5, f32_to_bytes(&[1.0])).unwrap();
        }
        inbox.deliver(14, 2, 0.5, f32_to_bytes(&[1.0])).unwrap();
        assert!(matches!(inbox.admit(14, 3), Ok(())));
        assert!(matches!(inbox.admit(14, 2), Err(Reject::Duplicate { .. })));
    }

    #[test]
    fn shares_ahead_wait_and_late_shares_are_still_added() {
        let inbox = PushInbox::new(8);
        let name = |r: Rank| format!("peer-{r}");
        let mut st = PushState::default();
        let (mut x, mut w) = (vec![1.0f32], 1.0);
        // Round 0 expects rank 1; its round-1 share arrives first.
        st.begin(&inbox, 0, &[1]).unwrap();
        inbox.deliver(1, 1, 0.25, f32_to_bytes(&[10.0])).unwrap();
        let err = st.collect(&ctx(&inbox, &name), Some(0), &mut x, &mut w, "push-sum");
        match err {
            Err(CommError::PeerTimeout {
                peer, rank, round, ..
            }) => {
                assert_eq!((peer.as_str(), rank, round), ("peer-1", 1, 0));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert_eq!((x[0], w), (1.0, 1.0), "a share of a later round waits");
        // With staleness the call returns; the late round-0 share lands in round 1.
        st.begin(&inbox, 1, &[]).unwrap();
        st.collect(&ctx(&inbox, &name), None, &mut x, &mut w, "push-sum")
            .unwrap();
        assert_eq!((x[0], w), (11.0, 1.25));
        inbox.deliver(0, 2, 0.5, f32_to_bytes(&[100.0])).unwrap();
        st.collect(&ctx(&inbox, &name), Some(u64::MAX), &mut x, &mut w, "drain")
            .unwrap_err();
        inbox
            .deliver(0, 1, 0.5, f32_to_bytes(&[1000.0]))
            .unwrap_err(); // rank 1 already sent round 1
    }

    #[test]
    fn a_share_still_arriving_is_waited_for_past_the_timeout() {
        let inbox = PushInbox::new(8);
        let name = |r: Rank| format!("peer-{r}");
        // The receive task notes progress every 20 ms (bytes of a slow
        // share), for four timeouts, and then the share lands.
        let last = Mutex::new(Instant::now());
        let deadline = |_: Rank, started: Instant| (*lock(&last)).max(started) + TIMEOUT;
        let ctx = CollectCtx {
            inbox: &inbox,
            pool: &POOL,
            timeout: TIMEOUT,
            deadline: &deadline,
            peer_name: &name,
        };
        let mut st = PushState::default();
        let (mut x, mut w) = (vec![1.0f32], 1.0);
        st.begin(&inbox, 0, &[1]).unwrap();
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..10 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    *lock(&last) = Instant::now();
                }
                inbox.deliver(0, 1, 0.5, f32_to_bytes(&[2.0])).unwrap();
            });
            st.collect(&ctx, Some(0), &mut x, &mut w, "push-sum")
                .expect("progress keeps the wait alive");
        });
        assert!(
            started.elapsed() >= 4 * TIMEOUT,
            "the share came after 200 ms"
        );
        assert_eq!((x[0], w), (3.0, 1.5));

        // Once progress stops, the same wait gives up and names the peer.
        st.begin(&inbox, 1, &[1]).unwrap();
        match st.collect(&ctx, Some(1), &mut x, &mut w, "push-sum") {
            Err(CommError::PeerTimeout { rank, round, .. }) => assert_eq!((rank, round), (1, 1)),
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
}
