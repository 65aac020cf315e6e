//! Splitting a training set into disjoint per-worker shards.
//!
//! Decentralised training behaves very differently on IID and on skewed data
//! (gossip must carry the information one worker lacks), so the partition is a
//! first-class experiment knob:
//!
//! - `iid`: a seeded shuffle dealt into equal shards (sizes differ by <= 1).
//! - `by-class`: samples sorted by label and cut into equal contiguous shards,
//!   so each worker sees only about `classes / workers` classes (the
//!   "pathological non-IID" split of McMahan et al. 2017).
//! - `contiguous`: equal runs of samples in their stored order, so each
//!   worker reads its own stretch of the data (the default for text, whose
//!   samples are windows of one stream).
//! - `dirichlet:<alpha>`: for every class, worker proportions are drawn from
//!   Dirichlet(alpha) (Hsu et al. 2019); small alpha is very skewed, large
//!   alpha approaches IID.
//!
//! Every sample lands in exactly one shard, every shard is non-empty, and the
//! result depends only on the labels, the worker count and the seed.

use slowmo_optim::Rng;

use super::DataError;

pub use slowmo_runspec::Partition;

/// Splits sample indices `0..labels.len()` into `workers` disjoint, non-empty
/// shards. Each shard is sorted ascending (the [`super::Batcher`] shuffles).
///
/// Errors when `workers` is 0, when there are fewer samples than workers,
/// when a label is `>= classes`, or for a Dirichlet alpha that is not > 0.
pub fn shard_indices(
    labels: &[u32],
    classes: usize,
    workers: usize,
    partition: Partition,
    seed: u64,
) -> Result<Vec<Vec<usize>>, DataError> {
    let fail = |reason: String| DataError::Unpartitionable {
        samples: labels.len(),
        workers,
        reason,
    };
    if workers == 0 {
        return Err(fail("need at least one worker".into()));
    }
    if labels.len() < workers {
        return Err(fail("every worker needs at least one sample".into()));
    }
    if let Some((i, &l)) = labels
        .iter()
        .enumerate()
        .find(|(_, l)| **l as usize >= classes)
    {
        return Err(fail(format!(
            "label {l} of sample {i} is not below {classes} classes"
        )));
    }
    let mut rng = Rng::derive(seed, 0x5041_5254); // "PART"
    let mut shards = match partition {
        Partition::Iid => {
            let mut all: Vec<usize> = (0..labels.len()).collect();
            rng.shuffle(&mut all);
            cut_equal(&all, workers)
        }
        Partition::ByClass => {
            let mut all: Vec<usize> = (0..labels.len()).collect();
            // shuffle first so ties within a class are broken randomly
            rng.shuffle(&mut all);
            all.sort_by_key(|&i| labels[i]);
            cut_equal(&all, workers)
        }
        Partition::Contiguous => {
            let all: Vec<usize> = (0..labels.len()).collect();
            cut_equal(&all, workers)
        }
        Partition::Dirichlet(alpha) => {
            if !(alpha.is_finite() && alpha > 0.0) {
                return Err(fail(format!(
                    "dirichlet alpha {alpha} must be finite and > 0"
                )));
            }
            dirichlet(labels, classes, workers, alpha, &mut rng)
        }
    };
    for s in &mut shards {
        s.sort_unstable();
    }
    Ok(shards)
}

/// Cuts `order` into `workers` contiguous pieces whose sizes differ by <= 1.
fn cut_equal(order: &[usize], workers: usize) -> Vec<Vec<usize>> {
    let (base, extra) = (order.len() / workers, order.len() % workers);
    let mut start = 0;
    (0..workers)
        .map(|w| {
            let len = base + usize::from(w < extra);
            let piece = order[start..start + len].to_vec();
            start += len;
            piece
        })
        .collect()
}

fn dirichlet(
    labels: &[u32],
    classes: usize,
    workers: usize,
    alpha: f64,
    rng: &mut Rng,
) -> Vec<Vec<usize>> {
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); classes];
    for (i, &l) in labels.iter().enumerate() {
        by_class[l as usize].push(i);
    }
    let mut shards: Vec<Vec<usize>> = vec![Vec::new(); workers];
    for members in &mut by_class {
        rng.shuffle(members);
        let weights: Vec<f64> = (0..workers).map(|_| rng.gamma(alpha)).collect();
        let total: f64 = weights.iter().sum();
        // cumulative rounding: shard sizes sum exactly to the class size
        let n = members.len() as f64;
        let mut acc = 0.0;
        let mut start = 0;
        for (w, weight) in weights.iter().enumerate() {
            acc += weight;
            let end = if w + 1 == workers || total <= 0.0 {
                members.len()
            } else {
                ((acc / total * n).round() as usize).clamp(start, members.len())
            };
            shards[w].extend_from_slice(&members[start..end]);
            start = end;
        }
    }
    // Small alpha can leave a worker with nothing; give it one sample from the
    // currently largest shard (deterministic, keeps shards disjoint).
    for w in 0..workers {
        if shards[w].is_empty() {
            let largest = (0..workers)
                .max_by_key(|&v| (shards[v].len(), std::cmp::Reverse(v)))
                .unwrap_or(0);
            if let Some(i) = shards[largest].pop() {
                shards[w].push(i);
            }
        }
    }
    shards
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10 classes, 100 samples each, interleaved.
    fn labels() -> Vec<u32> {
        (0..1000).map(|i| (i % 10) as u32).collect()
    }

    fn check_disjoint_cover(shards: &[Vec<usize>], n: usize) {
        let mut seen = vec![false; n];
        for s in shards {
            assert!(!s.is_empty());
            for &i in s {
                assert!(!seen[i], "index {i} in two shards");
                seen[i] = true;
            }
        }
        assert!(seen.iter().all(|&x| x), "not every sample assigned");
    }

    /// Average over workers of the fraction of a worker's samples in its most
    /// common class: 0.1 for perfectly balanced 10-class shards, 1.0 for
    /// single-class shards.
    fn dominance(shards: &[Vec<usize>], labels: &[u32]) -> f64 {
        let mut total = 0.0;
        for s in shards {
            let mut counts = [0usize; 10];
            for &i in s {
                counts[labels[i] as usize] += 1;
            }
            total += *counts.iter().max().unwrap() as f64 / s.len() as f64;
        }
        total / shards.len() as f64
    }

    #[test]
    fn every_partition_is_disjoint_covering_and_seeded() {
        let l = labels();
        for p in [
            Partition::Iid,
            Partition::ByClass,
            Partition::Dirichlet(0.5),
            Partition::Contiguous,
        ] {
            for workers in [1, 3, 8, 16] {
                let a = shard_indices(&l, 10, workers, p, 42).unwrap();
                assert_eq!(a.len(), workers);
                check_disjoint_cover(&a, l.len());
                assert_eq!(a, shard_indices(&l, 10, workers, p, 42).unwrap());
            }
            if p != Partition::ByClass && p != Partition::Contiguous {
                assert_ne!(
                    shard_indices(&l, 10, 4, p, 1).unwrap(),
                    shard_indices(&l, 10, 4, p, 2).unwrap(),
                    "{p}"
                );
            }
        }
    }

    #[test]
    fn contiguous_shards_are_runs_in_order() {
        let l = labels();
        let s = shard_indices(&l, 10, 3, Partition::Contiguous, 7).unwrap();
        let mut next = 0;
        for shard in &s {
            assert_eq!(shard, &(next..next + shard.len()).collect::<Vec<_>>());
            next += shard.len();
        }
        assert_eq!(next, l.len());
    }

    #[test]
    fn iid_shards_are_balanced_and_mixed() {
        let l = labels();
        let s = shard_indices(&l, 10, 3, Partition::Iid, 7).unwrap();
        let sizes: Vec<usize> = s.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![334, 333, 333]);
        assert!(dominance(&s, &l) < 0.2);
    }

    #[test]
    fn by_class_and_small_alpha_dirichlet_are_skewed() {
        let l = labels();
        let by_class = shard_indices(&l, 10, 5, Partition::ByClass, 7).unwrap();
        // 5 workers, 10 classes: exactly two classes each
        for s in &by_class {
            let mut classes: Vec<u32> = s.iter().map(|&i| l[i]).collect();
            classes.dedup();
            classes.sort();
            classes.dedup();
            assert_eq!(classes.len(), 2);
        }
        let skewed = dominance(
            &shard_indices(&l, 10, 8, Partition::Dirichlet(0.1), 7).unwrap(),
            &l,
        );
        let mild = dominance(
            &shard_indices(&l, 10, 8, Partition::Dirichlet(100.0), 7).unwrap(),
            &l,
        );
        assert!(skewed > 0.5, "dirichlet(0.1) dominance {skewed}");
        assert!(mild < 0.25, "dirichlet(100) dominance {mild}");
    }

    #[test]
    fn tiny_alpha_still_gives_everyone_a_sample() {
        let l = labels();
        let s = shard_indices(&l, 10, 64, Partition::Dirichlet(0.01), 3).unwrap();
        check_disjoint_cover(&s, l.len());
    }

    #[test]
    fn impossible_partitions_are_errors() {
        let l = labels();
        assert!(shard_indices(&l, 10, 0, Partition::Iid, 0).is_err());
        let err = shard_indices(&l[..3], 10, 4, Partition::Iid, 0).unwrap_err();
        assert!(
            err.to_string().contains("3 samples across 4 workers"),
            "{err}"
        );
        let err = shard_indices(&l, 5, 2, Partition::Iid, 0).unwrap_err();
        assert!(err.to_string().contains("label 5"), "{err}");
        assert!(shard_indices(&l, 10, 2, Partition::Dirichlet(0.0), 0).is_err());
        assert!(shard_indices(&l, 10, 2, Partition::Dirichlet(f64::NAN), 0).is_err());
    }
}
