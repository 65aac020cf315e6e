//! A decoder-only transformer language model in the GPT-2 style: token
//! embedding plus learned positional embedding, `layers` pre-norm blocks
//! (layer norm, causal multi-head self-attention, residual; layer norm, MLP
//! with GELU, residual), a final layer norm, and an output head tied to the
//! token embedding (the logits are `h · wteᵀ`). No dropout.
//!
//! Parameter names follow nanoGPT's `GPT` (`transformer.wte.weight`,
//! `transformer.h.0.attn.c_attn.weight`, ...; linear weights `(out, in)`),
//! so a saved file reads like its `state_dict` without the tied
//! `lm_head.weight`. Initialisation is GPT-2's: weights normal with std
//! 0.02 (the residual projections `0.02 / sqrt(2 * layers)`), biases zero,
//! layer norms one and zero.
//!
//! On the CPU, layer norm, the attention's scaled causal softmax, GELU and
//! the bias add are fused kernels with their own backward pass
//! (`fused.rs`); on another device they are candle's differentiable tensor
//! ops (candle-nn's fused
//! `layer_norm` and `softmax_last_dim` have no backward pass).

use candle_core::{D, Device, Result as CandleResult, Tensor};
use slowmo_runspec::TransformerShape;

use super::ModelError;
use super::fused;
use super::slot::{Init, Slot};

/// PyTorch's `LayerNorm` default epsilon.
const LN_EPS: f64 = 1e-5;
/// GPT-2's initialisation standard deviation.
const INIT_STD: f32 = 0.02;
/// Parameter tensors per block, in storage order.
const PER_BLOCK: usize = 12;

/// The transformer's geometry: its shape, vocabulary and causal mask.
#[derive(Debug, Clone)]
pub(crate) struct Transformer {
    pub shape: TransformerShape,
    pub vocab: usize,
    /// `(context, context)`: 0 on and below the diagonal, -inf above, added
    /// to the attention scores so a position sees only itself and earlier
    /// ones.
    mask: Tensor,
}

impl Transformer {
    pub fn new(shape: TransformerShape, vocab: usize, device: &Device) -> Result<Self, ModelError> {
        shape
            .validate()
            .map_err(|(name, why)| ModelError::Config(format!("transformer {name}: {why}")))?;
        if vocab < 2 {
            return Err(ModelError::Config(format!(
                "the transformer needs a vocabulary of at least 2 tokens, got {vocab}"
            )));
        }
        let mask = causal_mask(shape.context, device)?;
        Ok(Transformer { shape, vocab, mask })
    }

    /// Parameter tensors in storage order.
    pub fn slots(&self) -> Vec<Slot> {
        let (d, v, t) = (self.shape.width, self.vocab, self.shape.context);
        let normal = Init::Normal(INIT_STD);
        let residual = Init::Normal(INIT_STD / (2.0 * self.shape.layers as f32).sqrt());
        let mut out: Vec<Slot> = vec![
            ("transformer.wte.weight".into(), vec![v, d], normal),
            ("transformer.wpe.weight".into(), vec![t, d], normal),
        ];
        let norm = |name: String, out: &mut Vec<Slot>| {
            out.push((format!("{name}.weight"), vec![d], Init::Constant(1.0)));
            out.push((format!("{name}.bias"), vec![d], Init::Constant(0.0)));
        };
        let linear = |name: String, fan_in, fan_out, init, out: &mut Vec<Slot>| {
            out.push((format!("{name}.weight"), vec![fan_out, fan_in], init));
            out.push((format!("{name}.bias"), vec![fan_out], Init::Constant(0.0)));
        };
        for l in 0..self.shape.layers {
            let h = format!("transformer.h.{l}");
            norm(format!("{h}.ln_1"), &mut out);
            linear(format!("{h}.attn.c_attn"), d, 3 * d, normal, &mut out);
            linear(format!("{h}.attn.c_proj"), d, d, residual, &mut out);
            norm(format!("{h}.ln_2"), &mut out);
            linear(format!("{h}.mlp.c_fc"), d, 4 * d, normal, &mut out);
            linear(format!("{h}.mlp.c_proj"), 4 * d, d, residual, &mut out);
        }
        norm("transformer.ln_f".into(), &mut out);
        out
    }

    /// Next-token logits `(batch * context, vocab)`, position after
    /// position, for `tokens` `(batch, context)` (`u32`); `p` holds the
    /// tensors in [`Transformer::slots`] order.
    pub fn forward(&self, p: &[Tensor], tokens: &Tensor) -> CandleResult<Tensor> {
        let (b, t) = tokens.dims2()?;
        let d = self.shape.width;
        let (wte, wpe) = (&p[0], &p[1]);
        let x = wte.embedding(&tokens.flatten_all()?)?.reshape((b, t, d))?;
        let mut x = x
            .broadcast_add(&wpe.narrow(0, 0, t)?)?
            .reshape((b * t, d))?;
        for block in p[2..].chunks_exact(PER_BLOCK).take(self.shape.layers) {
            let y = layer_norm(&x, &block[0], &block[1])?;
            let y = self.attention(&y, b, t, &block[2..6])?;
            x = (x + y)?;
            let y = layer_norm(&x, &block[6], &block[7])?;
            let y = gelu(&linear(&y, &block[8], &block[9])?)?;
            x = (x + linear(&y, &block[10], &block[11])?)?;
        }
        let n = p.len();
        let x = layer_norm(&x, &p[n - 2], &p[n - 1])?;
        x.matmul(&wte.t()?)
    }

    /// Causal multi-head self-attention of `x` `(b * t, width)`; `p` holds
    /// `c_attn` and `c_proj` (weight, bias each).
    fn attention(&self, x: &Tensor, b: usize, t: usize, p: &[Tensor]) -> CandleResult<Tensor> {
        let (d, heads) = (self.shape.width, self.shape.heads);
        let hd = d / heads;
        let qkv = linear(x, &p[0], &p[1])?
            .reshape((b, t, 3, heads, hd))?
            .permute((2, 0, 3, 1, 4))?;
        let (q, k, v) = (
            qkv.get(0)?.contiguous()?,
            qkv.get(1)?.contiguous()?,
            qkv.get(2)?.contiguous()?,
        );
        let scale = 1.0 / (hd as f64).sqrt();
        let scores = q.matmul(&k.t()?)?;
        let att = if scores.device().is_cpu() {
            fused::causal_softmax(&scores, scale as f32)?
        } else {
            self.masked_softmax(&(scores * scale)?, t)?
        };
        let y = att
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * t, d))?;
        linear(&y, &p[2], &p[3])
    }

    /// Softmax of scaled scores `(b, heads, t, t)` under the causal mask,
    /// as tensor ops.
    fn masked_softmax(&self, scores: &Tensor, t: usize) -> CandleResult<Tensor> {
        let mask = if t == self.shape.context {
            self.mask.clone()
        } else {
            self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?
        };
        softmax_last(&scores.broadcast_add(&mask)?)
    }
}

/// `(t, t)`: 0 on and below the diagonal, -inf above.
pub(super) fn causal_mask(t: usize, device: &Device) -> CandleResult<Tensor> {
    let mask: Vec<f32> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(mask, (t, t), device)
}

/// `x Wᵀ + b` for `x` `(n, in)` and a PyTorch-layout weight `(out, in)`.
fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> CandleResult<Tensor> {
    let y = x.matmul(&w.t()?)?;
    if y.device().is_cpu() {
        fused::add_bias(&y, b)
    } else {
        y.broadcast_add(b)
    }
}

/// Layer norm over the last dimension of `(n, width)`, PyTorch's epsilon.
fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor) -> CandleResult<Tensor> {
    if x.device().is_cpu() {
        fused::layer_norm(x, w, b, LN_EPS as f32)
    } else {
        layer_norm_ops(x, w, b)
    }
}

/// [`layer_norm`] as candle's differentiable tensor ops.
pub(super) fn layer_norm_ops(x: &Tensor, w: &Tensor, b: &Tensor) -> CandleResult<Tensor> {
    let centred = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
    let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
    centred
        .broadcast_div(&(var + LN_EPS)?.sqrt()?)?
        .broadcast_mul(w)?
        .broadcast_add(b)
}

/// GELU, erf form.
fn gelu(x: &Tensor) -> CandleResult<Tensor> {
    if x.device().is_cpu() {
        fused::gelu_erf(x)
    } else {
        x.gelu_erf()
    }
}

/// Softmax over the last dimension (max-shifted; differentiable).
pub(super) fn softmax_last(x: &Tensor) -> CandleResult<Tensor> {
    let e = x.broadcast_sub(&x.max_keepdim(D::Minus1)?)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Inputs and targets of text samples: each sample of `context + 1`
/// tokens (stored as `f32`, as every split is) gives its first `context` as
/// inputs and its last `context` as targets. A value that is not a token id
/// below `vocab` is an error naming the sample.
pub(crate) fn split_tokens(
    samples: &[f32],
    context: usize,
    vocab: usize,
) -> Result<(Vec<u32>, Vec<u32>), ModelError> {
    let n = samples.len() / (context + 1);
    let (mut inputs, mut targets) = (
        Vec::with_capacity(n * context),
        Vec::with_capacity(n * context),
    );
    for (i, sample) in samples.chunks_exact(context + 1).enumerate() {
        for (j, &v) in sample.iter().enumerate() {
            if !(v >= 0.0 && v < vocab as f32 && v.fract() == 0.0) {
                return Err(ModelError::Config(format!(
                    "value {v} at position {j} of sample {i} is not a token id below {vocab}"
                )));
            }
            let tok = v as u32;
            if j < context {
                inputs.push(tok);
            }
            if j > 0 {
                targets.push(tok);
            }
        }
    }
    Ok((inputs, targets))
}
