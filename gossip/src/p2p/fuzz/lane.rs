//! The `lane` target and its generator.

use crate::ledger::Inbox;
use crate::p2p::payload::LeBytes;
use crate::p2p::wire::{DType, Kind, f32_to_bytes};

use super::ctx::*;
use super::rng::Rng;

/// What one data-lane connection of a member carries, after the set-up:
/// binary frame headers and payloads (the records as opened, so the cipher
/// is not in the way), through the header decoding, the checks of
/// [`crate::p2p::lane::conn`], the finiteness scan, share assembly into the
/// push-sum inbox and the ordering of all-reduce parts.
pub fn lane(data: &[u8]) -> Outcome {
    use crate::p2p::lane::check::{check_frame, check_session_view};
    use crate::p2p::lane::frame::{FrameHeader, FrameKind, HEADER};
    use crate::p2p::lane::{ReduceOrder, ShareAssembly};
    use crate::p2p::payload::first_non_finite;
    use crate::p2p::state::ReduceMsg;

    let ctx = ctx();
    let (peer, stream) = peer_of(data);
    let inbox: Inbox<LeBytes> = Inbox::new(WINDOW);
    // The inbox of a node that has installed our view.
    let _ = inbox.reset(VIEW);
    let shares = ShareAssembly::new(WINDOW);
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
            FrameKind::Coded => Kind::PushSum,
        };
        let coded = h.kind == FrameKind::Coded;
        if let Err(e) = check_session_view(VIEW, &h) {
            return refused(accepted, 0, e);
        }
        let (frame, from) = match check_frame(&ctx.cfg, &ctx.view, &peer, &h, kind, coded) {
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
            if let Err(e) = shares.add_part(&h, payload.to_vec(), None, &mut deliver) {
                return refused(accepted, 0, e);
            }
        } else {
            let msg = ReduceMsg {
                from,
                header: frame,
                payload: payload.to_vec(),
                landed: false,
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
pub(super) fn gen_lane(rng: &mut Rng, hostile: bool) -> (Vec<u8>, usize) {
    use crate::p2p::lane::frame::{FrameHeader, FrameKind};
    let sender = rng.below(MEMBERS);
    let mut frames: Vec<(FrameHeader, Vec<u8>)> = Vec::new();
    let mut messages = 0;
    let round0 = rng.below(100) as u64;
    let (mut share_seq, mut reduce_seq) = (0u64, 0u64);
    for _ in 0..1 + rng.below(5) {
        if rng.chance(50) && share_seq < WINDOW {
            let parts = 1 + rng.below(3);
            let weight = rng.unit() as f64;
            // Half the shares sent unscaled with their factor.
            let scale = rng.chance(50).then(|| 1.0 / (2 + rng.below(3)) as f32);
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
                    scale,
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
        match rng.below(13) {
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
                    Kind::Exchange,
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
            11 => {
                // Out of range, on a frame that takes none, or one part's
                // differing from its share's other parts.
                h.scale = Some(rng.pick(&[f32::NAN, f32::INFINITY, -0.25, 2.0, 0.5, 0.2]));
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
