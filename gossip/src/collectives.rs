//! Small typed collectives, written once above the transports: every rank
//! gathers every rank's exact values (see [`crate::Communicator::all_gather_u64`])
//! and combines them in rank order, so every rank computes the same bits
//! from the same inputs. Anything wrong with a contribution (its length, a
//! non-finite `f64`, an overflowing sum) fails every rank alike.

use crate::{CommError, Rank};

/// How [`crate::Communicator::all_reduce_u64`] combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum; a sum beyond `u64::MAX` is an error, not a wrap.
    Sum,
    Max,
    Min,
}

/// Checks that every rank contributed as many values as `out` holds. The
/// message is the same on every rank.
fn check_lengths(all: &[Vec<u64>], out_len: usize, what: &str) -> Result<(), CommError> {
    if all.iter().any(|v| v.len() != out_len) {
        let lengths: Vec<String> = all.iter().map(|v| v.len().to_string()).collect();
        return Err(CommError::Protocol(format!(
            "{what} all-reduce: the ranks contributed different numbers of values (by rank: {})",
            lengths.join(", ")
        )));
    }
    Ok(())
}

/// Combines every rank's values (`all[r]` is rank r's) into `out`.
pub fn reduce_u64(all: &[Vec<u64>], out: &mut [u64], op: ReduceOp) -> Result<(), CommError> {
    check_lengths(all, out.len(), "u64")?;
    for (i, slot) in out.iter_mut().enumerate() {
        let mut values = all.iter().map(|v| v[i]);
        let first = values.next().unwrap_or(*slot);
        *slot = match op {
            ReduceOp::Max => values.fold(first, u64::max),
            ReduceOp::Min => values.fold(first, u64::min),
            ReduceOp::Sum => values.try_fold(first, u64::checked_add).ok_or_else(|| {
                CommError::Value(format!(
                    "u64 all-reduce: the sum of element {i} over all ranks exceeds u64::MAX"
                ))
            })?,
        };
    }
    Ok(())
}

/// Sums every rank's `f64` values (as their bits, `all[r]` is rank r's) in
/// rank order `((v_0 + v_1) + v_2) ...` into `out`.
pub fn sum_f64_in_rank_order(all: &[Vec<u64>], out: &mut [f64]) -> Result<(), CommError> {
    check_lengths(all, out.len(), "f64")?;
    let bad = |rank: Rank, i: usize, v: f64| {
        CommError::Value(format!(
            "f64 all-reduce: rank {rank} contributed the non-finite value {v} at element {i}"
        ))
    };
    for (i, slot) in out.iter_mut().enumerate() {
        let mut total: Option<f64> = None;
        for (rank, values) in all.iter().enumerate() {
            let v = f64::from_bits(values[i]);
            if !v.is_finite() {
                return Err(bad(rank, i, v));
            }
            total = Some(total.map_or(v, |t| t + v));
        }
        if let Some(t) = total {
            *slot = t;
        }
    }
    Ok(())
}

/// Rank `me`'s part of an exchange gathered in full: `all[r]` is rank r's
/// `m` block lengths, then its blocks end to end; the result holds, in rank
/// order, the block each rank addressed to `me`. A contribution whose
/// lengths do not add up is an error naming its rank.
pub fn pick_exchanged(all: &[Vec<u64>], me: Rank, m: usize) -> Result<Vec<Vec<u64>>, CommError> {
    if all.len() != m {
        return Err(CommError::Protocol(format!(
            "exchange: {} contributions in a view of {m}",
            all.len()
        )));
    }
    all.iter()
        .enumerate()
        .map(|(rank, words)| {
            let bad = |what: &str| {
                CommError::Protocol(format!("exchange: rank {rank}'s contribution {what}"))
            };
            let lengths = words
                .get(..m)
                .ok_or_else(|| bad("is shorter than its table of lengths"))?;
            let mut start = m;
            for (to, len) in lengths.iter().enumerate() {
                let len = usize::try_from(*len).map_err(|_| bad("names a length beyond memory"))?;
                let end = start
                    .checked_add(len)
                    .filter(|end| *end <= words.len())
                    .ok_or_else(|| bad("has blocks longer than its words"))?;
                if to == me {
                    return Ok(words[start..end].to_vec());
                }
                start = end;
            }
            Err(bad("has no block for this rank"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_min_and_sum_near_the_top_of_u64() {
        let all = vec![
            vec![u64::MAX, 0, 1],
            vec![u64::MAX - 1, 7, 2],
            vec![3, 5, 3],
        ];
        let mut out = [0u64; 3];
        reduce_u64(&all, &mut out, ReduceOp::Max).unwrap();
        assert_eq!(out, [u64::MAX, 7, 3]);
        reduce_u64(&all, &mut out, ReduceOp::Min).unwrap();
        assert_eq!(out, [3, 0, 1]);
        let err = reduce_u64(&all, &mut out, ReduceOp::Sum).unwrap_err();
        assert!(err.to_string().contains("element 0"), "{err}");
        let near = vec![vec![u64::MAX - 10], vec![4], vec![6]];
        let mut one = [0u64];
        reduce_u64(&near, &mut one, ReduceOp::Sum).unwrap();
        assert_eq!(one, [u64::MAX]);
    }

    #[test]
    fn f64_sums_run_in_rank_order() {
        let values = [1e16, 1.0, -1e16, 1.0];
        let all: Vec<Vec<u64>> = values.iter().map(|v| vec![f64::to_bits(*v)]).collect();
        let mut out = [0.0];
        sum_f64_in_rank_order(&all, &mut out).unwrap();
        assert_eq!(
            out[0].to_bits(),
            (((1e16 + 1.0) + -1e16) + 1.0f64).to_bits()
        );
        assert_ne!(
            out[0],
            values.iter().rev().sum::<f64>(),
            "the order matters here"
        );
        let nan = vec![vec![1.0f64.to_bits()], vec![f64::NAN.to_bits()]];
        let err = sum_f64_in_rank_order(&nan, &mut out).unwrap_err();
        assert!(err.to_string().contains("rank 1"), "{err}");
    }

    #[test]
    fn an_exchange_gathered_in_full_gives_each_rank_its_blocks() {
        // Rank r sends [10 r + j; j + 1] to rank j.
        let m = 3;
        let all: Vec<Vec<u64>> = (0..m as u64)
            .map(|r| {
                let blocks: Vec<Vec<u64>> = (0..m as u64)
                    .map(|j| vec![10 * r + j; j as usize + 1])
                    .collect();
                let mut words: Vec<u64> = blocks.iter().map(|b| b.len() as u64).collect();
                blocks.iter().for_each(|b| words.extend(b));
                words
            })
            .collect();
        for me in 0..m {
            let got = pick_exchanged(&all, me, m).unwrap();
            let want: Vec<Vec<u64>> = (0..m as u64)
                .map(|r| vec![10 * r + me as u64; me + 1])
                .collect();
            assert_eq!(got, want);
        }
        let mut short = all.clone();
        short[1].pop();
        let err = pick_exchanged(&short, 2, m).unwrap_err();
        assert!(
            err.to_string()
                .contains("rank 1's contribution has blocks longer"),
            "{err}"
        );
        let err = pick_exchanged(&all[..2], 0, m).unwrap_err();
        assert!(
            err.to_string().contains("2 contributions in a view of 3"),
            "{err}"
        );
    }

    #[test]
    fn a_length_mismatch_names_the_rank() {
        let all = vec![vec![1, 2], vec![1]];
        let err = reduce_u64(&all, &mut [0, 0], ReduceOp::Max).unwrap_err();
        assert!(err.to_string().contains("(by rank: 2, 1)"), "{err}");
    }
}
