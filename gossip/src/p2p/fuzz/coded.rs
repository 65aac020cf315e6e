//! The compressed-share decoder (`crate::compress`): a payload the run's
//! codec must check in full before anything is added.
//!
//! An input is one byte choosing the codec (bf16, int8, topk:0.25), two
//! bytes of share length (1 to 9000 values: three top-k index blocks), then
//! the payload.

use super::ctx::Outcome;
use super::rng::Rng;
use crate::compress::{Compression, add_decoded, check, encode_share};

const CODECS: [Compression; 3] = [
    Compression::Bf16,
    Compression::Int8,
    Compression::TopK(0.25),
];
const MAX_VALUES: usize = 9000;

fn layout(data: &[u8]) -> Option<(Compression, usize, &[u8])> {
    let (&c, rest) = data.split_first()?;
    let (n, payload) = rest.split_at_checked(2)?;
    let n = 1 + usize::from(u16::from_le_bytes([n[0], n[1]])) % MAX_VALUES;
    Some((CODECS[usize::from(c) % CODECS.len()], n, payload))
}

/// Checks the payload as a share of the chosen codec and length; a share
/// that passes is added to zeros and must give finite values.
pub fn coded(data: &[u8]) -> Outcome {
    let Some((codec, n, payload)) = layout(data) else {
        return Outcome {
            error: Some("shorter than the codec and length bytes".into()),
            ..Outcome::default()
        };
    };
    if let Err(e) = check(codec, payload, n) {
        return Outcome {
            error: Some(e.to_string()),
            ..Outcome::default()
        };
    }
    let mut x = vec![0f32; n];
    add_decoded(codec, payload, &mut x);
    assert!(
        x.iter().all(|v| v.is_finite()),
        "{codec}: a checked share decoded to a non-finite value"
    );
    Outcome {
        accepted: 1,
        ..Outcome::default()
    }
}

/// A valid share of random values (as a sender encodes it), its codec and
/// length bytes in front; with `hostile`, a scale, index or value is then
/// broken.
pub(super) fn generate(rng: &mut Rng, hostile: bool) -> (Vec<u8>, usize) {
    let c = rng.below(CODECS.len());
    let n = 1 + rng.below(MAX_VALUES);
    let mut x: Vec<f32> = (0..n).map(|_| rng.unit() * 100.0).collect();
    let payload = encode_share(CODECS[c], &mut x, 0.5, 1, Vec::new());
    let mut bytes = vec![c as u8];
    bytes.extend_from_slice(&((n - 1) as u16).to_le_bytes());
    bytes.extend_from_slice(&payload);
    if hostile && payload.len() >= 4 {
        let at = 3 + 4 * rng.below(payload.len() / 4);
        let bad = rng.pick(&[f32::NAN, f32::INFINITY, -1.0, f32::MAX]);
        bytes[at..at + 4].copy_from_slice(&bad.to_le_bytes());
        if CODECS[c] == Compression::TopK(0.25) && rng.chance(50) {
            // the first block's count: more than the block or the share holds
            bytes[3..5].copy_from_slice(&(n as u16).to_le_bytes());
        }
    }
    (bytes, 1)
}
