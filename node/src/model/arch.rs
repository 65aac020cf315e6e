//! The two architectures: parameter layouts and forward passes.
//!
//! Weights follow PyTorch's conventions (`Linear` weight is `(out, in)`,
//! `Conv2d` weight is `(out, in, kh, kw)`), so a saved safetensors file reads
//! like a PyTorch `state_dict`.

use candle_core::{Result as CandleResult, Tensor};

use super::ModelError;

/// Kernel size of both convolutions.
const K: usize = 5;
/// Padding of the first convolution ("same" for 5x5), so 28x28 and 32x32 both work.
const PAD1: usize = 2;
const CONV1_OUT: usize = 6;
const CONV2_OUT: usize = 16;
const FC1: usize = 120;
const FC2: usize = 84;

/// Shapes the CNN's forward pass needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CnnGeometry {
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    /// Spatial size after conv1 + pool, before conv2.
    pub pool1: (usize, usize),
    /// Spatial size after conv2 + pool.
    pub pool2: (usize, usize),
    pub classes: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arch {
    /// Layer widths: input, hidden..., classes.
    Mlp(Vec<usize>),
    Cnn(CnnGeometry),
}

/// One parameter tensor before offsets are assigned: name, shape, fan-in.
pub(crate) type Slot = (String, Vec<usize>, usize);

fn linear(name: &str, fan_in: usize, fan_out: usize, out: &mut Vec<Slot>) {
    out.push((format!("{name}.weight"), vec![fan_out, fan_in], fan_in));
    out.push((format!("{name}.bias"), vec![fan_out], fan_in));
}

impl Arch {
    pub fn mlp(hidden: &[usize], sample_len: usize, classes: usize) -> Result<Self, ModelError> {
        if let Some(i) = hidden.iter().position(|&h| h == 0) {
            return Err(ModelError::Config(format!(
                "hidden layer {i} has width 0; every MLP hidden width must be >= 1"
            )));
        }
        let mut widths = vec![sample_len];
        widths.extend_from_slice(hidden);
        widths.push(classes);
        Ok(Arch::Mlp(widths))
    }

    pub fn cnn(
        channels: usize,
        height: usize,
        width: usize,
        classes: usize,
    ) -> Result<Self, ModelError> {
        // conv1 keeps the size (padding 2), pool halves it (floor), conv2 takes 4 off,
        // pool halves again: the smallest input that leaves 1x1 is 12x12.
        if height < 12 || width < 12 {
            return Err(ModelError::Config(format!(
                "the CNN needs images of at least 12x12 pixels, got {height}x{width}"
            )));
        }
        let pool1 = (height / 2, width / 2);
        let pool2 = ((pool1.0 - (K - 1)) / 2, (pool1.1 - (K - 1)) / 2);
        Ok(Arch::Cnn(CnnGeometry {
            channels,
            height,
            width,
            pool1,
            pool2,
            classes,
        }))
    }

    /// Parameter tensors in storage order.
    pub fn slots(&self) -> Vec<Slot> {
        let mut out = Vec::new();
        match self {
            Arch::Mlp(widths) => {
                for (i, pair) in widths.windows(2).enumerate() {
                    linear(&format!("fc{}", i + 1), pair[0], pair[1], &mut out);
                }
            }
            Arch::Cnn(g) => {
                let fan1 = g.channels * K * K;
                out.push((
                    "conv1.weight".into(),
                    vec![CONV1_OUT, g.channels, K, K],
                    fan1,
                ));
                out.push(("conv1.bias".into(), vec![CONV1_OUT], fan1));
                let fan2 = CONV1_OUT * K * K;
                out.push((
                    "conv2.weight".into(),
                    vec![CONV2_OUT, CONV1_OUT, K, K],
                    fan2,
                ));
                out.push(("conv2.bias".into(), vec![CONV2_OUT], fan2));
                let flat = CONV2_OUT * g.pool2.0 * g.pool2.1;
                linear("fc1", flat, FC1, &mut out);
                linear("fc2", FC1, FC2, &mut out);
                linear("fc3", FC2, g.classes, &mut out);
            }
        }
        out
    }

    /// Shape of one input batch of `batch` samples.
    pub fn input_shape(&self, batch: usize) -> Vec<usize> {
        match self {
            Arch::Mlp(widths) => vec![batch, widths[0]],
            Arch::Cnn(g) => vec![batch, g.channels, g.height, g.width],
        }
    }

    /// Logits `(batch, classes)` for input `x`; `p` holds the parameter
    /// tensors in [`Arch::slots`] order (with their final shapes).
    pub fn forward(&self, p: &[Tensor], x: &Tensor) -> CandleResult<Tensor> {
        match self {
            Arch::Mlp(_) => dense_stack(p, x.clone()),
            Arch::Cnn(_) => {
                let x = conv_block(x, &p[0], &p[1], PAD1)?;
                let x = conv_block(&x, &p[2], &p[3], 0)?;
                dense_stack(&p[4..], x.flatten_from(1)?)
            }
        }
    }
}

/// Linear layers (weight, bias pairs) with ReLU between them, none after the last.
fn dense_stack(p: &[Tensor], mut x: Tensor) -> CandleResult<Tensor> {
    let layers = p.len() / 2;
    for (i, wb) in p.chunks_exact(2).enumerate() {
        x = x.matmul(&wb[0].t()?)?.broadcast_add(&wb[1])?;
        if i + 1 < layers {
            x = x.relu()?;
        }
    }
    Ok(x)
}

/// conv -> 2x2 max-pool -> ReLU. Pooling before the ReLU gives the same
/// values (both are monotone) on a quarter of the elements.
fn conv_block(x: &Tensor, w: &Tensor, b: &Tensor, padding: usize) -> CandleResult<Tensor> {
    let out = w.dim(0)?;
    let y = x
        .conv2d(w, padding, 1, 1, 1)?
        .broadcast_add(&b.reshape((1, out, 1, 1))?)?;
    max_pool_2x2(&y)?.relu()
}

/// 2x2, stride-2 max-pooling (floor: an odd last row or column is dropped).
///
/// Written as a reshape and two `max` reductions rather than
/// `Tensor::max_pool2d` because candle 0.11's `max_pool2d` backward scales
/// the gradient by (number of maxima in the window) / 4, i.e. by 1/4 for the
/// usual unique maximum; the `max` reduction's backward is exact.
pub(crate) fn max_pool_2x2(y: &Tensor) -> CandleResult<Tensor> {
    let (b, c, h, w) = y.dims4()?;
    let (h2, w2) = (h / 2, w / 2);
    let mut y = y.clone();
    if h % 2 == 1 {
        y = y.narrow(2, 0, 2 * h2)?;
    }
    if w % 2 == 1 {
        y = y.narrow(3, 0, 2 * w2)?;
    }
    y.reshape((b, c, h2, 2, w2, 2))?.max(5)?.max(3)
}
