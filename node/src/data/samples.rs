//! What the training loop reads of data: [`Samples`] (a split: samples by
//! index, each with a label) and [`TrainData`] (the training samples the
//! workers shard and batch, the held-out ones they are measured on). The
//! built-in [`Dataset`] and its [`Split`]s implement them; a caller's own
//! data can too (`node/examples/custom_model.rs`), read from memory, files
//! or anything else that answers by index.

use super::{Dataset, Split};

/// A split: `len()` samples of `sample_len()` values, each with a label.
///
/// Reads must be deterministic (the same index gives the same values), or
/// peers and the simulator stop agreeing bit for bit.
pub trait Samples: Send + Sync {
    /// Number of samples.
    fn len(&self) -> usize;

    /// Values per sample.
    fn sample_len(&self) -> usize;

    /// The label of sample `i` (a class, or anything the model reads; the
    /// `label` partitions group by it). May panic when `i` is out of range.
    fn label(&self, i: usize) -> u32;

    /// Appends the `sample_len()` values of sample `i` to `out`. May panic
    /// when `i` is out of range.
    fn sample_into(&self, i: usize, out: &mut Vec<f32>);

    /// True when the split holds no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every label in order (what the data partitions read).
    fn labels(&self) -> Vec<u32> {
        (0..self.len()).map(|i| self.label(i)).collect()
    }
}

/// A dataset as the loop sees it.
pub trait TrainData: Send + Sync {
    /// A name for messages.
    fn name(&self) -> &str;

    /// Number of classes: every label is below it.
    fn classes(&self) -> usize;

    /// The samples the workers train on, sharded across them.
    fn train(&self) -> &dyn Samples;

    /// The held-out samples every evaluation measures.
    fn test(&self) -> &dyn Samples;

    /// Values per sample (the training split's).
    fn sample_len(&self) -> usize {
        self.train().sample_len()
    }
}

impl Samples for Split {
    fn len(&self) -> usize {
        Split::len(self)
    }

    fn sample_len(&self) -> usize {
        Split::sample_len(self)
    }

    fn label(&self, i: usize) -> u32 {
        self.labels[i]
    }

    fn sample_into(&self, i: usize, out: &mut Vec<f32>) {
        self.image_into(i, Split::sample_len(self), out);
    }

    fn labels(&self) -> Vec<u32> {
        self.labels.clone()
    }
}

impl TrainData for Dataset {
    fn name(&self) -> &str {
        &self.name
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn train(&self) -> &dyn Samples {
        &self.train
    }

    fn test(&self) -> &dyn Samples {
        &self.test
    }

    fn sample_len(&self) -> usize {
        Dataset::sample_len(self)
    }
}

/// The first `n` samples of a split (the evaluations during a run read the
/// head of a large test split), without a copy.
pub struct Head<'a> {
    pub samples: &'a dyn Samples,
    pub n: usize,
}

impl Samples for Head<'_> {
    fn len(&self) -> usize {
        self.n.min(self.samples.len())
    }

    fn sample_len(&self) -> usize {
        self.samples.sample_len()
    }

    fn label(&self, i: usize) -> u32 {
        assert!(i < self.len(), "sample {i} of a head of {}", self.len());
        self.samples.label(i)
    }

    fn sample_into(&self, i: usize, out: &mut Vec<f32>) {
        assert!(i < self.len(), "sample {i} of a head of {}", self.len());
        self.samples.sample_into(i, out);
    }
}
