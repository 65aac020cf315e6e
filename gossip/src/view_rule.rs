//! The membership decision, written once for both transports
//! (docs/algorithm.md, "Membership and views").
//!
//! A view change gathers reports from the members of the old view: the
//! newest barrier each holds, and the nodes waiting to join that each knows
//! of. Who counts as gone (a closed connection, silence past the peer
//! timeout, the script's kill, the far side of a partition) is the
//! transport's business; what the next view *is* follows from the reports
//! alone, by [`decide`]. The simulator's fault board and the libp2p
//! coordinator both call it, so a fault test of the simulator vouches for
//! the network too: messages, timers and state transfer stay in each
//! transport, the rule does not.
//!
//! ```
//! use slowmo_gossip::view_rule::{decide, Decision};
//! // Worker 2 of four is gone; worker 4 waits to join. Every survivor
//! // completed barrier 36, worker 3 also barrier 48.
//! let reports = [(0, 36), (1, 36), (3, 48)];
//! let Decision::Go(next) = decide(&[0, 1, 2, 3], &reports, &[4], |w| *w) else {
//!     unreachable!("three of four hold a quorum")
//! };
//! assert_eq!(next.members, [0, 1, 3, 4]); // survivors in old order, then joiners
//! assert_eq!(next.rollback_to, 36);
//! assert_eq!(next.state_sender, Some(0)); // rank 0 of the new view
//! assert_eq!((next.lost, next.joined), (vec![2], vec![4]));
//! ```

/// The next view, as the rule decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextView<K> {
    /// Members in rank order: the members of the old view that reported,
    /// in their old order, then the joiners in place order.
    pub members: Vec<K>,
    /// The barrier every member returns to: the oldest of the newest
    /// barriers the members of the old view that go on reported.
    pub rollback_to: u64,
    /// The rank (in `members`) that sends the training state to the
    /// joiners: the lowest-ranked member that was in the old view. `None`
    /// when nobody joins.
    pub state_sender: Option<usize>,
    /// Members of the old view that are not in the new one, in old order.
    pub lost: Vec<K>,
    /// Joiners admitted, in place order.
    pub joined: Vec<K>,
}

/// What the reports of one side of a change allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<K> {
    /// This side goes on as the run, in the view given.
    Go(NextView<K>),
    /// This side holds no quorum of the old view: it pauses and asks to be
    /// admitted again by the side that holds one.
    NoQuorum {
        /// Members of the old view on this side.
        reachable: usize,
        /// Members of the old view.
        of: usize,
    },
}

/// The quorum rule: a strict majority of the old view, or exactly half of
/// it holding the old view's rank 0. Of two sides that split a view, at
/// most one holds a quorum, so two sides never both go on as the run.
pub fn has_quorum<K: PartialEq>(old: &[K], live: &[K]) -> bool {
    let (m, n) = (old.len(), live.len());
    2 * n > m || (2 * n == m && old.first().is_some_and(|first| live.contains(first)))
}

/// The rank in `members` that sends the state to `joined`: the
/// lowest-ranked member that is not a joiner, or `None` without joiners.
pub fn state_sender<K: PartialEq>(members: &[K], joined: &[K]) -> Option<usize> {
    if joined.is_empty() {
        return None;
    }
    members.iter().position(|m| !joined.contains(m))
}

/// The next view from the old view `old` (rank order), the `reports` of the
/// members that go on (member, newest barrier it holds; reports from
/// outside `old` are ignored, a member reporting twice counts once, with
/// its oldest barrier) and the `joiners` they know of (members of `old`
/// that go on are not joiners; duplicates count once). `place` is the key
/// that orders nodes into places, the same one that ordered the first view
/// (the worker id in the simulator, the admission policy's place order over
/// the network); joiners take the ranks after the old members in its order.
pub fn decide<K, P, F>(old: &[K], reports: &[(K, u64)], joiners: &[K], place: F) -> Decision<K>
where
    K: Clone + PartialEq,
    P: Ord,
    F: Fn(&K) -> P,
{
    let barrier = |k: &K| {
        reports
            .iter()
            .filter(|(r, _)| r == k)
            .map(|(_, b)| *b)
            .min()
    };
    let live: Vec<K> = old
        .iter()
        .filter(|k| barrier(k).is_some())
        .cloned()
        .collect();
    if live.is_empty() || !has_quorum(old, &live) {
        return Decision::NoQuorum {
            reachable: live.len(),
            of: old.len(),
        };
    }
    let rollback_to = live.iter().filter_map(barrier).min().unwrap_or(0);
    let mut joined: Vec<K> = Vec::new();
    for j in joiners {
        if !live.contains(j) && !joined.contains(j) {
            joined.push(j.clone());
        }
    }
    joined.sort_by_cached_key(|k| place(k));
    let lost = old.iter().filter(|k| !live.contains(k)).cloned().collect();
    let members: Vec<K> = live.into_iter().chain(joined.iter().cloned()).collect();
    Decision::Go(NextView {
        state_sender: state_sender(&members, &joined),
        members,
        rollback_to,
        lost,
        joined,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn go(d: Decision<u32>) -> NextView<u32> {
        match d {
            Decision::Go(v) => v,
            other => panic!("expected a view, got {other:?}"),
        }
    }

    #[test]
    fn survivors_keep_their_order_and_joiners_follow_in_place_order() {
        // Old view in a non-sorted order (an earlier change appended 1).
        let old = [5, 0, 1, 7];
        let reports = [(7, 24), (0, 24), (5, 36)];
        // 1 restarts, 9 and 3 are new; 3 sorts first by place.
        let v = go(decide(&old, &reports, &[9, 1, 3, 9], |k| *k));
        assert_eq!(v.members, [5, 0, 7, 1, 3, 9]);
        assert_eq!(v.lost, [1]);
        assert_eq!(v.joined, [1, 3, 9]);
        assert_eq!(v.rollback_to, 24);
        assert_eq!(v.state_sender, Some(0));
    }

    #[test]
    fn place_key_orders_joiners_not_their_ids() {
        let v = go(decide(&[0, 1], &[(0, 0), (1, 0)], &[2, 3], |k| {
            std::cmp::Reverse(*k)
        }));
        assert_eq!(v.members, [0, 1, 3, 2]);
    }

    #[test]
    fn rollback_is_the_oldest_newest_barrier_of_a_member_that_goes_on() {
        // A member reporting twice counts once, with its oldest barrier;
        // reports from outside the old view are ignored.
        let reports = [(0, 48), (1, 48), (1, 36), (2, 48), (9, 12)];
        let v = go(decide(&[0, 1, 2], &reports, &[], |k| *k));
        assert_eq!(v.rollback_to, 36);
        assert_eq!(v.members, [0, 1, 2]);
        assert_eq!(v.state_sender, None, "nobody joins, nobody sends state");
        assert!(v.lost.is_empty() && v.joined.is_empty());
    }

    #[test]
    fn a_member_that_goes_on_is_not_a_joiner() {
        let v = go(decide(&[0, 1, 2], &[(0, 0), (1, 0)], &[1, 2], |k| *k));
        assert_eq!(v.members, [0, 1, 2]);
        assert_eq!(v.lost, [2]);
        assert_eq!(v.joined, [2], "a lost member may join again at once");
        assert_eq!(v.state_sender, Some(0));
    }

    #[test]
    fn quorum_is_a_strict_majority_or_half_with_rank_zero() {
        let old = [4, 3, 2, 1];
        let with_rank0 = [(4, 0), (2, 0)];
        let without = [(3, 0), (1, 0)];
        assert!(matches!(
            decide(&old, &with_rank0, &[], |k| *k),
            Decision::Go(_)
        ));
        assert_eq!(
            decide(&old, &without, &[], |k| *k),
            Decision::NoQuorum {
                reachable: 2,
                of: 4
            }
        );
        assert!(matches!(
            decide(&old, &[(3, 0), (2, 0), (1, 0)], &[], |k| *k),
            Decision::Go(_)
        ));
        assert_eq!(
            decide(&[0, 1, 2], &[(2, 0)], &[5], |k| *k),
            Decision::NoQuorum {
                reachable: 1,
                of: 3
            }
        );
        // Nobody reported: no view, whatever the joiners.
        assert!(matches!(
            decide::<u32, u32, _>(&[], &[], &[1], |k| *k),
            Decision::NoQuorum { .. }
        ));
    }

    #[test]
    fn two_sides_of_a_split_never_both_hold_a_quorum() {
        for m in 1..=9usize {
            let old: Vec<usize> = (0..m).collect();
            for mask in 0..(1u32 << m) {
                let a: Vec<usize> = old.iter().copied().filter(|i| mask >> i & 1 == 1).collect();
                let b: Vec<usize> = old.iter().copied().filter(|i| mask >> i & 1 == 0).collect();
                assert!(
                    !(has_quorum(&old, &a) && has_quorum(&old, &b)),
                    "m {m}: {a:?} | {b:?}"
                );
                assert!(
                    has_quorum(&old, &a) || has_quorum(&old, &b),
                    "m {m}: one side of a full split always holds a quorum: {a:?} | {b:?}"
                );
            }
        }
    }
}
