//! Inputs worth trying: valid streams, hostile fields, byte-level
//! mutations and plain random bytes.

use futures::executor::block_on;

use crate::p2p::gather::u64_to_bytes;
use crate::p2p::membership::msg::{Hello, MemberInfo, Refusal, Reply, ViewInfo, write_msg};
use crate::p2p::wire::{
    DType, Header, Kind, MAX_HEADER_BYTES, WIRE_VERSION, checksum, encode_header, f32_to_bytes,
};
use crate::ring::chunks;
use crate::{Rank, segment};

use super::ctx::*;
use super::decode::TARGETS;
use super::lane::gen_lane;
use super::rng::Rng;

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
        "coded" => super::coded::generate(rng, hostile),
        "sums" => super::sums::generate(rng, hostile),
        "hello" => gen_hello(rng, hostile, false),
        "reply" => gen_hello(rng, hostile, true),
        "knock" | "door" => {
            let ctx = ctx();
            let members = &ctx.peers[..MEMBERS];
            super::knock::generate(rng, members, ctx.peers[MEMBERS], hostile, name == "door")
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
                Kind::Exchange,
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
        lane: vec!["127.0.0.1:1".into()],
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
