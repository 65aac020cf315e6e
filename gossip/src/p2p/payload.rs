//! Payload bytes: conversion, the streaming checksum and finiteness scan,
//! and a small pool of buffers.
//!
//! A model-sized message touches memory a few times on each side; these
//! helpers keep it to as few passes as possible, each over data that is
//! still in cache (convert and checksum a block at a time, scan each block
//! right after it was read), and recycle buffers so that a 100 MB share does
//! not cost 25 000 fresh page faults every round.

use std::sync::Mutex;

use crate::compress::{self, CodecError, Compression};
pub use crate::le::{add_bytes, first_non_finite};
use crate::le::{flagged, non_finite_flag};
use crate::sync::lock;

const LANES: usize = 8;
/// Floats converted (and checksummed) per block while sending.
const BLOCK: usize = 4096;

/// Fletcher-style 64-bit checksum over 32-bit LE words in eight independent
/// lanes (word k goes to lane k mod 8), fed in pieces, noting any infinity
/// or NaN on the way. A trailing partial word is zero-padded.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    a: [u64; LANES],
    b: [u64; LANES],
    words: usize,
    bytes: u64,
    non_finite: bool,
}

impl Scan {
    /// Feeds the next bytes; every call but the last must hold whole words.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.bytes += bytes.len() as u64;
        let mut i = 0;
        while !self.words.is_multiple_of(LANES) && i + 4 <= bytes.len() {
            self.word(u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap()));
            i += 4;
        }
        let mut blocks = bytes[i..].chunks_exact(4 * LANES);
        let mut bad = 0u32;
        for block in &mut blocks {
            for lane in 0..LANES {
                let w = u32::from_le_bytes(block[4 * lane..4 * lane + 4].try_into().unwrap());
                self.a[lane] = self.a[lane].wrapping_add(w as u64);
                self.b[lane] = self.b[lane].wrapping_add(self.a[lane]);
                bad |= non_finite_flag(w);
            }
            self.words += LANES;
        }
        self.non_finite |= flagged(bad);
        for word in blocks.remainder().chunks(4) {
            let mut padded = [0u8; 4];
            padded[..word.len()].copy_from_slice(word);
            self.word(u32::from_le_bytes(padded));
        }
    }

    #[inline]
    fn word(&mut self, w: u32) {
        let lane = self.words % LANES;
        self.a[lane] = self.a[lane].wrapping_add(w as u64);
        self.b[lane] = self.b[lane].wrapping_add(self.a[lane]);
        self.non_finite |= flagged(non_finite_flag(w));
        self.words += 1;
    }

    /// The checksum of everything fed.
    pub fn checksum(&self) -> u64 {
        let mut sum = self.bytes.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for lane in 0..LANES {
            sum = sum.rotate_left(7) ^ self.a[lane];
            sum = sum.rotate_left(13) ^ self.b[lane];
        }
        sum
    }

    /// Whether any whole word fed was an `f32` infinity or NaN.
    pub fn non_finite(&self) -> bool {
        self.non_finite
    }
}

/// Checksum of a whole payload (see [`Scan`]).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut s = Scan::default();
    s.feed(bytes);
    s.checksum()
}

/// Whether an `f32` LE payload holds an infinity or NaN: a pass without
/// early exit that the compiler vectorises, for data just read.
pub fn has_non_finite(bytes: &[u8]) -> bool {
    bytes.chunks(16 << 10).any(|block| {
        flagged(block.chunks_exact(4).fold(0, |bad, w| {
            bad | non_finite_flag(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        }))
    })
}

/// `floats` as LE bytes in `buf` (reused), for the data lane: its records
/// are authenticated, so no checksum (the header's stays 0).
pub fn encode_f32_unchecked(floats: &[f32], mut buf: Vec<u8>) -> Vec<u8> {
    buf.clear();
    // Appended, not written over zeros: a fresh buffer is filled once.
    #[cfg(target_endian = "little")]
    buf.extend_from_slice(bytemuck::cast_slice(floats));
    #[cfg(not(target_endian = "little"))]
    buf.extend(floats.iter().flat_map(|v| v.to_le_bytes()));
    buf
}

/// Encodes a payload for the node's transport: checksummed for libp2p
/// streams, a plain copy for the data lane.
pub(crate) fn encode_for(lane: bool, floats: &[f32], buf: Vec<u8>) -> (Vec<u8>, u64) {
    if lane {
        (encode_f32_unchecked(floats, buf), 0)
    } else {
        encode_f32(floats, buf)
    }
}

/// Multiplies `floats` by `factor` in place and encodes the result for the
/// node's transport ([`encode_for`]) in the same pass, a cache-sized block
/// at a time: the push-sum share is written while the scaled values are
/// still in cache.
pub(crate) fn scale_and_encode(
    lane: bool,
    floats: &mut [f32],
    factor: f32,
    buf: Vec<u8>,
) -> (Vec<u8>, u64) {
    let mut buf = sized(buf, 4 * floats.len());
    let mut scan = Scan::default();
    for (dst, src) in buf.chunks_mut(4 * BLOCK).zip(floats.chunks_mut(BLOCK)) {
        for (d, v) in dst.chunks_exact_mut(4).zip(src.iter_mut()) {
            *v *= factor;
            d.copy_from_slice(&v.to_le_bytes());
        }
        if !lane {
            scan.feed(dst);
        }
    }
    (buf, if lane { 0 } else { scan.checksum() })
}

/// `floats` as little-endian bytes in a new buffer.
pub fn f32_to_bytes(floats: &[f32]) -> Vec<u8> {
    encode_f32(floats, Vec::new()).0
}

/// `buf` resized to `n` bytes, zero-filling only what it did not hold.
pub(crate) fn sized(mut buf: Vec<u8>, n: usize) -> Vec<u8> {
    if buf.len() >= n {
        buf.truncate(n);
    } else {
        buf.resize(n, 0);
    }
    buf
}

/// Writes `floats` as LE bytes into `buf` (reused) and checksums them in the
/// same pass, a cache-sized block at a time.
pub fn encode_f32(floats: &[f32], buf: Vec<u8>) -> (Vec<u8>, u64) {
    let mut buf = sized(buf, 4 * floats.len());
    let mut scan = Scan::default();
    for (dst, src) in buf.chunks_mut(4 * BLOCK).zip(floats.chunks(BLOCK)) {
        for (d, v) in dst.chunks_exact_mut(4).zip(src) {
            d.copy_from_slice(&v.to_le_bytes());
        }
        scan.feed(dst);
    }
    (buf, scan.checksum())
}

/// `dst[i] = payload[i]` for an `f32` LE payload (as many as both hold).
pub fn copy_bytes(dst: &mut [f32], payload: &[u8]) {
    #[cfg(target_endian = "little")]
    {
        let n = dst.len().min(payload.len() / 4);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut dst[..n]);
        bytes.copy_from_slice(&payload[..4 * n]);
    }
    #[cfg(not(target_endian = "little"))]
    for (d, w) in dst.iter_mut().zip(payload.chunks_exact(4)) {
        *d = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    }
}

/// A push-sum share as it came off the wire: `f32` LE bytes from the pool,
/// in one piece (a libp2p stream) or in parts at their element offsets (the
/// data lane), added straight from the bytes (each value times the share's
/// scale, when the sender sent its `x` unscaled); or a compressed share of
/// `floats` values in one piece, checked, added through its decoder.
pub(crate) struct LeBytes {
    parts: Vec<(usize, Vec<u8>)>,
    coded: Option<(Compression, usize)>,
    scale: Option<f32>,
}

impl LeBytes {
    pub fn whole(bytes: Vec<u8>) -> Self {
        Self::parts(vec![(0, bytes)])
    }

    /// Parts that cover the share in order, each at its element offset.
    pub fn parts(parts: Vec<(usize, Vec<u8>)>) -> Self {
        Self {
            parts,
            coded: None,
            scale: None,
        }
    }

    /// The same plain values, each to be added times `scale` (a share whose
    /// sender sent its `x` unscaled, with the factor).
    pub fn scaled_by(self, scale: Option<f32>) -> Self {
        debug_assert!(self.coded.is_none() || scale.is_none());
        Self { scale, ..self }
    }

    /// A whole share of `floats` values read for a run whose shares use
    /// `codec`: a compressed one is checked in full first.
    pub fn share(codec: Compression, floats: usize, bytes: Vec<u8>) -> Result<Self, CodecError> {
        if codec.is_none() {
            return Ok(Self::whole(bytes));
        }
        compress::check(codec, &bytes, floats)?;
        Ok(Self {
            parts: vec![(0, bytes)],
            coded: Some((codec, floats)),
            scale: None,
        })
    }

    /// Gives the buffers back to `pool`.
    pub fn recycle(self, pool: &BufferPool) {
        for (_, b) in self.parts {
            pool.give(b);
        }
    }
}

impl crate::ledger::SharePayload for LeBytes {
    fn floats(&self) -> usize {
        match self.coded {
            Some((_, floats)) => floats,
            None => self.parts.iter().map(|(_, b)| b.len() / 4).sum(),
        }
    }

    fn add_into(&self, x: &mut [f32]) {
        if let Some((codec, _)) = self.coded {
            for (_, bytes) in &self.parts {
                compress::add_decoded(codec, bytes, x);
            }
            return;
        }
        // A share sent scaled is added times 1: an exact multiply.
        let q = self.scale.unwrap_or(1.0);
        for (offset, bytes) in &self.parts {
            if let Some(dst) = x.get_mut(*offset..) {
                crate::le::add_scaled_bytes(dst, q, bytes);
            }
        }
    }

    fn scale_add_into(&self, p: f32, x: &mut [f32]) {
        // Parts that cover `x` end to end: one pass, scaling as it adds.
        let mut at = 0;
        let whole = self.coded.is_none()
            && self.parts.iter().all(|(offset, bytes)| {
                let ok = *offset == at;
                at += bytes.len() / 4;
                ok
            })
            && at == x.len();
        if !whole {
            crate::ledger::scale(x, p);
            self.add_into(x);
            return;
        }
        let q = self.scale.unwrap_or(1.0);
        for (offset, bytes) in &self.parts {
            crate::le::scale_add_bytes(&mut x[*offset..], p, q, bytes);
        }
    }
}

/// Recycled payload buffers, bounded in count and bytes.
pub(crate) struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    max_buffers: usize,
    max_bytes: usize,
}

impl BufferPool {
    pub fn new(max_buffers: usize, max_bytes: usize) -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            max_buffers,
            max_bytes,
        }
    }

    /// The smallest pooled buffer that holds `want` bytes without
    /// reallocating, else a new one of that capacity: a smaller pooled
    /// buffer is not grown (that would copy its old bytes and fault in
    /// fresh pages for nothing).
    pub fn take(&self, want: usize) -> Vec<u8> {
        let mut free = lock(&self.free);
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= want)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => free.swap_remove(i),
            None => Vec::with_capacity(want),
        }
    }

    /// Returns a buffer for reuse. A pool holding its count of buffers
    /// keeps the larger ones (the smallest held makes room for a larger
    /// one); a buffer over the byte budget is dropped.
    pub fn give(&self, buf: Vec<u8>) {
        if buf.capacity() == 0 {
            return;
        }
        let mut free = lock(&self.free);
        if free.len() >= self.max_buffers {
            let smallest = free
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, b)| (i, b.capacity()));
            match smallest {
                Some((i, cap)) if cap < buf.capacity() => {
                    free.swap_remove(i);
                }
                _ => return,
            }
        }
        let held: usize = free.iter().map(|b| b.capacity()).sum();
        if held + buf.capacity() <= self.max_bytes {
            free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_sees_swapped_and_changed_words() {
        let a = f32_to_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        let b = f32_to_bytes(&[2.0, 1.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        let c = f32_to_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.5]);
        assert_ne!(checksum(&a), checksum(&b));
        assert_ne!(checksum(&a), checksum(&c));
        assert_ne!(checksum(&a), checksum(&a[..36]));
    }

    #[test]
    fn fed_in_pieces_or_at_once_the_checksum_is_the_same() {
        let x: Vec<f32> = (0..10_007).map(|i| i as f32 * 0.25 - 7.0).collect();
        let (bytes, sum) = encode_f32(&x, vec![9u8; 3]);
        assert_eq!(
            bytes,
            x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()
        );
        assert_eq!(sum, checksum(&bytes));
        for piece in [4, 12, 36, 4000] {
            let mut s = Scan::default();
            for p in bytes.chunks(piece) {
                s.feed(p);
            }
            assert_eq!(s.checksum(), sum, "pieces of {piece}");
            assert!(!s.non_finite());
        }
    }

    #[test]
    fn scaling_while_encoding_gives_the_bits_of_scaling_then_encoding() {
        let x: Vec<f32> = (0..10_007).map(|i| i as f32 * 0.37 - 11.0).collect();
        let mut scaled = x.clone();
        scaled.iter_mut().for_each(|v| *v *= 1.0 / 3.0);
        for lane in [false, true] {
            let mut y = x.clone();
            let (bytes, sum) = scale_and_encode(lane, &mut y, 1.0 / 3.0, vec![1u8; 17]);
            assert!(
                y.iter()
                    .zip(&scaled)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            assert_eq!((bytes, sum), encode_for(lane, &scaled, Vec::new()));
        }
    }

    #[test]
    fn a_share_sent_unscaled_adds_the_bits_of_the_scaled_one() {
        use crate::ledger::SharePayload;
        // Values whose products by 1/3 round, subnormals and signed zeros.
        let s: Vec<f32> = (0..10_007)
            .map(|i| match i % 5 {
                0 => f32::from_bits(i as u32 + 1),
                1 => -0.0,
                _ => (i as f32 * 0.37 - 11.0) * 1.7e-3,
            })
            .collect();
        let x: Vec<f32> = (0..10_007).map(|i| i as f32 * -0.11 + 3.0).collect();
        let q = 1.0f32 / 3.0;
        let p = 1.0f32 / 7.0;
        let scaled: Vec<f32> = s.iter().map(|v| v * q).collect();
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        // In parts, whole and with a gap before the last (the slow path).
        let cut = |v: &[f32], gap: bool| {
            let bytes = f32_to_bytes(v);
            let parts = vec![(0, bytes[..4000].to_vec()), (1000, bytes[4000..].to_vec())];
            match gap {
                false => parts,
                true => vec![parts[0].clone()],
            }
        };
        for gap in [false, true] {
            let want = LeBytes::parts(cut(&scaled, gap));
            let got = LeBytes::parts(cut(&s, gap)).scaled_by(Some(q));
            let (mut a, mut b) = (x.clone(), x.clone());
            want.add_into(&mut a);
            got.add_into(&mut b);
            assert_eq!(bits(&a), bits(&b), "add, gap {gap}");
            let (mut a, mut b) = (x.clone(), x.clone());
            want.scale_add_into(p, &mut a);
            got.scale_add_into(p, &mut b);
            assert_eq!(bits(&a), bits(&b), "scale and add, gap {gap}");
        }
    }

    #[test]
    fn non_finite_values_are_found() {
        assert_eq!(
            first_non_finite(&f32_to_bytes(&[1.0, f32::MAX, -0.0])),
            None
        );
        assert_eq!(
            first_non_finite(&f32_to_bytes(&[1.0, f32::INFINITY]))
                .unwrap()
                .0,
            1
        );
        assert_eq!(first_non_finite(&f32_to_bytes(&[f32::NAN])).unwrap().0, 0);
        let mut s = Scan::default();
        s.feed(&f32_to_bytes(&[0.0; 20]));
        s.feed(&f32_to_bytes(&[f32::NEG_INFINITY]));
        assert!(s.non_finite());
        // Every exponent at its edges, both signs, each alone in a long
        // finite payload (the block-wise scans) and at each place of a block.
        for exp in 0u32..256 {
            for mantissa in [0, 1, 0x40_0000, 0x7f_ffff] {
                for sign in [0, 1 << 31] {
                    let bits = sign | exp << 23 | mantissa;
                    let v = f32::from_bits(bits);
                    let mut xs = vec![1.5f32; 40];
                    xs[(exp as usize + mantissa as usize) % 40] = v;
                    let bytes = f32_to_bytes(&xs);
                    let bad = !v.is_finite();
                    assert_eq!(has_non_finite(&bytes), bad, "{bits:#010x}");
                    assert_eq!(first_non_finite(&bytes).is_some(), bad, "{bits:#010x}");
                    let mut s = Scan::default();
                    s.feed(&bytes);
                    assert_eq!(s.non_finite(), bad, "{bits:#010x}");
                }
            }
        }
    }

    #[test]
    fn the_pool_reuses_and_stays_bounded() {
        let pool = BufferPool::new(2, 1000);
        pool.give(vec![0u8; 100]);
        pool.give(vec![0u8; 600]);
        pool.give(vec![0u8; 50]); // over the count
        assert_eq!(pool.take(500).len(), 600);
        pool.give(vec![0u8; 950]); // over the bytes
        assert_eq!(pool.take(10).len(), 100);
        assert!(pool.take(10).is_empty());
    }

    #[test]
    fn the_pool_hands_out_the_best_fit_and_never_grows_a_small_buffer() {
        let pool = BufferPool::new(3, 10_000);
        pool.give(Vec::with_capacity(100));
        pool.give(Vec::with_capacity(4000));
        pool.give(Vec::with_capacity(1000));
        assert_eq!(pool.take(900).capacity(), 1000);
        // Nothing held fits: a new buffer, and the small ones stay.
        assert!(pool.take(5000).capacity() >= 5000);
        assert_eq!(pool.take(50).capacity(), 100);
        assert_eq!(pool.take(50).capacity(), 4000);
        // A full pool makes room for a larger buffer, not a smaller one.
        for cap in [10, 20, 30] {
            pool.give(Vec::with_capacity(cap));
        }
        pool.give(Vec::with_capacity(5));
        pool.give(Vec::with_capacity(300));
        let mut held: Vec<usize> = (0..3).map(|_| pool.take(0).capacity()).collect();
        held.sort();
        assert_eq!(held, [20, 30, 300]);
    }
}
