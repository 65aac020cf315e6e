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
//! | `topk:F` | the `k = ceil(F n)` largest magnitudes: per block of [`TOPK_BLOCK`] values a `u16` count of kept values, then each kept value's `u16` offset in its block (increasing within the block), then the `k` values as bfloat16 | `4k + 2 ceil(n / 4096)` |

pub use slowmo_runspec::Compression;

pub(crate) mod average;
pub use average::compressed_average;

/// Values per int8 block (one `f32` scale each).
pub const INT8_BLOCK: usize = 256;

/// Values per top-k index block: a kept value's index is its block's
/// start plus a `u16` offset within the block, so an index costs 2 bytes
/// (and each block 2 more, for its count of kept values).
pub const TOPK_BLOCK: usize = 4096;

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
        Compression::TopK(f) => 4 * top_k(f, n) + 2 * n.div_ceil(TOPK_BLOCK),
    }
}

/// `f32` to bfloat16 bits, rounded to nearest even.
#[inline(always)]
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

#[inline(always)]
fn from_bf16(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `v` rounded half away from zero, as [`f32::round`], for `|v| < 2^23`
/// (an int8 code's range and far beyond): the truncation and the fraction
/// `v - trunc(v)` are exact there. Without SSE4.1 `f32::round` is a call
/// into libm for every value; this stays in registers. The reference
/// [`int8_code`] is tested against (it rounds the same way, in lanes).
#[cfg(test)]
fn round_half_away(v: f32) -> f32 {
    let t = v as i32 as f32;
    let frac = v - t;
    // The sign of a result that rounds to zero is `v`'s, as in `round`.
    (t + f32::from(u8::from(frac >= 0.5)) - f32::from(u8::from(frac <= -0.5))).copysign(v)
}

/// The int8 code of `v` (a value over its block's scale):
/// `round_half_away(v).clamp(-127.0, 127.0) as i8`, NaN coded 0, written
/// without saturating float-to-integer casts (each of which costs a NaN
/// test and a scalar conversion per lane) so that it runs in vector lanes.
#[inline(always)]
fn int8_code(v: f32) -> i8 {
    // Beyond +-128 every value codes +-127 either way.
    let v = if v.is_nan() {
        0.0
    } else {
        v.clamp(-128.0, 128.0)
    };
    // SAFETY: `v` is finite and within +-128, so it fits an i32.
    let t = unsafe { v.to_int_unchecked::<i32>() } as f32;
    let frac = v - t;
    let r = (t + f32::from(u8::from(frac >= 0.5)) - f32::from(u8::from(frac <= -0.5))).copysign(v);
    // SAFETY: `r` is finite and within +-129 before the clamp.
    unsafe { r.clamp(-127.0, 127.0).to_int_unchecked::<i32>() as i8 }
}

/// The value an int8 code stands for: the one expression both ends use.
#[inline(always)]
fn int8_value(q: i8, scale: f32) -> f32 {
    f32::from(q) * scale
}

/// Defines `$name` running the `#[inline(always)]` kernel `$plain` built
/// for the CPU it runs on: with AVX2 where the CPU has it (checked once a
/// call; the kernels are plain Rust, so both builds compute the same bits:
/// nothing is fused or reordered, only run eight lanes wide), else as
/// compiled for the baseline. Exported for the node's model kernels.
#[macro_export]
macro_rules! wide_lanes {
    ($(fn $name:ident / $wide:ident = $plain:ident($($arg:ident: $ty:ty),*);)*) => {$(
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2, checked just above.
                return unsafe { $wide($($arg),*) };
            }
            $plain($($arg),*)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        fn $wide($($arg: $ty),*) {
            $plain($($arg),*)
        }
    )*};
}

wide_lanes! {
    fn encode_bf16 / encode_bf16_avx2 = encode_bf16_plain(x: &mut [f32], p: f32, out: f32, buf: &mut Vec<u8>);
    fn encode_int8 / encode_int8_avx2 = encode_int8_plain(x: &mut [f32], p: f32, out: f32, buf: &mut Vec<u8>);
    fn add_bf16 / add_bf16_avx2 = add_bf16_plain(bytes: &[u8], x: &mut [f32]);
    fn add_int8 / add_int8_avx2 = add_int8_plain(bytes: &[u8], x: &mut [f32]);
    fn any_non_finite_bf16 / any_non_finite_bf16_avx2 = any_non_finite_bf16_plain(bytes: &[u8], bad: &mut bool);
}

/// Whether a bfloat16 value of `bytes` is not finite (all exponent bits
/// set), as one branch-free fold that runs in vector lanes.
#[inline(always)]
fn any_non_finite_bf16_plain(bytes: &[u8], bad: &mut bool) {
    let mut any = 0u8;
    for b in bytes.chunks_exact(2) {
        any |= u8::from(b[1] & 0x7f == 0x7f && b[0] & 0x80 == 0x80);
    }
    *bad = any != 0;
}

/// The index of the first bfloat16 value of `bytes` that is not finite:
/// a fold over pieces, and a scan of the piece that has one.
fn first_non_finite_bf16(bytes: &[u8]) -> Option<usize> {
    const PIECE: usize = 1 << 14;
    for (k, piece) in bytes.chunks(PIECE).enumerate() {
        let mut bad = false;
        any_non_finite_bf16(piece, &mut bad);
        if bad {
            let i = piece
                .chunks_exact(2)
                .position(|b| !from_bf16(u16::from_le_bytes([b[0], b[1]])).is_finite())?;
            return Some(k * PIECE / 2 + i);
        }
    }
    None
}

/// Appends the bf16 or int8 share of `x * p` to `buf`, leaving `x -= out *
/// D(share)`. Pieces of a buffer cut at multiples of [`INT8_BLOCK`] append
/// the bytes of the whole (the blocks restart at the same places).
pub(crate) fn append_dense(codec: Compression, x: &mut [f32], p: f32, out: f32, buf: &mut Vec<u8>) {
    match codec {
        Compression::Bf16 => encode_bf16(x, p, out, buf),
        Compression::Int8 => encode_int8(x, p, out, buf),
        _ => unreachable!("{codec} is not a dense codec"),
    }
}

/// The bfloat16 share of `x * p` into `buf`; `x -= out * D(share)`.
#[inline(always)]
fn encode_bf16_plain(x: &mut [f32], p: f32, out: f32, buf: &mut Vec<u8>) {
    let at = buf.len();
    buf.resize(at + 2 * x.len(), 0);
    for (v, c) in x.iter_mut().zip(buf[at..].chunks_exact_mut(2)) {
        let b = to_bf16(*v * p);
        c.copy_from_slice(&b.to_le_bytes());
        *v -= out * from_bf16(b);
    }
}

/// The block-scaled int8 share of `x * p` into `buf`; `x -= out * D(share)`.
#[inline(always)]
fn encode_int8_plain(x: &mut [f32], p: f32, out: f32, buf: &mut Vec<u8>) {
    let mut share = [0f32; INT8_BLOCK];
    for block in x.chunks_mut(INT8_BLOCK) {
        let s = &mut share[..block.len()];
        // The largest magnitude, NaN left out (as `f32::max` leaves it):
        // the bits of a non-negative float order as the float does, and
        // an integer maximum runs in vector lanes.
        let mut max_bits = 0u32;
        for (s, v) in s.iter_mut().zip(block.iter()) {
            *s = *v * p;
            let b = s.to_bits() & 0x7fff_ffff;
            max_bits = max_bits.max(if b <= 0x7f80_0000 { b } else { 0 });
        }
        let scale = f32::from_bits(max_bits) / 127.0;
        buf.extend_from_slice(&scale.to_le_bytes());
        let at = buf.len();
        buf.resize(at + block.len(), 0);
        // An all-zero block keeps its zero codes, and `x` is unchanged
        // (`v - out * 0` is `v`); otherwise one branch-free pass.
        if scale > 0.0 {
            for ((s, v), c) in s.iter().zip(block.iter_mut()).zip(&mut buf[at..]) {
                let q = int8_code(*s / scale);
                *c = q as u8;
                *v -= out * int8_value(q, scale);
            }
        }
    }
}

/// `x += D(bytes)` for a checked bfloat16 share.
#[inline(always)]
fn add_bf16_plain(bytes: &[u8], x: &mut [f32]) {
    for (d, b) in x.iter_mut().zip(bytes.chunks_exact(2)) {
        *d += from_bf16(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// `x += D(bytes)` for a checked int8 share.
#[inline(always)]
fn add_int8_plain(bytes: &[u8], x: &mut [f32]) {
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
        Compression::Bf16 | Compression::Int8 => append_dense(codec, x, p, out, &mut buf),
        Compression::None => unreachable!("the plain share is not encoded here"),

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
            let mut counts = vec![0u16; x.len().div_ceil(TOPK_BLOCK)];
            for &i in kept.iter() {
                counts[i as usize / TOPK_BLOCK] += 1;
            }
            for c in &counts {
                buf.extend_from_slice(&c.to_le_bytes());
            }
            for &i in kept.iter() {
                let offset = (i as usize % TOPK_BLOCK) as u16;
                buf.extend_from_slice(&offset.to_le_bytes());
            }
            for &i in kept.iter() {
                let b = to_bf16(share[i as usize]);
                buf.extend_from_slice(&b.to_le_bytes());
                x[i as usize] -= out * from_bf16(b);
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
            if let Some(i) = first_non_finite_bf16(bytes) {
                let v = from_bf16(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]));
                return Err(err("value", format!("{i} is {v}")));
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
        Compression::TopK(f) => {
            let k = top_k(f, n);
            let blocks = n.div_ceil(TOPK_BLOCK);
            let (counts, rest) = bytes.split_at(2 * blocks);
            let (offsets, values) = rest.split_at(2 * k);
            let mut offsets = offsets.chunks_exact(2);
            let mut seen = 0usize;
            for (block, c) in counts.chunks_exact(2).enumerate() {
                let count = usize::from(u16::from_le_bytes([c[0], c[1]]));
                let len = TOPK_BLOCK.min(n - block * TOPK_BLOCK);
                if count > len || seen + count > k {
                    return Err(err(
                        "index",
                        format!(
                            "count of block {block} is {count}, with {seen} before it; a block \
                             holds at most {len} and the share {k}"
                        ),
                    ));
                }
                let mut last = None;
                for j in seen..seen + count {
                    let o = offsets.next().expect("the length was checked");
                    let o = usize::from(u16::from_le_bytes([o[0], o[1]]));
                    if o >= len || last.is_some_and(|l| o <= l) {
                        return Err(err(
                            "index",
                            format!(
                                "{j} (offset {o} in block {block}) must increase within its \
                                 block and stay below {len} (previous {})",
                                last.map_or("none".into(), |l: usize| l.to_string())
                            ),
                        ));
                    }
                    last = Some(o);
                }
                seen += count;
            }
            if seen != k {
                return Err(err(
                    "index",
                    format!("the block counts add up to {seen}, the share keeps {k}"),
                ));
            }
            for (j, b) in values.chunks_exact(2).enumerate() {
                let v = from_bf16(u16::from_le_bytes([b[0], b[1]]));
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
        Compression::Bf16 => add_bf16(bytes, x),
        Compression::Int8 => add_int8(bytes, x),
        Compression::TopK(_) => {
            let blocks = x.len().div_ceil(TOPK_BLOCK);
            let Some((counts, rest)) = bytes.split_at_checked(2 * blocks) else {
                return;
            };
            let k = rest.len() / 4;
            let (offsets, values) = rest.split_at(2 * k);
            let mut entries = offsets.chunks_exact(2).zip(values.chunks_exact(2));
            for (block, c) in counts.chunks_exact(2).enumerate() {
                let count = usize::from(u16::from_le_bytes([c[0], c[1]]));
                for (o, v) in entries.by_ref().take(count) {
                    let i = block * TOPK_BLOCK + usize::from(u16::from_le_bytes([o[0], o[1]]));
                    if let Some(d) = x.get_mut(i) {
                        *d += from_bf16(u16::from_le_bytes([v[0], v[1]]));
                    }
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

    /// Awkward values: zeros of both signs, subnormals, infinities, NaN,
    /// halves that round away, and a spread of magnitudes.
    fn awkward(n: usize, seed: u32) -> Vec<f32> {
        let special = [
            0.0,
            -0.0,
            f32::MIN_POSITIVE / 4.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.5,
            -2.5,
            f32::MAX,
            1e-30,
        ];
        let mut state = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                if state.is_multiple_of(97) {
                    special[i % special.len()]
                } else {
                    let unit = (state >> 8) as f32 / (1 << 24) as f32 - 0.5;
                    unit * 10f32.powi((state % 9) as i32 - 4)
                }
            })
            .collect()
    }

    #[test]
    fn the_wide_kernels_compute_the_plain_kernels_bits() {
        type Encode = fn(&mut [f32], f32, f32, &mut Vec<u8>);
        type Add = fn(&[u8], &mut [f32]);
        let encoders: [(Encode, Encode, Add, Add); 2] = [
            (encode_bf16, encode_bf16_plain, add_bf16, add_bf16_plain),
            (encode_int8, encode_int8_plain, add_int8, add_int8_plain),
        ];
        // Bits, every NaN as one: the sign and payload of a NaN an
        // operation makes are not specified (an optimised build may give
        // another), and a NaN is refused before it is used anyway.
        let bits = |v: &[f32]| {
            v.iter()
                .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() })
                .collect::<Vec<_>>()
        };
        for (seed, n) in [(1, 1), (2, 255), (3, 256), (4, 257), (5, 5000), (6, 70_001)] {
            for &(wide, plain, add_wide, add_plain) in &encoders {
                let x = awkward(n, seed);
                let (mut a, mut b) = (x.clone(), x.clone());
                let (mut ca, mut cb) = (Vec::new(), Vec::new());
                wide(&mut a, 0.5, 2.0, &mut ca);
                plain(&mut b, 0.5, 2.0, &mut cb);
                assert_eq!(ca, cb, "codes of {n} values");
                assert_eq!(bits(&a), bits(&b), "what is kept of {n} values");
                let (mut da, mut db) = (awkward(n, seed + 10), awkward(n, seed + 10));
                add_wide(&ca, &mut da);
                add_plain(&ca, &mut db);
                assert_eq!(bits(&da), bits(&db), "decoded sums of {n} values");
            }
        }
    }

    #[test]
    fn the_first_non_finite_bfloat16_is_found_in_any_piece() {
        let n = 40_000;
        let mut bytes: Vec<u8> = (0..n as u32)
            .flat_map(|i| to_bf16((i as f32 * 0.37).sin() * 1e30).to_le_bytes())
            .collect();
        assert_eq!(first_non_finite_bf16(&bytes), None);
        for (at, v) in [
            (0, f32::NAN),
            (8191, f32::INFINITY),
            (8192, f32::NEG_INFINITY),
            (n - 1, f32::NAN),
        ] {
            let mut b = bytes.clone();
            b[2 * at..2 * at + 2].copy_from_slice(&to_bf16(v).to_le_bytes());
            b[2 * (n - 1)..].copy_from_slice(&to_bf16(f32::INFINITY).to_le_bytes());
            assert_eq!(first_non_finite_bf16(&b), Some(at), "{v} at {at}");
        }
        // The largest finite bfloat16 and the smallest subnormals pass.
        bytes[..2].copy_from_slice(&0x7f7fu16.to_le_bytes());
        bytes[2..4].copy_from_slice(&0x8001u16.to_le_bytes());
        assert_eq!(first_non_finite_bf16(&bytes), None);
    }

    #[test]
    fn int8_codes_are_the_saturating_rounding() {
        let mut values = awkward(200_000, 7);
        values.extend([
            127.5, -127.5, 126.5, 128.0, 128.4, -128.6, 1e9, -1e9, 0.49999997, -0.5, 2.5,
        ]);
        for v in values.iter().flat_map(|v| [*v, *v * 1e4, *v * 3e6]) {
            let want = round_half_away(v).clamp(-127.0, 127.0) as i8;
            assert_eq!(int8_code(v), want, "{v}");
        }
    }

    #[test]
    fn the_int8_scale_leaves_nan_out_as_f32_max_does() {
        for seed in 0..50 {
            let x = awkward(300, seed);
            let mut code = Vec::new();
            encode_int8_plain(&mut x.clone(), 1.0, 1.0, &mut code);
            for (b, block) in x.chunks(INT8_BLOCK).enumerate() {
                let max = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let at = b * (4 + INT8_BLOCK);
                let scale = f32::from_le_bytes(code[at..at + 4].try_into().unwrap());
                assert_eq!(scale.to_bits(), (max / 127.0).to_bits(), "block {b}");
            }
        }
    }

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
        // A kept value travels as bfloat16; the sender keeps the rounding.
        for i in sent {
            let b = from_bf16(to_bf16(0.5 * x[i]));
            assert_eq!(d[i], b);
            assert_eq!(kept[i], x[i] - b);
        }
    }

    #[test]
    fn the_byte_counts_meet_the_ratios() {
        let n = 203_530;
        assert_eq!(encoded_bytes(Compression::Bf16, n) * 2, 4 * n);
        let int8 = (4 * n) as f64 / encoded_bytes(Compression::Int8, n) as f64;
        assert!(int8 > 3.9, "{int8}");
        let topk = (4 * n) as f64 / encoded_bytes(Compression::TopK(0.01), n) as f64;
        assert!(topk > 95.0, "{topk}");
        assert_eq!(top_k(1e-9, 5), 1);
        assert_eq!(top_k(1.0, 5), 5);
        assert_eq!(top_k(0.5, 0), 0);
    }

    #[test]
    fn int8_rounding_is_f32_round() {
        let mut cases = vec![
            0.0f32, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, 126.5, -126.5, 127.0, 127.49, -127.51,
        ];
        for v in [0.5f32, 1.5, 2.5, 63.5, 126.5] {
            cases.extend([v.next_down(), v.next_up(), -v.next_down(), -v.next_up()]);
        }
        let mut h = 12_345u32;
        for _ in 0..100_000 {
            h = h.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            cases.push((h >> 8) as f32 / (1 << 24) as f32 * 300.0 - 150.0);
        }
        for v in cases {
            assert_eq!(round_half_away(v).to_bits(), v.round().to_bits(), "{v}");
        }
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
        // Ties go to the lowest indices: one block of k = 6 (0.05 as f64 is
        // a little over 0.05), offsets 0 to 5.
        assert_eq!(top_k(0.05, 100), 6);
        assert_eq!(&ea[..2], &6u16.to_le_bytes());
        assert_eq!(&ea[2..4], &0u16.to_le_bytes());
        assert_eq!(&ea[10..12], &4u16.to_le_bytes());
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
        // Top-k over three index blocks: counts, offsets, values.
        let topk = Compression::TopK(0.3);
        let n = 2 * TOPK_BLOCK + 600;
        let x = values(n, 1);
        let enc = |codec| encode_share(codec, &mut x.clone(), 0.5, 1, Vec::new());
        let k = top_k(0.3, n);
        let (offsets, vals) = (6, 6 + 2 * k);
        check(topk, &enc(topk), n).unwrap();
        let mut bytes = enc(topk);
        bytes[offsets + 2..offsets + 4].copy_from_slice(&(TOPK_BLOCK as u16).to_le_bytes());
        let e = check(topk, &bytes, n).unwrap_err();
        assert_eq!(e.field, "index", "{e}");
        let mut bytes = enc(topk);
        let first: [u8; 2] = bytes[offsets..offsets + 2].try_into().unwrap();
        bytes[offsets + 2..offsets + 4].copy_from_slice(&first);
        assert_eq!(check(topk, &bytes, n).unwrap_err().field, "index");
        // The last block holds 600 values: an offset of 600 is past it.
        let mut bytes = enc(topk);
        bytes[vals - 2..vals].copy_from_slice(&600u16.to_le_bytes());
        let e = check(topk, &bytes, n).unwrap_err();
        assert!(e.to_string().contains("block 2"), "{e}");
        // Counts that do not add up to k, or overfill a block.
        let mut bytes = enc(topk);
        let c = u16::from_le_bytes([bytes[4], bytes[5]]);
        bytes[4..6].copy_from_slice(&(c - 1).to_le_bytes());
        let e = check(topk, &bytes, n).unwrap_err();
        assert!(e.to_string().contains("add up to"), "{e}");
        let mut bytes = enc(topk);
        bytes[4..6].copy_from_slice(&601u16.to_le_bytes());
        let e = check(topk, &bytes, n).unwrap_err();
        assert!(e.to_string().contains("count of block 2"), "{e}");
        let mut bytes = enc(topk);
        bytes[vals..vals + 2].copy_from_slice(&0x7f80u16.to_le_bytes());
        let e = check(topk, &bytes, n).unwrap_err();
        assert_eq!(e.field, "value");
        let n = 600;
        let enc = |codec| encode_share(codec, &mut values(n, 1), 0.5, 1, Vec::new());
        let mut bytes = enc(Compression::Bf16);
        bytes[2..4].copy_from_slice(&0x7f80u16.to_le_bytes());
        assert_eq!(
            check(Compression::Bf16, &bytes, n).unwrap_err().field,
            "value"
        );
    }
}
