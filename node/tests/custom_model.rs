//! `node/examples/custom_model.rs` in CI: a model defined outside the
//! crates, trained in the simulator and over two real peers, every
//! parameter file bit-identical; and the checks a custom workload gets.

#[path = "../examples/custom_model.rs"]
mod example;

use slowmo_node::data::Dataset;

#[test]
fn a_model_from_outside_the_crate_trains_over_two_peers_as_in_the_simulator() {
    let dir = tempfile::tempdir().unwrap();
    // `run` checks the peers' and the simulator's parameters bit for bit
    let accuracy = example::run(600, dir.path()).unwrap();
    assert!(accuracy > 0.9, "the spirals were not learned: {accuracy}");
}

#[test]
fn samples_that_do_not_fit_are_refused_naming_the_split() {
    let ok = || (vec![0.0f32; 4], vec![0u32, 1]);
    assert!(Dataset::from_samples("d", 2, 2, ok(), ok()).is_ok());
    let e = |train: (Vec<f32>, Vec<u32>), test| {
        Dataset::from_samples("d", 2, 2, train, test)
            .unwrap_err()
            .to_string()
    };
    let short = e((vec![0.0; 3], vec![0, 1]), ok());
    assert!(
        short.contains("train split") && short.contains("3 values"),
        "{short}"
    );
    let label = e(ok(), (vec![0.0; 4], vec![0, 2]));
    assert!(
        label.contains("test split") && label.contains("label 2"),
        "{label}"
    );
    let nan = e((vec![0.0, f32::NAN, 0.0, 0.0], vec![0, 1]), ok());
    assert!(nan.contains("value 1") && nan.contains("NaN"), "{nan}");
    let empty = e((Vec::new(), Vec::new()), ok());
    assert!(empty.contains("no samples"), "{empty}");
}

#[test]
fn a_model_that_reads_other_samples_than_the_data_is_refused() {
    let dataset = Dataset::from_samples(
        "three",
        3,
        2,
        (vec![0.0; 6], vec![0, 1]),
        (vec![0.0; 6], vec![0, 1]),
    )
    .unwrap();
    let w = slowmo_node::engine::setup::Workload::custom(dataset, |d| {
        Ok(Box::new(example::SpiralNet::new(d)) as Box<dyn slowmo_node::model::Learner>)
    });
    let e = match w.build(&candle_core::Device::Cpu) {
        Ok(_) => panic!("a model of 2 values per sample took samples of 3"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("2 values") && e.contains("three"), "{e}");
}

#[test]
fn data_computed_on_demand_trains_as_the_same_data_held_in_memory() {
    use example::{Spiral, SpiralNet};
    use slowmo_node::data::Samples;
    use slowmo_node::engine::setup::Workload;
    use slowmo_node::engine::simulate::Simulation;

    let config = slowmo_node::config::TrainOptions::from_toml(&example::settings(60))
        .unwrap()
        .resolve()
        .unwrap();
    let materialise = |s: &Spiral| {
        let mut values = Vec::new();
        (0..s.len()).for_each(|i| s.sample_into(i, &mut values));
        (values, s.labels())
    };
    let (train, test) = (Spiral { n: 4000, seed: 1 }, Spiral { n: 1000, seed: 2 });
    let in_memory =
        Dataset::from_samples("spirals", 2, 2, materialise(&train), materialise(&test)).unwrap();
    let model = |d: &candle_core::Device| {
        Ok(Box::new(SpiralNet::new(d)) as Box<dyn slowmo_node::model::Learner>)
    };
    let lazy = Simulation::new(&config)
        .workload(example::workload())
        .run()
        .unwrap();
    let held = Simulation::new(&config)
        .workload(Workload::custom(in_memory, model))
        .run()
        .unwrap();
    let bits = |p: &[f32]| p.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&lazy.averaged_params), bits(&held.averaged_params));
    assert_eq!(lazy.test_accuracy, held.test_accuracy);
}

/// What spoils a buffer of initial parameters.
type Spoil = fn(Vec<f32>) -> Vec<f32>;

/// SpiralNet with initial parameters that are wrong in one way.
struct BadInit(example::SpiralNet, Spoil);

impl slowmo_node::model::Learner for BadInit {
    fn layout(&self) -> &[slowmo_node::model::ParamSpec] {
        self.0.layout()
    }
    fn sample_len(&self) -> usize {
        self.0.sample_len()
    }
    fn init_params(&self, seed: u64) -> Vec<f32> {
        (self.1)(self.0.init_params(seed))
    }
    fn loss_and_grad(
        &mut self,
        params: &[f32],
        inputs: &[f32],
        labels: &[u32],
        grad: &mut [f32],
    ) -> Result<f32, slowmo_node::model::ModelError> {
        self.0.loss_and_grad(params, inputs, labels, grad)
    }
    fn evaluate_batch(
        &mut self,
        params: &[f32],
        inputs: &[f32],
        labels: &[u32],
    ) -> Result<slowmo_node::model::BatchEval, slowmo_node::model::ModelError> {
        self.0.evaluate_batch(params, inputs, labels)
    }
}

#[test]
fn initial_parameters_of_the_wrong_length_or_not_finite_are_refused() {
    use slowmo_node::engine::setup::Workload;
    use slowmo_node::engine::simulate::Simulation;

    let config = slowmo_node::config::TrainOptions::from_toml(&example::settings(5))
        .unwrap()
        .resolve()
        .unwrap();
    let cases: [(Spoil, &[&str]); 2] = [
        (
            |mut x| {
                x.pop();
                x
            },
            &["initial parameters", "161", "expected 162"],
        ),
        (
            |mut x| {
                x[100] = f32::NAN;
                x
            },
            &["initial parameter 100", "out.weight", "NaN"],
        ),
    ];
    for (spoil, wanted) in cases {
        let data = Dataset::from_samples(
            "d",
            2,
            2,
            (vec![0.5; 8], vec![0, 1, 0, 1]),
            (vec![0.5; 4], vec![0, 1]),
        )
        .unwrap();
        let w = Workload::custom(data, move |d| {
            Ok(Box::new(BadInit(example::SpiralNet::new(d), spoil))
                as Box<dyn slowmo_node::model::Learner>)
        });
        let e = match Simulation::new(&config).workload(w).run() {
            Ok(_) => panic!("spoiled initial parameters trained"),
            Err(e) => format!("{e:#}"),
        };
        for s in wanted {
            assert!(e.contains(s), "{s:?} not in {e}");
        }
    }
}
