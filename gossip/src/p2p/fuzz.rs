//! Fuzzing every decoder of peer input: frame headers, push-sum shares,
//! all-reduce chunks, gather blocks, membership hellos and replies, and the
//! admission knock and door before them ([`super::fuzz_knock`]).
//!
//! Each target takes arbitrary bytes (what one peer could write on one
//! stream) and runs them through the code a node runs on them, against a
//! fixed run of four members in which we are rank 1. A bad input must come
//! out as an error in the [`Outcome`]; a panic is a bug. The seeded
//! [`generate`] makes inputs worth trying: valid streams (which must be
//! taken whole), the same with fields set to hostile values (huge lengths and
//! offsets, NaN weights and payloads, wrong senders, views, kinds), byte-level
//! mutations (bit flips, truncations, huge length prefixes, splices) and
//! plain random bytes.
//!
//! Used by the `cargo fuzz` targets in `gossip/fuzz`, by the
//! `fuzz_decoders` test (a bounded number of cases in CI) and by the
//! `fuzz_decoders` example (millions of cases). Not a stable API.

use std::sync::OnceLock;

use futures::executor::block_on;
use futures::io::Cursor;
use libp2p::PeerId;
use libp2p::identity::Keypair;

use super::allreduce::{chunk_of, chunk_verdict};
use super::config::{P2pConfig, RunIdentity};
use super::gather::{BlockVerdict, block_verdict, bytes_to_u64, u64_to_bytes};
use super::inbound::check_header;
use super::membership::{Hello, MemberInfo, Refusal, Reply, ViewInfo, read_msg, write_msg};
use super::payload::{LeBytes, add_bytes, copy_bytes};
use super::state::View;
use super::wire::{
    ALL_REDUCE_PROTOCOL, DType, Header, Kind, MAX_HEADER_BYTES, PUSH_SUM_PROTOCOL, ReadError,
    Reject, WIRE_VERSION, check_payload, checksum, encode_header, f32_to_bytes, read_header,
    read_payload,
};
use crate::collectives::{ReduceOp, reduce_u64, sum_f64_in_rank_order};
use crate::ledger::Inbox;
use crate::ring::{ChunkHeader, Expected, Links, chunks, direct_all_reduce, ring_all_reduce};
use crate::{CommError, Rank, segment};

/// The targets, by name.
pub const TARGETS: &[&str] = &[
    "header", "share", "chunk", "direct", "gather", "hello", "reply", "knock", "door", "lane",
];

/// Members of the fuzzed run; we are rank [`OUR_RANK`], our left neighbour
/// rank 0.
const MEMBERS: usize = 4;
const OUR_RANK: Rank = 1;
const LEFT: Rank = 0;
/// Floats of a push-sum share.
const FLOATS: usize = 16;
/// Floats of the all-reduce buffer, and per chunk.
const TOTAL: usize = 23;
const CHUNK: usize = 4;
/// Payload cap in bytes.
const CAP: u64 = 256;
/// Round window (and per-sender buffer) of the push-sum inbox.
const WINDOW: u64 = 4;
const VIEW: u64 = 3;
/// Sequence number of the collective being received.
const SEQ: u64 = 7;
/// Words each rank contributes to the gather.
const WORDS: usize = 3;
/// Frames read from one input at most.
const MAX_FRAMES: usize = 64;

/// What a target made of one input.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    /// Messages taken (frames delivered, chunks applied, hellos accepted).
    pub accepted: usize,
    /// Messages dropped without ending the stream.
    pub dropped: usize,
    /// Why the input was refused or the stream ended early, if it was.
    pub error: Option<String>,
}

struct Ctx {
    cfg: P2pConfig,
    view: View,
    /// Peer ids of the members by rank, then an outsider.
    peers: Vec<PeerId>,
    names: Vec<String>,
}

fn ctx() -> &'static Ctx {
    static CTX: OnceLock<Ctx> = OnceLock::new();
    CTX.get_or_init(|| {
        let mut members: Vec<PeerId> = (1..=MEMBERS as u8)
            .map(|i| {
                Keypair::ed25519_from_bytes([i; 32])
                    .expect("32 bytes are an ed25519 secret key")
                    .public()
                    .to_peer_id()
            })
            .collect();
        let view = View::new(VIEW, members.clone());
        members.clone_from(&view.members);
        let outsider = Keypair::ed25519_from_bytes([99; 32])
            .expect("32 bytes are an ed25519 secret key")
            .public()
            .to_peer_id();
        members.push(outsider);
        let run = RunIdentity {
            run_id: "fuzz-run".into(),
            config_hash: "c0ffee".into(),
            init_hash: "f00d".into(),
        };
        let mut cfg = P2pConfig::new(run, MEMBERS, FLOATS);
        cfg.max_message_bytes = CAP;
        cfg.round_window = WINDOW;
        cfg.chunk_floats = CHUNK;
        Ctx {
            cfg,
            view,
            names: members.iter().map(|p| p.to_string()).collect(),
            peers: members,
        }
    })
}

/// Runs target `name` on `data`. Panics on an unknown name, and wherever a
/// decoder has a bug.
pub fn run(name: &str, data: &[u8]) -> Outcome {
    match name {
        "header" => header(data),
        "share" => share(data),
        "chunk" => chunk(data),
        "direct" => direct(data),
        "gather" => gather(data),
        "hello" => hello(data),
        "reply" => reply(data),
        "knock" => knock(data),
        "door" => door(data),
        "lane" => lane(data),
        _ => panic!("no fuzz target `{name}` (targets: {})", TARGETS.join(", ")),
    }
}

fn refused(accepted: usize, dropped: usize, e: impl ToString) -> Outcome {
    Outcome {
        accepted,
        dropped,
        error: Some(e.to_string()),
    }
}

fn read_error(e: ReadError) -> String {
    match e {
        ReadError::Eof => "end of stream".into(),
        ReadError::Io(e) => format!("stream broke: {e}"),
        ReadError::Rejected(r) => r.to_string(),
        ReadError::Stale { view, ours } => format!("frame of view {view} after our view {ours}"),
    }
}

/// The authenticated peer of a stream: the first byte picks a member by rank
/// or (4) the outsider.
fn peer_of(data: &[u8]) -> (PeerId, &[u8]) {
    let ctx = ctx();
    match data.split_first() {
        Some((b, rest)) => (ctx.peers[*b as usize % ctx.peers.len()], rest),
        None => (ctx.peers[LEFT], data),
    }
}

/// A frame header as the node reads it; a decoded header must survive
/// encoding and decoding unchanged.
pub fn header(data: &[u8]) -> Outcome {
    let mut r = Cursor::new(data);
    match block_on(read_header(&mut r)) {
        Ok((h, size)) => {
            let len = u32::from_le_bytes(data[..4].try_into().expect("a prefix was read"));
            assert_eq!(size, 4 + len as u64, "header size on the wire");
            let again = encode_header(&h);
            let (h2, size2) =
                block_on(read_header(&mut Cursor::new(&again))).expect("an encoded header decodes");
            assert_eq!(size2 as usize, again.len());
            assert_eq!(encode_header(&h2), again, "header round trip");
            Outcome {
                accepted: 1,
                ..Outcome::default()
            }
        }
        Err(e) => refused(0, 0, read_error(e)),
    }
}

/// Reads one frame the way an inbound stream does: header, header checks,
/// `admit` (before any payload byte), payload, payload checks.
fn next_frame(
    r: &mut Cursor<&[u8]>,
    peer: &PeerId,
    protocol: &'static str,
    admit: &mut dyn FnMut(&Header, Rank) -> Result<(), Reject>,
) -> Result<(Header, Rank, Vec<u8>), ReadError> {
    let ctx = ctx();
    let (h, _) = block_on(read_header(r))?;
    let from =
        check_header(&ctx.cfg, &ctx.view, peer, &h, protocol).map_err(ReadError::Rejected)?;
    admit(&h, from).map_err(ReadError::Rejected)?;
    let bytes = h.dtype.size() * h.len;
    assert!(bytes <= CAP, "check_header let {bytes} bytes through");
    let (payload, scan) = block_on(read_payload(r, bytes, Vec::new(), &mut || {}))?;
    assert_eq!(payload.len() as u64, bytes, "payload length");
    check_payload(&h, &payload, &scan).map_err(ReadError::Rejected)?;
    Ok((h, from, payload))
}

/// A push-sum stream: frames through the header checks into the inbox.
pub fn share(data: &[u8]) -> Outcome {
    let (peer, stream) = peer_of(data);
    let inbox: Inbox<LeBytes> = Inbox::new(WINDOW);
    let mut r = Cursor::new(stream);
    let mut accepted = 0;
    for _ in 0..MAX_FRAMES {
        let mut admit = |h: &Header, from: Rank| inbox.admit(h.round, from).map_err(Reject::from);
        match next_frame(&mut r, &peer, PUSH_SUM_PROTOCOL, &mut admit) {
            Ok((h, from, payload)) => {
                assert_eq!(payload.len(), 4 * FLOATS, "share shape");
                assert!(h.weight.is_finite(), "share weight {}", h.weight);
                if let Err(e) = inbox.deliver(h.round, from, h.weight, LeBytes::whole(payload)) {
                    return refused(accepted, 0, e);
                }
                accepted += 1;
            }
            Err(ReadError::Eof) => break,
            Err(e) => return refused(accepted, 0, read_error(e)),
        }
    }
    Outcome {
        accepted,
        ..Outcome::default()
    }
}

/// Our side of an all-reduce whose chunks come from the input; what we send
/// goes nowhere. The frames come from `peer`, or with `per_frame`, each
/// from the peer its selector byte names (a member by rank, the outsider).
struct FuzzLinks<'a> {
    r: Cursor<&'a [u8]>,
    peer: PeerId,
    per_frame: bool,
    accepted: usize,
    dropped: usize,
}

impl Links for FuzzLinks<'_> {
    type Chunk = Vec<u8>;

    fn send(&mut self, _: Rank, _: ChunkHeader, _: &[f32]) -> Result<(), CommError> {
        Ok(())
    }

    fn recv(&mut self, expected: &[Expected]) -> Result<(usize, ChunkHeader, Vec<u8>), CommError> {
        for _ in 0..MAX_FRAMES {
            if self.per_frame {
                let mut b = [0u8; 1];
                block_on(futures::AsyncReadExt::read_exact(&mut self.r, &mut b))
                    .map_err(|_| CommError::Other(read_error(ReadError::Eof)))?;
                let peers = &ctx().peers;
                self.peer = peers[b[0] as usize % peers.len()];
            }
            let got = next_frame(&mut self.r, &self.peer, ALL_REDUCE_PROTOCOL, &mut |_, _| {
                Ok(())
            });
            let (h, from, payload) = got.map_err(|e| CommError::Other(read_error(e)))?;
            match chunk_verdict(&h, from, SEQ, expected, "all-reduce")? {
                Ok(i) => {
                    self.accepted += 1;
                    return Ok((i, chunk_of(&h, expected[i].phase), payload));
                }
                Err(_) => self.dropped += 1,
            }
        }
        Err(CommError::Other("too many frames".into()))
    }

    fn apply(&mut self, payload: Vec<u8>, into: &mut [f32], add: bool) {
        assert_eq!(payload.len(), 4 * into.len(), "chunk length");
        if add {
            add_bytes(into, &payload);
        } else {
            copy_bytes(into, &payload);
        }
    }
}

/// All-reduce chunks from the left neighbour through the header checks, the
/// ring's chunk check and into the buffer.
pub fn chunk(data: &[u8]) -> Outcome {
    let (peer, stream) = peer_of(data);
    let mut links = FuzzLinks {
        r: Cursor::new(stream),
        peer,
        per_frame: false,
        accepted: 0,
        dropped: 0,
    };
    let mut buf = vec![1.0f32; TOTAL];
    let mut scalar = 1.0;
    let chunk = ctx().cfg.message_floats();
    let result = ring_all_reduce(&mut links, OUR_RANK, MEMBERS, chunk, &mut buf, &mut scalar);
    Outcome {
        accepted: links.accepted,
        dropped: links.dropped,
        error: result.err().map(|e| e.to_string()),
    }
}

/// A direct all-reduce: every other member's contribution to our segment and
/// its sum of its own segment, interleaved, in parts, each frame behind a
/// byte naming its sender; through the header checks, the chunk check, the
/// adds in ring order and the copies into place.
pub fn direct(data: &[u8]) -> Outcome {
    let mut links = FuzzLinks {
        r: Cursor::new(data),
        peer: ctx().peers[LEFT],
        per_frame: true,
        accepted: 0,
        dropped: 0,
    };
    let mut buf = vec![1.0f32; TOTAL];
    let mut scalar = 1.0;
    let result = direct_all_reduce(&mut links, OUR_RANK, MEMBERS, &mut buf, &mut scalar);
    Outcome {
        accepted: links.accepted,
        dropped: links.dropped,
        error: result.err().map(|e| e.to_string()),
    }
}

/// Gather blocks from the left neighbour through the header checks, the
/// block check, decoding and the typed reductions.
pub fn gather(data: &[u8]) -> Outcome {
    let (peer, stream) = peer_of(data);
    let mut r = Cursor::new(stream);
    let own: Vec<u64> = (1..=WORDS as u64).collect();
    let mut blocks: Vec<Vec<u64>> = vec![Vec::new(); MEMBERS];
    blocks[OUR_RANK] = own;
    let (mut accepted, mut dropped) = (0, 0);
    let m = MEMBERS;
    for step in 0..m - 1 {
        let origin = (OUR_RANK + 2 * m - step - 1) % m;
        loop {
            if accepted + dropped >= MAX_FRAMES {
                return refused(accepted, dropped, "too many frames");
            }
            let (h, from, payload) =
                match next_frame(&mut r, &peer, ALL_REDUCE_PROTOCOL, &mut |_, _| Ok(())) {
                    Ok(f) => f,
                    Err(e) => return refused(accepted, dropped, read_error(e)),
                };
            match block_verdict(&h, from, LEFT, SEQ, step as u32, origin) {
                BlockVerdict::Take => {
                    assert_eq!(payload.len() as u64, 8 * h.len, "block length");
                    blocks[origin] = bytes_to_u64(&payload);
                    accepted += 1;
                    break;
                }
                BlockVerdict::Drop(_) => dropped += 1,
                BlockVerdict::OtherCollective(kind) => {
                    return refused(accepted, dropped, format!("{kind:?} frame"));
                }
            }
        }
    }
    let mut words = vec![0u64; WORDS];
    let mut floats = vec![0f64; WORDS];
    let error = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min]
        .into_iter()
        .map(|op| reduce_u64(&blocks, &mut words, op))
        .chain(std::iter::once(sum_f64_in_rank_order(&blocks, &mut floats)))
        .find_map(Result::err)
        .map(|e| e.to_string());
    Outcome {
        accepted,
        dropped,
        error,
    }
}

/// What a node takes from a hello before it uses it: who sent it, whether
/// it is of our run, and the addresses, members, proposal and view in it.
fn check_hello(peer: &PeerId, h: &Hello) -> Result<(), String> {
    let ctx = ctx();
    if h.peer != peer.to_string() {
        return Err(format!("hello claims to be {}", h.peer));
    }
    if h.version != WIRE_VERSION {
        return Err(format!("protocol version {}", h.version));
    }
    if let Some((field, ours, theirs)) = ctx.cfg.run.first_difference(&h.identity) {
        return Err(format!("{field} differs: ours {ours} theirs {theirs}"));
    }
    if h.nodes != ctx.cfg.nodes as u64 {
        return Err(format!("node count {}", h.nodes));
    }
    super::behaviour::parse_addrs("hello", &h.addrs).map_err(|e| e.to_string())?;
    for m in &h.members {
        m.peer
            .parse::<PeerId>()
            .map_err(|e| format!("member `{}`: {e}", m.peer))?;
        let _: Vec<libp2p::Multiaddr> = m.addrs.iter().filter_map(|a| a.parse().ok()).collect();
    }
    let peers = |names: &[String]| -> Result<Vec<PeerId>, String> {
        names
            .iter()
            .map(|n| n.parse::<PeerId>().map_err(|e| format!("`{n}`: {e}")))
            .collect()
    };
    if let Some(p) = &h.proposal {
        peers(p)?;
    }
    if let Some(v) = &h.view {
        let view = View::new(v.number, peers(&v.members)?);
        assert!(view.members.len() <= v.members.len());
    }
    Ok(())
}

/// A membership hello, as the answering side reads it.
pub fn hello(data: &[u8]) -> Outcome {
    let (peer, stream) = peer_of(data);
    match block_on(read_msg::<Hello, _>(&mut Cursor::new(stream))) {
        Ok(h) => match check_hello(&peer, &h) {
            Ok(()) => Outcome {
                accepted: 1,
                ..Outcome::default()
            },
            Err(e) => refused(0, 0, e),
        },
        Err(e) => refused(0, 0, e),
    }
}

/// A membership reply, as the greeting side reads it.
pub fn reply(data: &[u8]) -> Outcome {
    let (peer, stream) = peer_of(data);
    match block_on(read_msg::<Reply, _>(&mut Cursor::new(stream))) {
        Ok(Reply::Welcome(h)) => match check_hello(&peer, &h) {
            Ok(()) => Outcome {
                accepted: 1,
                ..Outcome::default()
            },
            Err(e) => refused(0, 0, e),
        },
        Ok(Reply::Refused(r)) => {
            let _text = format!(
                "peer {peer} refused us: {} differs in the settings {}",
                r.field,
                r.settings.join(", ")
            );
            Outcome {
                accepted: 1,
                ..Outcome::default()
            }
        }
        Err(e) => refused(0, 0, e),
    }
}

/// The first message of a membership exchange, as the answering side reads
/// and checks it.
pub fn knock(data: &[u8]) -> Outcome {
    let (peer, rest) = peer_of(data);
    super::fuzz_knock::knock(peer, &ctx().peers[..MEMBERS], rest)
}

/// The answer to a knock, as the knocking side reads and checks it.
pub fn door(data: &[u8]) -> Outcome {
    let (peer, rest) = peer_of(data);
    super::fuzz_knock::door(peer, &ctx().peers[..MEMBERS], rest)
}

/// What one data-lane connection of a member carries, after the set-up:
/// binary frame headers and payloads (the records as opened, so the cipher
/// is not in the way), through the header decoding, the checks of
/// [`super::lane::conn`], the finiteness scan, share assembly into the
/// push-sum inbox and the ordering of all-reduce parts.
pub fn lane(data: &[u8]) -> Outcome {
    use super::lane::conn::{check_frame, check_session_view};
    use super::lane::frame::{FrameHeader, FrameKind, HEADER};
    use super::lane::{ReduceOrder, ShareAssembly};
    use super::payload::first_non_finite;
    use super::state::ReduceMsg;

    let ctx = ctx();
    let (peer, stream) = peer_of(data);
    let inbox: Inbox<LeBytes> = Inbox::new(WINDOW);
    // The inbox of a node that has installed our view.
    let _ = inbox.reset(VIEW);
    let shares = ShareAssembly::default();
    let mut order = ReduceOrder::default();
    let (mut at, mut accepted) = (0usize, 0usize);
    for _ in 0..MAX_FRAMES {
        if at == stream.len() {
            break;
        }
        let Some(raw) = stream.get(at..at + HEADER) else {
            return refused(accepted, 0, "the connection ended inside a header");
        };
        at += HEADER;
        let h = match FrameHeader::decode(raw.try_into().expect("HEADER bytes")) {
            Ok(h) => h,
            Err(e) => return refused(accepted, 0, e),
        };
        let kind = match h.kind {
            FrameKind::End => break,
            FrameKind::Probe => {
                // Benchmark bytes, read and dropped.
                let left = (stream.len() - at) as u64;
                if h.len > left {
                    return refused(accepted, 0, "the connection ended inside a probe");
                }
                at += h.len as usize;
                continue;
            }
            FrameKind::Tensor(kind) => kind,
        };
        if let Err(e) = check_session_view(VIEW, &h) {
            return refused(accepted, 0, e);
        }
        let (frame, from) = match check_frame(&ctx.cfg, &ctx.view, &peer, &h, kind) {
            Ok(x) => x,
            Err(e) => return refused(accepted, 0, e),
        };
        let push = kind == Kind::PushSum;
        if push && let Err(e) = inbox.admit_in(VIEW, h.round, from) {
            return refused(accepted, 0, e);
        }
        // check_frame capped the size.
        let bytes = h.payload_bytes();
        assert!(bytes <= CAP, "a payload of {bytes} bytes passed the checks");
        let Some(payload) = stream.get(at..at + bytes as usize) else {
            return refused(accepted, 0, "the connection ended inside a payload");
        };
        at += bytes as usize;
        if DType::of(kind) == DType::F32
            && let Some((i, v)) = first_non_finite(payload)
        {
            return refused(accepted, 0, format!("element {i} is {v}"));
        }
        if push {
            let mut deliver = |round, weight, share| {
                inbox
                    .deliver_in(VIEW, round, from, weight, share)
                    .map(|()| accepted += 1)
                    .map_err(|e| e.to_string())
            };
            if let Err(e) = shares.add_part(&h, payload.to_vec(), &mut deliver) {
                return refused(accepted, 0, e);
            }
        } else {
            let msg = ReduceMsg {
                from,
                header: frame,
                payload: payload.to_vec(),
            };
            match order.file(h.sequence, msg) {
                Ok(ready) => accepted += ready.len(),
                Err(e) => return refused(accepted, 0, e),
            }
        }
    }
    Outcome {
        accepted,
        ..Outcome::default()
    }
}

/// One member's lane connection to us: shares in one to three parts and
/// all-reduce parts, interleaved, each part in its sender's sequence, the
/// parts of a message in any order; then the end frame.
fn gen_lane(rng: &mut Rng, hostile: bool) -> (Vec<u8>, usize) {
    use super::lane::frame::{FrameHeader, FrameKind};
    let sender = rng.below(MEMBERS);
    let mut frames: Vec<(FrameHeader, Vec<u8>)> = Vec::new();
    let mut messages = 0;
    let round0 = rng.below(100) as u64;
    let (mut share_seq, mut reduce_seq) = (0u64, 0u64);
    for _ in 0..1 + rng.below(5) {
        if rng.chance(50) && share_seq < WINDOW {
            let parts = 1 + rng.below(3);
            let weight = rng.unit() as f64;
            let mut these = Vec::new();
            for part in 0..parts {
                let start = FLOATS * part / parts;
                let end = FLOATS * (part + 1) / parts;
                let values: Vec<f32> = (start..end).map(|_| rng.unit()).collect();
                let h = FrameHeader {
                    part: part as u16,
                    parts: parts as u16,
                    sequence: share_seq,
                    view: VIEW,
                    round: round0 + share_seq,
                    offset: start as u64,
                    len: (end - start) as u64,
                    total: FLOATS as u64,
                    weight,
                    ..FrameHeader::of(FrameKind::Tensor(Kind::PushSum))
                };
                these.push((h, f32_to_bytes(&values)));
            }
            if rng.chance(50) {
                these.reverse();
            }
            frames.extend(these);
            share_seq += 1;
        } else {
            let offset = rng.below(TOTAL);
            let len = 1 + rng.below(TOTAL - offset);
            let values: Vec<f32> = (0..len).map(|_| rng.unit()).collect();
            let kind = rng.pick(&[Kind::ReduceScatter, Kind::AllGather]);
            let h = FrameHeader {
                sequence: reduce_seq,
                view: VIEW,
                round: SEQ,
                step: rng.below(6) as u32,
                offset: offset as u64,
                len: len as u64,
                total: TOTAL as u64,
                weight: rng.unit() as f64,
                ..FrameHeader::of(FrameKind::Tensor(kind))
            };
            frames.push((h, f32_to_bytes(&values)));
            reduce_seq += 1;
        }
        messages += 1;
    }
    if rng.chance(20) {
        let h = FrameHeader {
            len: rng.below(64) as u64,
            ..FrameHeader::of(FrameKind::Probe)
        };
        let at = rng.below(frames.len() + 1);
        frames.insert(at, (h, vec![0x5a; rng.below(64)]));
        let len = frames[at].1.len() as u64;
        frames[at].0.len = len;
    }
    if hostile && !frames.is_empty() {
        let i = rng.below(frames.len());
        let (h, payload) = &mut frames[i];
        match rng.below(12) {
            0 => h.view = rng.wild(),
            1 => h.len = rng.wild(),
            2 => h.offset = rng.wild(),
            3 => h.total = rng.wild(),
            4 => h.weight = rng.pick(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY]),
            5 => h.sequence = rng.wild(),
            6 => h.round = rng.wild(),
            7 => {
                h.parts = rng.wild() as u16;
                h.part = rng.wild() as u16;
            }
            8 => {
                h.kind = FrameKind::Tensor(rng.pick(&[
                    Kind::PushSum,
                    Kind::ReduceScatter,
                    Kind::AllGather,
                    Kind::Gather,
                ]))
            }
            9 if payload.len() >= 4 => {
                let j = rng.below(payload.len() / 4);
                let bad: f32 = rng.pick(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
                payload[4 * j..4 * j + 4].copy_from_slice(&bad.to_le_bytes());
            }
            10 => {
                let copy = frames[i].clone();
                frames.insert(i, copy);
            }
            _ => h.step = rng.wild() as u32,
        }
    }
    let mut bytes = vec![sender as u8];
    for (h, payload) in &frames {
        bytes.extend_from_slice(&h.encode());
        bytes.extend_from_slice(payload);
    }
    if rng.chance(70) {
        bytes.extend_from_slice(&FrameHeader::of(FrameKind::End).encode());
    }
    (bytes, messages)
}

/// A small seeded generator (xorshift64*), the same on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }

    /// A value in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.below(1 << 20) as f32 / (1 << 19) as f32) - 1.0
    }

    /// Hostile or ordinary `u64`s: edges, small numbers, anything.
    fn wild(&mut self) -> u64 {
        match self.below(6) {
            0 => self.pick(&[0, 1, u64::MAX, u64::MAX - 1, 1 << 32, 1 << 63]),
            1 => self.pick(&[CAP / 4 + 1, CAP, TOTAL as u64, FLOATS as u64 + 1]),
            2 | 3 => self.below(64) as u64,
            _ => self.next_u64(),
        }
    }
}

/// One generated input, and what a target must make of it when `valid`:
/// that many messages taken and no error.
#[derive(Debug, Clone)]
pub struct Case {
    pub bytes: Vec<u8>,
    pub valid: Option<usize>,
}

/// An input for target `name`.
pub fn generate(name: &str, rng: &mut Rng) -> Case {
    if rng.chance(3) {
        let most = if rng.chance(50) { 16 } else { 600 };
        let n = rng.below(most);
        let bytes = (0..n).map(|_| rng.next_u64() as u8).collect();
        return Case { bytes, valid: None };
    }
    // A quarter of the inputs stay as built; a semantic mutation at build
    // time makes the input no longer valid.
    let hostile = rng.chance(40);
    let (mut bytes, count) = match name {
        "header" => gen_header(rng, hostile),
        "share" => gen_shares(rng, hostile),
        "chunk" => gen_chunks(rng, hostile),
        "direct" => gen_direct(rng, hostile),
        "gather" => gen_blocks(rng, hostile),
        "lane" => gen_lane(rng, hostile),
        "hello" => gen_hello(rng, hostile, false),
        "reply" => gen_hello(rng, hostile, true),
        "knock" | "door" => {
            let ctx = ctx();
            let members = &ctx.peers[..MEMBERS];
            super::fuzz_knock::generate(rng, members, ctx.peers[MEMBERS], hostile, name == "door")
        }
        _ => panic!("no fuzz target `{name}` (targets: {})", TARGETS.join(", ")),
    };
    let mut valid = (!hostile).then_some(count);
    if rng.chance(60) {
        for _ in 0..1 + rng.below(3) {
            mutate(rng, &mut bytes);
        }
        valid = None;
    }
    Case { bytes, valid }
}

/// Byte-level mutations: bit flips, edge bytes, truncation, insertion,
/// duplication, and huge or off-by-one length prefixes.
fn mutate(rng: &mut Rng, b: &mut Vec<u8>) {
    if b.is_empty() {
        b.push(rng.next_u64() as u8);
        return;
    }
    let at = rng.below(b.len());
    match rng.below(8) {
        0 => b[at] ^= 1 << rng.below(8),
        1 => b[at] = rng.pick(&[0, 1, 0x7f, 0x80, 0xff, 0xf9, 0xfa, 0xfb, 0x9f, 0xbf]),
        2 => b.truncate(at),
        3 => {
            let extra: Vec<u8> = (0..1 + rng.below(8))
                .map(|_| rng.next_u64() as u8)
                .collect();
            b.splice(at..at, extra);
        }
        4 => {
            let end = (at + 1 + rng.below(64)).min(b.len());
            let piece = b[at..end].to_vec();
            let to = rng.below(b.len());
            b.splice(to..to, piece);
        }
        5 | 6 => {
            let v: u32 = rng.pick(&[
                u32::MAX,
                0x7fff_ffff,
                MAX_HEADER_BYTES + 1,
                MAX_HEADER_BYTES,
                0,
                1,
                1 << 20,
                (1 << 20) + 1,
            ]);
            let at = if rng.chance(50) {
                1.min(b.len() - 1)
            } else {
                at
            };
            let end = (at + 4).min(b.len());
            b[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
        }
        _ => {
            let x = rng.next_u64().to_le_bytes();
            let end = (at + 8).min(b.len());
            b[at..end].copy_from_slice(&x[..end - at]);
        }
    }
}

fn base_header(kind: Kind, sender: &str, len: usize, payload: &[u8]) -> Header {
    Header {
        version: WIRE_VERSION,
        run_id: ctx().cfg.run.run_id.clone(),
        view: VIEW,
        sender: sender.to_string(),
        round: 0,
        kind,
        dtype: DType::of(kind),
        len: len as u64,
        weight: 0.0,
        checksum: checksum(payload),
        step: 0,
        offset: 0,
        total: len as u64,
    }
}

/// Sets one field of `h` (or a value of `payload`) to something hostile.
fn spoil(rng: &mut Rng, h: &mut Header, payload: &mut Vec<u8>) {
    let ctx = ctx();
    match rng.below(16) {
        0 => h.version = rng.wild() as u16,
        1 => h.run_id = rng.pick(&["", "other", "fuzz-run\0"]).to_string(),
        2 => h.view = rng.wild(),
        3 => h.sender = ctx.names[rng.below(ctx.names.len())].clone(),
        4 => {
            h.kind = rng.pick(&[
                Kind::PushSum,
                Kind::ReduceScatter,
                Kind::AllGather,
                Kind::Gather,
            ])
        }
        5 => h.dtype = rng.pick(&[DType::F32, DType::U64]),
        6 => h.len = rng.wild(),
        7 => h.weight = rng.pick(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MAX, -0.0]),
        8 => h.checksum = rng.next_u64(),
        9 => h.step = rng.wild() as u32,
        10 => h.offset = rng.wild(),
        11 => h.total = rng.wild(),
        12 => h.round = rng.wild(),
        13 | 14 if payload.len() >= 4 => {
            // A non-finite value, with a checksum that matches it.
            let i = rng.below(payload.len() / 4);
            let bad: f32 = rng.pick(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN]);
            payload[4 * i..4 * i + 4].copy_from_slice(&bad.to_le_bytes());
            h.checksum = checksum(payload);
        }
        _ => {
            // The payload cut or lengthened with the header unchanged.
            if rng.chance(50) {
                payload.truncate(rng.below(payload.len() + 1));
            } else {
                payload.extend((0..1 + rng.below(12)).map(|_| rng.next_u64() as u8));
            }
        }
    }
}

fn push_frame(out: &mut Vec<u8>, h: &Header, payload: &[u8]) {
    out.extend_from_slice(&encode_header(h));
    out.extend_from_slice(payload);
}

/// Frames with at most one spoiled, after the peer selector byte.
fn frames(rng: &mut Rng, peer: Rank, hostile: bool, list: Vec<(Header, Vec<u8>)>) -> Vec<u8> {
    let mut out = vec![peer as u8];
    let spoilt = hostile.then(|| rng.below(list.len()));
    for (i, (mut h, mut payload)) in list.into_iter().enumerate() {
        if spoilt == Some(i) {
            spoil(rng, &mut h, &mut payload);
        }
        push_frame(&mut out, &h, &payload);
    }
    out
}

fn gen_header(rng: &mut Rng, hostile: bool) -> (Vec<u8>, usize) {
    let payload = f32_to_bytes(&[rng.unit(), rng.unit()]);
    let mut h = base_header(Kind::PushSum, &ctx().names[LEFT], 2, &payload);
    h.round = rng.below(1000) as u64;
    h.weight = rng.unit() as f64;
    let mut payload = payload;
    if hostile {
        spoil(rng, &mut h, &mut payload);
    }
    (encode_header(&h), 1)
}

fn gen_shares(rng: &mut Rng, hostile: bool) -> (Vec<u8>, usize) {
    let ctx = ctx();
    let peer = rng.below(MEMBERS);
    let n = 1 + rng.below(WINDOW as usize);
    let start = rng.below(100) as u64;
    let list = (0..n)
        .map(|i| {
            let values: Vec<f32> = (0..FLOATS).map(|_| rng.unit()).collect();
            let payload = f32_to_bytes(&values);
            let mut h = base_header(Kind::PushSum, &ctx.names[peer], FLOATS, &payload);
            h.round = start + i as u64;
            h.weight = rng.unit() as f64;
            (h, payload)
        })
        .collect();
    (frames(rng, peer, hostile, list), n)
}

/// The chunks of segment `seg` that rank `from` sends at `step` of
/// collective [`SEQ`], with random values; with `scalar`, the first carries
/// a random scalar.
fn segment_frames(
    rng: &mut Rng,
    kind: Kind,
    from: Rank,
    step: u32,
    seg: usize,
    scalar: bool,
) -> Vec<(Header, Vec<u8>)> {
    let range = segment(TOTAL, MEMBERS, seg);
    chunks(range.clone(), CHUNK)
        .into_iter()
        .map(|r| {
            let values: Vec<f32> = r.clone().map(|_| rng.unit()).collect();
            let payload = f32_to_bytes(&values);
            let mut h = base_header(kind, &ctx().names[from], r.len(), &payload);
            h.round = SEQ;
            h.step = step;
            h.offset = r.start as u64;
            h.total = TOTAL as u64;
            if scalar && r.start == range.start {
                h.weight = rng.unit() as f64;
            }
            (h, payload)
        })
        .collect()
}

/// Every chunk the left neighbour sends us in one all-reduce, in order.
fn gen_chunks(rng: &mut Rng, hostile: bool) -> (Vec<u8>, usize) {
    let m = MEMBERS;
    let l = LEFT;
    let mut list = Vec::new();
    for step in 0..2 * (m - 1) {
        let reduce = step < m - 1;
        let (seg, kind) = if reduce {
            ((l + m - step) % m, Kind::ReduceScatter)
        } else {
            ((l + 1 + m - (step - (m - 1))) % m, Kind::AllGather)
        };
        list.extend(segment_frames(rng, kind, l, step as u32, seg, seg == 0));
    }
    let n = list.len();
    (frames(rng, l, hostile, list), n)
}

/// Every frame the other members send us in one direct all-reduce: their
/// contributions to our segment (step 0) and their sums (step 1), each cut
/// into chunks, one sender's in order, the senders interleaved at random;
/// each frame behind its sender's selector byte.
fn gen_direct(rng: &mut Rng, hostile: bool) -> (Vec<u8>, usize) {
    let m = MEMBERS;
    // Per sender, its frames (last first).
    type Queue = Vec<(Header, Vec<u8>)>;
    let mut queues: Vec<(Rank, Queue)> = Vec::new();
    for from in (0..m).filter(|r| *r != OUR_RANK) {
        let mut list = Vec::new();
        for (step, seg, kind) in [
            (0, OUR_RANK, Kind::ReduceScatter),
            (1, from, Kind::AllGather),
        ] {
            list.extend(segment_frames(
                rng,
                kind,
                from,
                step,
                seg,
                from == 0 && step == 1,
            ));
        }
        list.reverse();
        queues.push((from, list));
    }
    let n: usize = queues.iter().map(|(_, l)| l.len()).sum();
    let spoilt = hostile.then(|| rng.below(n));
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        queues.retain(|(_, l)| !l.is_empty());
        if queues.is_empty() {
            break;
        }
        let q = rng.below(queues.len());
        let (from, list) = &mut queues[q];
        let (mut h, mut payload) = list.pop().expect("not empty");
        if spoilt == Some(i) {
            spoil(rng, &mut h, &mut payload);
        }
        out.push(*from as u8);
        push_frame(&mut out, &h, &payload);
        i += 1;
    }
    (out, n)
}

/// The blocks the left neighbour passes us in one gather, in order.
fn gen_blocks(rng: &mut Rng, hostile: bool) -> (Vec<u8>, usize) {
    let ctx = ctx();
    let m = MEMBERS;
    let l = LEFT;
    let list: Vec<(Header, Vec<u8>)> = (0..m - 1)
        .map(|step| {
            let origin = (l + m - step) % m;
            let words: Vec<u64> = (0..WORDS)
                .map(|_| (rng.unit() as f64).to_bits() >> (2 + rng.below(2)))
                .collect();
            let payload = u64_to_bytes(&words);
            let mut h = base_header(Kind::Gather, &ctx.names[l], WORDS, &payload);
            h.round = SEQ;
            h.step = step as u32;
            h.offset = origin as u64;
            h.total = m as u64;
            (h, payload)
        })
        .collect();
    let n = list.len();
    // Words that are f64 bits shifted right stay finite; the sum of WORDS
    // of them cannot overflow a u64.
    (frames(rng, l, hostile, list), n)
}

fn junk_or(rng: &mut Rng, name: &str) -> String {
    if rng.chance(10) {
        "\u{0}\u{ffff}".repeat(rng.below(4))
    } else {
        name.into()
    }
}

fn gen_hello(rng: &mut Rng, hostile: bool, as_reply: bool) -> (Vec<u8>, usize) {
    let ctx = ctx();
    let peer = rng.below(MEMBERS);
    let addr = |rng: &mut Rng| {
        let port = 4000 + rng.below(100);
        if rng.chance(50) {
            format!("/ip4/10.0.0.{}/tcp/{port}", rng.below(255))
        } else {
            format!("/ip4/127.0.0.1/udp/{port}/quic-v1")
        }
    };
    let members: Vec<MemberInfo> = (0..rng.below(MEMBERS + 1))
        .map(|i| MemberInfo {
            peer: ctx.names[i].clone(),
            addrs: (0..rng.below(3)).map(|_| addr(rng)).collect(),
        })
        .collect();
    let names: Vec<String> = ctx.names[..MEMBERS].to_vec();
    let mut h = Hello {
        version: WIRE_VERSION,
        nodes: MEMBERS as u64,
        identity: ctx.cfg.run.clone(),
        peer: ctx.names[peer].clone(),
        addrs: (0..1 + rng.below(2)).map(|_| addr(rng)).collect(),
        members,
        proposal: rng.chance(50).then(|| names.clone()),
        view: rng.chance(30).then_some(ViewInfo {
            number: VIEW,
            members: names,
            instances: Vec::new(),
        }),
        settings: [("lr".to_string(), "0.01".to_string())].into(),
        admission: "open".into(),
        instance: rng.next_u64(),
    };
    if hostile {
        let junk = rng.pick(&[
            "",
            "/",
            "/ip4/999.0.0.1/tcp/1",
            "12D3KooW",
            "/p2p/xyz",
            "\u{0}",
        ]);
        match rng.below(9) {
            0 => h.version = rng.wild() as u16,
            1 => h.identity.config_hash = junk.into(),
            2 => h.nodes = rng.wild(),
            3 => h.peer = junk.into(),
            4 => h.addrs.push(junk.into()),
            5 => h.members.push(MemberInfo {
                peer: junk.into(),
                addrs: vec![junk.into()],
            }),
            6 => h.proposal = Some(vec![junk.into(); 1 + rng.below(3)]),
            7 => {
                h.view = Some(ViewInfo {
                    number: rng.wild(),
                    members: vec![junk.into(), ctx.names[0].clone()],
                    instances: vec![rng.wild()],
                })
            }
            _ => h.members = Vec::new(),
        }
    }
    let mut out = vec![peer as u8];
    let wrote = if as_reply && rng.chance(20) {
        let r = Refusal {
            field: "config hash".into(),
            settings: vec!["lr".into(), junk_or(rng, "steps")],
        };
        block_on(write_msg(&mut out, &Reply::Refused(r)))
    } else if as_reply {
        block_on(write_msg(&mut out, &Reply::Welcome(h)))
    } else {
        block_on(write_msg(&mut out, &h))
    };
    wrote.expect("writing into a Vec cannot fail");
    (out, 1)
}
