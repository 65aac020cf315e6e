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

/// Chunks a rank may have sent beyond what it has received: steps overlap
/// (a chunk goes on to the right as soon as it arrived and was added) while
/// the links' buffers (at least this many chunks) keep the ring from
/// deadlocking with every rank blocked in a send.
pub(crate) const IN_FLIGHT: usize = 3;

/// Sums `buf` and `scalar` over the `m` ranks of the ring; rank `rank`'s
/// links lead to ranks `rank + 1` and `rank - 1` (mod m). Segments move in
/// chunks of at most `chunk` floats.
///
/// Pipelined: what a rank sends at step s + 1 is what it received at step s
/// (reduce-scatter and all-gather alike), so each chunk is sent on as soon
/// as it arrived, up to [`IN_FLIGHT`] chunks ahead of the receipts. Every
/// element still gets the same additions in the same order.
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
    let steps = 2 * (m - 1);
    let reduce = |step: usize| step < m - 1;
    let send_seg = |step: usize| {
        if reduce(step) {
            (rank + m - step) % m
        } else {
            (rank + 1 + m - (step - (m - 1))) % m
        }
    };
    let recv_seg = |step: usize| {
        if reduce(step) {
            (rank + 2 * m - step - 1) % m
        } else {
            (rank + m - (step - (m - 1))) % m
        }
    };
    let phase = |step: usize| {
        if reduce(step) {
            Phase::ReduceScatter
        } else {
            Phase::AllGather
        }
    };
    let expect = |step: usize| {
        let seg = segment(n, m, recv_seg(step));
        Expected {
            phase: phase(step),
            step: step as u32,
            segment: seg.clone(),
            cursor: seg.start,
            total: n,
        }
    };
    // Our current value of segment 0's scalar: our own, then the partial
    // sum of the ranks before us, then the total.
    let mut scalar0 = own;
    let (mut send_step, mut next_send) = (0, 0);
    let mut send_chunks = chunks(segment(n, m, send_seg(0)), chunk);
    let (mut recv_step, mut received_any) = (0, false);
    let mut expected = expect(0);
    let (mut sent, mut received) = (0usize, 0usize);
    while send_step < steps || recv_step < steps {
        // Sends of step s + 1 wait for the receipts of step s.
        let ready = send_chunks.get(next_send).is_some_and(|range| {
            send_step == 0
                || recv_step >= send_step
                || (recv_step + 1 == send_step && received_any && range.end <= expected.cursor)
        });
        if send_step < steps && ready && sent < received + IN_FLIGHT {
            let range = send_chunks[next_send].clone();
            let seg = send_seg(send_step);
            let first = range.start == segment(n, m, seg).start;
            let header = ChunkHeader {
                phase: phase(send_step),
                step: send_step as u32,
                offset: range.start,
                len: range.len(),
                total: n,
                scalar: if seg == 0 && first { scalar0 } else { 0.0 },
            };
            links.send(header, &buf[range])?;
            sent += 1;
            next_send += 1;
            if next_send == send_chunks.len() {
                send_step += 1;
                next_send = 0;
                if send_step < steps {
                    send_chunks = chunks(segment(n, m, send_seg(send_step)), chunk);
                }
            }
            continue;
        }
        if recv_step >= steps {
            return Err(CommError::Other(format!(
                "ring all-reduce: rank {rank} has nothing to send or receive at step {send_step}"
            )));
        }
        let (h, values) = links.recv(&expected)?;
        let r = h.offset..h.offset + h.len;
        let seg_start = expected.segment.start;
        if recv_seg(recv_step) == 0 && h.offset == seg_start {
            scalar0 = if reduce(recv_step) {
                h.scalar + own
            } else {
                h.scalar
            };
        }
        links.apply(values, &mut buf[r.clone()], reduce(recv_step));
        received += 1;
        received_any = true;
        expected.cursor = r.end;
        if expected.cursor == expected.segment.end {
            recv_step += 1;
            received_any = false;
            if recv_step < steps {
                expected = expect(recv_step);
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
