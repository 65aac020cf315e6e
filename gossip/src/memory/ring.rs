//! The in-memory links of the all-reduce schedules ([`crate::ring`]): one
//! inbox channel per rank, fed by every other rank. Chunks travel as `f32`
//! vectors, recycled by their receiver for its own next sends.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::worker_name;
use crate::ring::{ChunkHeader, DIRECT_MAX_BYTES, Expected, Links, Schedule};
use crate::{CommError, Rank};

/// A chunk in flight: its sender, the collective it belongs to, the
/// schedule's header, and its values.
struct Chunk {
    from: Rank,
    seq: u64,
    header: ChunkHeader,
    values: Vec<f32>,
}

/// One rank's ends: a sender to every rank's inbox and its own inbox.
pub(super) struct RingEnds {
    to: Vec<Sender<Chunk>>,
    inbox: Receiver<Chunk>,
    /// Held while this rank's ends live; the others watch it, so that a
    /// worker that is gone is noticed at once, not after the timeout (every
    /// rank holds a sender to every inbox, so the inbox itself never
    /// disconnects).
    _alive: Arc<()>,
    alive: Vec<Weak<()>>,
    /// All-reduces run so far.
    seq: u64,
    /// Received vectors, reused for sending.
    spare: Vec<Vec<f32>>,
}

/// The ring ends of ranks `0..size`, in rank order.
pub(super) fn ring_ends(size: usize) -> Vec<RingEnds> {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..size).map(|_| channel()).unzip();
    let tokens: Vec<Arc<()>> = (0..size).map(|_| Arc::new(())).collect();
    let alive: Vec<Weak<()>> = tokens.iter().map(Arc::downgrade).collect();
    receivers
        .into_iter()
        .zip(tokens)
        .map(|(inbox, token)| RingEnds {
            to: senders.clone(),
            inbox,
            _alive: token,
            alive: alive.clone(),
            seq: 0,
            spare: Vec::new(),
        })
        .collect()
}

/// One collective over a rank's ring ends.
struct Collective<'a> {
    ends: &'a mut RingEnds,
    rank: Rank,
    timeout: Duration,
    operation: &'static str,
}

impl Collective<'_> {
    /// A chunk that cannot come from a correct in-process peer.
    fn out_of_step(&self, from: Rank, reason: &str) -> CommError {
        CommError::Protocol(format!(
            "{} {}: from rank {from}: {reason}",
            self.operation, self.ends.seq
        ))
    }
}

impl Links for Collective<'_> {
    type Chunk = Vec<f32>;

    fn send(&mut self, to: Rank, header: ChunkHeader, values: &[f32]) -> Result<(), CommError> {
        let mut v = self.ends.spare.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(values);
        let chunk = Chunk {
            from: self.rank,
            seq: self.ends.seq,
            header,
            values: v,
        };
        self.ends.to[to]
            .send(chunk)
            .map_err(|_| CommError::Closed(format!("worker {to} is gone")))
    }

    fn recv(&mut self, expected: &[Expected]) -> Result<(usize, ChunkHeader, Vec<f32>), CommError> {
        let first = expected.first().map_or(self.rank, |e| e.from);
        let started = Instant::now();
        let chunk = loop {
            let left = self.timeout.saturating_sub(started.elapsed());
            match self.ends.inbox.recv_timeout(left.min(crate::POLL)) {
                Ok(chunk) => break chunk,
                Err(RecvTimeoutError::Timeout) => {
                    let gone = expected
                        .iter()
                        .find(|e| self.ends.alive[e.from].strong_count() == 0);
                    if let Some(e) = gone {
                        return Err(CommError::Closed(format!("worker {} is gone", e.from)));
                    }
                    if started.elapsed() >= self.timeout {
                        return Err(CommError::PeerTimeout {
                            peer: worker_name(first),
                            rank: first,
                            round: self.ends.seq,
                            operation: self.operation,
                            timeout: self.timeout,
                        });
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(CommError::Closed(format!("worker {first} is gone")));
                }
            }
        };
        if chunk.seq != self.ends.seq {
            let reason = format!("a chunk of collective {}", chunk.seq);
            return Err(self.out_of_step(chunk.from, &reason));
        }
        let from = chunk.from;
        let Some(i) = expected
            .iter()
            .position(|e| e.from == from && e.phase == chunk.header.phase)
        else {
            return Err(self.out_of_step(from, "a chunk no schedule step waits for"));
        };
        if let Some(reason) = expected[i].check(&chunk.header)? {
            return Err(self.out_of_step(from, &reason));
        }
        Ok((i, chunk.header, chunk.values))
    }

    fn apply(&mut self, values: Vec<f32>, into: &mut [f32], add: bool) -> Result<(), CommError> {
        if add {
            for (a, b) in into.iter_mut().zip(&values) {
                *a += *b;
            }
        } else {
            into.copy_from_slice(&values);
        }
        self.ends.spare.push(values);
        Ok(())
    }
}

/// Sums `buf` and `scalar` over the `size` ranks ([`crate::ring::Schedule`]).
/// Every rank must call it with a buffer of the same length.
pub(super) fn all_reduce(
    ends: &mut RingEnds,
    rank: Rank,
    size: usize,
    timeout: Duration,
    buf: &mut [f32],
    scalar: &mut f64,
    scale: Option<f32>,
) -> Result<(), CommError> {
    ends.seq += 1;
    let mut links = Collective {
        ends,
        rank,
        timeout,
        operation: "all-reduce",
    };
    // In memory a chunk costs a hand-over, not bandwidth: one per segment.
    let schedule = Schedule::choose(buf.len(), size, usize::MAX, DIRECT_MAX_BYTES);
    crate::ring::all_reduce(
        &mut links,
        schedule,
        rank,
        size,
        usize::MAX,
        buf,
        scalar,
        scale,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{direct_all_reduce, ring_all_reduce};
    use crate::{sum_scalars_in_rank_order, sum_segment_in_ring_order};

    /// Values of mixed magnitude, so that the order of a sum shows in its
    /// bits.
    fn values(rank: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let big = if (i + rank).is_multiple_of(3) {
                    1e4
                } else {
                    1.0
                };
                (((i * 31 + rank * 17) % 97) as f32 * 0.013 - 0.4) * big
            })
            .collect()
    }

    fn scalar_of(rank: usize) -> f64 {
        0.1 + rank as f64 * 0.7
    }

    /// Every rank's result of one all-reduce of `n` floats over `m` ranks
    /// with `schedule` (the ring in chunks of `chunk`).
    fn reduce(m: usize, n: usize, chunk: usize, schedule: Schedule) -> Vec<(Vec<u32>, u64)> {
        reduce_scaled(m, n, chunk, schedule, None)
    }

    /// [`reduce`], each sum multiplied by `scale` in the all-reduce.
    fn reduce_scaled(
        m: usize,
        n: usize,
        chunk: usize,
        schedule: Schedule,
        scale: Option<f32>,
    ) -> Vec<(Vec<u32>, u64)> {
        let handles: Vec<_> = ring_ends(m)
            .into_iter()
            .enumerate()
            .map(|(rank, mut ends)| {
                std::thread::spawn(move || {
                    let mut buf = values(rank, n);
                    let mut scalar = scalar_of(rank);
                    ends.seq += 1;
                    let mut links = Collective {
                        ends: &mut ends,
                        rank,
                        timeout: Duration::from_secs(10),
                        operation: "all-reduce",
                    };
                    let (b, s) = (&mut buf, &mut scalar);
                    match schedule {
                        Schedule::Ring => ring_all_reduce(&mut links, rank, m, chunk, b, s, scale),
                        Schedule::Direct => direct_all_reduce(&mut links, rank, m, b, s, scale),
                    }
                    .unwrap();
                    (buf.iter().map(|v| v.to_bits()).collect(), scalar.to_bits())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// The sum the protocol defines: each segment in ring order, the scalar
    /// in rank order.
    fn reference(m: usize, n: usize) -> (Vec<u32>, u64) {
        let all: Vec<Vec<f32>> = (0..m).map(|r| values(r, n)).collect();
        let refs: Vec<&[f32]> = all.iter().map(Vec::as_slice).collect();
        let mut out = vec![0.0f32; n];
        for j in 0..m {
            let seg = crate::segment(n, m, j);
            sum_segment_in_ring_order(&refs, j, &mut out[seg]);
        }
        let scalar = sum_scalars_in_rank_order((0..m).map(scalar_of));
        (out.iter().map(|v| v.to_bits()).collect(), scalar.to_bits())
    }

    #[test]
    fn pipelined_chunks_give_the_bits_of_whole_segments() {
        for (m, n) in [(2, 10), (3, 50), (4, 1001), (5, 3)] {
            let whole = reduce(m, n, usize::MAX, Schedule::Ring);
            assert!(
                whole.iter().all(|r| *r == reference(m, n)),
                "m {m} n {n}: a rank differs from the reference sum"
            );
            for chunk in [1, 3, 7, 64] {
                let chunked = reduce(m, n, chunk, Schedule::Ring);
                assert_eq!(chunked, whole, "m {m} n {n} chunk {chunk}");
            }
        }
    }

    #[test]
    fn a_scaled_all_reduce_gives_the_bits_of_the_sum_then_the_pass() {
        let factor = 1.0f32 / 3.0;
        for (m, n) in [(1, 5), (2, 10), (3, 50), (4, 1001), (5, 3), (7, 0)] {
            let (sum, scalar) = reference(m, n);
            let want: Vec<u32> = sum
                .iter()
                .map(|b| (f32::from_bits(*b) * factor).to_bits())
                .collect();
            for (schedule, chunk) in [
                (Schedule::Ring, usize::MAX),
                (Schedule::Ring, 7),
                (Schedule::Ring, 1),
                (Schedule::Direct, usize::MAX),
            ] {
                let got = reduce_scaled(m, n, chunk, schedule, Some(factor));
                for (rank, (bits, s)) in got.iter().enumerate() {
                    assert_eq!(
                        bits, &want,
                        "m {m} n {n} {schedule:?} chunk {chunk} rank {rank}"
                    );
                    if m > 1 {
                        assert_eq!(*s, scalar, "m {m} n {n}: the scalar is not scaled");
                    }
                }
            }
        }
    }

    #[test]
    fn the_direct_schedule_gives_the_rings_bits() {
        // Sums whose order matters (values of mixed magnitude), segments
        // of every size including empty ones, rank counts up to 9.
        let rank_order = |m: usize, n: usize| {
            let all: Vec<Vec<f32>> = (0..m).map(|r| values(r, n)).collect();
            let mut out = all[0].clone();
            for v in &all[1..] {
                out.iter_mut().zip(v).for_each(|(a, b)| *a += *b);
            }
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        assert_ne!(
            reference(8, 4099).0,
            rank_order(8, 4099),
            "the values must make the summation order visible"
        );
        for (m, n) in [(2, 10), (3, 50), (4, 1001), (5, 3), (8, 4099), (9, 0)] {
            let want = reference(m, n);
            for attempt in 0..3 {
                let got = reduce(m, n, usize::MAX, Schedule::Direct);
                for (rank, r) in got.iter().enumerate() {
                    assert_eq!(*r, want, "m {m} n {n} rank {rank} attempt {attempt}");
                }
            }
        }
    }
}
