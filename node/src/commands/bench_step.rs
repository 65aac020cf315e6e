//! `slowmo bench step`: the time of one training step of a built-in model
//! (forward, backward, the optimizer's update of the flat parameters) on
//! this process's CPU (or, with `--device cuda:N` on a CUDA build, on a
//! GPU), for the side-by-side with PyTorch (`tools/bench/torch_step.py`
//! builds the same models and times them the same way).
//!
//! Besides the whole step, each row gives the median of its two halves:
//! the forward and backward pass (on the device, with the copy of the
//! parameters in and of the gradient out) and the optimizer's update of the
//! flat parameters (always on the host).
//!
//! The batch is random data of the model's input shape (28x28x1 images
//! and 10 classes for the MLP and the CNN, byte tokens for the
//! transformer), drawn once from a fixed seed: the step's cost does not
//! depend on the values. The compute threads are candle's, set as for a
//! node by `RAYON_NUM_THREADS` (1 unless set; printed beside the figures).

use std::time::Instant;

use anyhow::{Result, bail};
use candle_core::Device;
use serde::Serialize;
use slowmo_optim::{Optimizer, OptimizerConfig, OptimizerKind, Rng};

use crate::model::{Model, ModelKind, StepPhases, TransformerShape};

/// Image side of the classifiers' inputs (Fashion-MNIST's).
const SIDE: usize = 28;
/// Classes of the classifiers, tokens of the transformer.
const CLASSES: usize = 10;
const VOCAB: usize = 256;

/// What `bench step` measures for one model.
#[derive(Debug, Clone, Serialize)]
pub struct StepTime {
    pub model: String,
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub params: usize,
    pub batch: usize,
    pub threads: usize,
    pub optimizer: String,
    /// Median of the timed steps, in milliseconds.
    pub median_ms: f64,
    /// Fastest timed step, in milliseconds.
    pub best_ms: f64,
    /// Median of the forward and backward passes alone, in milliseconds.
    pub forward_backward_ms: f64,
    /// Median of the optimizer's update alone, in milliseconds.
    pub update_ms: f64,
    /// With `--phases`: the median of each phase of the forward and
    /// backward pass, in milliseconds, from as many more steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases_ms: Option<StepPhases>,
}

/// The model of `kind` as the bench (and the PyTorch script) builds it.
fn model(kind: ModelKind, shape: TransformerShape, device: &Device) -> Result<Model> {
    Ok(match kind {
        ModelKind::Transformer => Model::transformer(shape, VOCAB, device)?,
        _ => Model::new(kind, &[256], 1, SIDE, SIDE, CLASSES, device)?,
    })
}

/// Times `steps` steps of each model after `warmup` untimed ones.
pub fn run(
    models: &[ModelKind],
    batch: Option<usize>,
    shape: TransformerShape,
    (warmup, steps): (usize, usize),
    device: &Device,
    phases: bool,
    json: bool,
) -> Result<()> {
    if steps == 0 {
        bail!("--steps must be at least 1");
    }
    if batch == Some(0) {
        bail!("--batch must be at least 1");
    }
    let threads = candle_core::utils::get_num_threads();
    let mut rows = Vec::new();
    for &kind in models {
        // the transformer's default batch is the README's (16 windows)
        let batch = batch.unwrap_or(if kind == ModelKind::Transformer {
            16
        } else {
            32
        });
        let mut row = time_model(kind, shape, batch, (warmup, steps), threads, device)?;
        if phases {
            row.phases_ms = Some(time_phases(kind, shape, batch, steps, device)?);
        }
        rows.push(row);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "| model | device | parameters | batch | threads | optimizer | median step | best step | forward+backward | update |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            r.model,
            r.device,
            r.params,
            r.batch,
            r.threads,
            r.optimizer,
            r.median_ms,
            r.best_ms,
            r.forward_backward_ms,
            r.update_ms
        );
    }
    if phases {
        println!();
        println!(
            "| model | device | batch in | parameters in | forward | backward | gradient out |"
        );
        println!("|---|---|---|---|---|---|---|");
        for r in &rows {
            let Some(p) = r.phases_ms else { continue };
            println!(
                "| {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
                r.model, r.device, p.batch_in, p.params_in, p.forward, p.backward, p.grad_out
            );
        }
    }
    Ok(())
}

/// The median of each phase of `steps` forward and backward passes (after
/// one untimed pass), in milliseconds.
fn time_phases(
    kind: ModelKind,
    shape: TransformerShape,
    batch: usize,
    steps: usize,
    device: &Device,
) -> Result<StepPhases> {
    let (mut m, x, inputs, labels) = setup(kind, shape, batch, device)?;
    let mut grad = vec![0f32; x.len()];
    m.timed_loss_and_grad(&x, &inputs, &labels, &mut grad)?;
    let mut all = Vec::with_capacity(steps);
    for _ in 0..steps {
        all.push(m.timed_loss_and_grad(&x, &inputs, &labels, &mut grad)?);
    }
    let median = |f: fn(&StepPhases) -> f64| {
        let mut v: Vec<f64> = all.iter().map(|p| f(p) * 1e3).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(StepPhases {
        batch_in: median(|p| p.batch_in),
        params_in: median(|p| p.params_in),
        forward: median(|p| p.forward),
        backward: median(|p| p.backward),
        grad_out: median(|p| p.grad_out),
    })
}

/// A model, its initial parameters, and the bench's batch (inputs, labels).
type Setup = (Model, Vec<f32>, Vec<f32>, Vec<u32>);

/// The model, its initial parameters and the bench's fixed random batch.
fn setup(kind: ModelKind, shape: TransformerShape, batch: usize, device: &Device) -> Result<Setup> {
    let m = model(kind, shape, device)?;
    let x = m.init_params(1);
    let mut rng = Rng::new(7);
    let sample_len = m.sample_len();
    let inputs: Vec<f32> = (0..batch * sample_len)
        .map(|_| match kind {
            ModelKind::Transformer => rng.below(VOCAB as u64) as f32,
            _ => rng.uniform() as f32 * 2.0 - 1.0,
        })
        .collect();
    let labels: Vec<u32> = (0..batch)
        .map(|_| rng.below(CLASSES as u64) as u32)
        .collect();
    Ok((m, x, inputs, labels))
}

fn time_model(
    kind: ModelKind,
    shape: TransformerShape,
    batch: usize,
    (warmup, steps): (usize, usize),
    threads: usize,
    device: &Device,
) -> Result<StepTime> {
    let (mut m, mut x, inputs, labels) = setup(kind, shape, batch, device)?;
    let mut grad = vec![0f32; x.len()];
    let (opt_cfg, lr) = match kind {
        // the transformer trains with Adam, the classifiers with SGD and
        // momentum 0.9 (each the README's setting)
        ModelKind::Transformer => (
            OptimizerConfig {
                kind: OptimizerKind::Adam,
                ..OptimizerConfig::default()
            },
            1e-3,
        ),
        _ => (OptimizerConfig::default(), 1e-2),
    };
    let mut opt = Optimizer::new(&opt_cfg, x.len())?;
    let (mut times, mut passes, mut updates) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..warmup + steps {
        // the gradient lands in a host buffer, so the pass has finished on
        // the device when loss_and_grad returns
        let start = Instant::now();
        m.loss_and_grad(&x, &inputs, &labels, &mut grad)?;
        let passed = Instant::now();
        opt.step(&mut x, &grad, lr);
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64() * 1e3);
            passes.push((passed - start).as_secs_f64() * 1e3);
            updates.push(passed.elapsed().as_secs_f64() * 1e3);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (forward_backward_ms, update_ms) = (median(&mut passes), median(&mut updates));
    times.sort_by(f64::total_cmp);
    Ok(StepTime {
        model: kind.to_string(),
        device: match device.location() {
            candle_core::DeviceLocation::Cpu => "cpu".into(),
            candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
            other => format!("{other:?}"),
        },
        params: x.len(),
        batch,
        threads,
        optimizer: match opt_cfg.kind {
            OptimizerKind::Sgd => "SGD, momentum 0.9".into(),
            other => other.to_string(),
        },
        median_ms: times[times.len() / 2],
        best_ms: times[0],
        forward_backward_ms,
        update_ms,
        phases_ms: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_takes_a_timed_step() {
        let tiny = TransformerShape {
            layers: 1,
            heads: 2,
            width: 16,
            context: 8,
        };
        for kind in [ModelKind::Mlp, ModelKind::Cnn, ModelKind::Transformer] {
            let cpu = Device::Cpu;
            let t = time_model(kind, tiny, 2, (0, 3), 1, &cpu).unwrap();
            assert_eq!(t.params, model(kind, tiny, &cpu).unwrap().num_params());
            assert_eq!(t.device, "cpu");
            assert!(t.best_ms > 0.0 && t.best_ms <= t.median_ms, "{t:?}");
            assert!(t.forward_backward_ms > 0.0 && t.update_ms > 0.0, "{t:?}");
            assert!(
                t.forward_backward_ms + t.update_ms <= 2.0 * t.median_ms + 1.0,
                "{t:?}"
            );
            let p = time_phases(kind, tiny, 2, 3, &cpu).unwrap();
            let parts = [p.batch_in, p.params_in, p.forward, p.backward, p.grad_out];
            assert!(parts.iter().all(|&ms| ms >= 0.0), "{p:?}");
            assert!(p.forward > 0.0 && p.backward > 0.0, "{p:?}");
        }
        let cpu = Device::Cpu;
        assert!(run(&[ModelKind::Mlp], Some(0), tiny, (0, 1), &cpu, false, true).is_err());
        assert!(run(&[ModelKind::Mlp], None, tiny, (0, 0), &cpu, false, true).is_err());
    }
}
