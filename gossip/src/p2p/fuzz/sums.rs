//! The compressed average's decoders of peer words (`crate::compress`'s
//! reduce-scatter): a segment's contributions, checked and summed by the
//! rank that owns it, and the gathered coded sums every rank reads.
//!
//! An input is one byte choosing the decoder (even: contributions, odd:
//! sums), one byte choosing the codec (bf16, int8), one byte of ranks (2 to
//! 5), two bytes of values (1 to 3000), then per rank a `u16` count of
//! words and that many little-endian words.

use super::ctx::Outcome;
use super::rng::Rng;
use crate::compress::average::{REFUSED, SUMMED, read_sums, reduce_segment};
use crate::compress::{Compression, add_decoded, encode_share, encoded_bytes};
use crate::segment;

const CODECS: [Compression; 2] = [Compression::Bf16, Compression::Int8];
const MAX_VALUES: usize = 3000;

fn refused(error: String) -> Outcome {
    Outcome {
        error: Some(error),
        ..Outcome::default()
    }
}

/// Reads the input's choices and its ranks' words.
fn layout(data: &[u8]) -> Option<(bool, Compression, usize, Vec<Vec<u64>>)> {
    let (head, mut rest) = data.split_at_checked(5)?;
    let sums = head[0] % 2 == 1;
    let codec = CODECS[usize::from(head[1]) % CODECS.len()];
    let m = 2 + usize::from(head[2]) % 4;
    let n = 1 + usize::from(u16::from_le_bytes([head[3], head[4]])) % MAX_VALUES;
    let mut ranks = Vec::with_capacity(m);
    for _ in 0..m {
        let (count, tail) = rest.split_at_checked(2)?;
        let count = usize::from(u16::from_le_bytes([count[0], count[1]]));
        let (words, tail) = tail.split_at_checked(8 * count)?;
        ranks.push(
            words
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                .collect(),
        );
        rest = tail;
    }
    Some((sums, codec, n, ranks))
}

/// Runs the chosen decoder; what it takes must be finite.
pub fn sums(data: &[u8]) -> Outcome {
    let Some((sums, codec, n, ranks)) = layout(data) else {
        return refused("shorter than its layout".into());
    };
    let m = ranks.len();
    if sums {
        return match read_sums(codec, &ranks, n) {
            Ok((total, codes)) => {
                assert!(total.is_finite() && total > 0.0, "a sum of weights {total}");
                let mut x = vec![0f32; n];
                for (j, code) in codes.iter().enumerate() {
                    add_decoded(codec, code, &mut x[segment(n, m, j)]);
                }
                assert!(x.iter().all(|v| v.is_finite()), "{codec}: a non-finite sum");
                Outcome {
                    accepted: m,
                    ..Outcome::default()
                }
            }
            Err(e) => refused(e.to_string()),
        };
    }
    match reduce_segment(codec, &ranks, n) {
        Ok((total, sum)) => {
            assert!(total.is_finite() && total > 0.0, "a sum of weights {total}");
            assert!(
                sum.iter().all(|v| v.is_finite()),
                "{codec}: a non-finite sum"
            );
            Outcome {
                accepted: m,
                ..Outcome::default()
            }
        }
        Err(e) => refused(e),
    }
}

/// A weight's bits and the code of `len` random values, as words.
fn coded(rng: &mut Rng, codec: Compression, weight: f64, len: usize) -> Vec<u64> {
    let mut x: Vec<f32> = (0..len).map(|_| rng.unit() * 100.0).collect();
    let bytes = encode_share(codec, &mut x, 1.0, 1, Vec::new());
    let mut words = vec![weight.to_bits()];
    words.extend(bytes.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    }));
    words
}

/// Valid contributions or sums as ranks send them; with `hostile`, one
/// word of one rank set to a value that breaks it (a weight, a scale, a
/// marker, a length).
pub(super) fn generate(rng: &mut Rng, hostile: bool) -> (Vec<u8>, usize) {
    let sums = rng.chance(50);
    let c = rng.below(CODECS.len());
    let codec = CODECS[c];
    let m = 2 + rng.below(4);
    let n = 1 + rng.below(MAX_VALUES);
    let mut ranks: Vec<Vec<u64>> = if sums {
        let total = (1 + rng.below(8)) as f64;
        let width = 2 + encoded_bytes(codec, n.div_ceil(m)).div_ceil(8);
        (0..m)
            .map(|j| {
                let mut words = vec![SUMMED];
                words.extend(coded(rng, codec, total, segment(n, m, j).len()));
                words.resize(width, 0);
                words
            })
            .collect()
    } else {
        (0..m)
            .map(|_| {
                let weight = 0.5 + f64::from(rng.unit().abs());
                coded(rng, codec, weight, n)
            })
            .collect()
    };
    if hostile {
        let r = rng.below(m);
        let at = rng.below(ranks[r].len());
        ranks[r][at] = rng.pick(&[
            f64::NAN.to_bits(),
            f64::INFINITY.to_bits(),
            (-1.0f64).to_bits(),
            u64::from(f32::NAN.to_bits()) * 0x1_0000_0001,
            u64::MAX,
            REFUSED,
        ]);
        if rng.chance(30) {
            ranks[r].push(rng.wild());
        }
    }
    let mut bytes = vec![
        u8::from(sums) + 2 * rng.below(100) as u8,
        c as u8,
        (m - 2) as u8,
    ];
    bytes.extend_from_slice(&((n - 1) as u16).to_le_bytes());
    for words in &ranks {
        bytes.extend_from_slice(&(words.len() as u16).to_le_bytes());
        for w in words {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
    }
    (bytes, m)
}
