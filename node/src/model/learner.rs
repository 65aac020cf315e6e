//! What the training loop needs of a model: the [`Learner`] trait, which the
//! built-in [`Model`] implements and a user's own candle model can too, and
//! [`FlatParams`], the two copies that put a flat parameter buffer into
//! candle and take its gradient out.
//!
//! The loop, gossip and SlowMo see a model only as a flat `f32` buffer
//! with a [`ParamSpec`] layout: they never look inside. A learner gives
//! the layout, the initial buffer (the same on every node for a seed),
//! the loss and gradient of a batch, and the loss and hits of a batch for
//! evaluation. `node/examples/custom_model.rs` trains a model defined
//! outside this crate over two real peers.

use candle_core::{Device, Tensor, Var, backprop::GradStore};

use super::{Evaluation, Model, ModelError, ParamSpec, copy_out};
use crate::data::Samples;

/// The loss and the hits of one evaluated batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchEval {
    /// Mean loss over the batch's samples.
    pub mean_loss: f32,
    /// Predictions that were right.
    pub correct: u64,
    /// Predictions made (one per sample for a classifier; a language
    /// model makes one per position).
    pub predictions: u64,
}

/// A model the training loop can train: everything works on one flat
/// parameter buffer laid out by [`Learner::layout`].
///
/// A batch is `labels.len()` samples of [`Learner::sample_len`] `f32`
/// values each, sample after sample, as a split ([`Samples`]) gives
/// them. Implementations must be deterministic (the same inputs give the
/// same bits), or peers and the simulator stop agreeing bit for bit.
pub trait Learner: Send {
    /// The named tensors of the flat buffer, in storage order, the first at
    /// offset 0 and each after the one before (checkpoints, safetensors
    /// files and the size checks of every exchange follow it).
    fn layout(&self) -> &[ParamSpec];

    /// Values per input sample.
    fn sample_len(&self) -> usize;

    /// The initial parameters: every node calls this with the run's seed
    /// and must get the same buffer (the run checks it by hash).
    fn init_params(&self, seed: u64) -> Vec<f32>;

    /// The mean loss of a batch at `params`, with its gradient written into
    /// `grad` (the same layout).
    fn loss_and_grad(
        &mut self,
        params: &[f32],
        inputs: &[f32],
        labels: &[u32],
        grad: &mut [f32],
    ) -> Result<f32, ModelError>;

    /// The loss and hits of a batch at `params`, no gradient.
    fn evaluate_batch(
        &mut self,
        params: &[f32],
        inputs: &[f32],
        labels: &[u32],
    ) -> Result<BatchEval, ModelError>;

    /// Length of the flat buffer.
    fn num_params(&self) -> usize {
        self.layout().iter().map(ParamSpec::numel).sum()
    }

    /// Mean loss and accuracy over all of `split`, `batch` samples at a time.
    fn evaluate(
        &mut self,
        params: &[f32],
        split: &dyn Samples,
        sample_len: usize,
        batch: usize,
    ) -> Result<Evaluation, ModelError> {
        evaluate_in_batches(self, params, split, sample_len, batch)
    }
}

/// The initial parameters of `learner` for `seed`, checked: as many as its
/// layout holds, every one finite (a learner written outside the crate is
/// not trusted to get this right).
pub fn initial_params<L: Learner + ?Sized>(learner: &L, seed: u64) -> Result<Vec<f32>, ModelError> {
    let x0 = learner.init_params(seed);
    if x0.len() != learner.num_params() {
        return Err(ModelError::Length {
            what: "the initial parameters",
            expected: learner.num_params(),
            got: x0.len(),
        });
    }
    if let Some(i) = x0.iter().position(|v| !v.is_finite()) {
        let name = learner
            .layout()
            .iter()
            .find(|s| s.range().contains(&i))
            .map_or("?", |s| s.name.as_str());
        return Err(ModelError::Config(format!(
            "initial parameter {i} (in {name}) is {}",
            x0[i]
        )));
    }
    Ok(x0)
}

/// [`Learner::evaluate`] from [`Learner::evaluate_batch`]: the split in
/// chunks of `batch`, the loss weighted by each chunk's samples.
pub fn evaluate_in_batches<L: Learner + ?Sized>(
    learner: &mut L,
    params: &[f32],
    split: &dyn Samples,
    sample_len: usize,
    batch: usize,
) -> Result<Evaluation, ModelError> {
    check_split(learner.sample_len(), split, sample_len, batch)?;
    let labels = split.labels();
    over_batches(split, &labels, sample_len, batch, |inputs, chunk| {
        learner.evaluate_batch(params, inputs, chunk)
    })
}

/// What every evaluation checks first: the split holds samples, they (and
/// the length the caller says they have) are the `reads` values a learner
/// reads, and a batch holds at least one.
pub(super) fn check_split(
    reads: usize,
    split: &dyn Samples,
    sample_len: usize,
    batch: usize,
) -> Result<(), ModelError> {
    if split.is_empty() {
        return Err(ModelError::Empty("the evaluation split"));
    }
    for got in [sample_len, split.sample_len()] {
        if got != reads {
            return Err(ModelError::Length {
                what: "samples of the split",
                expected: reads,
                got,
            });
        }
    }
    if batch == 0 {
        return Err(ModelError::Config(
            "evaluation batch size must be >= 1".into(),
        ));
    }
    Ok(())
}

/// Walks `split` (whose labels are `labels`) `batch` samples at a time,
/// `eval` giving each chunk's loss and hits, and sums them up: the loss
/// weighted by each chunk's samples, the accuracy over every prediction.
pub(super) fn over_batches(
    split: &dyn Samples,
    labels: &[u32],
    sample_len: usize,
    batch: usize,
    mut eval: impl FnMut(&[f32], &[u32]) -> Result<BatchEval, ModelError>,
) -> Result<Evaluation, ModelError> {
    let (mut loss_sum, mut correct, mut predictions) = (0.0f64, 0u64, 0u64);
    let mut inputs = Vec::with_capacity(batch.min(labels.len()) * sample_len);
    for (k, chunk) in labels.chunks(batch).enumerate() {
        inputs.clear();
        (k * batch..k * batch + chunk.len()).for_each(|i| split.sample_into(i, &mut inputs));
        let b = eval(&inputs, chunk)?;
        loss_sum += f64::from(b.mean_loss) * chunk.len() as f64;
        correct += b.correct;
        predictions += b.predictions;
    }
    Ok(Evaluation {
        loss: (loss_sum / labels.len() as f64) as f32,
        accuracy: (correct as f64 / predictions.max(1) as f64) as f32,
    })
}

impl Learner for Model {
    fn layout(&self) -> &[ParamSpec] {
        Model::layout(self)
    }

    fn sample_len(&self) -> usize {
        Model::sample_len(self)
    }

    fn init_params(&self, seed: u64) -> Vec<f32> {
        Model::init_params(self, seed)
    }

    fn loss_and_grad(
        &mut self,
        params: &[f32],
        inputs: &[f32],
        labels: &[u32],
        grad: &mut [f32],
    ) -> Result<f32, ModelError> {
        Model::loss_and_grad(self, params, inputs, labels, grad)
    }

    fn evaluate_batch(
        &mut self,
        params: &[f32],
        inputs: &[f32],
        labels: &[u32],
    ) -> Result<BatchEval, ModelError> {
        Model::evaluate_batch(self, params, inputs, labels)
    }

    fn num_params(&self) -> usize {
        Model::num_params(self)
    }

    /// The built-in models' own: the parameters become tensors once for
    /// the whole split, and the chunk size is capped per architecture.
    fn evaluate(
        &mut self,
        params: &[f32],
        split: &dyn Samples,
        sample_len: usize,
        batch: usize,
    ) -> Result<Evaluation, ModelError> {
        Model::evaluate(self, params, split, sample_len, batch)
    }
}

/// A flat buffer as candle variables, one per [`ParamSpec`], for a
/// learner's forward and backward pass: [`FlatParams::new`] copies the
/// values in, [`FlatParams::grads_into`] copies the gradient out into the
/// flat gradient buffer. (One `Var` per tensor, not views of one flat
/// `Var`: candle's backward of a view pads its gradient to the full length,
/// see the module docs of [`crate::model`].)
pub struct FlatParams {
    vars: Vec<Var>,
    ranges: Vec<std::ops::Range<usize>>,
    /// The parameters came in, and the gradient goes out, as one transfer.
    staged: bool,
}

impl FlatParams {
    /// The tensors of `params` laid out by `layout`, on `device`.
    ///
    /// On the CPU each tensor is its own copy of its slice. On a GPU the
    /// buffer crosses to the device in one copy and each tensor is then
    /// copied out of it there: one transfer a step instead of one per
    /// tensor (and [`FlatParams::grads_into`] likewise brings the gradient
    /// back in one).
    pub fn new(layout: &[ParamSpec], params: &[f32], device: &Device) -> Result<Self, ModelError> {
        Self::build(layout, params, device, !device.is_cpu())
    }

    pub(super) fn build(
        layout: &[ParamSpec],
        params: &[f32],
        device: &Device,
        staged: bool,
    ) -> Result<Self, ModelError> {
        let total: usize = layout.iter().map(ParamSpec::numel).sum();
        if params.len() != total {
            return Err(ModelError::Length {
                what: "the parameter buffer",
                expected: total,
                got: params.len(),
            });
        }
        let vars = if staged {
            let flat = Tensor::from_slice(params, total, device)?;
            layout
                .iter()
                .map(|s| {
                    Var::from_tensor(
                        &flat
                            .narrow(0, s.offset, s.numel())?
                            .reshape(s.shape.as_slice())?,
                    )
                })
                .collect::<Result<Vec<_>, _>>()?
        } else {
            layout
                .iter()
                .map(|s| Var::from_slice(&params[s.range()], s.shape.as_slice(), device))
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(Self {
            vars,
            ranges: layout.iter().map(ParamSpec::range).collect(),
            staged,
        })
    }

    /// The tensor of layout entry `i`.
    ///
    /// # Panics
    /// When `i` is not an entry of the layout.
    pub fn get(&self, i: usize) -> &Tensor {
        self.vars[i].as_tensor()
    }

    /// Every tensor, in layout order.
    pub fn tensors(&self) -> Vec<Tensor> {
        self.vars.iter().map(|v| v.as_tensor().clone()).collect()
    }

    /// Writes the gradient of each tensor from `grads` (a loss's
    /// `backward()`) into its range of `out`; a tensor the loss does not
    /// depend on gets zeros.
    pub fn grads_into(&self, grads: &GradStore, out: &mut [f32]) -> Result<(), ModelError> {
        let total = self.ranges.last().map_or(0, |r| r.end);
        if out.len() != total {
            return Err(ModelError::Length {
                what: "the gradient buffer",
                expected: total,
                got: out.len(),
            });
        }
        if self.staged {
            // every gradient joined on the device, then one copy to the host
            let parts = self
                .vars
                .iter()
                .map(|var| match grads.get(var.as_tensor()) {
                    Some(g) => g.flatten_all(),
                    None => var.as_tensor().zeros_like()?.flatten_all(),
                })
                .collect::<Result<Vec<_>, _>>()?;
            return copy_out(Some(&Tensor::cat(&parts, 0)?), out);
        }
        for (var, range) in self.vars.iter().zip(&self.ranges) {
            copy_out(grads.get(var.as_tensor()), &mut out[range.clone()])?;
        }
        Ok(())
    }
}
