use super::*;
use crate::data::Split;

fn cpu() -> Device {
    Device::Cpu
}

/// Inputs and labels from a seeded stream.
fn batch(model: &Model, n: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut rng = Rng::new(seed);
    let images = (0..n * model.sample_len())
        .map(|_| rng.normal() as f32)
        .collect();
    let labels = (0..n)
        .map(|_| rng.below(model.classes() as u64) as u32)
        .collect();
    (images, labels)
}

fn tiny_mlp() -> Model {
    Model::new(ModelKind::Mlp, &[5], 1, 2, 3, 3, &cpu()).unwrap()
}

/// Odd height exercises the crop before pooling; two channels the conv fan-in.
fn tiny_cnn() -> Model {
    Model::new(ModelKind::Cnn, &[], 2, 13, 12, 3, &cpu()).unwrap()
}

/// How a central-difference check probes and what it tolerates: `eps`, the
/// random coordinates per tensor beside its largest gradient entry, and
/// `|fd - grad| <= abs + rel |grad|`.
pub(super) struct Differences {
    pub eps: f32,
    pub random: usize,
    pub abs: f32,
    pub rel: f32,
    pub seed: u64,
}

/// Central differences of the loss at `params` on `(inputs, labels)`, at
/// each tensor's largest gradient entry and seeded random coordinates,
/// against the analytic gradient `grad` there. Returns the coordinates
/// checked.
pub(super) fn check_differences(
    model: &mut Model,
    params: &[f32],
    inputs: &[f32],
    labels: &[u32],
    grad: &[f32],
    d: &Differences,
) -> usize {
    let mut scratch = vec![0.0; model.num_params()];
    let mut rng = Rng::new(d.seed);
    let layout = model.layout().to_vec();
    let mut checked = 0;
    for spec in &layout {
        let r = spec.range();
        let biggest = r
            .clone()
            .max_by(|&a, &b| grad[a].abs().total_cmp(&grad[b].abs()))
            .unwrap();
        let random = (0..d.random).map(|_| r.start + rng.below(spec.numel() as u64) as usize);
        for i in std::iter::once(biggest).chain(random) {
            let mut p = params.to_vec();
            p[i] += d.eps;
            let up = model
                .loss_and_grad(&p, inputs, labels, &mut scratch)
                .unwrap();
            p[i] -= 2.0 * d.eps;
            let down = model
                .loss_and_grad(&p, inputs, labels, &mut scratch)
                .unwrap();
            let fd = (up - down) / (2.0 * d.eps);
            assert!(
                (fd - grad[i]).abs() <= d.abs + d.rel * grad[i].abs(),
                "{} [{}]: finite difference {fd}, analytic {}",
                spec.name,
                i - r.start,
                grad[i]
            );
            checked += 1;
        }
        assert!(grad[biggest].abs() > 1e-4, "{} has no gradient", spec.name);
    }
    checked
}

/// [`check_differences`] at the model's initial parameters on a seeded batch.
fn check_gradient(model: &mut Model, seed: u64) {
    let params = model.init_params(seed);
    let (images, labels) = batch(model, 4, seed + 100);
    let mut grad = vec![0.0; model.num_params()];
    model
        .loss_and_grad(&params, &images, &labels, &mut grad)
        .unwrap();
    let d = Differences {
        eps: 1e-3,
        random: 3,
        abs: 1e-3,
        rel: 0.03,
        seed,
    };
    check_differences(model, &params, &images, &labels, &grad, &d);
}

#[test]
fn mlp_gradient_matches_finite_differences() {
    check_gradient(&mut tiny_mlp(), 1);
}

#[test]
fn cnn_gradient_matches_finite_differences() {
    check_gradient(&mut tiny_cnn(), 2);
}

#[test]
fn both_parameter_strategies_give_the_same_gradient() {
    for mut model in [tiny_mlp(), tiny_cnn()] {
        let params = model.init_params(3);
        let (images, labels) = batch(&model, 5, 4);
        let mut a = vec![0.0; model.num_params()];
        let mut b = vec![1.0; model.num_params()];
        let la = model
            .loss_and_grad(&params, &images, &labels, &mut a)
            .unwrap();
        model.strategy = Strategy::FlatVar;
        let lb = model
            .loss_and_grad(&params, &images, &labels, &mut b)
            .unwrap();
        assert!((la - lb).abs() < 1e-6);
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-6, "{x} vs {y}");
        }
    }
}

/// The one-transfer path a GPU takes (the whole buffer in, every gradient
/// out joined) gives the same bits as one copy per tensor; forced here on
/// the CPU. A tensor the loss does not reach gets zeros either way.
#[test]
fn one_transfer_and_per_tensor_copies_give_the_same_bits() {
    for model in [tiny_mlp(), tiny_cnn()] {
        let params = model.init_params(5);
        let (images, labels) = batch(&model, 4, 6);
        let (x, y) = model.inputs(&images, &labels).unwrap();
        let mut grads = Vec::new();
        for staged in [false, true] {
            let p = FlatParams::build(&model.layout, &params, &cpu(), staged).unwrap();
            for (t, s) in p.tensors().iter().zip(&model.layout) {
                assert_eq!(t.dims(), s.shape.as_slice());
                let values = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                assert_eq!(values, params[s.range()]);
            }
            let loss =
                candle_nn::loss::cross_entropy(&model.arch.forward(&p.tensors(), &x).unwrap(), &y)
                    .unwrap();
            let mut g = vec![f32::NAN; params.len()];
            p.grads_into(&loss.backward().unwrap(), &mut g).unwrap();
            grads.push(g);
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&grads[0]), bits(&grads[1]));
        assert!(grads[1].iter().any(|&g| g != 0.0));
    }
    // a tensor the loss does not depend on
    let layout = [
        ParamSpec {
            name: "a".into(),
            shape: vec![2],
            offset: 0,
        },
        ParamSpec {
            name: "b".into(),
            shape: vec![3],
            offset: 2,
        },
    ];
    for staged in [false, true] {
        let p = FlatParams::build(&layout, &[1.0, 2.0, 3.0, 4.0, 5.0], &cpu(), staged).unwrap();
        let loss = p.get(0).sqr().unwrap().sum_all().unwrap();
        let mut g = vec![f32::NAN; 5];
        p.grads_into(&loss.backward().unwrap(), &mut g).unwrap();
        assert_eq!(g, [2.0, 4.0, 0.0, 0.0, 0.0], "staged {staged}");
        let mut short = vec![0.0; 4];
        assert!(p.grads_into(&loss.backward().unwrap(), &mut short).is_err());
    }
    assert!(FlatParams::build(&layout, &[1.0; 4], &cpu(), true).is_err());
}

#[test]
fn sgd_on_a_fixed_batch_reduces_the_loss() {
    for (mut model, lr, steps) in [(tiny_mlp(), 0.5, 30), (tiny_cnn(), 0.2, 40)] {
        let mut params = model.init_params(5);
        let (images, labels) = batch(&model, 8, 6);
        let mut grad = vec![0.0; model.num_params()];
        let first = model
            .loss_and_grad(&params, &images, &labels, &mut grad)
            .unwrap();
        let mut last = first;
        for _ in 0..steps {
            params.iter_mut().zip(&grad).for_each(|(p, g)| *p -= lr * g);
            last = model
                .loss_and_grad(&params, &images, &labels, &mut grad)
                .unwrap();
        }
        assert!(
            last < 0.5 * first,
            "{}: loss {first} -> {last}",
            model.kind()
        );
    }
}

#[test]
fn init_is_seeded_and_pytorch_scaled() {
    let model = Model::new(ModelKind::Mlp, &[256], 1, 28, 28, 10, &cpu()).unwrap();
    let a = model.init_params(7);
    assert_eq!(a, model.init_params(7));
    assert_ne!(a, model.init_params(8));
    assert_eq!(a.len(), model.num_params());
    assert_eq!(model.num_params(), 784 * 256 + 256 + 256 * 10 + 10);
    let fc1 = &a[model.layout()[0].range()];
    let bound = 1.0 / 784f32.sqrt();
    assert!(fc1.iter().all(|v| v.abs() <= bound));
    let max = fc1.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(max > 0.99 * bound, "uniform over the whole range");
    let fc2 = &a[model.layout()[2].range()];
    assert!(fc2.iter().any(|v| v.abs() > 0.9 / 256f32.sqrt()));
}

#[test]
fn layouts_are_contiguous_and_named() {
    let mlp = Model::new(ModelKind::Mlp, &[256, 64], 1, 28, 28, 10, &cpu()).unwrap();
    let names: Vec<&str> = mlp.layout().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "fc1.weight",
            "fc1.bias",
            "fc2.weight",
            "fc2.bias",
            "fc3.weight",
            "fc3.bias"
        ]
    );
    assert_eq!(mlp.layout()[2].shape, vec![64, 256]);
    for (geometry, flat) in [((1, 28, 28), 16 * 5 * 5), ((3, 32, 32), 16 * 6 * 6)] {
        let (c, h, w) = geometry;
        let cnn = Model::new(ModelKind::Cnn, &[256], c, h, w, 10, &cpu()).unwrap();
        let l = cnn.layout();
        assert_eq!(l[0].name, "conv1.weight");
        assert_eq!(l[0].shape, vec![6, c, 5, 5]);
        assert_eq!(l[4].shape, vec![120, flat]);
        assert_eq!(l.last().unwrap().shape, vec![10]);
        for pair in l.windows(2) {
            assert_eq!(pair[1].offset, pair[0].offset + pair[0].numel());
        }
        let total = l.last().unwrap().range().end;
        assert_eq!(cnn.num_params(), total);
        // a forward/backward at the real size works
        let mut cnn = cnn;
        let (images, labels) = batch(&cnn, 2, 1);
        let mut grad = vec![0.0; total];
        let loss = cnn
            .loss_and_grad(&cnn.init_params(0), &images, &labels, &mut grad)
            .unwrap();
        assert!(loss.is_finite() && grad.iter().any(|g| *g != 0.0));
    }
}

#[test]
fn evaluate_matches_logits_and_handles_ragged_batches() {
    let mut model = tiny_mlp();
    let params = model.init_params(1);
    let (images, labels) = batch(&model, 7, 2);
    let split = Split {
        images: images.clone().into(),
        labels: labels.clone(),
    };
    let logits = model.logits(&params, &images).unwrap();
    let mut correct = 0;
    let mut loss = 0.0f64;
    for (row, &l) in logits.chunks(3).zip(&labels) {
        let arg = (0..3).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
        correct += usize::from(arg == l as usize);
        let lse = row.iter().map(|v| (*v as f64).exp()).sum::<f64>().ln();
        loss += lse - row[l as usize] as f64;
    }
    for b in [1, 3, 7, 100] {
        let e = model.evaluate(&params, &split, 6, b).unwrap();
        assert!(
            (e.accuracy - correct as f32 / 7.0).abs() < 1e-6,
            "batch {b}"
        );
        assert!((e.loss as f64 - loss / 7.0).abs() < 1e-4, "batch {b}");
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let mut m = tiny_mlp();
    let p = m.init_params(0);
    let mut g = vec![0.0; m.num_params()];
    let (images, labels) = batch(&m, 2, 0);
    let err = m
        .loss_and_grad(&p, &images[1..], &labels, &mut g)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Length {
                expected: 12,
                got: 11,
                ..
            }
        ),
        "{err}"
    );
    assert!(m.loss_and_grad(&p[1..], &images, &labels, &mut g).is_err());
    assert!(m.loss_and_grad(&p, &images, &labels, &mut g[1..]).is_err());
    assert!(matches!(
        m.loss_and_grad(&p, &[], &[], &mut g).unwrap_err(),
        ModelError::Empty(_)
    ));
    let err = m.loss_and_grad(&p, &images, &[0, 3], &mut g).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::LabelOutOfRange {
                index: 1,
                label: 3,
                ..
            }
        ),
        "{err}"
    );
    let split = Split {
        images: images.clone().into(),
        labels: labels.clone(),
    };
    assert!(m.evaluate(&p, &split, 5, 4).is_err());
    assert!(m.evaluate(&p, &split, 6, 0).is_err());
    assert!(m.evaluate(&p, &Split::default(), 6, 4).is_err());
    assert!(m.logits(&p, &images[1..]).is_err());

    assert!(Model::new(ModelKind::Cnn, &[], 1, 11, 28, 10, &cpu()).is_err());
    assert!(Model::new(ModelKind::Mlp, &[0], 1, 28, 28, 10, &cpu()).is_err());
    assert!(Model::new(ModelKind::Mlp, &[8], 0, 28, 28, 10, &cpu()).is_err());
    assert!(Model::new(ModelKind::Mlp, &[8], 1, 28, 28, 1, &cpu()).is_err());
}

#[test]
fn safetensors_round_trip_keeps_names_shapes_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.safetensors");
    let model = tiny_cnn();
    let params = model.init_params(11);
    model.save_safetensors(&params, &path).unwrap();
    assert_eq!(model.load_safetensors(&path).unwrap(), params);
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for spec in model.layout() {
        let t = file.tensor(&spec.name).unwrap();
        assert_eq!(t.shape(), spec.shape.as_slice());
        assert_eq!(t.dtype(), safetensors::Dtype::F32);
    }
    assert_eq!(file.len(), model.layout().len());
}

#[test]
fn loading_another_architecture_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.safetensors");
    let wide = Model::new(ModelKind::Mlp, &[6], 1, 2, 3, 3, &cpu()).unwrap();
    wide.save_safetensors(&wide.init_params(0), &path).unwrap();
    let err = tiny_mlp().load_safetensors(&path).unwrap_err().to_string();
    assert!(
        err.contains("fc1.weight") && err.contains("[6, 6]") && err.contains("[5, 6]"),
        "{err}"
    );
    assert!(err.contains("p.safetensors"), "{err}");

    let deep = Model::new(ModelKind::Mlp, &[5, 5], 1, 2, 3, 3, &cpu()).unwrap();
    deep.save_safetensors(&deep.init_params(0), &path).unwrap();
    let err = tiny_mlp().load_safetensors(&path).unwrap_err().to_string();
    assert!(err.contains("unexpected tensor \"fc3"), "{err}");

    let err = deep
        .load_safetensors(&dir.path().join("missing"))
        .unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    std::fs::write(&path, b"garbage").unwrap();
    let err = tiny_mlp().load_safetensors(&path).unwrap_err().to_string();
    assert!(err.contains("not a valid safetensors file"), "{err}");
}

/// Per-step cost of the two parameter strategies for the 784-256-10 MLP and
/// the LeNet CNN at batch 32, first with glibc's default allocator settings,
/// then after [`tune_malloc_for_training`]: the best of 5 interleaved rounds,
/// so other load on the machine inflates the figures as little as possible.
/// Run single-threaded and alone (the allocator setting is process-wide):
/// `RAYON_NUM_THREADS=1 cargo test -p slowmo-node --lib -- --ignored bench_param_strategies --nocapture`
/// (the test profile builds candle with opt-level 3, like release).
#[test]
#[ignore = "benchmark; prints timings"]
fn bench_param_strategies() {
    for malloc in ["default malloc", "tuned malloc"] {
        if malloc == "tuned malloc" {
            assert!(tune_malloc_for_training());
        }
        for (kind, hidden, steps) in [
            (ModelKind::Mlp, vec![256], 300),
            (ModelKind::Cnn, vec![], 40),
        ] {
            let mut model = Model::new(kind, &hidden, 1, 28, 28, 10, &cpu()).unwrap();
            let params = model.init_params(0);
            let (images, labels) = batch(&model, 32, 1);
            let mut grad = vec![0.0; model.num_params()];
            let mut best = [f64::INFINITY; 2];
            for _round in 0..5 {
                for (k, strategy) in [Strategy::PerLayer, Strategy::FlatVar]
                    .into_iter()
                    .enumerate()
                {
                    model.strategy = strategy;
                    for _ in 0..5 {
                        model
                            .loss_and_grad(&params, &images, &labels, &mut grad)
                            .unwrap();
                    }
                    let t = std::time::Instant::now();
                    for _ in 0..steps {
                        model
                            .loss_and_grad(&params, &images, &labels, &mut grad)
                            .unwrap();
                    }
                    best[k] = best[k].min(t.elapsed().as_secs_f64() / steps as f64);
                }
            }
            println!(
                "{malloc}, {kind} ({} params, batch 32): per-layer {:.0} us/step, flat var {:.0} us/step",
                model.num_params(),
                best[0] * 1e6,
                best[1] * 1e6
            );
        }
    }
}

/// Pins the reason for `arch::max_pool_2x2`: our pooling passes the whole
/// gradient to the maximum (candle's own `max_pool2d` passes a quarter).
#[test]
fn max_pool_gradient_goes_to_the_maximum() {
    let v = Var::from_slice(&[1.0f32, 3.0, 2.0, 0.5, 7.0, -1.0], (1, 2, 3, 1), &cpu()).unwrap();
    let y = arch::max_pool_2x2(v.as_tensor()).unwrap();
    assert_eq!(
        y.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        vec![7.0]
    );
    let g = y.sum_all().unwrap().backward().unwrap();
    let g = g.get(v.as_tensor()).unwrap().flatten_all().unwrap();
    assert_eq!(
        g.to_vec1::<f32>().unwrap(),
        vec![0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    );
}
