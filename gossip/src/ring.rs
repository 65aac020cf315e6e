//! The exact all-reduce, written once for every transport: two schedules,
//! both summing every element in the one order of
//! [`crate::sum_segment_in_ring_order`], so the choice never changes a bit.
//!
//! **Ring** (reduce-scatter then all-gather, pipelined in chunks): the buffer
//! is cut into m segments; in m - 1 reduce-scatter steps each segment
//! travels once round the ring, every rank adding its own values, and ends
//! fully reduced on one rank; in m - 1 all-gather steps those bits are
//! copied round the ring. Each rank sends and receives 2 (m - 1) / m of the
//! buffer (the bandwidth optimum) but a segment passes 2 (m - 1) ranks one
//! after the other.
//!
//! **Direct** (for buffers whose segments fit in one chunk): every rank sends
//! segment j straight to rank j, which adds the m - 1 contributions in ring
//! order (its own, then rank j + 1's, j + 2's, ...: a contribution that comes
//! early waits for its turn), then sends the sum straight to every rank. The
//! same bytes per rank as the ring, but two hops instead of 2 (m - 1): the
//! latency-bound small buffers (a model of a few MB, the typed collectives)
//! win. [`Schedule::choose`] picks by size and node count.
//!
//! The scalar rides on segment 0 and is summed in rank order
//! ([`crate::sum_scalars_in_rank_order`]) by either schedule.
//!
//! A transport provides only [`Links`]: send a chunk to a rank, receive the
//! next chunk of the collective from one of the ranks a schedule waits for.

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

/// The chunk a rank waits for next from one sender.
#[derive(Debug, Clone)]
pub(crate) struct Expected {
    /// The rank it must come from.
    pub from: Rank,
    pub phase: Phase,
    pub step: u32,
    /// The segment being received.
    pub segment: Range<usize>,
    /// Where the next chunk must start.
    pub cursor: usize,
    pub total: usize,
}

impl Expected {
    /// Checks a chunk of this collective from [`Expected::from`]: `Ok(None)`
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

/// What a transport provides to the schedules.
pub(crate) trait Links {
    /// A received chunk's values, in the transport's form.
    type Chunk;
    /// Sends `values` (the buffer at `header.offset`) to rank `to`.
    fn send(&mut self, to: Rank, header: ChunkHeader, values: &[f32]) -> Result<(), CommError>;
    /// Waits for the next chunk of this collective that is one of
    /// `expected` (each names its sender; at most one per sender) and
    /// returns its index there; anything else is dropped (or is an error, as
    /// [`Expected::check`] says). Silence is a [`CommError::PeerTimeout`]
    /// naming the first of `expected`'s senders.
    fn recv(
        &mut self,
        expected: &[Expected],
    ) -> Result<(usize, ChunkHeader, Self::Chunk), CommError>;
    /// Writes a received chunk's values into `into` (its place in the
    /// buffer): `into[i] += v[i]` when `add`, else a copy. A transport that
    /// sends straight from the buffer first waits until what it sent from
    /// `into` is on its way.
    fn apply(&mut self, chunk: Self::Chunk, into: &mut [f32], add: bool) -> Result<(), CommError>;
    /// Receives the next chunk of `expected` (one sender) into its place in
    /// `buf` (the whole buffer): `buf[i] += v[i]` when `add`, else a copy.
    /// Returns its header. `next` is what the ring waits for once this
    /// step is done (and whether its chunks are added). A transport may
    /// write parts of either into place as they arrive, and hand them over
    /// in turn.
    fn recv_into(
        &mut self,
        expected: &Expected,
        add: bool,
        next: Option<(&Expected, bool)>,
        buf: &mut [f32],
    ) -> Result<ChunkHeader, CommError> {
        let _ = next;
        recv_then_apply(self, expected, add, buf)
    }
}

/// [`Links::recv_into`] without landing: the chunk is received whole, then
/// applied in its place.
pub(crate) fn recv_then_apply<L: Links + ?Sized>(
    links: &mut L,
    expected: &Expected,
    add: bool,
    buf: &mut [f32],
) -> Result<ChunkHeader, CommError> {
    let (_, h, values) = links.recv(std::slice::from_ref(expected))?;
    // `Expected::check` passed: the chunk lies inside the buffer.
    links.apply(values, &mut buf[h.offset..h.offset + h.len], add)?;
    Ok(h)
}

/// How an all-reduce moves its segments (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    Ring,
    Direct,
}

/// The largest all-reduce message over the network, in floats (4 MiB), unless
/// configured otherwise.
pub const CHUNK_FLOATS: usize = 1 << 20;

/// Buffers up to this many bytes whose segments fit in one chunk go
/// [`Schedule::Direct`]. Measured (`slowmo bench allreduce`, 4 and 8 local
/// nodes on 2 cores): direct is 20% faster at 0.8 MB over 4 nodes and ties
/// over 8; from 4 MB on the ring's pipelining wins by a third (every owner
/// takes m - 1 whole contributions at once and holds the early ones).
pub const DIRECT_MAX_BYTES: usize = 1 << 20;

/// The direct schedule is taken over at most this many ranks: every rank
/// sends to every other, so it needs a link to each, and a node's links
/// must stay bounded as runs grow (over more ranks the ring, which needs
/// its two neighbours, is as fast: measured to tie from 8 ranks on).
pub const DIRECT_MAX_RANKS: usize = 16;

impl Schedule {
    /// The schedule of an all-reduce of `n` floats over `m` ranks moving at
    /// most `chunk` floats per message: direct up to `direct_max` bytes
    /// ([`DIRECT_MAX_BYTES`] unless configured). A pure function of its
    /// arguments, so every rank (configured alike) picks the same.
    pub fn choose(n: usize, m: usize, chunk: usize, direct_max: usize) -> Self {
        let one_chunk = m > 0 && n.div_ceil(m) <= chunk;
        if Self::direct_possible(m, direct_max) && one_chunk && n.saturating_mul(4) <= direct_max {
            Schedule::Direct
        } else {
            Schedule::Ring
        }
    }

    /// Whether [`Schedule::choose`] may take the direct schedule over `m`
    /// ranks (then every rank needs a link to every other).
    pub fn direct_possible(m: usize, direct_max: usize) -> bool {
        m > 2 && m <= DIRECT_MAX_RANKS && direct_max > 0
    }

    pub fn name(self) -> &'static str {
        match self {
            Schedule::Ring => "ring",
            Schedule::Direct => "direct",
        }
    }
}

/// Sums `buf` and `scalar` over the `m` ranks with `schedule` (the ring in
/// messages of at most `chunk` floats); see [`ring_all_reduce`] and
/// [`direct_all_reduce`]. With `scale`, every element of the sum is then
/// multiplied by it: by the rank that finished that segment, before the
/// all-gather sends it on, so that no rank makes a pass over the whole
/// buffer afterwards (the same bits as the pass).
#[allow(clippy::too_many_arguments)] // the schedules' inputs, passed through
pub(crate) fn all_reduce<L: Links>(
    links: &mut L,
    schedule: Schedule,
    rank: Rank,
    m: usize,
    chunk: usize,
    buf: &mut [f32],
    scalar: &mut f64,
    scale: Option<f32>,
) -> Result<(), CommError> {
    match schedule {
        Schedule::Ring => ring_all_reduce(links, rank, m, chunk, buf, scalar, scale),
        Schedule::Direct => direct_all_reduce(links, rank, m, buf, scalar, scale),
    }
}

/// Multiplies `values` by `factor`, if any: the sum's scaling, done once
/// per element by the rank that finished it, before it is sent on.
pub(crate) fn scale_sum(values: &mut [f32], factor: Option<f32>) {
    if let Some(f) = factor {
        crate::ledger::scale(values, f);
    }
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
pub(crate) fn ring_all_reduce<L: Links>(
    links: &mut L,
    rank: Rank,
    m: usize,
    chunk: usize,
    buf: &mut [f32],
    scalar: &mut f64,
    scale: Option<f32>,
) -> Result<(), CommError> {
    if m <= 1 {
        scale_sum(buf, scale);
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
            from: (rank + m - 1) % m,
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
            // The first all-gather step sends the segment we finished.
            if send_step == m - 1 {
                scale_sum(&mut buf[range.clone()], scale);
            }
            links.send((rank + 1) % m, header, &buf[range])?;
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
            return Err(CommError::Misuse(format!(
                "ring all-reduce: rank {rank} has nothing to send or receive at step {send_step}"
            )));
        }
        let next = (recv_step + 1 < steps).then(|| expect(recv_step + 1));
        let next = next.as_ref().map(|e| (e, reduce(recv_step + 1)));
        let h = links.recv_into(&expected, reduce(recv_step), next, buf)?;
        let r = h.offset..h.offset + h.len;
        let seg_start = expected.segment.start;
        if recv_seg(recv_step) == 0 && h.offset == seg_start {
            scalar0 = if reduce(recv_step) {
                h.scalar + own
            } else {
                h.scalar
            };
        }
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

/// Sums `buf` and `scalar` over the `m` ranks, every segment straight to its
/// owner and back (see the [module docs](self)). Each segment goes as one
/// message, so that a rank never has more than two messages per collective
/// queued for one link ([`Schedule::choose`] keeps it to buffers where that
/// fits); received contributions may come in parts (a lane cuts a message
/// over its connections) and are added part by part, in turn.
pub(crate) fn direct_all_reduce<L: Links>(
    links: &mut L,
    rank: Rank,
    m: usize,
    buf: &mut [f32],
    scalar: &mut f64,
    scale: Option<f32>,
) -> Result<(), CommError> {
    if m <= 1 {
        scale_sum(buf, scale);
        return Ok(());
    }
    let n = buf.len();
    let mine = segment(n, m, rank);
    let others = |rank: Rank| (1..m).map(move |k| (rank + k) % m);
    // Reduce-scatter: segment j to rank j; the scalar to rank 0.
    for j in others(rank) {
        let seg = segment(n, m, j);
        let header = ChunkHeader {
            phase: Phase::ReduceScatter,
            step: 0,
            offset: seg.start,
            len: seg.len(),
            total: n,
            scalar: if j == 0 { *scalar } else { 0.0 },
        };
        links.send(j, header, &buf[seg])?;
    }
    // Our segment's contributions, added in ring order (rank + 1's first),
    // and the other ranks' sums, which may come before ours is done.
    let expect = |from: Rank, phase: Phase, seg: Range<usize>| Expected {
        from,
        phase,
        step: if phase == Phase::ReduceScatter { 0 } else { 1 },
        cursor: seg.start,
        segment: seg,
        total: n,
    };
    let mut waiting: Vec<Expected> = others(rank)
        .map(|from| expect(from, Phase::ReduceScatter, mine.clone()))
        .chain(others(rank).map(|from| expect(from, Phase::AllGather, segment(n, m, from))))
        .collect();
    // Contributions by turn (rank + 1's is turn 0), in the parts the
    // transport delivered; `turn` is the one being added.
    let mut parts: Vec<Vec<(ChunkHeader, L::Chunk)>> = (1..m).map(|_| Vec::new()).collect();
    let mut complete = vec![false; m - 1];
    let mut turn = 0;
    let mut total = None;
    while !waiting.is_empty() {
        // Kept in order, so that silence is blamed on a contribution first.
        let (i, h, values) = links.recv(&waiting)?;
        let e = &mut waiting[i];
        e.cursor = h.offset + h.len;
        let (from, phase, seg) = (e.from, e.phase, e.segment.clone());
        if e.cursor == seg.end {
            waiting.remove(i);
        }
        if phase == Phase::AllGather {
            if from == 0 && h.offset == seg.start {
                total = Some(h.scalar);
            }
            links.apply(values, &mut buf[h.offset..h.offset + h.len], false)?;
            continue;
        }
        let t = (from + m - rank) % m - 1;
        parts[t].push((h, values));
        complete[t] = !waiting
            .iter()
            .any(|e| e.from == from && e.phase == Phase::ReduceScatter);
        while turn < m - 1 {
            for (h, values) in parts[turn].drain(..) {
                if rank == 0 && h.offset == mine.start {
                    *scalar += h.scalar;
                }
                links.apply(values, &mut buf[h.offset..h.offset + h.len], true)?;
            }
            if !complete[turn] {
                break;
            }
            turn += 1;
            if turn == m - 1 {
                // Our sum to every rank.
                scale_sum(&mut buf[mine.clone()], scale);
                for j in others(rank) {
                    let header = ChunkHeader {
                        phase: Phase::AllGather,
                        step: 1,
                        offset: mine.start,
                        len: mine.len(),
                        total: n,
                        scalar: if rank == 0 { *scalar } else { 0.0 },
                    };
                    links.send(j, header, &buf[mine.clone()])?;
                }
            }
        }
    }
    if let Some(total) = total {
        *scalar = total;
    }
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
    fn small_buffers_over_three_or_more_ranks_go_direct() {
        let choose = |n, m, chunk| Schedule::choose(n, m, chunk, DIRECT_MAX_BYTES);
        assert_eq!(choose(200_000, 4, CHUNK_FLOATS), Schedule::Direct);
        assert_eq!(choose(0, 3, CHUNK_FLOATS), Schedule::Direct);
        // Two ranks: the ring is already direct.
        assert_eq!(choose(200_000, 2, CHUNK_FLOATS), Schedule::Ring);
        // Too large, or a segment that takes more than one message.
        assert_eq!(choose(10_000_000, 4, CHUNK_FLOATS), Schedule::Ring);
        assert_eq!(choose(200_000, 4, 1000), Schedule::Ring);
        let at_most = DIRECT_MAX_BYTES / 4;
        assert_eq!(choose(at_most, 8, usize::MAX), Schedule::Direct);
        assert_eq!(choose(at_most + 1, 8, usize::MAX), Schedule::Ring);
        // Configured off.
        assert_eq!(Schedule::choose(1000, 4, CHUNK_FLOATS, 0), Schedule::Ring);
    }

    #[test]
    fn chunks_cover_a_segment_and_empty_segments_have_one_chunk() {
        assert_eq!(chunks(3..10, 4), vec![3..7, 7..10]);
        assert_eq!(chunks(5..5, 4), vec![5..5]);
        assert_eq!(chunks(0..3, usize::MAX), vec![0..3]);
    }

    fn expected() -> Expected {
        Expected {
            from: 1,
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
