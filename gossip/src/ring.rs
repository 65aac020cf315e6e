//! Ring all-reduce, written once for every transport: reduce-scatter then
//! all-gather, pipelined in chunks.
//!
//! The buffer is cut into m segments; in m - 1 reduce-scatter steps each
//! segment travels once round the ring, every rank adding its own values,
//! and ends fully reduced on one rank; in m - 1 all-gather steps those bits
//! are copied round the ring. Each rank sends and receives 2 (m - 1) / m of
//! the buffer (the bandwidth optimum), every element is summed by exactly one
//! rank in one order (the order of [`crate::sum_segment_in_ring_order`]), and
//! so every rank ends with the same bits, whatever the transport. The scalar
//! rides on the first chunk of segment 0 and is summed in rank order
//! ([`crate::sum_scalars_in_rank_order`]).
//!
//! A transport provides only [`RingLinks`]: send a chunk to the right
//! neighbour, receive the next expected one from the left neighbour.

use std::ops::Range;

use crate::{CommError, Rank, segment};

/// The half of the ring a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Partial sums, added by the receiver.
    ReduceScatter,
    /// Finished sums, copied by the receiver.
    AllGather,
}

/// What the ring says about a chunk, beyond its values. The transport adds
/// the collective's identity (sequence number, sender) itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChunkHeader {
    pub phase: Phase,
    /// Ring step, `0..2 (m - 1)`.
    pub step: u32,
    /// Where the chunk's values lie in the buffer.
    pub offset: usize,
    pub len: usize,
    /// The buffer's length.
    pub total: usize,
    /// The partial sum of the scalar on segment 0's first chunk, else 0.
    pub scalar: f64,
}

/// The chunk a rank waits for next from its left neighbour.
#[derive(Debug, Clone)]
pub(crate) struct Expected {
    pub phase: Phase,
    pub step: u32,
    /// The segment being received.
    pub segment: Range<usize>,
    /// Where the next chunk must start.
    pub cursor: usize,
    pub total: usize,
}

impl Expected {
    /// Checks a chunk of this collective from the left neighbour: `Ok(None)`
    /// if it is the one expected, `Ok(Some(reason))` if it must be dropped,
    /// an error if the ranks disagree on the buffer's length.
    pub fn check(&self, h: &ChunkHeader) -> Result<Option<String>, CommError> {
        if h.total != self.total {
            return Err(CommError::ShapeMismatch {
                expected: self.total,
                got: h.total,
            });
        }
        if h.step != self.step || h.phase != self.phase {
            return Ok(Some(format!(
                "all-reduce chunk of step {} ({:?}), expected step {} ({:?})",
                h.step, h.phase, self.step, self.phase
            )));
        }
        let end = h.offset.saturating_add(h.len);
        let fits = if self.segment.is_empty() {
            h.len == 0
        } else {
            h.len > 0 && end <= self.segment.end
        };
        if h.offset != self.cursor || !fits {
            return Ok(Some(format!(
                "all-reduce chunk at {}..{end}, expected one starting at {} inside {:?}",
                h.offset, self.cursor, self.segment
            )));
        }
        Ok(None)
    }
}

/// A rank's two ring neighbours, as a transport provides them.
pub(crate) trait RingLinks {
    /// A received chunk's values, in the transport's form.
    type Chunk;
    /// Sends `values` (the buffer at `header.offset`) to the right neighbour.
    fn send(&mut self, header: ChunkHeader, values: &[f32]) -> Result<(), CommError>;
    /// Waits for the chunk `expected` from the left neighbour; anything else
    /// is dropped (or is an error, as [`Expected::check`] says). A silent
    /// neighbour is a [`CommError::PeerTimeout`].
    fn recv(&mut self, expected: &Expected) -> Result<(ChunkHeader, Self::Chunk), CommError>;
    /// Writes a received chunk's values into `into` (its place in the
    /// buffer): `into[i] += v[i]` when `add`, else a copy.
    fn apply(&mut self, chunk: Self::Chunk, into: &mut [f32], add: bool);
}

/// Chunks of at most `chunk` floats of a segment; an empty segment is one
/// empty chunk (it still carries the scalar and keeps the steps in lockstep).
pub(crate) fn chunks(seg: Range<usize>, chunk: usize) -> Vec<Range<usize>> {
    if seg.is_empty() {
        return std::iter::once(seg.start..seg.start).collect();
    }
    (seg.start..seg.end)
        .step_by(chunk.max(1))
        .map(|s| s..s.saturating_add(chunk).min(seg.end))
        .collect()
}

/// Sums `buf` and `scalar` over the `m` ranks of the ring; rank `rank`'s
/// links lead to ranks `rank + 1` and `rank - 1` (mod m). Segments move in
/// chunks of at most `chunk` floats.
pub(crate) fn ring_all_reduce<L: RingLinks>(
    links: &mut L,
    rank: Rank,
    m: usize,
    chunk: usize,
    buf: &mut [f32],
    scalar: &mut f64,
) -> Result<(), CommError> {
    if m <= 1 {
        return Ok(());
    }
    let n = buf.len();
    let own = *scalar;
    // Our current value of segment 0's scalar: our own, then the partial
    // sum of the ranks before us, then the total.
    let mut scalar0 = own;
    for step in 0..2 * (m - 1) {
        let reduce = step < m - 1;
        let t = if reduce { step } else { step - (m - 1) };
        let (send_seg, recv_seg, phase) = if reduce {
            (
                (rank + m - t) % m,
                (rank + 2 * m - t - 1) % m,
                Phase::ReduceScatter,
            )
        } else {
            ((rank + 1 + m - t) % m, (rank + m - t) % m, Phase::AllGather)
        };
        let send_range = segment(n, m, send_seg);
        let send_chunks = chunks(send_range.clone(), chunk);
        let recv_range = segment(n, m, recv_seg);
        let mut expected = Expected {
            phase,
            step: step as u32,
            segment: recv_range.clone(),
            cursor: recv_range.start,
            total: n,
        };
        let mut recv_done = false;
        let mut next_send = 0;
        while next_send < send_chunks.len() || !recv_done {
            if let Some(range) = send_chunks.get(next_send) {
                let first = range.start == send_range.start;
                let header = ChunkHeader {
                    phase,
                    step: step as u32,
                    offset: range.start,
                    len: range.len(),
                    total: n,
                    scalar: if send_seg == 0 && first { scalar0 } else { 0.0 },
                };
                links.send(header, &buf[range.clone()])?;
                next_send += 1;
            }
            if !recv_done {
                let (h, values) = links.recv(&expected)?;
                let r = h.offset..h.offset + h.len;
                if recv_seg == 0 && h.offset == recv_range.start {
                    scalar0 = if reduce { h.scalar + own } else { h.scalar };
                }
                links.apply(values, &mut buf[r.clone()], reduce);
                expected.cursor = r.end;
                recv_done = expected.cursor == recv_range.end;
            }
        }
    }
    *scalar = scalar0;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_buffer_in_order() {
        for (n, m) in [(10, 3), (2, 4), (0, 3), (7, 7), (1_000_003, 4)] {
            let mut next = 0;
            for i in 0..m {
                let s = segment(n, m, i);
                assert_eq!(s.start, next);
                next = s.end;
            }
            assert_eq!(next, n);
        }
    }

    #[test]
    fn chunks_cover_a_segment_and_empty_segments_have_one_chunk() {
        assert_eq!(chunks(3..10, 4), vec![3..7, 7..10]);
        assert_eq!(chunks(5..5, 4), vec![5..5]);
        assert_eq!(chunks(0..3, usize::MAX), vec![0..3]);
    }

    fn expected() -> Expected {
        Expected {
            phase: Phase::ReduceScatter,
            step: 2,
            segment: 10..20,
            cursor: 14,
            total: 30,
        }
    }

    fn header(offset: usize, len: usize) -> ChunkHeader {
        ChunkHeader {
            phase: Phase::ReduceScatter,
            step: 2,
            offset,
            len,
            total: 30,
            scalar: 0.0,
        }
    }

    #[test]
    fn only_the_expected_chunk_passes_the_check() {
        let e = expected();
        assert!(e.check(&header(14, 6)).unwrap().is_none());
        assert!(e.check(&header(14, 7)).unwrap().is_some());
        assert!(e.check(&header(13, 2)).unwrap().is_some());
        assert!(e.check(&header(14, 0)).unwrap().is_some());
        let other_step = ChunkHeader {
            step: 3,
            ..header(14, 2)
        };
        assert!(e.check(&other_step).unwrap().is_some());
        let other_phase = ChunkHeader {
            phase: Phase::AllGather,
            ..header(14, 2)
        };
        assert!(e.check(&other_phase).unwrap().is_some());
        let other_total = ChunkHeader {
            total: 31,
            ..header(14, 2)
        };
        assert!(matches!(
            e.check(&other_total),
            Err(CommError::ShapeMismatch {
                expected: 30,
                got: 31
            })
        ));
    }
}
