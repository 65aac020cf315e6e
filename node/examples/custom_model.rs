//! Bring your own model and data: a candle model defined here, outside the
//! slowmo crates, trained by the slowmo loop (push-sum gossip, exact
//! averages, slow momentum), first in the simulator and then over two real
//! peers (libp2p and the data lane on loopback, one thread each).
//!
//! ```sh
//! cargo run --release -p slowmo-node --example custom_model
//! cargo run --release -p slowmo-node --example custom_model -- 1000   # steps
//! ```
//!
//! The model is a two-layer tanh network classifying points of two
//! interleaved spirals. All it has to give the loop is a [`Learner`]: a
//! layout of named tensors over one flat `f32` buffer, the initial buffer
//! for a seed, the loss and gradient of a batch, and the loss and hits of
//! an evaluated batch. [`FlatParams`] does the copies between the flat
//! buffer and candle. The data is [`TrainData`] over [`Samples`] computed
//! on demand (data already in memory can be a `Dataset::from_samples`).
//!
//! At the end the two peers' parameter files must be byte-identical to
//! each other and to the simulator's result, as they are for the built-in
//! models (`node/tests/custom_model.rs` runs this in CI).

use std::path::Path;

use anyhow::{Context, Result, ensure};
use candle_core::{D, DType, Device, Tensor};
use clap::Parser;
use slowmo_node::commands::node::{NodeArgs, run_with};
use slowmo_node::config::TrainOptions;
use slowmo_node::data::{Samples, TrainData};
use slowmo_node::engine::setup::Workload;
use slowmo_node::engine::simulate::Simulation;
use slowmo_node::model::{BatchEval, FlatParams, Learner, ModelError, ParamSpec, load_params_file};

const HIDDEN: usize = 32;
const CLASSES: usize = 2;

/// A two-layer network, 2 -> 32 (tanh) -> 2, in candle.
pub struct SpiralNet {
    layout: Vec<ParamSpec>,
    device: Device,
}

impl SpiralNet {
    pub fn new(device: &Device) -> Self {
        let mut layout = Vec::new();
        let mut offset = 0;
        for (name, shape) in [
            ("hidden.weight", vec![HIDDEN, 2]),
            ("hidden.bias", vec![HIDDEN]),
            ("out.weight", vec![CLASSES, HIDDEN]),
            ("out.bias", vec![CLASSES]),
        ] {
            let numel: usize = shape.iter().product();
            layout.push(ParamSpec {
                name: name.into(),
                shape,
                offset,
            });
            offset += numel;
        }
        Self {
            layout,
            device: device.clone(),
        }
    }

    /// Logits `(n, 2)` of `n` points.
    fn logits(&self, p: &FlatParams, inputs: &[f32]) -> candle_core::Result<Tensor> {
        let x = Tensor::from_slice(inputs, (inputs.len() / 2, 2), &self.device)?;
        let h = x.matmul(&p.get(0).t()?)?.broadcast_add(p.get(1))?.tanh()?;
        h.matmul(&p.get(2).t()?)?.broadcast_add(p.get(3))
    }

    fn targets(&self, labels: &[u32]) -> candle_core::Result<Tensor> {
        Tensor::from_slice(labels, labels.len(), &self.device)
    }
}

impl Learner for SpiralNet {
    fn layout(&self) -> &[ParamSpec] {
        &self.layout
    }

    fn sample_len(&self) -> usize {
        2
    }

    /// Uniform in +-1/sqrt(fan in), from the seed alone: every peer draws
    /// the same buffer (the run checks that by hash).
    fn init_params(&self, seed: u64) -> Vec<f32> {
        let mut rng = slowmo_optim::Rng::new(seed);
        let mut out = Vec::new();
        for spec in &self.layout {
            // PyTorch's default for a linear layer: its input width
            let fan_in = if spec.name.starts_with("hidden") {
                2
            } else {
                HIDDEN
            };
            let bound = 1.0 / (fan_in as f64).sqrt();
            out.extend((0..spec.numel()).map(|_| ((2.0 * rng.uniform() - 1.0) * bound) as f32));
        }
        out
    }

    fn loss_and_grad(
        &mut self,
        params: &[f32],
        inputs: &[f32],
        labels: &[u32],
        grad: &mut [f32],
    ) -> Result<f32, ModelError> {
        let p = FlatParams::new(&self.layout, params, &self.device)?;
        let loss =
            candle_nn::loss::cross_entropy(&self.logits(&p, inputs)?, &self.targets(labels)?)?;
        p.grads_into(&loss.backward()?, grad)?;
        Ok(loss.to_scalar::<f32>()?)
    }

    fn evaluate_batch(
        &mut self,
        params: &[f32],
        inputs: &[f32],
        labels: &[u32],
    ) -> Result<BatchEval, ModelError> {
        let p = FlatParams::new(&self.layout, params, &self.device)?;
        let logits = self.logits(&p, inputs)?;
        let y = self.targets(labels)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &y)?.to_scalar::<f32>()?;
        let hits = logits.argmax(D::Minus1)?.eq(&y)?.to_dtype(DType::U32)?;
        Ok(BatchEval {
            mean_loss: loss,
            correct: u64::from(hits.sum_all()?.to_scalar::<u32>()?),
            predictions: labels.len() as u64,
        })
    }
}

/// Two interleaved spirals with a little noise: point `i` (label `i % 2`)
/// is computed from the seed and `i` when the loop asks for it, so the data
/// needs no memory and no file. This is all the loop needs of a split.
pub struct Spiral {
    pub n: usize,
    pub seed: u64,
}

impl Samples for Spiral {
    fn len(&self) -> usize {
        self.n
    }

    fn sample_len(&self) -> usize {
        2
    }

    fn label(&self, i: usize) -> u32 {
        (i % 2) as u32
    }

    fn sample_into(&self, i: usize, out: &mut Vec<f32>) {
        let mut rng = slowmo_optim::Rng::derive(self.seed, i as u64);
        let t = 0.5 + 3.0 * rng.uniform();
        let angle = t * 2.0 + std::f64::consts::PI * f64::from(self.label(i));
        let (nx, ny) = (rng.uniform() - 0.5, rng.uniform() - 0.5);
        out.push((t * angle.cos() / 3.5 + 0.08 * nx) as f32);
        out.push((t * angle.sin() / 3.5 + 0.08 * ny) as f32);
    }
}

/// The dataset: 4000 training points, 1000 held out (another seed).
pub struct Spirals {
    train: Spiral,
    test: Spiral,
}

impl TrainData for Spirals {
    fn name(&self) -> &str {
        "spirals"
    }

    fn classes(&self) -> usize {
        CLASSES
    }

    fn train(&self) -> &dyn Samples {
        &self.train
    }

    fn test(&self) -> &dyn Samples {
        &self.test
    }
}

/// The workload: the model and the spirals.
pub fn workload() -> Workload {
    let data = Spirals {
        train: Spiral { n: 4000, seed: 1 },
        test: Spiral { n: 1000, seed: 2 },
    };
    Workload::custom(data, |device| {
        Ok(Box::new(SpiralNet::new(device)) as Box<dyn Learner>)
    })
}

/// The run's settings, shared by the simulator and the peers: SlowMo over
/// SGP (the default algorithm), two workers.
pub fn settings(steps: u64) -> String {
    format!("workers = 2\nsteps = {steps}\nlr = 0.05\nbatch_size = 32\neval_every = 0\n")
}

/// `n` distinct free UDP ports on loopback (all held until every one is
/// chosen, so no two are the same).
fn free_udp_ports(n: usize) -> Result<Vec<u16>> {
    let held = (0..n)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(held
        .iter()
        .map(|s| s.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<_>>()?)
}

#[derive(Parser)]
struct Node {
    #[command(flatten)]
    args: NodeArgs,
}

/// Trains the workload in the simulator and over two peers in `dir`;
/// returns the test accuracy of the averaged model and checks that all
/// three parameter files agree bit for bit.
pub fn run(steps: u64, dir: &Path) -> Result<f32> {
    let config_file = dir.join("run.toml");
    std::fs::write(&config_file, settings(steps))?;
    let config = TrainOptions::from_toml(&settings(steps))
        .map_err(anyhow::Error::msg)?
        .resolve()?;
    let summary = Simulation::new(&config).workload(workload()).run()?;
    println!(
        "simulator: {steps} steps, test accuracy {:.4} (averaged model)",
        summary.test_accuracy
    );

    let ports = free_udp_ports(2)?;
    let addr = |p: u16| format!("/ip4/127.0.0.1/udp/{p}/quic-v1");
    let peers: Vec<_> = (0..2)
        .map(|i| {
            let params = dir.join(format!("peer-{i}.safetensors"));
            let cli = Node::try_parse_from([
                "node".into(),
                "--config".into(),
                config_file.display().to_string(),
                "--run-id".into(),
                "custom-model".into(),
                "--listen".into(),
                addr(ports[i]),
                "--bootstrap".into(),
                addr(ports[1 - i]),
                "--threads".into(),
                "1".into(),
                "--save-params".into(),
                params.display().to_string(),
            ])?;
            let handle = std::thread::spawn(move || run_with(cli.args, Some(workload())));
            Ok::<_, anyhow::Error>((handle, params))
        })
        .collect::<Result<_>>()?;
    let layout = SpiralNet::new(&Device::Cpu).layout;
    // every peer's outcome, all errors together: one peer's own error is
    // the cause of the other's join timeout
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for (i, (handle, path)) in peers.into_iter().enumerate() {
        match handle.join() {
            Ok(Ok(())) => files.push(load_params_file(&layout, &path)?),
            Ok(Err(e)) => errors.push(format!("peer {i}: {e:#}")),
            Err(_) => errors.push(format!("peer {i} panicked")),
        }
    }
    ensure!(errors.is_empty(), "{}", errors.join("; "));
    ensure!(
        files[0] == files[1],
        "the two peers ended with different parameters"
    );
    let same = files[0]
        .iter()
        .zip(&summary.averaged_params)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    ensure!(
        same && files[0].len() == summary.averaged_params.len(),
        "the peers' parameters differ from the simulator's"
    );
    println!("two peers: the same parameters as the simulator, bit for bit");
    Ok(summary.test_accuracy)
}

#[allow(dead_code)] // the test includes this file and calls `run`
fn main() -> Result<()> {
    let steps = match std::env::args().nth(1) {
        Some(s) => s
            .parse()
            .with_context(|| format!("steps: {s:?} is not a number"))?,
        None => 600,
    };
    let dir = std::env::temp_dir().join(format!("slowmo-custom-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let accuracy = run(steps, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    println!("test accuracy of the averaged model: {:.4}", accuracy?);
    Ok(())
}
