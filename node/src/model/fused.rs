//! Fused CPU kernels for the transformer, each with its own backward pass:
//! layer norm, the attention's scaled causal softmax, erf GELU, and the
//! linear layers' bias add.
//!
//! Written as candle tensor ops, each of these is several passes over
//! memory forward (a reduction, a broadcast subtraction, a division, ...)
//! and more backward, where candle differentiates every one of them; that
//! was about a third of the transformer's CPU step. Here each is one pass
//! forward and one backward, row by row. Rows are independent, so the
//! result does not depend on how many threads share the rows; the layer
//! norm's weight and bias gradients (sums over rows) are summed in row
//! order on one thread.
//!
//! Only for the CPU: on another device the model uses the tensor-op
//! versions (`transformer.rs`), which candle runs there.

use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, bail,
};
use rayon::prelude::*;
use slowmo_gossip::wide_lanes;

/// Rows per parallel task: enough work that a hand-off costs little.
const MIN_ROWS: usize = 16;
/// Values per parallel task of the element-wise GELU.
const PIECE: usize = 4096;

fn contiguous_f32<'a>(storage: &'a CpuStorage, layout: &Layout, what: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(values) = storage else {
        bail!("{what}: f32 only")
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => bail!("{what}: the input must be contiguous"),
    }
}

/// Two inputs of one shape (an operation's input and its output's
/// gradient), as contiguous f32 values.
fn same_shape_f32<'a>(
    (s1, l1): (&'a CpuStorage, &Layout),
    (s2, l2): (&'a CpuStorage, &Layout),
    what: &str,
) -> Result<(&'a [f32], &'a [f32])> {
    let a = contiguous_f32(s1, l1, what)?;
    let b = contiguous_f32(s2, l2, &format!("{what} gradient"))?;
    if a.len() != b.len() {
        bail!("{what}: shapes disagree");
    }
    Ok((a, b))
}

/// Width of the last dimension and the number of rows of `layout`.
fn rows(layout: &Layout, what: &str) -> Result<(usize, usize)> {
    let dims = layout.shape().dims();
    match dims.last() {
        Some(&w) if w > 0 => Ok((w, layout.shape().elem_count() / w)),
        _ => bail!("{what}: needs a non-empty last dimension, got {dims:?}"),
    }
}

/// Layer norm over the last dimension of `x`, with weight and bias:
/// `(x - mean) / sqrt(var + eps) * w + b`, the variance biased (PyTorch's).
pub(crate) fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f32) -> Result<Tensor> {
    x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, LayerNorm { eps })
}

/// `softmax(scale * s)` over the last dimension of attention scores `s`
/// `(.., t, t)`, row `i` of each `(t, t)` block seeing only columns `0..=i`
/// (the others are 0).
pub(crate) fn causal_softmax(scores: &Tensor, scale: f32) -> Result<Tensor> {
    scores.contiguous()?.apply_op1(CausalSoftmax { scale })
}

/// GELU with the exact (erf) form: `x Φ(x)`.
pub(crate) fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(GeluErf)
}

/// `x + b` for `x` `(.., out)` and a bias `b` `(out)`: the bias added to
/// every row. Its backward passes the gradient through to `x` as it is and
/// sums it over rows for `b`, in row order (candle's broadcast add reduces
/// with a strided sum, and adds a node to the graph).
pub(crate) fn add_bias(x: &Tensor, b: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&b.contiguous()?, AddBias)
}

/// Mean and `1 / sqrt(var + eps)` of one row, in two passes.
#[inline]
fn moments(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    (mean, 1.0 / (var + eps).sqrt())
}

struct LayerNorm {
    eps: f32,
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "slowmo-layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s1, l1, "layer norm")?;
        let (w, b) = (
            contiguous_f32(s2, l2, "layer norm weight")?,
            contiguous_f32(s3, l3, "layer norm bias")?,
        );
        let (d, _) = rows(l1, "layer norm")?;
        if w.len() != d || b.len() != d {
            bail!(
                "layer norm: weight {} and bias {} for rows of {d}",
                w.len(),
                b.len()
            );
        }
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .with_min_len(MIN_ROWS)
            .for_each(|(y, x)| {
                let (mean, rstd) = moments(x, self.eps);
                for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
                    *y = (x - mean) * rstd * w + b;
                }
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let n = x.elem_count() / w.elem_count();
        let all = x.apply_op3_no_bwd(w, &grad.contiguous()?, &LayerNormGrad { eps: self.eps })?;
        let dx = all.narrow(0, 0, n)?.reshape(x.shape())?;
        let dw = all.narrow(0, n, 1)?.reshape(w.shape())?;
        let db = all.narrow(0, n + 1, 1)?.reshape(w.shape())?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// The layer norm's gradients from `x`, `w` and the output's gradient `g`:
/// `(n + 2, d)`, the rows of `dx`, then `dw`, then `db`.
struct LayerNormGrad {
    eps: f32,
}

impl CustomOp3 for LayerNormGrad {
    fn name(&self) -> &'static str {
        "slowmo-layer-norm-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, g) = same_shape_f32((s1, l1), (s3, l3), "layer norm backward")?;
        let w = contiguous_f32(s2, l2, "layer norm backward weight")?;
        let (d, n) = rows(l1, "layer norm backward")?;
        if w.len() != d {
            bail!(
                "layer norm backward: a weight of {} for rows of {d}",
                w.len()
            );
        }
        let stats: Vec<(f32, f32)> = x
            .par_chunks(d)
            .with_min_len(MIN_ROWS)
            .map(|x| moments(x, self.eps))
            .collect();
        let mut out = vec![0f32; (n + 2) * d];
        let (dx, sums) = out.split_at_mut(n * d);
        dx.par_chunks_mut(d)
            .zip(x.par_chunks(d).zip(g.par_chunks(d)).zip(&stats))
            .with_min_len(MIN_ROWS)
            .for_each(|(dx, ((x, g), &(mean, rstd)))| {
                // mean of g*w and of g*w*xhat over the row
                let (mut a, mut c) = (0f32, 0f32);
                for ((&x, &g), &w) in x.iter().zip(g).zip(w) {
                    let gw = g * w;
                    a += gw;
                    c += gw * (x - mean) * rstd;
                }
                let (a, c) = (a / d as f32, c / d as f32);
                for (((dx, &x), &g), &w) in dx.iter_mut().zip(x).zip(g).zip(w) {
                    *dx = rstd * (g * w - a - (x - mean) * rstd * c);
                }
            });
        let (dw, db) = sums.split_at_mut(d);
        for ((x, g), &(mean, rstd)) in x.chunks_exact(d).zip(g.chunks_exact(d)).zip(&stats) {
            for (((dw, db), &x), &g) in dw.iter_mut().zip(db.iter_mut()).zip(x).zip(g) {
                *dw += g * (x - mean) * rstd;
                *db += g;
            }
        }
        Ok((CpuStorage::F32(out), Shape::from_dims(&[n + 2, d])))
    }
}

struct AddBias;

impl CustomOp2 for AddBias {
    fn name(&self) -> &'static str {
        "slowmo-add-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s1, l1, "bias add")?;
        let b = contiguous_f32(s2, l2, "bias add bias")?;
        let (d, _) = rows(l1, "bias add")?;
        if b.len() != d {
            bail!("bias add: a bias of {} for rows of {d}", b.len());
        }
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .with_min_len(MIN_ROWS)
            .for_each(|(y, x)| {
                for ((y, &x), &b) in y.iter_mut().zip(x).zip(b) {
                    *y = x + b;
                }
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let db = grad.contiguous()?.apply_op1_no_bwd(&SumRows)?;
        Ok((Some(grad.clone()), Some(db.reshape(b.shape())?)))
    }
}

/// The sum of the rows of `(.., d)`: `(d)`, added in row order.
struct SumRows;

impl CustomOp1 for SumRows {
    fn name(&self) -> &'static str {
        "slowmo-sum-rows"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = contiguous_f32(storage, layout, "row sum")?;
        let (d, _) = rows(layout, "row sum")?;
        let mut sum = vec![0f32; d];
        for row in g.chunks_exact(d) {
            sum.iter_mut().zip(row).for_each(|(s, g)| *s += g);
        }
        Ok((CpuStorage::F32(sum), Shape::from_dims(&[d])))
    }
}

struct CausalSoftmax {
    scale: f32,
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "slowmo-causal-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let s = contiguous_f32(storage, layout, "causal softmax")?;
        let dims = layout.shape().dims();
        let t = match dims {
            [.., a, b] if a == b && *a > 0 => *a,
            _ => bail!("causal softmax: needs square (.., t, t) scores, got {dims:?}"),
        };
        let mut y = vec![0f32; s.len()];
        y.par_chunks_mut(t)
            .zip(s.par_chunks(t))
            .enumerate()
            .with_min_len(MIN_ROWS)
            .for_each(|(row, (y, s))| {
                let seen = row % t + 1;
                let (y, s) = (&mut y[..seen], &s[..seen]);
                let max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let mut sum = 0f32;
                for (y, &s) in y.iter_mut().zip(s) {
                    *y = (self.scale * (s - max)).exp();
                    sum += *y;
                }
                let inv = 1.0 / sum;
                y.iter_mut().for_each(|y| *y *= inv);
            });
        Ok((CpuStorage::F32(y), layout.shape().clone()))
    }

    fn bwd(&self, _s: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let g = y.apply_op2_no_bwd(
            &grad.contiguous()?,
            &CausalSoftmaxGrad { scale: self.scale },
        )?;
        Ok(Some(g))
    }
}

/// `scale * y (g - Σ y g)` per row, from the softmax's output `y` and its
/// gradient `g`.
struct CausalSoftmaxGrad {
    scale: f32,
}

impl CustomOp2 for CausalSoftmaxGrad {
    fn name(&self) -> &'static str {
        "slowmo-causal-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (y, g) = same_shape_f32((s1, l1), (s2, l2), "causal softmax backward")?;
        let (t, _) = rows(l1, "causal softmax backward")?;
        let mut out = vec![0f32; y.len()];
        out.par_chunks_mut(t)
            .zip(y.par_chunks(t).zip(g.par_chunks(t)))
            .enumerate()
            .with_min_len(MIN_ROWS)
            .for_each(|(row, (out, (y, g)))| {
                let seen = row % t + 1;
                let (out, y, g) = (&mut out[..seen], &y[..seen], &g[..seen]);
                let dot: f32 = y.iter().zip(g).map(|(y, g)| y * g).sum();
                for ((o, &y), &g) in out.iter_mut().zip(y).zip(g) {
                    *o = self.scale * y * (g - dot);
                }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

struct GeluErf;

/// `erf(x)` as a rational function of `x` clamped to [-4, 4] (beyond which
/// erf is 1 in f32 to within 2e-8), evaluated in f32: at most 5e-7 from
/// the exact value (tested; the worst near |x| = 3.6, where the f32 sums
/// round; libm's erff is within 3e-8), branch-free, so that loops of it run
/// in vector lanes, where libm's erff is a scalar call a value. For GELU
/// that is an error of at most 2.5e-6 on `x Φ(x)`, at x near -5.
#[inline(always)]
fn erf(x: f32) -> f32 {
    const P: [f32; 7] = [
        -2.726_142_3e-10,
        2.770_681_4e-8,
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906_3e-4,
        -2.954_600_1e-3,
        -1.609_603_3e-2,
    ];
    const Q: [f32; 5] = [
        -1.456_607_2e-5,
        -2.133_740_6e-4,
        -1.682_827e-3,
        -7.373_329e-3,
        -1.426_474e-2,
    ];
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = P[1..].iter().fold(P[0], |p, &c| p * x2 + c) * x;
    let q = Q[1..].iter().fold(Q[0], |q, &c| q * x2 + c);
    (p / q).clamp(-1.0, 1.0)
}

/// `Φ(x)`, the standard normal's distribution function.
#[inline(always)]
fn phi(x: f32) -> f32 {
    0.5 * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `e^a` for `a <= 0`, branch-free so that loops of it run in vector lanes:
/// `a` clamped to [-87, 0] (e^-87 is 1.6e-38, the smallest normal f32 is
/// 1.2e-38), `a = n ln 2 + r` with `|r| <= ln 2 / 2`, `e^r` by its Taylor
/// series to `r^7`, times `2^n` through the exponent bits. Within 2e-7 of
/// the exact value, relatively (tested).
#[inline(always)]
fn exp_nonpositive(a: f32) -> f32 {
    // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let a = a.clamp(-87.0, 0.0);
    let n = (a * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = (a - n * LN2_HI) - n * LN2_LO;
    const C: [f32; 8] = [
        1.0 / 5040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
    let e = C[1..].iter().fold(C[0], |e, &c| e * r + c);
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `x Φ(x)` of every `x` into `y`.
#[inline(always)]
fn gelu_plain(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = x * phi(x);
    }
}

/// `g (Φ(x) + x φ(x))` of every `x` and `g` into `out`.
#[inline(always)]
fn gelu_grad_plain(x: &[f32], g: &[f32], out: &mut [f32]) {
    // 1 / sqrt(2 pi)
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    for ((o, &x), &g) in out.iter_mut().zip(x).zip(g) {
        let density = INV_SQRT_2PI * exp_nonpositive(-0.5 * x * x);
        *o = g * (phi(x) + x * density);
    }
}

wide_lanes! {
    fn gelu_lanes / gelu_avx2 = gelu_plain(x: &[f32], y: &mut [f32]);
    fn gelu_grad_lanes / gelu_grad_avx2 = gelu_grad_plain(x: &[f32], g: &[f32], out: &mut [f32]);
}

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "slowmo-gelu-erf"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(storage, layout, "gelu")?;
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(PIECE)
            .zip(x.par_chunks(PIECE))
            .for_each(|(y, x)| gelu_lanes(x, y));
        Ok((CpuStorage::F32(y), layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &GeluErfGrad)?))
    }
}

/// `g (Φ(x) + x φ(x))`, GELU's gradient at `x` times the output's `g`.
struct GeluErfGrad;

impl CustomOp2 for GeluErfGrad {
    fn name(&self) -> &'static str {
        "slowmo-gelu-erf-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, g) = same_shape_f32((s1, l1), (s2, l2), "gelu backward")?;
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(PIECE)
            .zip(x.par_chunks(PIECE).zip(g.par_chunks(PIECE)))
            .for_each(|(out, (x, g))| gelu_grad_lanes(x, g, out));
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::transformer::{causal_mask, layer_norm_ops, softmax_last};
    use candle_core::{Device, Var};

    /// Deterministic values in about [-scale, scale].
    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn tensor(v: Vec<f32>, shape: &[usize]) -> Tensor {
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn flat(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    fn assert_close(what: &str, fused: &[f32], ops: &[f32], tol: f32) {
        assert_eq!(fused.len(), ops.len(), "{what}: lengths");
        for (i, (a, b)) in fused.iter().zip(ops).enumerate() {
            assert!(
                (a - b).abs() <= tol * (1.0 + b.abs()),
                "{what}[{i}]: fused {a}, tensor ops {b}"
            );
        }
    }

    /// The value and the gradients (of `sum(f(inputs) * upstream)`) of `f`.
    fn value_and_grads(
        inputs: &[Tensor],
        upstream: &Tensor,
        f: impl Fn(&[Tensor]) -> Result<Tensor>,
    ) -> (Vec<f32>, Vec<Vec<f32>>) {
        let vars: Vec<Var> = inputs
            .iter()
            .map(|t| Var::from_tensor(t).unwrap())
            .collect();
        let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let y = f(&ts).unwrap();
        let grads = (&y * upstream)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g = ts.iter().map(|t| flat(grads.get(t).unwrap())).collect();
        (flat(&y), g)
    }

    #[test]
    fn layer_norm_matches_the_tensor_ops_forward_and_backward() {
        let (n, d) = (37, 24);
        let inputs = [
            tensor(values(n * d, 1, 3.0), &[n, d]),
            tensor(values(d, 2, 1.5), &[d]),
            tensor(values(d, 3, 0.5), &[d]),
        ];
        let up = tensor(values(n * d, 4, 1.0), &[n, d]);
        let fused = value_and_grads(&inputs, &up, |p| layer_norm(&p[0], &p[1], &p[2], 1e-5));
        let ops = value_and_grads(&inputs, &up, |p| layer_norm_ops(&p[0], &p[1], &p[2]));
        assert_close("y", &fused.0, &ops.0, 1e-5);
        for (i, name) in ["dx", "dw", "db"].iter().enumerate() {
            assert_close(name, &fused.1[i], &ops.1[i], 1e-4);
        }
    }

    #[test]
    fn causal_softmax_matches_the_masked_tensor_ops_forward_and_backward() {
        let (b, h, t) = (2, 3, 7);
        let scale = 0.35f32;
        let s = [tensor(values(b * h * t * t, 5, 4.0), &[b, h, t, t])];
        let up = tensor(values(b * h * t * t, 6, 1.0), &[b, h, t, t]);
        let mask = causal_mask(t, &Device::Cpu).unwrap();
        let fused = value_and_grads(&s, &up, |p| causal_softmax(&p[0], scale));
        let ops = value_and_grads(&s, &up, |p| {
            softmax_last(&(&p[0] * scale as f64)?.broadcast_add(&mask)?)
        });
        assert_close("y", &fused.0, &ops.0, 1e-6);
        assert_close("ds", &fused.1[0], &ops.1[0], 1e-5);
        // above the diagonal: nothing forward, nothing backward
        for (i, (y, g)) in fused.0.iter().zip(&fused.1[0]).enumerate() {
            if i % t > (i / t) % t {
                assert_eq!((*y, *g), (0.0, 0.0), "entry {i}");
            }
        }
    }

    #[test]
    fn gelu_matches_candles_forward_and_backward() {
        let n = 10_000;
        let x = [tensor(values(n, 7, 6.0), &[n])];
        let up = tensor(values(n, 8, 1.0), &[n]);
        let fused = value_and_grads(&x, &up, |p| gelu_erf(&p[0]));
        let ops = value_and_grads(&x, &up, |p| p[0].gelu_erf());
        assert_close("y", &fused.0, &ops.0, 1e-6);
        assert_close("dx", &fused.1[0], &ops.1[0], 1e-5);
    }

    #[test]
    fn erf_is_within_5e7_of_the_exact_value() {
        let mut worst = 0f64;
        for i in -900_000..=900_000 {
            let x = i as f32 * 1e-5;
            let exact = libm::erf(x as f64);
            worst = worst.max((erf(x) as f64 - exact).abs());
        }
        assert!(worst < 5e-7, "{worst}");
        assert!((erf(f32::INFINITY) - 1.0).abs() < 5e-7);
        assert!((erf(f32::NEG_INFINITY) + 1.0).abs() < 5e-7);
        assert!(erf(f32::NAN).is_nan());
        assert_eq!(erf(0.0), 0.0);
    }

    #[test]
    fn exp_is_within_2e7_of_the_exact_value() {
        let mut worst = 0f64;
        for i in 0..=8_700_000 {
            let a = -(i as f32) * 1e-5;
            let exact = (a as f64).exp();
            worst = worst.max(((exp_nonpositive(a) as f64) - exact).abs() / exact);
        }
        assert!(worst < 2e-7, "{worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(-1e30) > 0.0 && exp_nonpositive(-1e30) < 2e-38);
        assert!(exp_nonpositive(f32::NEG_INFINITY) < 2e-38);
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }

    #[test]
    fn gelu_lanes_give_the_plain_bits() {
        let x = values(10_001, 22, 7.0);
        let g = values(10_001, 23, 1.0);
        let (mut wide, mut plain) = (vec![0f32; x.len()], vec![0f32; x.len()]);
        gelu_lanes(&x, &mut wide);
        gelu_plain(&x, &mut plain);
        assert_eq!(wide, plain);
        gelu_grad_lanes(&x, &g, &mut wide);
        gelu_grad_plain(&x, &g, &mut plain);
        assert_eq!(wide, plain);
    }

    #[test]
    fn bias_add_matches_the_broadcast_add_forward_and_backward() {
        let (n, d) = (45, 19);
        let inputs = [
            tensor(values(n * d, 19, 2.0), &[n, d]),
            tensor(values(d, 20, 1.0), &[d]),
        ];
        let up = tensor(values(n * d, 21, 1.0), &[n, d]);
        let fused = value_and_grads(&inputs, &up, |p| add_bias(&p[0], &p[1]));
        let ops = value_and_grads(&inputs, &up, |p| p[0].broadcast_add(&p[1]));
        assert_close("y", &fused.0, &ops.0, 0.0);
        assert_close("dx", &fused.1[0], &ops.1[0], 0.0);
        assert_close("db", &fused.1[1], &ops.1[1], 1e-5);
    }

    #[test]
    fn the_bits_do_not_depend_on_the_thread_count() {
        let (n, d, t) = (300, 32, 16);
        let inputs = [
            tensor(values(n * d, 9, 2.0), &[n, d]),
            tensor(values(d, 10, 1.0), &[d]),
            tensor(values(d, 11, 1.0), &[d]),
        ];
        let up = tensor(values(n * d, 12, 1.0), &[n, d]);
        let scores = [tensor(values(4 * 8 * t * t, 13, 3.0), &[4, 8, t, t])];
        let up_scores = tensor(values(4 * 8 * t * t, 14, 1.0), &[4, 8, t, t]);
        let big = [tensor(values(50_000, 15, 5.0), &[50_000])];
        let up_big = tensor(values(50_000, 16, 1.0), &[50_000]);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                [
                    value_and_grads(&inputs, &up, |p| layer_norm(&p[0], &p[1], &p[2], 1e-5)),
                    value_and_grads(&scores, &up_scores, |p| causal_softmax(&p[0], 0.25)),
                    value_and_grads(&big, &up_big, |p| gelu_erf(&p[0])),
                    value_and_grads(&inputs[..2], &up, |p| add_bias(&p[0], &p[1])),
                ]
            })
        };
        let (one, three) = (run(1), run(3));
        for (a, b) in one.iter().zip(&three) {
            assert_eq!(a.0, b.0);
            assert_eq!(a.1, b.1);
        }
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let x = tensor(values(12, 17, 1.0), &[3, 4]);
        let w = tensor(values(5, 18, 1.0), &[5]);
        let err = layer_norm(&x, &w, &w, 1e-5).unwrap_err().to_string();
        assert!(err.contains("layer norm"), "{err}");
        let err = causal_softmax(&x, 1.0).unwrap_err().to_string();
        assert!(err.contains("square"), "{err}");
    }
}
