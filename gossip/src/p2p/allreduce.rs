//! The libp2p links of the ring all-reduce ([`crate::ring`]): chunks are
//! frames of `all-reduce/1` to the right neighbour, read back from the
//! reduce inbox and checked against what the ring expects.
//!
//! Memory: a segment moves in chunks of at most `chunk_floats`; a rank holds
//! at most a few chunks in flight per neighbour (one queued for sending, one
//! being written, one being read, one waiting to be added).

use std::sync::Arc;
use std::time::Instant;

use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::links::Outgoing;
use super::payload::{add_bytes, copy_bytes, encode_for};
use super::state::{ReduceMsg, Shared, View};
use super::wire::{DType, Header, Kind, Reject, WIRE_VERSION, encode_header};
use super::{Stopped, block_on_active};
use crate::ring::{ChunkHeader, Expected, Phase, RingLinks, ring_all_reduce};
use crate::{CommError, Rank};

fn kind_of(phase: Phase) -> Kind {
    match phase {
        Phase::ReduceScatter => Kind::ReduceScatter,
        Phase::AllGather => Kind::AllGather,
    }
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
    /// Rank of the left ring neighbour, from which every chunk comes.
    pub(super) fn left(&self) -> Rank {
        let m = self.view.members.len();
        (self.rank + m - 1) % m
    }

    /// The next message in the collective inbox. Silence, not slowness, is
    /// what times out: the left neighbour's clock restarts with every frame,
    /// and with every byte of one still arriving; frames the caller rejects
    /// do not restart it (`started` stays the caller's).
    pub(super) fn next_from_left(&mut self, started: Instant) -> Result<ReduceMsg, CommError> {
        let left = self.left();
        let left_peer = self.view.members[left];
        let wait = self.shared.cfg.peer_timeout;
        let number = self.view.number;
        let inbox = &mut *self.inbox;
        let shared = self.shared;
        // A chunk of an earlier view (checked before the view changed, or
        // queued then) is dropped without blame.
        let fresh = async move {
            loop {
                match inbox.recv().await {
                    Some(msg) if msg.header.view != number => shared.pool.give(msg.payload),
                    other => return other,
                }
            }
        };
        let got = block_on_active(self.rt, self.shared, &left_peer, started, wait, fresh);
        match got {
            Ok(Some(msg)) => Ok(msg),
            Ok(None) => Err(CommError::Closed("all-reduce inbox closed".into())),
            Err(Stopped::Alarm(e)) => Err(e),
            Err(Stopped::Silent) => Err(self.peer_timeout(left)),
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

    /// The error of a rank whose left neighbour sent a frame of another
    /// kind of collective under our sequence number.
    pub(super) fn other_collective(&self, left: Rank, kind: Kind) -> CommError {
        other_collective(self.operation, self.seq, left, kind)
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
            Err(Stopped::Alarm(e)) => Err(e),
            Err(Stopped::Silent) => Err(self.peer_timeout(right)),
        }
    }

    /// Waits for the next frame from the left neighbour that is the chunk
    /// `expected`; anything else is dropped and counted.
    fn recv_chunk(&mut self, expected: &Expected) -> Result<ReduceMsg, CommError> {
        let left = self.left();
        let started = Instant::now();
        loop {
            let msg = self.next_from_left(started)?;
            let verdict = chunk_verdict(
                &msg.header,
                msg.from,
                left,
                self.seq,
                expected,
                self.operation,
            )?;
            match verdict {
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
        let chunk = self
            .shared
            .cfg
            .chunk_floats
            .min((self.shared.cfg.max_message_bytes / 4) as usize)
            .max(1);
        let (rank, m) = (self.rank, self.view.members.len());
        ring_all_reduce(self, rank, m, chunk, buf, scalar)
    }
}

/// The error of a rank whose left neighbour sent a frame of another kind of
/// collective under our sequence number.
fn other_collective(operation: &str, seq: u64, left: Rank, kind: Kind) -> CommError {
    CommError::Other(format!(
        "{operation} {seq}: the left neighbour (rank {left}) sent a {kind:?} frame: the ranks \
         called collectives in different orders"
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
/// `from`) while collective `seq` of `operation` waits for the chunk
/// `expected` from rank `left`: `Ok(None)` it is that chunk, `Ok(Some(reason))`
/// it is dropped, an error ends the collective.
pub(super) fn chunk_verdict(
    h: &Header,
    from: Rank,
    left: Rank,
    seq: u64,
    expected: &Expected,
    operation: &str,
) -> Result<Option<String>, CommError> {
    let ours = from == left && h.round == seq;
    if ours && h.kind == Kind::Gather {
        return Err(other_collective(operation, seq, left, h.kind));
    }
    if from != left {
        return Ok(Some(format!(
            "all-reduce chunk from rank {from}, expected the left neighbour {left}"
        )));
    }
    if h.round != seq {
        return Ok(Some(format!(
            "all-reduce chunk of collective {} step {} ({:?}), expected {seq} step {} ({:?})",
            h.round,
            h.step,
            h.kind,
            expected.step,
            kind_of(expected.phase)
        )));
    }
    if h.kind == Kind::PushSum {
        return Ok(Some(
            "a push-sum frame on the all-reduce protocol".to_string(),
        ));
    }
    let phase = match h.kind {
        Kind::AllGather => Phase::AllGather,
        _ => Phase::ReduceScatter,
    };
    expected.check(&chunk_of(h, phase))
}

impl RingLinks for Ring<'_> {
    type Chunk = Vec<u8>;

    fn send(&mut self, chunk: ChunkHeader, values: &[f32]) -> Result<(), CommError> {
        let lane = self.shared.lanes.get().is_some();
        let (payload, sum) = encode_for(lane, values, self.shared.pool.take(4 * values.len()));
        let header = Header {
            weight: chunk.scalar,
            offset: chunk.offset as u64,
            total: chunk.total as u64,
            ..self.header(kind_of(chunk.phase), chunk.step, values.len() as u64, sum)
        };
        self.send_frame(header, payload)
    }

    fn recv(&mut self, expected: &Expected) -> Result<(ChunkHeader, Vec<u8>), CommError> {
        let msg = self.recv_chunk(expected)?;
        Ok((chunk_of(&msg.header, expected.phase), msg.payload))
    }

    fn apply(&mut self, payload: Vec<u8>, into: &mut [f32], add: bool) {
        if add {
            add_bytes(into, &payload);
        } else {
            copy_bytes(into, &payload);
        }
        self.shared.pool.give(payload);
    }
}
