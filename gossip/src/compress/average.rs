//! The compressed exact average (`--compress-average`; docs/algorithm.md,
//! "Compressed exact averages"), written once over [`Communicator`]'s
//! exchange and all-gather so that both transports run the same code.
//!
//! Worker `i` encodes its pseudo-gradient plus what it kept last time,
//! `g_i = anchor * w_i - x_i + e_i`, keeps `e_i = g_i - D(Q(g_i))`, and
//! contributes `w_i` (its exact bits) and the bytes of `Q(g_i)`. The result
//! is `x = anchor - S / (w_0 + w_1 + ...)`, the weights summed in rank
//! order, where `S` is the decoded sum of the contributions, made in one
//! fixed order, so that every worker ends with the same bits:
//! - int8 and bf16 over 2 to 16 ranks ([`reduced_average`]): segment `j`
//!   of every `g_i` is coded for rank `j`, which sums the decoded codes in
//!   rank order and codes the sum again (keeping what that coding missed
//!   in its own residual); the coded sums are all-gathered (straight to
//!   every rank up to [`DIRECT_MAX_BYTES`] in all, else round the ring).
//!   About the f32 all-reduce's traffic, in the codec's bytes.
//! - otherwise ([`gathered_average`]): every contribution goes to every
//!   rank, which sums them decoded in rank order (top-k, whose sums are
//!   dense).
//!
//! Without compression error this is `sum x_i / sum w_i`, the exact average.

use std::borrow::Cow;

use super::{Compression, add_decoded, append_dense, check, encode_share, encoded_bytes};
use crate::{
    CommError, Communicator, DIRECT_MAX_BYTES, DIRECT_MAX_RANKS, segment, sum_scalars_in_rank_order,
};

/// `bytes` as little-endian `u64` words, the last one zero-padded.
fn to_words(bytes: &[u8], out: &mut Vec<u64>) {
    let start = out.len();
    out.resize(start + bytes.len().div_ceil(8), 0);
    if cfg!(target_endian = "little") {
        bytemuck::cast_slice_mut::<u64, u8>(&mut out[start..])[..bytes.len()]
            .copy_from_slice(bytes);
    } else {
        for (o, chunk) in out[start..].iter_mut().zip(bytes.chunks(8)) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            *o = u64::from_le_bytes(word);
        }
    }
}

/// The first `len` bytes of `words` (their little-endian bytes, borrowed
/// where memory already holds them so), or why they cannot be a payload of
/// `len` bytes (the count of words, nonzero padding).
fn from_words(words: &[u64], len: usize) -> Result<Cow<'_, [u8]>, String> {
    if words.len() != len.div_ceil(8) {
        return Err(format!(
            "{} words where a payload of {len} bytes takes {}",
            words.len(),
            len.div_ceil(8)
        ));
    }
    let bytes: Cow<'_, [u8]> = if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(words))
    } else {
        Cow::Owned(crate::le::u64_to_bytes(words))
    };
    if bytes[len..].iter().any(|b| *b != 0) {
        return Err("nonzero padding after the payload".into());
    }
    Ok(match bytes {
        Cow::Borrowed(b) => Cow::Borrowed(&b[..len]),
        Cow::Owned(mut v) => {
            v.truncate(len);
            Cow::Owned(v)
        }
    })
}

/// The compressed exact average of `(x, w)` around `anchor` with this
/// worker's error-feedback `residual` (see the module docs). A collective:
/// every rank calls it with the same codec and length. A contribution that
/// does not fit (its weight, its length, a scale, an index or a value) is an
/// error naming the rank and the field, on every rank; `x` and `w` are then
/// unchanged (the residual already holds the new error, and the failed
/// outer step is rolled back by the caller).
pub fn compressed_average(
    comm: &mut dyn Communicator,
    codec: Compression,
    x: &mut [f32],
    w: &mut f64,
    anchor: &[f32],
    residual: &mut [f32],
) -> Result<(), CommError> {
    let n = x.len();
    if codec.is_none() || anchor.len() != n || residual.len() != n {
        return Err(CommError::Misuse(format!(
            "compressed average of {n} values with codec {codec}, an anchor of {} and a \
             residual of {}",
            anchor.len(),
            residual.len()
        )));
    }
    let m = comm.world_size();
    if reduces(codec, m) {
        reduced_average(comm, codec, x, w, anchor, residual)
    } else {
        gathered_average(comm, codec, x, w, anchor, residual)
    }
}

/// Whether the average of `codec` over `m` ranks goes as a reduce-scatter
/// of codes and a gather of coded sums ([`reduced_average`]): for the dense
/// codecs over 2 to [`DIRECT_MAX_RANKS`] ranks (each rank sends to every
/// other, as the direct all-reduce does). The sum of top-k codes is dense,
/// so top-k, and runs of more ranks, all-gather the contributions. Every
/// rank decides alike.
fn reduces(codec: Compression, m: usize) -> bool {
    matches!(codec, Compression::Bf16 | Compression::Int8) && (2..=DIRECT_MAX_RANKS).contains(&m)
}

/// The contribution `g` (in `residual`) all-gathered: every rank decodes
/// and sums every contribution.
fn gathered_average(
    comm: &mut dyn Communicator,
    codec: Compression,
    x: &mut [f32],
    w: &mut f64,
    anchor: &[f32],
    residual: &mut [f32],
) -> Result<(), CommError> {
    let n = x.len();
    pseudo_gradient(residual, anchor, x, *w);
    let bytes = encode_share(codec, residual, 1.0, 1, Vec::new());
    let len = encoded_bytes(codec, n);
    debug_assert_eq!(bytes.len(), len);
    let mut mine = Vec::with_capacity(1 + len.div_ceil(8));
    mine.push(w.to_bits());
    to_words(&bytes, &mut mine);
    let gathered = gather_in_pieces(comm, &mine, n)?;
    // Every contribution is checked before `x` is touched.
    let mut weights = Vec::with_capacity(gathered.len());
    let mut payloads = Vec::with_capacity(gathered.len());
    for (rank, words) in gathered.iter().enumerate() {
        let (weight, payload) = contribution(codec, words, n)
            .map_err(|what| refused(rank, &format!("its contribution ({codec}): {what}")))?;
        weights.push(weight);
        payloads.push(payload);
    }
    // The sum in rank order, made in `x` itself (no fresh buffer to fault
    // in), then `x = anchor - sum / W`.
    x.fill(0.0);
    for payload in &payloads {
        add_decoded(codec, payload, x);
    }
    finish(x, w, anchor, sum_scalars_in_rank_order(weights));
    Ok(())
}

/// `e += anchor * f32(w) - x`: the pseudo-gradient plus what was kept.
fn pseudo_gradient(e: &mut [f32], anchor: &[f32], x: &[f32], w: f64) {
    let wf = w as f32;
    for ((e, a), v) in e.iter_mut().zip(anchor).zip(x) {
        *e += *a * wf - *v;
    }
}

/// Values per piece of the reduce-scatter's fused passes: a multiple of the
/// int8 block (so that pieces code as the whole does), small enough that a
/// piece stays in cache between its two passes.
const PIECE: usize = 16 * super::INT8_BLOCK;

/// The bytes of values `at..at + len` in a dense (bf16, int8) code, for
/// `at` a multiple of [`PIECE`].
fn piece_bytes(codec: Compression, at: usize, len: usize) -> std::ops::Range<usize> {
    let start = encoded_bytes(codec, at);
    start..start + encoded_bytes(codec, len)
}

/// `x = anchor - sum / total`, `w = 1`.
fn finish(x: &mut [f32], w: &mut f64, anchor: &[f32], total: f64) {
    let inv = (1.0 / total) as f32;
    for (v, a) in x.iter_mut().zip(anchor) {
        *v = *a - *v * inv;
    }
    *w = 1.0;
}

fn refused(rank: usize, what: &str) -> CommError {
    CommError::Protocol(format!("compressed average: rank {rank}'s {what}"))
}

/// A contribution's weight and coded values of `n` values, checked: `words`
/// is the weight's bits, then the code's bytes as words.
fn contribution(
    codec: Compression,
    words: &[u64],
    n: usize,
) -> Result<(f64, Cow<'_, [u8]>), String> {
    let (&weight, payload) = words.split_first().ok_or("it is empty")?;
    let weight = f64::from_bits(weight);
    if !(weight.is_finite() && weight > 0.0) {
        return Err(format!("weight {weight}, expected a finite number > 0"));
    }
    let payload = from_words(payload, encoded_bytes(codec, n))?;
    check(codec, &payload, n).map_err(|e| e.to_string())?;
    Ok((weight, payload))
}

/// The average as a compressed reduce-scatter and a gather of coded sums:
/// rank `i` codes segment `j` of its `g_i` for rank `j` (keeping the
/// coding error in its residual); rank `j` checks the `m` codes of its
/// segment, sums them decoded in rank order, codes the sum (keeping that
/// error in its own residual: it contributes it again next time) and the
/// coded sums are all-gathered. Every rank decodes the same sums: the same
/// bits everywhere. Each rank sends and receives about `2 (m - 1) / m` of
/// a coded model, as the f32 all-reduce does of the f32 one, and decodes
/// about `2 n` values instead of `m n`.
fn reduced_average(
    comm: &mut dyn Communicator,
    codec: Compression,
    x: &mut [f32],
    w: &mut f64,
    anchor: &[f32],
    residual: &mut [f32],
) -> Result<(), CommError> {
    let (n, m, me) = (x.len(), comm.world_size(), comm.rank());
    // The pseudo-gradient and its code in one pass, piece by piece.
    let blocks: Vec<Vec<u64>> = (0..m)
        .map(|j| {
            let seg = segment(n, m, j);
            let mut bytes = Vec::with_capacity(encoded_bytes(codec, seg.len()));
            for at in seg.clone().step_by(PIECE) {
                let piece = at..(at + PIECE).min(seg.end);
                let e = &mut residual[piece.clone()];
                pseudo_gradient(e, &anchor[piece.clone()], &x[piece], *w);
                append_dense(codec, e, 1.0, 1.0, &mut bytes);
            }
            let mut words = Vec::with_capacity(1 + bytes.len().div_ceil(8));
            words.push(w.to_bits());
            to_words(&bytes, &mut words);
            words
        })
        .collect();
    let got = comm.exchange_u64(&blocks)?;
    drop(blocks);
    let mine = segment(n, m, me);
    // Every rank's reply has the same length, so that all gather it in the
    // same number of pieces.
    let reply_words = 2 + encoded_bytes(codec, n.div_ceil(m)).div_ceil(8);
    let mut reply = Vec::with_capacity(reply_words);
    match reduce_segment(codec, &got, mine.len()) {
        Ok((total, mut sum)) => {
            let bytes = encode_share(codec, &mut sum, 1.0, 1, Vec::new());
            // What the coded sum missed is this rank's to send again.
            for (e, lost) in residual[mine].iter_mut().zip(&sum) {
                *e += *lost;
            }
            reply.extend([SUMMED, total.to_bits()]);
            to_words(&bytes, &mut reply);
        }
        Err(why) => {
            let room = 8 * (reply_words - 2);
            let cut = (0..=why.len().min(room))
                .rev()
                .find(|i| why.is_char_boundary(*i))
                .unwrap_or(0);
            reply.extend([REFUSED, cut as u64]);
            to_words(&why.as_bytes()[..cut], &mut reply);
        }
    }
    reply.resize(reply_words, 0);
    // A small model's sums go straight to every rank (one hop, as the
    // direct all-reduce's do); a large one's round the ring in pieces.
    let sums = if 8 * m * reply_words <= DIRECT_MAX_BYTES {
        comm.exchange_u64(&vec![reply; m])?
    } else {
        gather_in_pieces(comm, &reply, n)?
    };
    drop(got);
    let (total, payloads) = read_sums(codec, &sums, n)?;
    // Decoded and finished piece by piece: `x = anchor - S / W`.
    let inv = (1.0 / total) as f32;
    for (j, payload) in payloads.iter().enumerate() {
        let seg = segment(n, m, j);
        for at in (0..seg.len()).step_by(PIECE) {
            let len = PIECE.min(seg.len() - at);
            let piece = seg.start + at..seg.start + at + len;
            let v = &mut x[piece.clone()];
            v.fill(0.0);
            add_decoded(codec, &payload[piece_bytes(codec, at, len)], v);
            for (v, a) in v.iter_mut().zip(&anchor[piece]) {
                *v = *a - *v * inv;
            }
        }
    }
    *w = 1.0;
    Ok(())
}

/// The first word of a rank's coded sum: the sum follows.
pub(crate) const SUMMED: u64 = 0;
/// The first word of a rank that refused a contribution: the length of its
/// reason, then the reason's bytes.
pub(crate) const REFUSED: u64 = 1;

/// A segment's contributions (`got[i]` from rank `i`: its weight, then its
/// code of the segment's `len` values) checked, decoded and summed in rank
/// order; also the sum of the weights in rank order. The error names the
/// rank and the field.
pub(crate) fn reduce_segment(
    codec: Compression,
    got: &[Vec<u64>],
    len: usize,
) -> Result<(f64, Vec<f32>), String> {
    let mut weights = Vec::with_capacity(got.len());
    let mut sum = vec![0f32; len];
    let mut payloads = Vec::with_capacity(got.len());
    for (rank, words) in got.iter().enumerate() {
        let (weight, payload) = contribution(codec, words, len)
            .map_err(|what| format!("rank {rank}'s contribution ({codec}): {what}"))?;
        weights.push(weight);
        payloads.push(payload);
    }
    for payload in &payloads {
        add_decoded(codec, payload, &mut sum);
    }
    if let Some(v) = sum.iter().find(|v| !v.is_finite()) {
        return Err(format!(
            "sum of its segment ({codec}) overflowed to {v}: the contributions are too large"
        ));
    }
    Ok((sum_scalars_in_rank_order(weights), sum))
}

/// The gathered coded sums (`sums[j]` from rank `j`, of segment `j`), all
/// checked: the sum of the weights, which every rank must report alike,
/// and each segment's code. A refusal, or a sum that does not fit, is an
/// error naming the rank.
#[allow(clippy::type_complexity)]
pub(crate) fn read_sums(
    codec: Compression,
    sums: &[Vec<u64>],
    n: usize,
) -> Result<(f64, Vec<Cow<'_, [u8]>>), CommError> {
    let m = sums.len();
    let mut total: Option<f64> = None;
    let mut payloads = Vec::with_capacity(m);
    for (rank, words) in sums.iter().enumerate() {
        let bad = |what: String| refused(rank, &format!("sum of its segment ({codec}): {what}"));
        match words.first() {
            Some(&REFUSED) => {
                let len = words.get(1).copied().unwrap_or(0);
                let rest = &words[2.min(words.len())..];
                let why = usize::try_from(len)
                    .ok()
                    .filter(|len| len.div_ceil(8) <= rest.len())
                    .and_then(|len| from_words(&rest[..len.div_ceil(8)], len).ok())
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_else(|| "(an unreadable reason)".into());
                return Err(CommError::Protocol(format!(
                    "compressed average: rank {rank} refused it: {why}"
                )));
            }
            Some(&SUMMED) => {}
            other => return Err(bad(format!("it begins with {other:?}, not 0 or 1"))),
        }
        let len = segment(n, m, rank).len();
        // The weights' sum and the code, then zeros to the common length.
        let used = 2 + encoded_bytes(codec, len).div_ceil(8);
        if words.len() < used || words[used..].iter().any(|w| *w != 0) {
            return Err(bad(format!(
                "{} words where its sum takes {used} and zeros after",
                words.len()
            )));
        }
        let (weights, payload) = contribution(codec, &words[1..used], len).map_err(bad)?;
        match total {
            Some(t) if t.to_bits() != weights.to_bits() => {
                return Err(bad(format!(
                    "the weights add up to {weights} there and to {t} at rank 0"
                )));
            }
            _ => total = Some(weights),
        }
        payloads.push(payload);
    }
    let total =
        total.ok_or_else(|| CommError::Protocol("compressed average of no ranks".into()))?;
    Ok((total, payloads))
}

/// Every rank's `words`, gathered in pieces that fit a message of the run
/// (at most `4 n` bytes each, the size of one share of the model).
fn gather_in_pieces(
    comm: &mut dyn Communicator,
    words: &[u64],
    n: usize,
) -> Result<Vec<Vec<u64>>, CommError> {
    let per = (n / 2).max(1);
    let mut all: Vec<Vec<u64>> = Vec::new();
    for piece in words.chunks(per) {
        let got = comm.all_gather_u64(piece)?;
        if all.is_empty() {
            all = got;
        } else if got.len() != all.len() {
            return Err(CommError::Protocol(format!(
                "the compressed average's pieces came from {} and then {} ranks",
                all.len(),
                got.len()
            )));
        } else {
            for (a, g) in all.iter_mut().zip(got) {
                a.extend(g);
            }
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryNetwork;

    #[test]
    fn words_round_trip_and_bad_padding_is_refused() {
        let bytes: Vec<u8> = (1..=13).collect();
        let mut words = Vec::new();
        to_words(&bytes, &mut words);
        assert_eq!(words.len(), 2);
        assert_eq!(*from_words(&words, 13).unwrap(), bytes[..]);
        assert!(
            from_words(&words, 12)
                .unwrap_err()
                .contains("nonzero padding")
        );
        assert!(from_words(&words[..1], 13).unwrap_err().contains("takes 2"));
    }

    #[test]
    fn every_rank_gets_the_same_bits_and_keeps_its_own_error() {
        // The reduce-scatter (int8, bf16; segments of unequal lengths at
        // n = 1001, m = 3; of several fused pieces), and the all-gather
        // (top-k, and 17 ranks).
        for (codec, m, n, most) in [
            (Compression::Int8, 4, 1000, 5e-3),
            (Compression::Int8, 3, 1001, 5e-3),
            (Compression::Int8, 2, 1000, 5e-3),
            (Compression::Bf16, 4, 1000, 2e-2),
            // Segments of several pieces, the last one short.
            (Compression::Int8, 2, 20_000, 5e-3),
            (Compression::Bf16, 3, 30_001, 2e-2),
            // Sums of more than DIRECT_MAX_BYTES: gathered round the ring.
            (Compression::Int8, 2, 1_100_000, 5e-3),
            (Compression::TopK(0.1), 4, 1000, 0.5),
            (Compression::Int8, 17, 1000, 5e-3),
        ] {
            same_bits_and_own_error(codec, m, n, most);
        }
    }

    fn same_bits_and_own_error(codec: Compression, m: usize, n: usize, most: f32) {
        let handles: Vec<_> = MemoryNetwork::new(m, std::time::Duration::from_secs(30))
            .into_iter()
            .map(|mut comm| {
                std::thread::spawn(move || {
                    let r = comm.rank() as f32;
                    let anchor: Vec<f32> = (0..n).map(|i| (i as f32 * 0.01).sin()).collect();
                    let mut x: Vec<f32> = anchor
                        .iter()
                        .enumerate()
                        .map(|(i, a)| a - 0.1 * ((i as f32 + r) * 0.37).cos())
                        .collect();
                    let exact_part = x.clone();
                    let mut w = 1.0;
                    let mut e = vec![0f32; n];
                    compressed_average(&mut comm, codec, &mut x, &mut w, &anchor, &mut e).unwrap();
                    (exact_part, x, e, w)
                })
            })
            .collect();
        let outs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let exact: Vec<f32> = (0..n)
            .map(|i| outs.iter().map(|o| o.0[i]).sum::<f32>() / m as f32)
            .collect();
        for o in &outs {
            assert_eq!(o.3, 1.0);
            assert!(
                o.1.iter()
                    .zip(&outs[0].1)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "every rank ends with the same bits"
            );
        }
        // The average misses the exact one by the mean of the errors kept.
        for (i, exact) in exact.iter().enumerate() {
            let kept: f32 = outs.iter().map(|o| o.2[i]).sum::<f32>() / m as f32;
            let got = outs[0].1[i];
            assert!(
                (got - kept - exact).abs() < 1e-5,
                "{codec} over {m}, {i}: {got} {kept} {exact}"
            );
        }
        let err: f32 = outs[0].2.iter().map(|v| v.abs()).fold(0.0, f32::max);
        assert!(
            err > 0.0 && err < most,
            "{codec} over {m} keeps a small error: {err}"
        );
    }

    /// Rank `rank`'s contribution of `values` to a segment, as it sends it.
    fn block(codec: Compression, weight: f64, values: &[f32]) -> Vec<u64> {
        let mut v = values.to_vec();
        let bytes = encode_share(codec, &mut v, 1.0, 1, Vec::new());
        let mut words = vec![weight.to_bits()];
        to_words(&bytes, &mut words);
        words
    }

    #[test]
    fn a_bad_contribution_to_a_segment_is_refused_naming_its_rank_and_field() {
        let codec = Compression::Int8;
        let values = [0.5f32, -0.25, 1.0];
        let good = || {
            (0..3)
                .map(|_| block(codec, 1.0, &values))
                .collect::<Vec<_>>()
        };
        let (total, sum) = reduce_segment(codec, &good(), 3).unwrap();
        assert_eq!(total, 3.0);
        for (s, v) in sum.iter().zip(values) {
            assert!((s - 3.0 * v).abs() < 0.03, "{sum:?}");
        }
        let mut bad = good();
        bad[1][0] = f64::NAN.to_bits();
        let err = reduce_segment(codec, &bad, 3).unwrap_err();
        assert!(
            err.contains("rank 1's contribution (int8): weight NaN"),
            "{err}"
        );
        let mut bad = good();
        // The block's scale (its first 4 bytes after the weight) made NaN.
        bad[2][1] = (bad[2][1] & !0xffff_ffff) | u64::from(f32::NAN.to_bits());
        let err = reduce_segment(codec, &bad, 3).unwrap_err();
        assert!(
            err.contains("rank 2's contribution") && err.contains("scale"),
            "{err}"
        );
        let mut bad = good();
        bad[0].push(0);
        let err = reduce_segment(codec, &bad, 3).unwrap_err();
        assert!(
            err.contains("rank 0's contribution") && err.contains("words"),
            "{err}"
        );
        // Sums past f32's range are refused, not coded as infinities.
        let huge = (0..3)
            .map(|_| block(codec, 1.0, &[f32::MAX / 2.0; 3]))
            .collect::<Vec<_>>();
        let err = reduce_segment(codec, &huge, 3).unwrap_err();
        assert!(err.contains("overflowed"), "{err}");
    }

    /// A rank's reply to the gather of sums, padded to `len` words.
    fn reply(codec: Compression, total: f64, values: &[f32], len: usize) -> Vec<u64> {
        let mut words = vec![SUMMED];
        words.extend(block(codec, total, values));
        words.resize(len, 0);
        words
    }

    #[test]
    fn the_gathered_sums_are_read_alike_and_a_refusal_is_every_ranks_error() {
        let codec = Compression::Bf16;
        let (n, m) = (5, 2);
        let len = 2 + encoded_bytes(codec, 3).div_ceil(8);
        // Segments 0..2 and 2..5.
        let sums = vec![
            reply(codec, 2.0, &[1.0, 2.0], len),
            reply(codec, 2.0, &[3.0, 4.0, 5.0], len),
        ];
        let (total, codes) = read_sums(codec, &sums, n).unwrap();
        assert_eq!(total, 2.0);
        let mut x = vec![0f32; n];
        add_decoded(codec, &codes[0], &mut x[..2]);
        add_decoded(codec, &codes[1], &mut x[2..]);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0, 5.0]);
        let mut other = sums.clone();
        other[1] = reply(codec, 3.0, &[3.0, 4.0, 5.0], len);
        let err = read_sums(codec, &other, n).unwrap_err().to_string();
        assert!(
            err.contains("rank 1's sum") && err.contains("add up to 3"),
            "{err}"
        );
        let mut refusal = vec![REFUSED, 5];
        to_words(b"nope!", &mut refusal);
        refusal.resize(len, 0);
        other[0] = refusal;
        let err = read_sums(codec, &other, n).unwrap_err().to_string();
        assert!(err.contains("rank 0 refused it: nope!"), "{err}");
        let mut padded = sums.clone();
        padded[0].push(7);
        let err = read_sums(codec, &padded, n).unwrap_err().to_string();
        assert!(err.contains("zeros after"), "{err}");
        assert_eq!(m, sums.len());
    }
}
