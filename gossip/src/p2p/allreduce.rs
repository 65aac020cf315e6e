//! The network links of the all-reduce schedules ([`crate::ring`]): chunks
//! are frames of `all-reduce/1` (or lane frames) to a rank, read back from
//! the reduce inbox and checked against what the schedule expects.
//!
//! On the data lane a ring's chunks go straight from the caller's buffer
//! (lent, [`super::lent`]) and the parts it waits for land there as they
//! are read ([`super::landing`]).
//!
//! Memory: a segment moves in chunks of at most `chunk_floats`; a rank holds
//! at most a few chunks in flight per link (one queued for sending, one
//! being written, one being read, one waiting to be added), and a direct
//! schedule's owner at most m - 1 early contributions of one segment.

use std::sync::Arc;
use std::time::Instant;

use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::landing::{Landing, overlaps};
use super::lent::Lender;
use super::links::{Link, Outgoing, Payload};
use super::payload::{add_bytes, copy_bytes, encode_for};
use super::state::{ReduceMsg, Shared, View};
use super::wait::{Stopped, block_on_active};
use super::wire::{DType, Header, Kind, Reject, WIRE_VERSION, encode_header};
use crate::ring::{ChunkHeader, Expected, Links, Phase, all_reduce, recv_then_apply};
use crate::{CommError, Rank};

/// Everything one collective needs.
pub(crate) struct Ring<'a> {
    pub rt: &'a Runtime,
    pub shared: &'a Arc<Shared>,
    pub view: &'a View,
    pub rank: Rank,
    /// All-reduce links by rank.
    pub links: &'a [Option<Link>],
    pub inbox: &'a mut mpsc::Receiver<ReduceMsg>,
    /// Frames of the next collective, kept for it: a rank that finished a
    /// direct schedule may start the next collective while we still wait
    /// for another rank's part of this one.
    pub early: &'a mut Vec<ReduceMsg>,
    pub seq: u64,
    pub operation: &'static str,
    /// Whether the frames go over the data lane (its payload layout).
    pub lane: bool,
    /// Chunks sent straight from the caller's buffer, until they are on
    /// their way ([`super::lent`]).
    pub lent: Vec<LentChunk>,
}

/// A chunk lent from the buffer: where (addresses) and to which rank.
pub(crate) struct LentChunk {
    at: std::ops::Range<usize>,
    to: Rank,
    lender: Lender,
}

/// The addresses of `values`.
fn span(values: &[f32]) -> std::ops::Range<usize> {
    let at = values.as_ptr() as usize;
    at..at + std::mem::size_of_val(values)
}

impl Ring<'_> {
    /// Rank of the left ring neighbour, from which every chunk comes.
    pub(super) fn left(&self) -> Rank {
        let m = self.view.members.len();
        (self.rank + m - 1) % m
    }

    /// The next message of this collective in the inbox, waiting for rank
    /// `from` (the first of those the caller waits for). Silence, not
    /// slowness, is what times out: that rank's clock restarts with every
    /// frame, and with every byte of one still arriving; frames the caller
    /// rejects do not restart it (`started` stays the caller's). Frames of
    /// the next collective are kept for it.
    pub(super) fn next_msg(
        &mut self,
        from: Rank,
        started: Instant,
    ) -> Result<ReduceMsg, CommError> {
        if let Some(i) = self.early.iter().position(|m| m.header.round == self.seq) {
            return Ok(self.early.remove(i));
        }
        let peer = self.view.members[from];
        let wait = self.shared.cfg.peer_timeout;
        let number = self.view.number;
        let next = self.seq + 1;
        // A rank one collective ahead has sent at most a few chunks to us.
        let keep = 8 * self.view.members.len() + 16;
        let inbox = &mut *self.inbox;
        let early = &mut *self.early;
        let shared = self.shared;
        // A chunk of an earlier view (checked before the view changed, or
        // queued then) is dropped without blame.
        let fresh = async move {
            loop {
                match inbox.recv().await {
                    Some(msg) if msg.header.view != number => shared.pool.give(msg.payload),
                    Some(msg) if msg.header.round == next && early.len() < keep => early.push(msg),
                    other => return other,
                }
            }
        };
        let got = block_on_active(self.rt, self.shared, &peer, started, wait, fresh);
        match got {
            Ok(Some(msg)) => Ok(msg),
            Ok(None) => Err(CommError::Closed("all-reduce inbox closed".into())),
            Err(Stopped::Alarm(e)) => Err(e),
            Err(Stopped::Silent) => Err(self.peer_timeout(from)),
        }
    }

    pub(super) fn peer_timeout(&self, rank: Rank) -> CommError {
        CommError::PeerTimeout {
            peer: self.view.members[rank].to_string(),
            rank,
            round: self.seq,
            operation: self.operation,
            timeout: self.shared.cfg.peer_timeout,
        }
    }

    /// The error of a rank to which rank `from` sent a frame of another
    /// kind of collective under our sequence number.
    pub(super) fn other_collective(&self, from: Rank, kind: Kind) -> CommError {
        other_collective(self.operation, self.seq, from, kind)
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

    /// Queues one frame for rank `to`.
    pub(super) fn send_frame(
        &self,
        to: Rank,
        header: Header,
        payload: Vec<u8>,
    ) -> Result<(), CommError> {
        self.queue(
            to,
            Outgoing {
                header: encode_header(&header),
                payload: Payload::Owned(Arc::new(payload)),
            },
        )
    }

    /// Waits until the chunks lent from the buffer where it overlaps
    /// `into` are on their way (all of them, with `None`); the loans end.
    fn settle(&mut self, into: Option<std::ops::Range<usize>>) -> Result<(), CommError> {
        let under = |c: &LentChunk| into.as_ref().is_none_or(|r| overlaps(&c.at, r));
        while let Some(i) = self.lent.iter().position(under) {
            let chunk = self.lent.swap_remove(i);
            let peer = self.view.members[chunk.to];
            let (started, wait) = (Instant::now(), self.shared.cfg.peer_timeout);
            chunk.lender.settle(crate::POLL, || {
                self.shared.check()?;
                if self.shared.activity.deadline(&peer, started, wait) <= Instant::now() {
                    return Err(self.peer_timeout(chunk.to));
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Whether every chunk lent from where `at` lies is on its way (those
    /// loans end), without waiting.
    fn settled_over(&mut self, at: std::ops::Range<usize>) -> bool {
        let over = |c: &LentChunk| overlaps(&c.at, &at);
        if self.lent.iter().any(|c| over(c) && !c.lender.settled()) {
            return false;
        }
        self.lent.retain(|c| !over(c));
        true
    }

    fn queue(&self, to: Rank, msg: Outgoing) -> Result<(), CommError> {
        let Some(Some(link)) = self.links.get(to) else {
            return Err(CommError::Misuse(format!(
                "{} {}: no all-reduce link to rank {to}",
                self.operation, self.seq
            )));
        };
        let wait = self.shared.cfg.peer_timeout;
        let peer = self.view.members[to];
        let send = link.queue.send(msg);
        match block_on_active(self.rt, self.shared, &peer, Instant::now(), wait, send) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(CommError::Closed(format!("link to rank {to} is gone"))),
            Err(Stopped::Alarm(e)) => Err(e),
            Err(Stopped::Silent) => Err(self.peer_timeout(to)),
        }
    }

    /// Waits for the next frame that is one of the chunks `expected`
    /// (returning its index there); anything else is dropped and counted.
    fn recv_chunk(&mut self, expected: &[Expected]) -> Result<(usize, ReduceMsg), CommError> {
        let first = expected.first().map_or(self.left(), |e| e.from);
        let started = Instant::now();
        loop {
            let msg = self.next_msg(first, started)?;
            let verdict = chunk_verdict(&msg.header, msg.from, self.seq, expected, self.operation)?;
            match verdict {
                Ok(i) => return Ok((i, msg)),
                // Written into the buffer already: not a part to drop.
                Err(reason) if msg.landed && msg.header.round == self.seq => {
                    return Err(CommError::Protocol(format!(
                        "{} {}: rank {} sent a part it had sent before: {reason}",
                        self.operation, self.seq, msg.from
                    )));
                }
                Err(reason) => {
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

    /// Sums `buf` and `scalar` over the ranks ([`crate::ring::Schedule`]).
    /// On the lane, chunks go straight from `buf` (lent until they are on
    /// their way; a loan still open when this returns, by an error, is
    /// revoked as the ring is dropped).
    pub fn run(
        &mut self,
        buf: &mut [f32],
        scalar: &mut f64,
        scale: Option<f32>,
    ) -> Result<(), CommError> {
        let chunk = self.shared.cfg.message_floats();
        let (rank, m) = (self.rank, self.view.members.len());
        let schedule = self.shared.cfg.schedule(buf.len(), m);
        // Parts stop landing in `buf` when this returns, by error too.
        let _close = CloseOnDrop(&self.shared.landing);
        all_reduce(self, schedule, rank, m, chunk, buf, scalar, scale)?;
        self.settle(None)
    }

    /// Whether parts may land in the buffer as they arrive.
    fn lands(&self) -> bool {
        self.lane && cfg!(target_endian = "little")
    }
}

/// Closes the landing zone when dropped.
struct CloseOnDrop<'a>(&'a Landing);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The error of a rank to which rank `from` sent a frame of another kind of
/// collective under our sequence number.
fn other_collective(operation: &str, seq: u64, from: Rank, kind: Kind) -> CommError {
    CommError::Protocol(format!(
        "{operation} {seq}: rank {from} sent a {kind:?} frame: the ranks called collectives in \
         different orders"
    ))
}

/// What the ring reads from a chunk's header (values beyond `usize` become
/// `usize::MAX`, which no check lets through).
pub(super) fn chunk_of(h: &Header, phase: Phase) -> ChunkHeader {
    ChunkHeader {
        phase,
        step: h.step,
        offset: usize::try_from(h.offset).unwrap_or(usize::MAX),
        len: usize::try_from(h.len).unwrap_or(usize::MAX),
        total: usize::try_from(h.total).unwrap_or(usize::MAX),
        scalar: h.weight,
    }
}

/// What becomes of a checked frame of the collective inbox (sent by rank
/// `from`) while collective `seq` of `operation` waits for one of the chunks
/// `expected`: `Ok(Ok(i))` it is `expected[i]`, `Ok(Err(reason))` it is
/// dropped, an error ends the collective.
pub(super) fn chunk_verdict(
    h: &Header,
    from: Rank,
    seq: u64,
    expected: &[Expected],
    operation: &str,
) -> Result<Result<usize, String>, CommError> {
    let ours = expected.iter().any(|e| e.from == from) && h.round == seq;
    if ours && matches!(h.kind, Kind::Gather | Kind::Exchange) {
        return Err(other_collective(operation, seq, from, h.kind));
    }
    let phase = match h.kind {
        Kind::AllGather => Phase::AllGather,
        _ => Phase::ReduceScatter,
    };
    // The sender's expectation of the frame's phase, else its other one.
    let by_phase = expected
        .iter()
        .position(|e| e.from == from && e.phase == phase);
    let Some(i) = by_phase.or_else(|| expected.iter().position(|e| e.from == from)) else {
        let senders: Vec<String> = expected.iter().map(|e| e.from.to_string()).collect();
        return Ok(Err(format!(
            "all-reduce chunk from rank {from}, expected one from rank {}",
            senders.join(" or ")
        )));
    };
    let e = &expected[i];
    if h.round != seq {
        return Ok(Err(format!(
            "all-reduce chunk of collective {} step {} ({:?}), expected {seq} step {} ({:?})",
            h.round,
            h.step,
            h.kind,
            e.step,
            Kind::of_phase(e.phase)
        )));
    }
    if h.kind == Kind::PushSum {
        return Ok(Err(
            "a push-sum frame on the all-reduce protocol".to_string()
        ));
    }
    Ok(match e.check(&chunk_of(h, phase))? {
        None => Ok(i),
        Some(reason) => Err(reason),
    })
}

impl Links for Ring<'_> {
    type Chunk = Vec<u8>;

    fn send(&mut self, to: Rank, chunk: ChunkHeader, values: &[f32]) -> Result<(), CommError> {
        if self.lane && cfg!(target_endian = "little") {
            // Straight from the buffer: the ring writes this place again
            // only through `apply`, which waits for the loan to end.
            let header = Header {
                weight: chunk.scalar,
                offset: chunk.offset as u64,
                total: chunk.total as u64,
                ..self.header(
                    Kind::of_phase(chunk.phase),
                    chunk.step,
                    values.len() as u64,
                    0,
                )
            };
            // SAFETY: `values` is the caller's buffer, alive for the ring;
            // `apply` settles this loan before writing where it lies, and
            // `run` before returning (dropping the ring revokes it).
            let (lender, share) = unsafe { Lender::lend(values) };
            self.lent.push(LentChunk {
                at: span(values),
                to,
                lender,
            });
            return self.queue(
                to,
                Outgoing {
                    header: encode_header(&header),
                    payload: Payload::Lent(share),
                },
            );
        }
        let (payload, sum) = encode_for(self.lane, values, self.shared.pool.take(4 * values.len()));
        let header = Header {
            weight: chunk.scalar,
            offset: chunk.offset as u64,
            total: chunk.total as u64,
            ..self.header(
                Kind::of_phase(chunk.phase),
                chunk.step,
                values.len() as u64,
                sum,
            )
        };
        self.send_frame(to, header, payload)
    }

    fn recv(&mut self, expected: &[Expected]) -> Result<(usize, ChunkHeader, Vec<u8>), CommError> {
        let (i, msg) = self.recv_chunk(expected)?;
        if msg.landed {
            // Only `recv_into` opens a zone for parts to land in.
            return Err(CommError::Protocol(format!(
                "{} {}: a part from rank {} landed where no chunk was awaited",
                self.operation, self.seq, msg.from
            )));
        }
        Ok((i, chunk_of(&msg.header, expected[i].phase), msg.payload))
    }

    fn recv_into(
        &mut self,
        expected: &Expected,
        add: bool,
        next: Option<(&Expected, bool)>,
        buf: &mut [f32],
    ) -> Result<ChunkHeader, CommError> {
        if !self.lands() {
            return recv_then_apply(self, expected, add, buf);
        }
        // Nothing sent from where parts land may still be on its way: the
        // current step's rest is settled, the next step's is opened only
        // if nothing sent from there is still lent (it is, from long ago,
        // in the first all-gather step; a ring of two sends it right now).
        let rest = expected.cursor..expected.segment.end;
        self.settle(Some(span(&buf[rest])))?;
        let next = next.filter(|(e, _)| self.settled_over(span(&buf[e.segment.clone()])));
        let windows: Vec<(&Expected, bool)> =
            std::iter::once((expected, add)).chain(next).collect();
        // SAFETY: `buf` is the ring's buffer, alive until `run` returns,
        // which closes the zone first; the ring reads only parts it already
        // received (below the cursor) and adds a part that came the old way
        // only where no reader claimed (`reserve` below); the windows'
        // ranges are lent to no writer (settled or checked above).
        unsafe {
            self.shared
                .landing
                .expect(self.view.number, self.seq, buf, &windows)
        };
        let (_, msg) = self.recv_chunk(std::slice::from_ref(expected))?;
        let h = chunk_of(&msg.header, expected.phase);
        if msg.landed {
            return Ok(h);
        }
        let at = h.offset..h.offset + h.len;
        if !self.shared.landing.reserve(&at) {
            self.shared.pool.give(msg.payload);
            return Err(CommError::Protocol(format!(
                "{} {}: rank {} sent the part at {}..{} twice",
                self.operation, self.seq, msg.from, at.start, at.end
            )));
        }
        self.apply(msg.payload, &mut buf[at], add)?;
        Ok(h)
    }

    fn apply(&mut self, payload: Vec<u8>, into: &mut [f32], add: bool) -> Result<(), CommError> {
        self.settle(Some(span(into)))?;
        if add {
            add_bytes(into, &payload);
        } else {
            copy_bytes(into, &payload);
        }
        self.shared.pool.give(payload);
        Ok(())
    }
}
