//! Compressed push-sum shares (`--compress`), written once for both
//! transports (docs/algorithm.md, "Compressed gossip").
//!
//! The rule that keeps push-sum exact under compression:
//! - the weight `w` travels exactly (its `f64` bits), never compressed;
//! - the sender computes its share `s = p x`, encodes it as `Q(s)`, decodes
//!   that with the receiver's own code into `d = D(Q(s))`, and keeps
//!   `x - out * d`: it debits exactly what its out-peers will add, so the
//!   sum of numerators over the run changes only by the gradient steps (to
//!   rounding), and the compression error `s - d` stays with the sender
//!   (implicit error feedback: it goes out in a later round);
//! - receivers add `d` in `(round, sender)` order like any share, so runs
//!   stay deterministic and the simulator and real peers agree bit for bit.
//!
//! Everything a receiver needs to size a share is in the run's settings (the
//! codec and the model's length), so a payload's byte count is known before
//! a byte of it is read, and a payload is checked in full ([`check`]) before
//! it is added.
//!
//! | codec | layout | bytes for `n` values |
//! |---|---|---|
//! | `bf16` | `n` bfloat16 (round to nearest even) | `2n` |
//! | `int8` | per block of [`INT8_BLOCK`] values: an `f32` scale, then the block's `i8`s | `n + 4 ceil(n / 256)` |
//! | `topk:F` | `k = ceil(F n)` strictly increasing `u32` indices, then their `k` `f32` values | `8k` |

pub use slowmo_runspec::Compression;

mod average;
pub use average::compressed_average;

/// Values per int8 block (one `f32` scale each).
pub const INT8_BLOCK: usize = 256;

/// Why a compressed share does not fit the run: the field and what was
/// wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("compressed share ({codec}): {field} {detail}")]
pub struct CodecError {
    /// The codec the run uses.
    pub codec: String,
    /// The part of the payload at fault (`length`, `scale`, `index`, `value`).
    pub field: &'static str,
    /// What was found and what was expected.
    pub detail: String,
}

/// The number of values a top-k share of `n` keeps: `ceil(fraction n)`,
/// at least 1 (for `n > 0`), at most `n`.
pub fn top_k(fraction: f32, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let k = (f64::from(fraction) * n as f64).ceil() as usize;
    k.clamp(1, n)
}

/// The exact byte length of a share of `n` values under `codec`.
pub fn encoded_bytes(codec: Compression, n: usize) -> usize {
    match codec {
        Compression::None => 4 * n,
        Compression::Bf16 => 2 * n,
        Compression::Int8 => n + 4 * n.div_ceil(INT8_BLOCK),
        Compression::TopK(f) => 8 * top_k(f, n),
    }
}

/// `f32` to bfloat16 bits, rounded to nearest even.
#[inline]
fn to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    let round = 0x7fff + ((bits >> 16) & 1);
    let b = (bits.wrapping_add(round) >> 16) as u16;
    // A finite value never rounds to infinity: the largest finite bfloat16.
    if b & 0x7f80 == 0x7f80 && v.is_finite() {
        (b & 0x8000) | 0x7f7f
    } else {
        b
    }
}

#[inline]
fn from_bf16(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// The value an int8 code stands for: the one expression both ends use.
#[inline]
fn int8_value(q: i8, scale: f32) -> f32 {
    f32::from(q) * scale
}

/// Scales `x` by `p` into this round's share, encodes the share into `buf`
/// (reused) and leaves in `x` what the sender keeps: `x - out_peers * d`,
/// where `d` is the share as every receiver will decode it. `codec` must
/// not be [`Compression::None`] (the plain path scales in place).
pub fn encode_share(
    codec: Compression,
    x: &mut [f32],
    p: f32,
    out_peers: usize,
    mut buf: Vec<u8>,
) -> Vec<u8> {
    let out = out_peers as f32;
    buf.clear();
    buf.reserve(encoded_bytes(codec, x.len()));
    match codec {
        Compression::None => unreachable!("the plain share is not encoded here"),
        Compression::Bf16 => {
            for v in x.iter_mut() {
                let b = to_bf16(*v * p);
                buf.extend_from_slice(&b.to_le_bytes());
                *v -= out * from_bf16(b);
            }
        }
        Compression::Int8 => {
            let mut share = [0f32; INT8_BLOCK];
            for block in x.chunks_mut(INT8_BLOCK) {
                let s = &mut share[..block.len()];
                let mut max = 0f32;
                for (s, v) in s.iter_mut().zip(block.iter()) {
                    *s = *v * p;
                    max = max.max(s.abs());
                }
                let scale = max / 127.0;
                buf.extend_from_slice(&scale.to_le_bytes());
                for (s, v) in s.iter().zip(block.iter_mut()) {
                    let q = if scale > 0.0 {
                        (*s / scale).round().clamp(-127.0, 127.0) as i8
                    } else {
                        0
                    };
                    buf.push(q as u8);
                    *v -= out * int8_value(q, scale);
                }
            }
        }
        Compression::TopK(fraction) => {
            let k = top_k(fraction, x.len());
            let share: Vec<f32> = x.iter().map(|v| *v * p).collect();
            let mut order: Vec<u32> = (0..x.len() as u32).collect();
            // Largest magnitude first, ties to the lower index: a total
            // order, so the kept set does not depend on the sort.
            let by_size = |a: &u32, b: &u32| {
                let (va, vb) = (share[*a as usize].abs(), share[*b as usize].abs());
                vb.total_cmp(&va).then(a.cmp(b))
            };
            if k < order.len() {
                order.select_nth_unstable_by(k, by_size);
            }
            let kept = &mut order[..k];
            kept.sort_unstable();
            for i in kept.iter() {
                buf.extend_from_slice(&i.to_le_bytes());
            }
            for &i in kept.iter() {
                let d = share[i as usize];
                buf.extend_from_slice(&d.to_le_bytes());
                x[i as usize] -= out * d;
            }
        }
    }
    buf
}

/// Checks that `bytes` is a share of `n` values under `codec`: its length,
/// and every scale, index and value (finite, in range, increasing). Nothing
/// is allocated.
pub fn check(codec: Compression, bytes: &[u8], n: usize) -> Result<(), CodecError> {
    let err = |field, detail: String| CodecError {
        codec: codec.to_string(),
        field,
        detail,
    };
    let want = encoded_bytes(codec, n);
    if bytes.len() != want {
        return Err(err(
            "length",
            format!(
                "is {} bytes, a share of {n} values takes {want}",
                bytes.len()
            ),
        ));
    }
    match codec {
        Compression::None => {
            if let Some((i, v)) = crate::le::first_non_finite(bytes) {
                return Err(err("value", format!("{i} is {v}")));
            }
        }
        Compression::Bf16 => {
            for (i, b) in bytes.chunks_exact(2).enumerate() {
                let v = from_bf16(u16::from_le_bytes([b[0], b[1]]));
                if !v.is_finite() {
                    return Err(err("value", format!("{i} is {v}")));
                }
            }
        }
        Compression::Int8 => {
            let mut at = 0;
            for block in 0..n.div_ceil(INT8_BLOCK) {
                let scale = f32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
                if !(scale.is_finite() && scale >= 0.0 && (scale * 127.0).is_finite()) {
                    return Err(err(
                        "scale",
                        format!("of block {block} is {scale}, expected a finite value >= 0"),
                    ));
                }
                at += 4 + INT8_BLOCK.min(n - block * INT8_BLOCK);
            }
        }
        Compression::TopK(_) => {
            let k = bytes.len() / 8;
            let (indices, values) = bytes.split_at(4 * k);
            let mut last = None;
            for (j, b) in indices.chunks_exact(4).enumerate() {
                let i = u32::from_le_bytes(b.try_into().expect("4 bytes"));
                if i as usize >= n || last.is_some_and(|l| i <= l) {
                    return Err(err(
                        "index",
                        format!(
                            "{j} is {i}; indices must increase and stay below {n} (previous {})",
                            last.map_or("none".into(), |l: u32| l.to_string())
                        ),
                    ));
                }
                last = Some(i);
            }
            for (j, b) in values.chunks_exact(4).enumerate() {
                let v = f32::from_le_bytes(b.try_into().expect("4 bytes"));
                if !v.is_finite() {
                    return Err(err("value", format!("{j} is {v}")));
                }
            }
        }
    }
    Ok(())
}

/// `x += D(bytes)`: adds a checked share ([`check`]) with the decode the
/// sender debited.
pub fn add_decoded(codec: Compression, bytes: &[u8], x: &mut [f32]) {
    match codec {
        Compression::None => crate::le::add_bytes(x, bytes),
        Compression::Bf16 => {
            for (d, b) in x.iter_mut().zip(bytes.chunks_exact(2)) {
                *d += from_bf16(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        Compression::Int8 => {
            let mut at = 0;
            for block in x.chunks_mut(INT8_BLOCK) {
                let Some(head) = bytes.get(at..at + 4) else {
                    return;
                };
                let scale = f32::from_le_bytes(head.try_into().expect("4 bytes"));
                let codes = &bytes[at + 4..(at + 4 + block.len()).min(bytes.len())];
                for (d, q) in block.iter_mut().zip(codes) {
                    *d += int8_value(*q as i8, scale);
                }
                at += 4 + block.len();
            }
        }
        Compression::TopK(_) => {
            let k = bytes.len() / 8;
            let (indices, values) = bytes.split_at(4 * k);
            for (i, v) in indices.chunks_exact(4).zip(values.chunks_exact(4)) {
                let i = u32::from_le_bytes(i.try_into().expect("4 bytes")) as usize;
                if let Some(d) = x.get_mut(i) {
                    *d += f32::from_le_bytes(v.try_into().expect("4 bytes"));
                }
            }
        }
    }
}

/// A push-sum share as the in-memory transport moves it: plain values, or
/// a compressed payload that receivers decode with [`add_decoded`] exactly
/// as they would off the wire.
#[derive(Clone)]
pub(crate) enum MemShare {
    Plain(Vec<f32>),
    Coded {
        codec: Compression,
        floats: usize,
        bytes: std::sync::Arc<Vec<u8>>,
    },
}

impl MemShare {
    /// This round's share of `x` (scaled by `p`) for `out_peers` peers,
    /// leaving in `x` what the sender keeps.
    pub fn encode(codec: Compression, x: &mut [f32], p: f32, out_peers: usize) -> Self {
        match codec {
            Compression::None => MemShare::Plain(
                x.iter_mut()
                    .map(|v| {
                        *v *= p;
                        *v
                    })
                    .collect(),
            ),
            codec => MemShare::Coded {
                codec,
                floats: x.len(),
                bytes: std::sync::Arc::new(encode_share(codec, x, p, out_peers, Vec::new())),
            },
        }
    }

    /// Payload bytes on the wire.
    pub fn wire_bytes(&self) -> u64 {
        match self {
            MemShare::Plain(v) => 4 * v.len() as u64,
            MemShare::Coded { bytes, .. } => bytes.len() as u64,
        }
    }
}

impl crate::ledger::SharePayload for MemShare {
    fn floats(&self) -> usize {
        match self {
            MemShare::Plain(v) => v.len(),
            MemShare::Coded { floats, .. } => *floats,
        }
    }

    fn add_into(&self, x: &mut [f32]) {
        match self {
            MemShare::Plain(v) => v.add_into(x),
            MemShare::Coded { codec, bytes, .. } => add_decoded(*codec, bytes, x),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODECS: [Compression; 4] = [
        Compression::Bf16,
        Compression::Int8,
        Compression::TopK(0.01),
        Compression::TopK(0.3),
    ];

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761);
                (h % 20_001) as f32 / 1000.0 - 10.0
            })
            .collect()
    }

    #[test]
    fn the_sender_debits_exactly_what_the_receivers_add() {
        for codec in CODECS {
            for n in [1, 255, 256, 257, 10_007] {
                for out in [1, 2, 3] {
                    let x = values(n, 7);
                    let mut kept = x.clone();
                    let p = 1.0 / (out as f32 + 1.0);
                    let bytes = encode_share(codec, &mut kept, p, out, vec![9; 3]);
                    assert_eq!(bytes.len(), encoded_bytes(codec, n), "{codec} n={n}");
                    check(codec, &bytes, n).unwrap();
                    let mut d = vec![0f32; n];
                    add_decoded(codec, &bytes, &mut d);
                    // What the sender kept plus what each out-peer adds is
                    // what it had, to rounding; the kept error is bounded.
                    for i in 0..n {
                        let total = kept[i] + out as f32 * d[i];
                        assert!(
                            (total - x[i]).abs() <= 1e-5 * x[i].abs().max(1.0),
                            "{codec} n={n} out={out} i={i}: {total} vs {}",
                            x[i]
                        );
                        // The sender keeps x - out d bit for bit.
                        assert_eq!(kept[i].to_bits(), (x[i] - out as f32 * d[i]).to_bits());
                    }
                }
            }
        }
    }

    #[test]
    fn decoded_shares_are_close_to_the_share() {
        let n = 4096;
        let x = values(n, 3);
        for (codec, tol) in [(Compression::Bf16, 1e-2), (Compression::Int8, 0.05)] {
            let mut kept = x.clone();
            let bytes = encode_share(codec, &mut kept, 0.5, 1, Vec::new());
            let mut d = vec![0f32; n];
            add_decoded(codec, &bytes, &mut d);
            for i in 0..n {
                let err = (d[i] - 0.5 * x[i]).abs();
                assert!(err <= tol * x[i].abs().max(1.0), "{codec} {i}: {err}");
            }
        }
        // Top-k keeps the largest magnitudes, exactly.
        let mut kept = x.clone();
        let bytes = encode_share(Compression::TopK(0.1), &mut kept, 0.5, 1, Vec::new());
        let mut d = vec![0f32; n];
        add_decoded(Compression::TopK(0.1), &bytes, &mut d);
        let sent: Vec<usize> = (0..n).filter(|i| d[*i] != 0.0).collect();
        assert_eq!(sent.len(), top_k(0.1, n));
        let smallest_sent = sent.iter().map(|i| x[*i].abs()).fold(f32::MAX, f32::min);
        let largest_kept = (0..n)
            .filter(|i| d[*i] == 0.0)
            .map(|i| x[i].abs())
            .fold(0f32, f32::max);
        assert!(smallest_sent >= largest_kept);
        for i in sent {
            assert_eq!(d[i], 0.5 * x[i]);
            assert_eq!(kept[i], x[i] - 0.5 * x[i]);
        }
    }

    #[test]
    fn the_byte_counts_meet_the_ratios() {
        let n = 203_530;
        assert_eq!(encoded_bytes(Compression::Bf16, n) * 2, 4 * n);
        let int8 = (4 * n) as f64 / encoded_bytes(Compression::Int8, n) as f64;
        assert!(int8 > 3.9, "{int8}");
        let topk = (4 * n) as f64 / encoded_bytes(Compression::TopK(0.01), n) as f64;
        assert!(topk > 49.0, "{topk}");
        assert_eq!(top_k(1e-9, 5), 1);
        assert_eq!(top_k(1.0, 5), 5);
        assert_eq!(top_k(0.5, 0), 0);
    }

    #[test]
    fn an_all_zero_block_and_ties_encode_deterministically() {
        let mut x = vec![0f32; 300];
        let bytes = encode_share(Compression::Int8, &mut x, 0.5, 1, Vec::new());
        check(Compression::Int8, &bytes, 300).unwrap();
        assert!(x.iter().all(|v| *v == 0.0));
        let mut a = vec![1f32; 100];
        let mut b = a.clone();
        let ea = encode_share(Compression::TopK(0.05), &mut a, 0.5, 1, Vec::new());
        let eb = encode_share(Compression::TopK(0.05), &mut b, 0.5, 1, Vec::new());
        assert_eq!(ea, eb);
        // Ties go to the lowest indices.
        assert_eq!(&ea[..4], &0u32.to_le_bytes());
        assert_eq!(&ea[16..20], &4u32.to_le_bytes());
    }

    #[test]
    fn bad_shares_are_refused_naming_the_field() {
        let n = 600;
        let x = values(n, 1);
        let enc = |codec| encode_share(codec, &mut x.clone(), 0.5, 1, Vec::new());
        for codec in CODECS {
            let bytes = enc(codec);
            let e = check(codec, &bytes[..bytes.len() - 1], n).unwrap_err();
            assert_eq!(e.field, "length", "{e}");
            let e = check(codec, &bytes, n + 50).unwrap_err();
            assert_eq!(e.field, "length", "{e}");
        }
        let mut bytes = enc(Compression::Int8);
        bytes[256 + 4..256 + 8].copy_from_slice(&f32::NAN.to_le_bytes());
        let e = check(Compression::Int8, &bytes, n).unwrap_err();
        assert_eq!(e.field, "scale");
        assert!(e.to_string().contains("block 1"), "{e}");
        let mut bytes = enc(Compression::Int8);
        bytes[..4].copy_from_slice(&(-1f32).to_le_bytes());
        assert_eq!(
            check(Compression::Int8, &bytes, n).unwrap_err().field,
            "scale"
        );
        let topk = Compression::TopK(0.3);
        let mut bytes = enc(topk);
        bytes[4..8].copy_from_slice(&(n as u32).to_le_bytes());
        assert_eq!(check(topk, &bytes, n).unwrap_err().field, "index");
        let mut bytes = enc(topk);
        let first: [u8; 4] = bytes[..4].try_into().unwrap();
        bytes[4..8].copy_from_slice(&first);
        assert_eq!(check(topk, &bytes, n).unwrap_err().field, "index");
        let mut bytes = enc(topk);
        let k = bytes.len() / 8;
        bytes[4 * k..4 * k + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
        let e = check(topk, &bytes, n).unwrap_err();
        assert_eq!(e.field, "value");
        let mut bytes = enc(Compression::Bf16);
        bytes[2..4].copy_from_slice(&0x7f80u16.to_le_bytes());
        assert_eq!(
            check(Compression::Bf16, &bytes, n).unwrap_err().field,
            "value"
        );
    }
}
