//! The targets on tensor frames and membership messages: each runs
//! arbitrary bytes through the code a node runs on them.

use futures::executor::block_on;
use futures::io::Cursor;
use libp2p::PeerId;

use crate::collectives::{ReduceOp, reduce_u64, sum_f64_in_rank_order};
use crate::ledger::Inbox;
use crate::p2p::allreduce::{chunk_of, chunk_verdict};
use crate::p2p::gather::{BlockVerdict, block_verdict, bytes_to_u64};
use crate::p2p::inbound::check_header;
use crate::p2p::membership::msg::{Hello, Reply, read_msg};
use crate::p2p::payload::{LeBytes, add_bytes, copy_bytes};
use crate::p2p::state::View;
use crate::p2p::wire::{
    ALL_REDUCE_PROTOCOL, Header, PUSH_SUM_PROTOCOL, ReadError, Reject, WIRE_VERSION, check_payload,
    encode_header, read_header, read_payload,
};
use crate::ring::{ChunkHeader, Expected, Links, direct_all_reduce, ring_all_reduce};
use crate::{CommError, Rank};

use super::ctx::*;
use super::lane::lane;

/// The targets, by name.
pub const TARGETS: &[&str] = &[
    "header", "share", "chunk", "direct", "gather", "hello", "reply", "knock", "door", "lane",
    "coded", "sums",
];

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
        "coded" => super::coded(data),
        "sums" => super::sums(data),
        _ => panic!("no fuzz target `{name}` (targets: {})", TARGETS.join(", ")),
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
                    .map_err(|_| CommError::Protocol(read_error(ReadError::Eof)))?;
                let peers = &ctx().peers;
                self.peer = peers[b[0] as usize % peers.len()];
            }
            let got = next_frame(&mut self.r, &self.peer, ALL_REDUCE_PROTOCOL, &mut |_, _| {
                Ok(())
            });
            let (h, from, payload) = got.map_err(|e| CommError::Protocol(read_error(e)))?;
            match chunk_verdict(&h, from, SEQ, expected, "all-reduce")? {
                Ok(i) => {
                    self.accepted += 1;
                    return Ok((i, chunk_of(&h, expected[i].phase), payload));
                }
                Err(_) => self.dropped += 1,
            }
        }
        Err(CommError::Protocol("too many frames".into()))
    }

    fn apply(&mut self, payload: Vec<u8>, into: &mut [f32], add: bool) -> Result<(), CommError> {
        assert_eq!(payload.len(), 4 * into.len(), "chunk length");
        if add {
            add_bytes(into, &payload);
        } else {
            copy_bytes(into, &payload);
        }
        Ok(())
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
    let result = ring_all_reduce(
        &mut links,
        OUR_RANK,
        MEMBERS,
        chunk,
        &mut buf,
        &mut scalar,
        None,
    );
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
    let result = direct_all_reduce(&mut links, OUR_RANK, MEMBERS, &mut buf, &mut scalar, None);
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
    crate::p2p::addrs::parse_addrs("hello", &h.addrs).map_err(|e| e.to_string())?;
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
    super::knock::knock(peer, &ctx().peers[..MEMBERS], rest)
}

/// The answer to a knock, as the knocking side reads and checks it.
pub fn door(data: &[u8]) -> Outcome {
    let (peer, rest) = peer_of(data);
    super::knock::door(peer, &ctx().peers[..MEMBERS], rest)
}
