//! The training loop over the in-memory communicator, end to end.

use slowmo_node::config::{RunConfig, TrainOptions};
use slowmo_node::simulate::{SimulationSummary, simulate};

fn options(text: &str) -> TrainOptions {
    TrainOptions::from_toml(text).unwrap()
}

fn run(config: &RunConfig) -> SimulationSummary {
    simulate(config, &mut |_| {}).unwrap()
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / x.abs().max(y.abs()).max(1e-3))
        .fold(0.0, f32::max)
}

const SMALL: &str = "hidden = [32]\nbatch_size = 16\neval_every = 0\n";

#[test]
fn same_seed_gives_the_same_bits_and_another_seed_does_not() {
    let text = format!("{SMALL}workers = 4\nsteps = 30\nbase = \"sgp\"\ntau = 6\n");
    let c = options(&text).resolve().unwrap();
    let a = run(&c);
    let b = run(&c);
    assert_eq!(a.averaged_params, b.averaged_params);
    let mut other = c.clone();
    other.seed += 1;
    assert_ne!(run(&other).averaged_params, a.averaged_params);
}

#[test]
fn local_sgd_with_tau_one_equals_all_reduce_sgd() {
    // Averaging parameters after every plain-SGD step is averaging gradients.
    let text = format!("{SMALL}workers = 3\nsteps = 20\nmomentum = 0.0\n");
    let local = options(&format!("{text}preset = \"local-sgd\"\ntau = 1\n"))
        .resolve()
        .unwrap();
    let ar = options(&format!("{text}preset = \"ar-sgd\"\n"))
        .resolve()
        .unwrap();
    let a = run(&local);
    let b = run(&ar);
    let d = max_rel_diff(&a.averaged_params, &b.averaged_params);
    assert!(d < 1e-4, "max relative difference {d}");
}

#[test]
fn slowmo_over_local_sgd_reaches_a_lower_train_loss_than_local_sgd() {
    let text = "workers = 4\nsteps = 360\ntau = 12\neval_every = 0\nbatch_size = 32\nlr = 0.01\n";
    let local = options(&format!("{text}base = \"local-sgd\"\nbeta = 0.0\n"))
        .resolve()
        .unwrap();
    let slow = options(&format!("{text}base = \"local-sgd\"\nbeta = 0.5\n"))
        .resolve()
        .unwrap();
    let a = run(&local);
    let b = run(&slow);
    assert!(
        b.final_train_loss < a.final_train_loss,
        "SlowMo {} vs Local SGD {}",
        b.final_train_loss,
        a.final_train_loss
    );
}

#[test]
fn every_base_trains_for_sizes_that_are_not_powers_of_two() {
    for base in ["sgp", "osgp", "local-sgd", "ar-sgd"] {
        for m in [1, 3, 6] {
            let text = format!("{SMALL}workers = {m}\nsteps = 24\nbase = \"{base}\"\ntau = 6\n");
            let s = run(&options(&text).resolve().unwrap());
            assert_eq!(s.steps, 24);
            assert!(s.final_train_loss.is_finite(), "{base} m={m}");
            assert!(s.consensus_distance.is_finite());
            if base == "sgp" || base == "osgp" {
                assert!(s.bytes_sent_per_worker > 0 || m == 1);
            }
        }
    }
}

#[test]
fn osgp_with_staleness_still_converges() {
    let mut finals: Vec<Vec<f32>> = Vec::new();
    for s in [0, 1, 2] {
        let text = format!(
            "workers = 4\nsteps = 200\npreset = \"osgp\"\nstaleness = {s}\neval_every = 0\nhidden = [64]\n"
        );
        let c = options(&text).resolve().unwrap();
        let mut first = None;
        let out = simulate(&c, &mut |r| {
            first.get_or_insert(r.loss);
        })
        .unwrap();
        let first = first.unwrap();
        assert!(
            out.final_train_loss < 0.6 * first,
            "staleness {s}: loss {} from {first}",
            out.final_train_loss
        );
        // The bound takes effect: shares mixed s rounds late give another
        // trajectory than synchronous gossip (a bound silently replaced by
        // 0 or 1 would repeat an earlier run's bits).
        assert!(
            finals.iter().all(|f| *f != out.averaged_params),
            "staleness {s} ran like a smaller bound"
        );
        finals.push(out.averaged_params);
    }
}

#[test]
fn background_gossip_honours_the_staleness_bound() {
    let run_with = |s: u64| {
        let text = format!(
            "{SMALL}workers = 4\nsteps = 60\nbase = \"osgp\"\ntau = 6\nbackground_gossip = true\n\
             staleness = {s}\n"
        );
        let c = options(&text).resolve().unwrap();
        assert_eq!(c.algorithm.staleness, s, "recorded as given");
        run(&c)
    };
    let one = run_with(1);
    let five = run_with(5);
    assert!(five.final_train_loss.is_finite());
    assert!(
        one.averaged_params != five.averaged_params,
        "--staleness 5 with background gossip ran like staleness 1"
    );
    // Staleness 0 is synchronous gossip: refused with the reason.
    let text =
        format!("{SMALL}workers = 4\nbase = \"osgp\"\nbackground_gossip = true\nstaleness = 0\n");
    let e = options(&text).resolve().unwrap_err().to_string();
    assert!(e.contains("staleness") && e.contains("at least 1"), "{e}");
}

#[test]
fn a_missing_dataset_is_a_clear_error() {
    let c = options("dataset = \"mnist\"\ndata_dir = \"/nonexistent/slowmo-test\"\n")
        .resolve()
        .unwrap();
    let err = simulate(&c, &mut |_| {}).unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("/nonexistent/slowmo-test"), "{text}");
}

#[test]
fn background_gossip_in_the_simulator_starts_a_round_every_step_and_is_deterministic() {
    // The in-memory network cannot tell what has arrived without waiting, so
    // a background round starts every step and waits like staleness 1; the
    // simulator stays deterministic.
    let text = format!(
        "{SMALL}workers = 4\nsteps = 60\nbase = \"osgp\"\ntau = 6\nbackground_gossip = true\n"
    );
    let mut config = options(&text).resolve().unwrap();
    // Evaluations are each worker's own (no collective to wait on).
    config.eval_every = 20;
    let mut records = Vec::new();
    let mut evaluations = Vec::new();
    let first = simulate(&config, &mut |r| {
        records.push((r.step, r.gossip_rounds, r.loss));
        if let Some(acc) = r.test_accuracy {
            evaluations.push((r.step, acc, r.consensus_distance));
        }
    })
    .unwrap();
    assert_eq!(records.len(), 60);
    assert_eq!(evaluations.len(), 2, "{evaluations:?}");
    for (step, acc, consensus) in &evaluations {
        assert!((0.0..=1.0).contains(acc), "step {step}: accuracy {acc}");
        assert!(consensus.is_none(), "step {step}: a collective ran");
    }
    for (step, rounds, _) in &records {
        assert_eq!(*rounds, step + 1, "step {step}");
    }
    let start = records[..5].iter().map(|r| r.2).sum::<f32>() / 5.0;
    assert!(
        first.final_train_loss < 0.8 * start,
        "loss {start} -> {}",
        first.final_train_loss
    );
    assert_eq!(run(&config).averaged_params, first.averaged_params);
}

#[test]
fn background_gossip_needs_osgp() {
    let err = options("base = \"sgp\"\nbackground_gossip = true\n")
        .resolve()
        .unwrap_err()
        .to_string();
    assert!(err.contains("background gossip needs base osgp"), "{err}");
}
