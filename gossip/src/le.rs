//! Little-endian payloads: the `f32` helpers every decoder of plain values
//! shares (the p2p payloads and the codecs' plain case) and the `u64` word
//! conversions of the all-gather (the p2p ring and the compressed average),
//! below all of them.

/// `f32` exponent bits: all ones means infinity or NaN.
pub(crate) const EXP: u32 = 0x7f80_0000;

/// A word whose top bit is set when `bits` is an `f32` infinity or NaN:
/// its exponent bits plus one unit of exponent carry into bit 31 only when
/// they are all ones. Or-ed over a block and tested once, it vectorises to
/// an and, an add and an or a word.
#[inline]
pub(crate) fn non_finite_flag(bits: u32) -> u32 {
    (bits & EXP).wrapping_add(1 << 23)
}

/// Whether a word of [`non_finite_flag`]s or-ed together saw one.
#[inline]
pub(crate) fn flagged(flags: u32) -> bool {
    flags & (1 << 31) != 0
}

/// The first non-finite element of an `f32` LE payload, if any.
pub fn first_non_finite(bytes: &[u8]) -> Option<(usize, f32)> {
    let bad = bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .position(|bits| flagged(non_finite_flag(bits)))?;
    let v = f32::from_le_bytes(bytes[4 * bad..4 * bad + 4].try_into().unwrap());
    Some((bad, v))
}

/// `dst[i] += payload[i]` for an `f32` LE payload ([`add_scaled_bytes`] by
/// 1, an exact multiply the compiler drops).
pub fn add_bytes(dst: &mut [f32], payload: &[u8]) {
    add_scaled_bytes(dst, 1.0, payload);
}

/// `dst[i] += q * payload[i]` (LE `f32`s), the product rounded first: the
/// bits of adding a payload its sender had scaled by `q`.
#[inline]
pub fn add_scaled_bytes(dst: &mut [f32], q: f32, payload: &[u8]) {
    for (d, w) in dst.iter_mut().zip(payload.chunks_exact(4)) {
        *d += f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * q;
    }
}

/// `dst[i] = p * dst[i] + q * payload[i]` (LE `f32`s), each product
/// rounded, then the sum (no fused multiply-add): the bits of scaling `dst`
/// first and then adding a payload its sender had scaled by `q` (1 for one
/// sent scaled).
pub fn scale_add_bytes(dst: &mut [f32], p: f32, q: f32, payload: &[u8]) {
    for (d, w) in dst.iter_mut().zip(payload.chunks_exact(4)) {
        let scaled = *d * p;
        *d = scaled + f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * q;
    }
}

/// `values` as little-endian bytes.
pub(crate) fn u64_to_bytes(values: &[u64]) -> Vec<u8> {
    if cfg!(target_endian = "little") {
        // One copy of memory that already holds these bytes.
        bytemuck::cast_slice(values).to_vec()
    } else {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}

/// Little-endian `u64` words of `bytes` (a trailing partial word is left
/// out).
pub(crate) fn bytes_to_u64(bytes: &[u8]) -> Vec<u64> {
    let mut out = vec![0u64; bytes.len() / 8];
    if cfg!(target_endian = "little") {
        let whole = 8 * out.len();
        bytemuck::cast_slice_mut::<u64, u8>(&mut out).copy_from_slice(&bytes[..whole]);
    } else {
        for (o, w) in out.iter_mut().zip(bytes.chunks_exact(8)) {
            *o = u64::from_le_bytes(w.try_into().expect("chunks of 8"));
        }
    }
    out
}
