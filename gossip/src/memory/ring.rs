//! The in-memory links of the ring all-reduce ([`crate::ring`]): one
//! channel per rank from its left neighbour. Chunks travel as `f32`
//! vectors, recycled by their receiver for its own next sends.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

use super::worker_name;
use crate::ring::{ChunkHeader, Expected, RingLinks, ring_all_reduce};
use crate::{CommError, Rank};

/// A chunk in flight: the ring's header, the collective it belongs to, and
/// its values.
struct Chunk {
    seq: u64,
    header: ChunkHeader,
    values: Vec<f32>,
}

/// One rank's ends of the ring: a sender to its right neighbour and the
/// receiver of its left neighbour's chunks.
pub(super) struct RingEnds {
    to_right: Sender<Chunk>,
    from_left: Receiver<Chunk>,
    /// All-reduces run so far.
    seq: u64,
    /// Received vectors, reused for sending.
    spare: Vec<Vec<f32>>,
}

/// The ring ends of ranks `0..size`, in rank order.
pub(super) fn ring_ends(size: usize) -> Vec<RingEnds> {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..size).map(|_| channel()).unzip();
    // Rank r sends into the channel that rank r + 1 receives from.
    receivers
        .into_iter()
        .enumerate()
        .map(|(rank, from_left)| RingEnds {
            to_right: senders[(rank + 1) % size].clone(),
            from_left,
            seq: 0,
            spare: Vec::new(),
        })
        .collect()
}

/// One collective over a rank's ring ends.
struct Links<'a> {
    ends: &'a mut RingEnds,
    rank: Rank,
    size: usize,
    timeout: Duration,
    operation: &'static str,
}

impl Links<'_> {
    fn left(&self) -> Rank {
        (self.rank + self.size - 1) % self.size
    }

    /// A chunk that cannot come from a correct in-process peer.
    fn out_of_step(&self, reason: &str) -> CommError {
        CommError::Other(format!(
            "{} {}: from rank {}: {reason}",
            self.operation,
            self.ends.seq,
            self.left()
        ))
    }
}

impl RingLinks for Links<'_> {
    type Chunk = Vec<f32>;

    fn send(&mut self, header: ChunkHeader, values: &[f32]) -> Result<(), CommError> {
        let mut v = self.ends.spare.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(values);
        let chunk = Chunk {
            seq: self.ends.seq,
            header,
            values: v,
        };
        self.ends.to_right.send(chunk).map_err(|_| {
            let right = (self.rank + 1) % self.size;
            CommError::Closed(format!("worker {right} is gone"))
        })
    }

    fn recv(&mut self, expected: &Expected) -> Result<(ChunkHeader, Vec<f32>), CommError> {
        let chunk = match self.ends.from_left.recv_timeout(self.timeout) {
            Ok(chunk) => chunk,
            Err(RecvTimeoutError::Timeout) => {
                let left = self.left();
                return Err(CommError::PeerTimeout {
                    peer: worker_name(left),
                    rank: left,
                    round: self.ends.seq,
                    operation: self.operation,
                    timeout: self.timeout,
                });
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(CommError::Closed(format!("worker {} is gone", self.left())));
            }
        };
        if chunk.seq != self.ends.seq {
            let reason = format!("a chunk of collective {}", chunk.seq);
            return Err(self.out_of_step(&reason));
        }
        if let Some(reason) = expected.check(&chunk.header)? {
            return Err(self.out_of_step(&reason));
        }
        Ok((chunk.header, chunk.values))
    }

    fn apply(&mut self, values: Vec<f32>, into: &mut [f32], add: bool) {
        if add {
            for (a, b) in into.iter_mut().zip(&values) {
                *a += *b;
            }
        } else {
            into.copy_from_slice(&values);
        }
        self.ends.spare.push(values);
    }
}

/// Sums `buf` and `scalar` over the ring of `size` ranks. Every rank must
/// call it with a buffer of the same length.
pub(super) fn all_reduce(
    ends: &mut RingEnds,
    rank: Rank,
    size: usize,
    timeout: Duration,
    buf: &mut [f32],
    scalar: &mut f64,
) -> Result<(), CommError> {
    ends.seq += 1;
    let mut links = Links {
        ends,
        rank,
        size,
        timeout,
        operation: "all-reduce",
    };
    // In memory a chunk costs a hand-over, not bandwidth: one per segment.
    ring_all_reduce(&mut links, rank, size, usize::MAX, buf, scalar)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank's result of one all-reduce of `n` floats over `m` ranks
    /// in chunks of `chunk`.
    fn reduce(m: usize, n: usize, chunk: usize) -> Vec<(Vec<u32>, u64)> {
        let handles: Vec<_> = ring_ends(m)
            .into_iter()
            .enumerate()
            .map(|(rank, mut ends)| {
                std::thread::spawn(move || {
                    let mut buf: Vec<f32> = (0..n)
                        .map(|i| ((i * 31 + rank * 17) % 97) as f32 * 0.013 - 0.4)
                        .collect();
                    let mut scalar = 0.1 + rank as f64;
                    ends.seq += 1;
                    let mut links = Links {
                        ends: &mut ends,
                        rank,
                        size: m,
                        timeout: Duration::from_secs(10),
                        operation: "all-reduce",
                    };
                    ring_all_reduce(&mut links, rank, m, chunk, &mut buf, &mut scalar).unwrap();
                    (buf.iter().map(|v| v.to_bits()).collect(), scalar.to_bits())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn pipelined_chunks_give_the_bits_of_whole_segments() {
        for (m, n) in [(2, 10), (3, 50), (4, 1001), (5, 3)] {
            let whole = reduce(m, n, usize::MAX);
            assert!(
                whole.iter().all(|r| *r == whole[0]),
                "m {m} n {n}: ranks differ"
            );
            for chunk in [1, 3, 7, 64] {
                assert_eq!(reduce(m, n, chunk), whole, "m {m} n {n} chunk {chunk}");
            }
        }
    }
}
