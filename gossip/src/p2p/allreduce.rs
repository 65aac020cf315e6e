//! Ring all-reduce: reduce-scatter then all-gather, pipelined in chunks.
//!
//! The buffer is cut into m segments; in m - 1 reduce-scatter steps each
//! segment travels once round the ring, every rank adding its own values,
//! and ends fully reduced on one rank; in m - 1 all-gather steps those bits
//! are copied round the ring. Each rank sends and receives 2 (m - 1) / m of
//! the buffer (the bandwidth optimum), every element is summed by exactly one
//! rank in one order, and so every rank ends with the same bits. The scalar
//! rides on the first chunk of segment 0 and is summed in rank order.
//!
//! Memory: a segment moves in chunks of at most `chunk_floats`; a rank holds
//! at most a few chunks in flight per neighbour (one queued for sending, one
//! being written, one being read, one waiting to be added).

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::block_on_active;
use super::links::Outgoing;
use super::payload::{add_bytes, copy_bytes, encode_f32};
use super::state::{ReduceMsg, Shared, View};
use super::wire::{DType, Header, Kind, Reject, WIRE_VERSION, encode_header};
use crate::{CommError, Rank, segment};

/// Chunks of a segment; an empty segment is one empty chunk (it still
/// carries the scalar and keeps the steps in lockstep).
fn chunks(seg: Range<usize>, chunk: usize) -> Vec<Range<usize>> {
    if seg.is_empty() {
        return std::iter::once(seg.start..seg.start).collect();
    }
    (seg.start..seg.end)
        .step_by(chunk)
        .map(|s| s..(s + chunk).min(seg.end))
        .collect()
}

/// Everything one collective needs.
pub(crate) struct Ring<'a> {
    pub rt: &'a Runtime,
    pub shared: &'a Arc<Shared>,
    pub view: &'a View,
    pub rank: Rank,
    pub right: &'a mpsc::Sender<Outgoing>,
    pub inbox: &'a mut mpsc::Receiver<ReduceMsg>,
    pub seq: u64,
    pub operation: &'static str,
}

impl Ring<'_> {
    pub(super) fn peer_timeout(&self, rank: Rank) -> CommError {
        CommError::PeerTimeout {
            peer: self.view.members[rank].to_string(),
            rank,
            round: self.seq,
            operation: self.operation,
            timeout: self.shared.cfg.peer_timeout,
        }
    }

    /// The error of a rank whose left neighbour sent a frame of another
    /// kind of collective under our sequence number.
    pub(super) fn other_collective(&self, left: Rank, kind: Kind) -> CommError {
        CommError::Other(format!(
            "{} {}: the left neighbour (rank {left}) sent a {kind:?} frame: the ranks called \
             collectives in different orders",
            self.operation, self.seq
        ))
    }

    /// A header of this collective, located at 0 in a buffer of `len`.
    pub(super) fn header(&self, kind: Kind, step: u32, len: u64, checksum: u64) -> Header {
        Header {
            version: WIRE_VERSION,
            run_id: self.shared.cfg.run.run_id.clone(),
            view: self.view.number,
            sender: self.shared.local.to_string(),
            round: self.seq,
            kind,
            dtype: DType::of(kind),
            len,
            weight: 0.0,
            checksum,
            step,
            offset: 0,
            total: len,
        }
    }

    fn send(
        &self,
        kind: Kind,
        step: u32,
        range: Range<usize>,
        total: usize,
        buf: &[f32],
        scalar: f64,
    ) -> Result<(), CommError> {
        let slice = &buf[range.clone()];
        let (payload, sum) = encode_f32(slice, self.shared.pool.take(4 * slice.len()));
        let header = Header {
            weight: scalar,
            offset: range.start as u64,
            total: total as u64,
            ..self.header(kind, step, range.len() as u64, sum)
        };
        self.send_frame(header, payload)
    }

    /// Queues one frame for the right neighbour.
    pub(super) fn send_frame(&self, header: Header, payload: Vec<u8>) -> Result<(), CommError> {
        let msg = Outgoing {
            header: encode_header(&header),
            payload: Arc::new(payload),
        };
        let right = (self.rank + 1) % self.view.members.len();
        let wait = self.shared.cfg.peer_timeout;
        let peer = self.view.members[right];
        let send = self.right.send(msg);
        match block_on_active(self.rt, self.shared, &peer, Instant::now(), wait, send) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(CommError::Closed(format!("link to rank {right} is gone"))),
            Err(_) => Err(self.peer_timeout(right)),
        }
    }

    /// Waits for the next expected chunk from the left neighbour; anything
    /// else is dropped and counted.
    fn recv(
        &mut self,
        kind: Kind,
        step: u32,
        seg: &Range<usize>,
        cursor: usize,
        total: usize,
    ) -> Result<ReduceMsg, CommError> {
        let m = self.view.members.len();
        let left = (self.rank + m - 1) % m;
        // Silence, not slowness, is what times out: the clock restarts with
        // every chunk, and with every byte of one that is still arriving.
        // Rejected chunks do not restart it.
        let started = Instant::now();
        let left_peer = self.view.members[left];
        let wait = self.shared.cfg.peer_timeout;
        loop {
            let got = block_on_active(
                self.rt,
                self.shared,
                &left_peer,
                started,
                wait,
                self.inbox.recv(),
            );
            let msg = match got {
                Ok(Some(msg)) => msg,
                Ok(None) => return Err(CommError::Closed("all-reduce inbox closed".into())),
                Err(_) => return Err(self.peer_timeout(left)),
            };
            let h = &msg.header;
            if msg.from == left && h.round == self.seq && h.kind == Kind::Gather {
                return Err(self.other_collective(left, h.kind));
            }
            if msg.from == left && h.round == self.seq && h.total != total as u64 {
                return Err(CommError::ShapeMismatch {
                    expected: total,
                    got: h.total as usize,
                });
            }
            let end = h.offset + h.len;
            let fits = if seg.is_empty() {
                h.len == 0
            } else {
                h.len > 0 && end <= seg.end as u64
            };
            let reason = if msg.from != left {
                Some(format!(
                    "all-reduce chunk from rank {}, expected the left neighbour {left}",
                    msg.from
                ))
            } else if h.round != self.seq || h.step != step || h.kind != kind {
                Some(format!(
                    "all-reduce chunk of collective {} step {} ({:?}), expected {} step {step} ({kind:?})",
                    h.round, h.step, h.kind, self.seq
                ))
            } else if h.offset != cursor as u64 || !fits {
                Some(format!(
                    "all-reduce chunk at {}..{end}, expected one starting at {cursor} inside {seg:?}",
                    h.offset
                ))
            } else {
                None
            };
            match reason {
                None => return Ok(msg),
                Some(reason) => {
                    let peer = self.view.members[msg.from];
                    self.shared.reject(
                        &peer,
                        super::wire::ALL_REDUCE_PROTOCOL,
                        &Reject::MalformedHeader(reason),
                    );
                }
            }
        }
    }

    /// Sums `buf` and `scalar` over the ring.
    pub fn run(&mut self, buf: &mut [f32], scalar: &mut f64) -> Result<(), CommError> {
        let m = self.view.members.len();
        if m == 1 {
            return Ok(());
        }
        let n = buf.len();
        let chunk = self
            .shared
            .cfg
            .chunk_floats
            .min((self.shared.cfg.max_message_bytes / 4) as usize)
            .max(1);
        let own = *scalar;
        // Our current value of segment 0's scalar: our own, then the partial
        // sum of the ranks before us, then the total.
        let mut scalar0 = own;
        for step in 0..2 * (m - 1) {
            let reduce = step < m - 1;
            let t = if reduce { step } else { step - (m - 1) };
            let (send_seg, recv_seg, kind) = if reduce {
                (
                    (self.rank + m - t) % m,
                    (self.rank + 2 * m - t - 1) % m,
                    Kind::ReduceScatter,
                )
            } else {
                (
                    (self.rank + 1 + m - t) % m,
                    (self.rank + m - t) % m,
                    Kind::AllGather,
                )
            };
            let send_chunks = chunks(segment(n, m, send_seg), chunk);
            let recv_range = segment(n, m, recv_seg);
            let mut cursor = recv_range.start;
            let mut recv_done = false;
            let mut next_send = 0;
            while next_send < send_chunks.len() || !recv_done {
                if let Some(range) = send_chunks.get(next_send) {
                    let first = range.start == segment(n, m, send_seg).start;
                    let s = if send_seg == 0 && first { scalar0 } else { 0.0 };
                    self.send(kind, step as u32, range.clone(), n, buf, s)?;
                    next_send += 1;
                }
                if !recv_done {
                    let msg = self.recv(kind, step as u32, &recv_range, cursor, n)?;
                    let h = &msg.header;
                    let r = h.offset as usize..(h.offset + h.len) as usize;
                    if recv_seg == 0 && h.offset as usize == recv_range.start {
                        scalar0 = if reduce { h.weight + own } else { h.weight };
                    }
                    if reduce {
                        add_bytes(&mut buf[r.clone()], &msg.payload);
                    } else {
                        copy_bytes(&mut buf[r.clone()], &msg.payload);
                    }
                    cursor = r.end;
                    self.shared.pool.give(msg.payload);
                    recv_done = cursor == recv_range.end;
                }
            }
        }
        *scalar = scalar0;
        Ok(())
    }
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
    }
}
