//! In-memory communicator: `m` workers inside one process, one thread each.
//!
//! Deterministic by construction: a push-sum share sent in round `r` is added
//! by its receiver exactly in round `r + s` (the staleness bound, the worst
//! delay OSGP allows), shares are added in `(round, sender)` order, and
//! all-reduce sums in rank order. The same seed therefore gives the same bits.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{
    CommError, CommStats, Communicator, PushSumRound, Rank, push_sum_share, segment,
    sum_scalars_in_rank_order, sum_segment_in_ring_order,
};

/// Bytes a push-sum message would take on the wire: payload plus weight.
fn message_bytes(len: usize) -> u64 {
    4 * len as u64 + 8
}

struct Share {
    round: u64,
    from: Rank,
    x: Vec<f32>,
    w: f64,
}

/// One contribution to a collective: a vector and a scalar.
type Contribution = (Vec<f32>, f64);

#[derive(Default)]
struct Reduce {
    generation: u64,
    arrived: usize,
    slots: Vec<Option<Contribution>>,
    result: Option<Arc<Vec<Contribution>>>,
}

struct Shared {
    size: usize,
    timeout: Duration,
    mailboxes: Vec<(Mutex<Vec<Share>>, Condvar)>,
    reduce: Mutex<Reduce>,
    reduce_done: Condvar,
}

/// Factory for the communicators of one in-process run.
pub struct MemoryNetwork;

impl MemoryNetwork {
    /// One communicator per rank. `timeout` bounds every wait; a rank that
    /// waits longer reports the silent peer.
    #[allow(clippy::new_ret_no_self)] // a network is only its communicators
    pub fn new(size: usize, timeout: Duration) -> Vec<MemoryComm> {
        let shared = Arc::new(Shared {
            size,
            timeout,
            mailboxes: (0..size)
                .map(|_| (Mutex::new(Vec::new()), Condvar::new()))
                .collect(),
            reduce: Mutex::new(Reduce {
                slots: (0..size).map(|_| None).collect(),
                ..Reduce::default()
            }),
            reduce_done: Condvar::new(),
        });
        (0..size)
            .map(|rank| MemoryComm {
                rank,
                shared: shared.clone(),
                expected: BTreeMap::new(),
                stats: CommStats::default(),
                len: None,
            })
            .collect()
    }
}

/// One rank's end of a [`MemoryNetwork`].
pub struct MemoryComm {
    rank: Rank,
    shared: Arc<Shared>,
    /// Round -> senders whose share of that round has not been added yet.
    expected: BTreeMap<u64, Vec<Rank>>,
    stats: CommStats,
    len: Option<usize>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A worker thread that panicked poisons nothing we cannot still read.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryComm {
    fn check_len(&mut self, len: usize) -> Result<(), CommError> {
        match self.len {
            None => {
                self.len = Some(len);
                Ok(())
            }
            Some(expected) if expected == len => Ok(()),
            Some(expected) => Err(CommError::ShapeMismatch { expected, got: len }),
        }
    }

    /// Adds every expected share of rounds `<= up_to`, waiting for missing ones.
    fn collect(
        &mut self,
        up_to: u64,
        x: &mut [f32],
        w: &mut f64,
        operation: &'static str,
    ) -> Result<(), CommError> {
        let rounds: Vec<u64> = self.expected.range(..=up_to).map(|(r, _)| *r).collect();
        if rounds.is_empty() {
            return Ok(());
        }
        let (mailbox, arrived) = &self.shared.mailboxes[self.rank];
        let deadline = Instant::now() + self.shared.timeout;
        let mut inbox = lock(mailbox);
        loop {
            let complete = rounds.iter().all(|r| {
                self.expected[r]
                    .iter()
                    .all(|from| inbox.iter().any(|s| s.round == *r && s.from == *from))
            });
            if complete {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                let (round, peer) = rounds
                    .iter()
                    .find_map(|r| {
                        self.expected[r]
                            .iter()
                            .find(|from| !inbox.iter().any(|s| s.round == *r && s.from == **from))
                            .map(|p| (*r, *p))
                    })
                    .expect("incomplete implies a missing share");
                return Err(CommError::PeerTimeout {
                    peer: format!("worker-{peer}"),
                    rank: peer,
                    round,
                    operation,
                    timeout: self.shared.timeout,
                });
            }
            inbox = arrived
                .wait_timeout(inbox, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let mut taken: Vec<Share> = Vec::new();
        let mut i = 0;
        while i < inbox.len() {
            if inbox[i].round <= up_to {
                taken.push(inbox.swap_remove(i));
            } else {
                i += 1;
            }
        }
        drop(inbox);
        taken.sort_by_key(|s| (s.round, s.from));
        for share in taken {
            for (a, b) in x.iter_mut().zip(&share.x) {
                *a += *b;
            }
            *w += share.w;
            self.stats.messages_received += 1;
            self.stats.bytes_received += message_bytes(share.x.len());
        }
        for r in rounds {
            self.expected.remove(&r);
        }
        Ok(())
    }

    /// Puts a share of round `round` into `peer`'s mailbox.
    fn send_share(&mut self, peer: Rank, round: u64, x: Vec<f32>, w: f64) {
        let bytes = message_bytes(x.len());
        let (mailbox, arrived) = &self.shared.mailboxes[peer];
        lock(mailbox).push(Share {
            round,
            from: self.rank,
            x,
            w,
        });
        arrived.notify_all();
        self.stats.messages_sent += 1;
        self.stats.bytes_sent += bytes;
    }

    /// Every rank's contribution, in rank order, once all have arrived.
    fn gather(
        &mut self,
        values: Vec<f32>,
        scalar: f64,
        operation: &'static str,
    ) -> Result<Arc<Vec<Contribution>>, CommError> {
        let shared = self.shared.clone();
        let mut state = lock(&shared.reduce);
        let generation = state.generation;
        state.slots[self.rank] = Some((values, scalar));
        state.arrived += 1;
        if state.arrived == shared.size {
            let all: Vec<Contribution> = state
                .slots
                .iter_mut()
                .map(|slot| slot.take().expect("every rank deposited"))
                .collect();
            // Overwriting the previous result is safe: every rank took it
            // before it could deposit into this generation.
            state.result = Some(Arc::new(all));
            state.arrived = 0;
            state.generation += 1;
            shared.reduce_done.notify_all();
        } else {
            let deadline = Instant::now() + shared.timeout;
            while state.generation == generation {
                let now = Instant::now();
                if now >= deadline {
                    let missing = state.slots.iter().position(|s| s.is_none()).unwrap_or(0);
                    return Err(CommError::PeerTimeout {
                        peer: format!("worker-{missing}"),
                        rank: missing,
                        round: generation,
                        operation,
                        timeout: shared.timeout,
                    });
                }
                state = shared
                    .reduce_done
                    .wait_timeout(state, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        let result = state.result.clone().expect("result of a finished gather");
        Ok(result)
    }
}

impl Communicator for MemoryComm {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.size
    }

    fn push_sum(
        &mut self,
        round: &PushSumRound<'_>,
        x: &mut [f32],
        w: &mut f64,
    ) -> Result<(), CommError> {
        self.check_len(x.len())?;
        let p = push_sum_share(round.out_peers.len());
        if let Some((&last, others)) = round.out_peers.split_last() {
            let pf = p as f32;
            // One pass scales x and writes the first share.
            let share: Vec<f32> = x
                .iter_mut()
                .map(|v| {
                    *v *= pf;
                    *v
                })
                .collect();
            *w *= p;
            // Every peer but the last gets a copy; the last takes the share.
            for &peer in others {
                self.send_share(peer, round.round, share.clone(), *w);
            }
            self.send_share(last, round.round, share, *w);
        }
        if !round.in_peers.is_empty() {
            self.expected
                .entry(round.round)
                .or_default()
                .extend_from_slice(round.in_peers);
        }
        match round.round.checked_sub(round.staleness) {
            Some(up_to) => self.collect(up_to, x, w, "push-sum"),
            None => Ok(()),
        }
    }

    fn drain(&mut self, x: &mut [f32], w: &mut f64) -> Result<(), CommError> {
        self.collect(u64::MAX, x, w, "drain")
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32], scalar: &mut f64) -> Result<(), CommError> {
        let size = self.shared.size;
        // Phase 1: everyone's contribution; phase 2: each rank sums its own
        // segment of the result over all contributions in the ring order (the
        // order of the network's reduce-scatter, so the bits are the same as
        // over the network and do not depend on scheduling), and the segments
        // are gathered.
        let inputs = self.gather(buf.to_vec(), *scalar, "all-reduce")?;
        // Every rank sees every length, so a mismatch fails them all alike.
        if let Some((v, _)) = inputs.iter().find(|(v, _)| v.len() != buf.len()) {
            return Err(CommError::ShapeMismatch {
                expected: buf.len(),
                got: v.len(),
            });
        }
        let len = buf.len();
        let mut part = vec![0f32; segment(len, size, self.rank).len()];
        let views: Vec<&[f32]> = inputs.iter().map(|(v, _)| v.as_slice()).collect();
        sum_segment_in_ring_order(&views, self.rank, &mut part);
        let total = sum_scalars_in_rank_order(inputs.iter().map(|(_, s)| *s));
        drop(views);
        drop(inputs);
        let parts = self.gather(part, total, "all-reduce")?;
        for (rank, (part, _)) in parts.iter().enumerate() {
            buf[segment(len, size, rank)].copy_from_slice(part);
        }
        *scalar = total;
        // What a bandwidth-optimal ring all-reduce would move.
        if size > 1 {
            let bytes = 2 * (size as u64 - 1) * (4 * buf.len() as u64 + 8) / size as u64;
            self.stats.bytes_sent += bytes;
            self.stats.bytes_received += bytes;
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.gather(Vec::new(), 0.0, "barrier").map(drop)
    }

    fn stats(&self) -> CommStats {
        self.stats
    }
}
