//! The compressed exact average (`--compress-average`; docs/algorithm.md,
//! "Compressed exact averages"), written once over [`Communicator`]'s
//! all-gather so that both transports run the same code.
//!
//! Worker `i` encodes its pseudo-gradient plus what it kept last time,
//! `g_i = anchor * w_i - x_i + e_i`, keeps `e_i = g_i - D(Q(g_i))`, and
//! contributes `w_i` (its exact bits) and the bytes of `Q(g_i)`. Every
//! worker receives every contribution, checks it in full, and computes
//! `x = anchor - (D(Q(g_0)) + D(Q(g_1)) + ...) / (w_0 + w_1 + ...)`, both
//! sums in rank order: the same bits everywhere. Without compression error
//! this is `sum x_i / sum w_i`, the exact average.

use std::borrow::Cow;

use super::{Compression, add_decoded, check, encode_share, encoded_bytes};
use crate::{CommError, Communicator, sum_scalars_in_rank_order};

/// `bytes` as little-endian `u64` words, the last one zero-padded.
fn to_words(bytes: &[u8], out: &mut Vec<u64>) {
    for chunk in bytes.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        out.push(u64::from_le_bytes(word));
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
/// error naming the rank and the field, on every rank that received it;
/// `x` and `w` are then unchanged (the residual already holds the new
/// error, and the failed outer step is rolled back by the caller).
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
    let wf = *w as f32;
    for ((e, a), v) in residual.iter_mut().zip(anchor).zip(x.iter()) {
        *e += *a * wf - *v;
    }
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
        let bad = |what: String| {
            CommError::Protocol(format!(
                "rank {rank}'s contribution to the compressed average ({codec}): {what}"
            ))
        };
        let (&weight, payload) = words
            .split_first()
            .ok_or_else(|| bad("it is empty".into()))?;
        let weight = f64::from_bits(weight);
        if !(weight.is_finite() && weight > 0.0) {
            return Err(bad(format!(
                "weight {weight}, expected a finite number > 0"
            )));
        }
        let payload = from_words(payload, len).map_err(bad)?;
        check(codec, &payload, n).map_err(|e| bad(e.to_string()))?;
        weights.push(weight);
        payloads.push(payload);
    }
    // The sum in rank order, made in `x` itself (no fresh buffer to fault
    // in), then `x = anchor - sum / W`.
    x.fill(0.0);
    for payload in &payloads {
        add_decoded(codec, payload, x);
    }
    let inv = (1.0 / sum_scalars_in_rank_order(weights)) as f32;
    for (v, a) in x.iter_mut().zip(anchor) {
        *v = *a - *v * inv;
    }
    *w = 1.0;
    Ok(())
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
        let (m, n) = (4, 1000);
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
                    compressed_average(
                        &mut comm,
                        Compression::Int8,
                        &mut x,
                        &mut w,
                        &anchor,
                        &mut e,
                    )
                    .unwrap();
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
                "{i}: {got} {kept} {exact}"
            );
        }
        let err: f32 = outs[0].2.iter().map(|v| v.abs()).fold(0.0, f32::max);
        assert!(err > 0.0 && err < 1e-3, "int8 keeps a small error: {err}");
    }
}
