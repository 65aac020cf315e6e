//! `slowmo bench step`: the time of one training step of a built-in model
//! (forward, backward, the optimizer's update of the flat parameters) on
//! this process's CPU, for the side-by-side with PyTorch
//! (`tools/bench/torch_step.py` builds the same models and times them the
//! same way).
//!
//! The batch is random data of the model's input shape (28x28x1 images
//! and 10 classes for the MLP and the CNN, byte tokens for the
//! transformer), drawn once from a fixed seed: the step's cost does not
//! depend on the values. The compute threads are candle's, set as for a
//! node by `RAYON_NUM_THREADS` (1 unless set; printed beside the figures).

use std::time::Instant;

use anyhow::{Result, bail};
use serde::Serialize;
use slowmo_optim::{Optimizer, OptimizerConfig, OptimizerKind, Rng};

use crate::model::{Model, ModelKind, TransformerShape};

/// Image side of the classifiers' inputs (Fashion-MNIST's).
const SIDE: usize = 28;
/// Classes of the classifiers, tokens of the transformer.
const CLASSES: usize = 10;
const VOCAB: usize = 256;

/// What `bench step` measures for one model.
#[derive(Debug, Clone, Serialize)]
pub struct StepTime {
    pub model: String,
    pub params: usize,
    pub batch: usize,
    pub threads: usize,
    pub optimizer: String,
    /// Median of the timed steps, in milliseconds.
    pub median_ms: f64,
    /// Fastest timed step, in milliseconds.
    pub best_ms: f64,
}

/// The model of `kind` as the bench (and the PyTorch script) builds it.
fn model(kind: ModelKind, shape: TransformerShape) -> Result<Model> {
    let cpu = candle_core::Device::Cpu;
    Ok(match kind {
        ModelKind::Transformer => Model::transformer(shape, VOCAB, &cpu)?,
        _ => Model::new(kind, &[256], 1, SIDE, SIDE, CLASSES, &cpu)?,
    })
}

/// Times `steps` steps of each model after `warmup` untimed ones.
pub fn run(
    models: &[ModelKind],
    batch: Option<usize>,
    shape: TransformerShape,
    (warmup, steps): (usize, usize),
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
        rows.push(time_model(kind, shape, batch, warmup, steps, threads)?);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("| model | parameters | batch | threads | optimizer | median step | best step |");
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {:.2} ms | {:.2} ms |",
            r.model, r.params, r.batch, r.threads, r.optimizer, r.median_ms, r.best_ms
        );
    }
    Ok(())
}

fn time_model(
    kind: ModelKind,
    shape: TransformerShape,
    batch: usize,
    warmup: usize,
    steps: usize,
    threads: usize,
) -> Result<StepTime> {
    let mut m = model(kind, shape)?;
    let mut x = m.init_params(1);
    let mut grad = vec![0f32; x.len()];
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
    let mut times = Vec::with_capacity(steps);
    for i in 0..warmup + steps {
        let start = Instant::now();
        m.loss_and_grad(&x, &inputs, &labels, &mut grad)?;
        opt.step(&mut x, &grad, lr);
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(StepTime {
        model: kind.to_string(),
        params: x.len(),
        batch,
        threads,
        optimizer: match opt_cfg.kind {
            OptimizerKind::Sgd => "SGD, momentum 0.9".into(),
            other => other.to_string(),
        },
        median_ms: times[times.len() / 2],
        best_ms: times[0],
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
            let t = time_model(kind, tiny, 2, 0, 2, 1).unwrap();
            assert_eq!(t.params, model(kind, tiny).unwrap().num_params());
            assert!(t.best_ms > 0.0 && t.best_ms <= t.median_ms, "{t:?}");
        }
        assert!(run(&[ModelKind::Mlp], Some(0), tiny, (0, 1), true).is_err());
        assert!(run(&[ModelKind::Mlp], None, tiny, (0, 0), true).is_err());
    }
}
