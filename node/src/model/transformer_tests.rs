//! The transformer: gradients, causality, learning on text, bad tokens.

use super::*;
use crate::data::{Batcher, text};
use slowmo_optim::{Optimizer, OptimizerConfig, OptimizerKind};

const VOCAB: usize = 11;

fn tiny(context: usize) -> Model {
    let shape = TransformerShape {
        layers: 2,
        heads: 2,
        width: 8,
        context,
    };
    Model::transformer(shape, VOCAB, &Device::Cpu).unwrap()
}

/// `n` samples of seeded tokens below [`VOCAB`], and their (unread) labels.
fn token_batch(model: &Model, n: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut rng = Rng::new(seed);
    let samples: Vec<f32> = (0..n * model.sample_len())
        .map(|_| rng.below(VOCAB as u64) as f32)
        .collect();
    let labels = samples
        .chunks(model.sample_len())
        .map(|s| s[s.len() - 1] as u32)
        .collect();
    (samples, labels)
}

/// GPT-2's init plus seeded noise, so that layer norms, biases and
/// attention are far from their trivial starting values.
fn noisy_params(model: &Model, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut p = model.init_params(seed);
    p.iter_mut().for_each(|v| *v += (rng.normal() * 0.3) as f32);
    p
}

#[test]
fn transformer_gradient_matches_finite_differences() {
    let mut model = tiny(5);
    let params = noisy_params(&model, 3);
    let (samples, labels) = token_batch(&model, 3, 4);
    let mut grad = vec![0.0; model.num_params()];
    model
        .loss_and_grad(&params, &samples, &labels, &mut grad)
        .unwrap();
    let d = super::tests::Differences {
        eps: 1e-2,
        random: 2,
        abs: 2e-3,
        rel: 0.05,
        seed: 9,
    };
    let checked =
        super::tests::check_differences(&mut model, &params, &samples, &labels, &grad, &d);
    let layout = model.layout().to_vec();
    assert_eq!(checked, 3 * layout.len());
    // the tied head: the embedding's gradient has both the input and the
    // output contribution, so every row of the vocabulary gets one
    let wte = layout[0].range();
    for row in 0..VOCAB {
        let g = &grad[wte.start + row * 8..wte.start + (row + 1) * 8];
        assert!(g.iter().any(|v| *v != 0.0), "row {row} has no gradient");
    }
}

#[test]
fn a_later_token_leaves_earlier_logits_unchanged() {
    let context = 7;
    let model = tiny(context);
    let params = noisy_params(&model, 5);
    let (sample, _) = token_batch(&model, 1, 6);
    let before = model.logits(&params, &sample).unwrap();
    assert_eq!(before.len(), context * VOCAB);
    for changed in 1..context {
        let mut other = sample.clone();
        other[changed] = ((other[changed] as usize + 1) % VOCAB) as f32;
        let after = model.logits(&params, &other).unwrap();
        for pos in 0..context {
            let (a, b) = (
                &before[pos * VOCAB..(pos + 1) * VOCAB],
                &after[pos * VOCAB..(pos + 1) * VOCAB],
            );
            let diff = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            if pos < changed {
                assert!(
                    diff == 0.0,
                    "token {changed} changed position {pos}'s logits by {diff}"
                );
            } else {
                assert!(diff > 1e-4, "token {changed} did not reach position {pos}");
            }
        }
    }
}

#[test]
fn loss_falls_on_text_the_test_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corpus.txt");
    let line = "the quick brown fox jumps over the lazy dog. ";
    std::fs::write(&path, line.repeat(60)).unwrap();
    let context = 16;
    let data = text::load(&path, context).unwrap();
    let shape = TransformerShape {
        layers: 2,
        heads: 2,
        width: 32,
        context,
    };
    let mut model = Model::transformer(shape, data.classes, &Device::Cpu).unwrap();
    let mut params = model.init_params(1);
    let start = model
        .evaluate(&params, &data.test, data.sample_len(), 64)
        .unwrap();
    // uniform over 256 bytes at the start
    assert!((start.loss - (256f32).ln()).abs() < 0.2, "{start:?}");
    let cfg = OptimizerConfig {
        kind: OptimizerKind::Adam,
        ..OptimizerConfig::default()
    };
    let mut opt = Optimizer::new(&cfg, params.len()).unwrap();
    let mut batcher = Batcher::new((0..data.train.len()).collect(), 2);
    let (mut x, mut y, mut grad) = (Vec::new(), Vec::new(), vec![0.0; params.len()]);
    for _ in 0..200 {
        batcher.next_batch(&data.train, data.sample_len(), 8, &mut x, &mut y);
        model.loss_and_grad(&params, &x, &y, &mut grad).unwrap();
        opt.step(&mut params, &grad, 1e-2);
    }
    let end = model
        .evaluate(&params, &data.test, data.sample_len(), 64)
        .unwrap();
    assert!(
        end.loss < 0.4 * start.loss && end.accuracy > 0.8,
        "held-out loss {start:?} -> {end:?}"
    );
}

#[test]
fn layout_is_named_like_nanogpt_and_counted_like_the_config() {
    let model = tiny(5);
    let names: Vec<&str> = model.layout().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names[0], "transformer.wte.weight");
    assert_eq!(names[1], "transformer.wpe.weight");
    assert_eq!(names[2], "transformer.h.0.ln_1.weight");
    assert_eq!(names[4], "transformer.h.0.attn.c_attn.weight");
    assert_eq!(model.layout()[4].shape, vec![24, 8]);
    assert_eq!(names[names.len() - 1], "transformer.ln_f.bias");
    assert_eq!(names.len(), 2 + 2 * 12 + 2);
    let shape = model.transformer_shape().unwrap();
    assert_eq!(model.num_params() as u64, shape.param_count(VOCAB));
    // GPT-2's init: layer norms one and zero, biases zero, small weights
    let p = model.init_params(1);
    let get = |name: &str| {
        &p[model
            .layout()
            .iter()
            .find(|s| s.name == name)
            .unwrap()
            .range()]
    };
    assert!(get("transformer.h.1.ln_2.weight").iter().all(|&v| v == 1.0));
    assert!(
        get("transformer.h.1.mlp.c_fc.bias")
            .iter()
            .all(|&v| v == 0.0)
    );
    let w = get("transformer.h.0.mlp.c_fc.weight");
    let std = (w.iter().map(|v| v * v).sum::<f32>() / w.len() as f32).sqrt();
    assert!((0.01..0.03).contains(&std), "{std}");
    assert_eq!(p, model.init_params(1));
}

#[test]
fn values_that_are_not_tokens_are_errors() {
    let mut model = tiny(4);
    let params = model.init_params(1);
    let mut grad = vec![0.0; model.num_params()];
    for bad in [11.0, -1.0, 2.5, f32::NAN] {
        let mut sample = vec![1.0; 5];
        sample[3] = bad;
        let err = model
            .loss_and_grad(&params, &sample, &[1], &mut grad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("position 3 of sample 0"), "{err}");
    }
    assert!(matches!(
        Model::new(ModelKind::Transformer, &[], 1, 1, 5, 11, &Device::Cpu),
        Err(ModelError::Config(_))
    ));
    let bad_heads = TransformerShape {
        layers: 1,
        heads: 3,
        width: 8,
        context: 4,
    };
    let err = Model::transformer(bad_heads, 11, &Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("heads"), "{err}");
}
