//! The architectures: parameter layouts and forward passes (the
//! transformer's in `transformer.rs`).
//!
//! Weights follow PyTorch's conventions (`Linear` weight is `(out, in)`,
//! `Conv2d` weight is `(out, in, kh, kw)`), so a saved safetensors file reads
//! like a PyTorch `state_dict`.

use candle_core::{Device, Result as CandleResult, Tensor};

use super::ModelError;
use super::slot::{Init, Slot};
use super::transformer::Transformer;

/// Kernel size of both convolutions.
const K: usize = 5;
/// Padding of the first convolution ("same" for 5x5), so 28x28 and 32x32 both work.
const PAD1: usize = 2;
const CONV1_OUT: usize = 6;
const CONV2_OUT: usize = 16;
const FC1: usize = 120;
const FC2: usize = 84;

/// Shapes and gather indices the CNN's forward pass needs.
#[derive(Debug, Clone)]
pub(crate) struct CnnGeometry {
    pub channels: usize,
    pub classes: usize,
    conv1: Im2Col,
    conv2: Im2Col,
    /// Spatial size after conv2 + pool.
    pool2: (usize, usize),
}

#[derive(Debug, Clone)]
pub(crate) enum Arch {
    /// Layer widths: input, hidden..., classes.
    Mlp(Vec<usize>),
    Cnn(CnnGeometry),
    Transformer(Transformer),
}

fn linear(name: &str, fan_in: usize, fan_out: usize, out: &mut Vec<Slot>) {
    out.push((
        format!("{name}.weight"),
        vec![fan_out, fan_in],
        Init::fan_in(fan_in),
    ));
    out.push((format!("{name}.bias"), vec![fan_out], Init::fan_in(fan_in)));
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
        device: &Device,
    ) -> Result<Self, ModelError> {
        // conv1 keeps the size (padding 2), pool halves it (floor), conv2 takes 4 off,
        // pool halves again: the smallest input that leaves 1x1 is 12x12.
        if height < 12 || width < 12 || channels == 0 {
            return Err(ModelError::Config(format!(
                "the CNN needs images of at least 1x12x12, got {channels}x{height}x{width}"
            )));
        }
        let conv1 = Im2Col::new(channels, height, width, PAD1, device)?;
        let (h1, w1) = (conv1.out_h / 2, conv1.out_w / 2);
        let conv2 = Im2Col::new(CONV1_OUT, h1, w1, 0, device)?;
        let pool2 = (conv2.out_h / 2, conv2.out_w / 2);
        Ok(Arch::Cnn(CnnGeometry {
            channels,
            classes,
            conv1,
            conv2,
            pool2,
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
                    Init::fan_in(fan1),
                ));
                out.push(("conv1.bias".into(), vec![CONV1_OUT], Init::fan_in(fan1)));
                let fan2 = CONV1_OUT * K * K;
                out.push((
                    "conv2.weight".into(),
                    vec![CONV2_OUT, CONV1_OUT, K, K],
                    Init::fan_in(fan2),
                ));
                out.push(("conv2.bias".into(), vec![CONV2_OUT], Init::fan_in(fan2)));
                let flat = CONV2_OUT * g.pool2.0 * g.pool2.1;
                linear("fc1", flat, FC1, &mut out);
                linear("fc2", FC1, FC2, &mut out);
                linear("fc3", FC2, g.classes, &mut out);
            }
            Arch::Transformer(t) => out = t.slots(),
        }
        out
    }

    /// Shape of one input batch of `batch` samples.
    pub fn input_shape(&self, batch: usize) -> Vec<usize> {
        match self {
            Arch::Mlp(widths) => vec![batch, widths[0]],
            Arch::Cnn(g) => vec![batch, g.channels, g.conv1.height, g.conv1.width],
            Arch::Transformer(t) => vec![batch, t.shape.context],
        }
    }

    /// Logits `(batch, classes)` for input `x` (the transformer: `(batch *
    /// context, vocab)` for tokens `x`); `p` holds the parameter
    /// tensors in [`Arch::slots`] order (with their final shapes).
    pub fn forward(&self, p: &[Tensor], x: &Tensor) -> CandleResult<Tensor> {
        match self {
            Arch::Mlp(_) => dense_stack(p, x.t()?),
            Arch::Cnn(g) => {
                // convolutions run batch-last, (C, H, W, N): see `Im2Col`
                let n = x.dim(0)?;
                let x = x.reshape((n, g.conv1.in_len))?.t()?.contiguous()?;
                let y = max_pool_2x2(&g.conv1.conv(&x, &p[0], &p[1])?)?.relu()?;
                let y = y.reshape((g.conv2.in_len, n))?;
                let y = max_pool_2x2(&g.conv2.conv(&y, &p[2], &p[3])?)?.relu()?;
                // (C*H*W, N) is PyTorch's flatten order, feature-major
                let y = y.reshape((CONV2_OUT * g.pool2.0 * g.pool2.1, n))?;
                dense_stack(&p[4..], y)
            }
            Arch::Transformer(t) => t.forward(p, x),
        }
    }
}

/// Linear layers (weight, bias pairs) with ReLU between them, none after
/// the last, on feature-major activations: `x` is `(features, batch)` and
/// each layer computes `W x + b`; the result is returned as `(batch,
/// classes)` logits.
///
/// Feature-major because candle differentiates `x W^T` (the batch-major
/// form) into a weight gradient that arrives transposed and is then added
/// into the zero-initialised gradient with a strided add; `W x` gives the
/// weight gradient contiguously. For the 784-256-10 MLP at batch 32 that
/// cut the fc1 forward+backward from 4.1 ms to 2.5 ms (single thread).
fn dense_stack(p: &[Tensor], mut x: Tensor) -> CandleResult<Tensor> {
    let layers = p.len() / 2;
    for (i, wb) in p.chunks_exact(2).enumerate() {
        let out = wb[0].dim(0)?;
        x = wb[0].matmul(&x)?.broadcast_add(&wb[1].reshape((out, 1))?)?;
        if i + 1 < layers {
            x = x.relu()?;
        }
    }
    x.t()
}

/// A stride-1 `K x K` convolution as a row gather (im2col) and one matrix
/// product, on batch-last tensors: the input is `(C*H*W, N)`, the output
/// `(out, out_h, out_w, N)`.
///
/// Why not candle's `conv2d`: its CPU backward computes the input gradient
/// with a direct `conv_transpose2d`, which made a LeNet step several times
/// slower (single-threaded, batch 32: 62 ms for conv2's forward and
/// backward). Gather + matmul differentiates into scatter-add + matmul and
/// runs on every device. Batch-last order makes each gathered row a
/// contiguous run of N values (a batch-first gather copies one float per
/// index and was 3x slower), and the matmul `(out, patch) x (patch, L*N)`
/// lands directly in the output layout, with no transposes.
#[derive(Debug, Clone)]
struct Im2Col {
    /// For patch entry (c, ky, kx) and output position (oy, ox), in that
    /// order, the input row to copy; padding points at an extra zero row
    /// appended after the input.
    index: Tensor,
    in_len: usize,
    padded: bool,
    height: usize,
    width: usize,
    out_h: usize,
    out_w: usize,
    patch: usize,
}

impl Im2Col {
    fn new(
        channels: usize,
        height: usize,
        width: usize,
        pad: usize,
        device: &Device,
    ) -> CandleResult<Self> {
        let (out_h, out_w) = (height + 2 * pad + 1 - K, width + 2 * pad + 1 - K);
        let in_len = channels * height * width;
        let mut index = Vec::with_capacity(channels * K * K * out_h * out_w);
        let mut padded = false;
        for c in 0..channels {
            for ky in 0..K {
                for kx in 0..K {
                    for oy in 0..out_h {
                        for ox in 0..out_w {
                            let iy = (oy + ky).wrapping_sub(pad);
                            let ix = (ox + kx).wrapping_sub(pad);
                            let row = if iy >= height || ix >= width {
                                padded = true;
                                in_len
                            } else {
                                (c * height + iy) * width + ix
                            };
                            index.push(row as u32);
                        }
                    }
                }
            }
        }
        let len = index.len();
        Ok(Im2Col {
            index: Tensor::from_vec(index, len, device)?,
            in_len,
            padded,
            height,
            width,
            out_h,
            out_w,
            patch: channels * K * K,
        })
    }

    /// `x`: `(C*H*W, N)` -> `(out, out_h, out_w, N)`.
    fn conv(&self, x: &Tensor, w: &Tensor, b: &Tensor) -> CandleResult<Tensor> {
        let n = x.dim(1)?;
        let out = w.dim(0)?;
        let mut x = x.clone();
        if self.padded {
            let zero = Tensor::zeros((1, n), x.dtype(), x.device())?;
            x = Tensor::cat(&[&x, &zero], 0)?;
        }
        let positions = self.out_h * self.out_w;
        let cols = x
            .index_select(&self.index, 0)?
            .reshape((self.patch, positions * n))?;
        w.reshape((out, self.patch))?
            .matmul(&cols)?
            .broadcast_add(&b.reshape((out, 1))?)?
            .reshape((out, self.out_h, self.out_w, n))
    }
}

/// 2x2, stride-2 max-pooling of a `(C, H, W, N)` tensor (floor: an odd last
/// row or column is dropped).
///
/// Written as a reshape and two `max` reductions rather than
/// `Tensor::max_pool2d` because candle 0.11's `max_pool2d` backward scales
/// the gradient by (number of maxima in the window) / 4, i.e. by 1/4 for the
/// usual unique maximum; the `max` reduction's backward is exact. Pooling
/// comes before the ReLU: the same values (both are monotone) on a quarter
/// of the elements.
pub(crate) fn max_pool_2x2(y: &Tensor) -> CandleResult<Tensor> {
    let (c, h, w, n) = y.dims4()?;
    let (h2, w2) = (h / 2, w / 2);
    let mut y = y.clone();
    if h % 2 == 1 {
        y = y.narrow(1, 0, 2 * h2)?;
    }
    if w % 2 == 1 {
        y = y.narrow(2, 0, 2 * w2)?;
    }
    y.reshape((c, h2, 2, w2, 2, n))?.max(4)?.max(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn randn(shape: &[usize], seed: u64) -> Tensor {
        let mut rng = slowmo_optim::Rng::new(seed);
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    /// The gather + matmul convolution computes what candle's `conv2d`
    /// computes (its forward is right; only the speed of its backward and
    /// the max-pool backward made us write our own), with and without
    /// padding, for odd sizes and several channels.
    #[test]
    fn im2col_conv_matches_candle_conv2d() {
        for (c, h, w, pad) in [(1, 12, 12, 2), (3, 9, 11, 2), (6, 10, 7, 0)] {
            let x = randn(&[2, c, h, w], 1);
            let k = randn(&[4, c, K, K], 2);
            let b = randn(&[4], 3);
            let want = x
                .conv2d(&k, pad, 1, 1, 1)
                .unwrap()
                .broadcast_add(&b.reshape((1, 4, 1, 1)).unwrap())
                .unwrap();
            let conv = Im2Col::new(c, h, w, pad, &Device::Cpu).unwrap();
            let input = x
                .reshape((2, c * h * w))
                .unwrap()
                .t()
                .unwrap()
                .contiguous()
                .unwrap();
            let got = conv
                .conv(&input, &k, &b)
                .unwrap()
                .permute((3, 0, 1, 2))
                .unwrap();
            assert_eq!(got.dims(), want.dims());
            let diff = (got - &want).unwrap().abs().unwrap().max_all().unwrap();
            assert!(
                diff.to_scalar::<f32>().unwrap() < 1e-4,
                "{c}x{h}x{w} pad {pad}"
            );
        }
    }
}
