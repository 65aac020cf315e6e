//! Seeded mini-batches over one worker's shard.

use slowmo_optim::Rng;

use super::Samples;

/// Walks a shard of sample indices in a random order that is reshuffled at
/// the start of every epoch, from `Rng::derive(seed, epoch)`: the order is a
/// pure function of (shard, seed, epoch), so a resumed run can rebuild it.
///
/// A batch that runs past the end of an epoch takes the rest of its samples
/// from the next epoch's order, so every batch is full.
#[derive(Debug, Clone)]
pub struct Batcher {
    indices: Vec<usize>,
    order: Vec<usize>,
    seed: u64,
    epoch: u64,
    pos: usize,
}

impl Batcher {
    /// A batcher over `indices` (positions in the split it will be used with).
    pub fn new(indices: Vec<usize>, seed: u64) -> Self {
        let mut b = Batcher {
            order: indices.clone(),
            indices,
            seed,
            epoch: 0,
            pos: 0,
        };
        b.reshuffle();
        b
    }

    fn reshuffle(&mut self) {
        self.order.clear();
        self.order.extend_from_slice(&self.indices);
        Rng::derive(self.seed, self.epoch).shuffle(&mut self.order);
        self.pos = 0;
    }

    /// The epoch the next sample comes from (0 during the first pass).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Samples in the shard.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// True for an empty shard (every batch is then empty).
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// Samples already taken in the current epoch (always below [`Batcher::len`]
    /// for a non-empty shard: finishing an epoch starts the next one).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Jumps to `position` of `epoch` (as reported by [`Batcher::epoch`] and
    /// [`Batcher::position`]), e.g. when resuming from a checkpoint. A
    /// position past the end of the shard starts the following epoch.
    pub fn seek(&mut self, epoch: u64, position: usize) {
        self.epoch = epoch;
        if position >= self.indices.len() && !self.indices.is_empty() {
            self.epoch += 1;
        }
        self.reshuffle();
        if position < self.indices.len() {
            self.pos = position;
        }
    }

    /// Replaces `images` and `labels` with the next `batch` samples of
    /// `split` (`sample_len` values each); both are cleared first and keep
    /// their capacity, so a loop that reuses them does not allocate.
    ///
    /// The indices must be valid for `split` (they come from
    /// [`super::shard_indices`] on the same split); an index out of range is a
    /// programming error and panics. An empty shard yields an empty batch.
    pub fn next_batch(
        &mut self,
        split: &dyn Samples,
        sample_len: usize,
        batch: usize,
        images: &mut Vec<f32>,
        labels: &mut Vec<u32>,
    ) {
        images.clear();
        labels.clear();
        if self.indices.is_empty() {
            return;
        }
        images.reserve(batch * sample_len);
        labels.reserve(batch);
        for _ in 0..batch {
            let i = self.order[self.pos];
            self.pos += 1;
            if self.pos == self.order.len() {
                self.epoch += 1;
                self.reshuffle();
            }
            split.sample_into(i, images);
            labels.push(split.label(i));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Split;

    fn split(n: usize) -> Split {
        Split {
            images: (0..n * 2).map(|v| v as f32).collect::<Vec<_>>().into(),
            labels: (0..n as u32).collect(),
        }
    }

    #[test]
    fn each_epoch_is_a_permutation_and_epochs_differ() {
        let s = split(20);
        let shard: Vec<usize> = (5..15).collect();
        let mut b = Batcher::new(shard.clone(), 9);
        let (mut img, mut lab) = (Vec::new(), Vec::new());
        let mut epochs = Vec::new();
        for e in 0..3 {
            assert_eq!(b.epoch(), e);
            b.next_batch(&s, 2, 10, &mut img, &mut lab);
            assert_eq!(img.len(), 20);
            // pixels follow their labels
            for (k, &l) in lab.iter().enumerate() {
                assert_eq!(img[2 * k], 2.0 * l as f32);
            }
            let mut sorted: Vec<usize> = lab.iter().map(|&l| l as usize).collect();
            sorted.sort();
            assert_eq!(sorted, shard);
            epochs.push(lab.clone());
        }
        assert_ne!(epochs[0], epochs[1]);
        assert_ne!(epochs[1], epochs[2]);
        // same seed, same sequence; other seed, other sequence
        let mut again = Batcher::new(shard.clone(), 9);
        again.next_batch(&s, 2, 10, &mut img, &mut lab);
        assert_eq!(lab, epochs[0]);
        Batcher::new(shard, 10).next_batch(&s, 2, 10, &mut img, &mut lab);
        assert_ne!(lab, epochs[0]);
    }

    #[test]
    fn batches_straddle_epochs_and_seek_resumes() {
        let s = split(7);
        let mut b = Batcher::new((0..7).collect(), 1);
        let (mut img, mut lab) = (Vec::new(), Vec::new());
        let mut stream = Vec::new();
        for _ in 0..5 {
            b.next_batch(&s, 2, 3, &mut img, &mut lab);
            assert_eq!(lab.len(), 3);
            stream.extend_from_slice(&lab);
        }
        assert_eq!(b.epoch(), 2);
        assert_eq!(b.position(), 1);
        let mut first: Vec<u32> = stream[..7].to_vec();
        first.sort();
        assert_eq!(first, (0..7).collect::<Vec<_>>());

        let mut resumed = Batcher::new((0..7).collect(), 1);
        resumed.seek(1, 2);
        resumed.next_batch(&s, 2, 6, &mut img, &mut lab);
        assert_eq!(lab, stream[9..15]);
    }

    #[test]
    fn empty_shard_gives_empty_batches() {
        let mut b = Batcher::new(Vec::new(), 0);
        let (mut img, mut lab) = (vec![1.0], vec![1]);
        b.next_batch(&split(3), 2, 4, &mut img, &mut lab);
        assert!(img.is_empty() && lab.is_empty());
    }
}
