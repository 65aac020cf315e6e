//! OSGP over a local testnet of real `slowmo node` processes converges with
//! staleness 1 and 2: every node finishes, shares really are mixed late
//! (weights leave 1, which synchronous gossip never does here), nothing is
//! lost (the drained weights sum to the number of nodes, and the final
//! average is sum(x) / sum(w) of the drained state), and the train loss ends
//! well below where it began.

use std::path::Path;
use std::process::Command;

mod local_support;
use local_support::harness_files;

/// (step, loss, weight) of every metrics line.
fn metrics(path: &Path) -> Vec<(u64, f64, f64)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["step"].as_u64().unwrap(),
                v["loss"].as_f64().unwrap(),
                v["weight"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// Runs a 4-node OSGP testnet of `steps` steps with `flags` and returns
/// each node's folder and summary, checking that every node completed.
fn osgp_testnet(
    out: &Path,
    steps: u64,
    flags: &[&str],
) -> Vec<(std::path::PathBuf, serde_json::Value)> {
    let status = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["local", "--nodes", "4", "--quiet", "--preset", "osgp"])
        .args(flags)
        .args(["--steps", &steps.to_string(), "--eval-every", "0"])
        .args(["--hidden", "32", "--batch-size", "16"])
        .args(["--join-timeout", "60", "--peer-timeout", "60"])
        .args(harness_files(out))
        .status()
        .unwrap();
    assert!(status.success(), "osgp testnet {flags:?}");
    (0..4)
        .map(|node| {
            let dir = out.join(format!("node-{node}"));
            let summary: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                    .unwrap();
            assert_eq!(summary["completed"], true, "node {node}: {summary}");
            (dir, summary)
        })
        .collect()
}

/// Sum of every value of a safetensors file of f32 tensors.
fn params_sum(path: &Path) -> f64 {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut sum = 0.0;
    for (name, t) in file.tensors() {
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        sum += t
            .data()
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .sum::<f64>();
    }
    sum
}

fn converges_with_staleness(staleness: u64) {
    let dir = tempfile::tempdir().unwrap();
    let steps = 200;
    let staleness_flag = staleness.to_string();
    let nodes = osgp_testnet(
        &dir.path().join("net"),
        steps,
        &["--staleness", &staleness_flag],
    );
    let mut late_shares = 0;
    for (node, (dir, summary)) in nodes.iter().enumerate() {
        assert_eq!(summary["steps"], steps, "node {node}");
        assert_eq!(summary["config"]["algorithm"]["staleness"], staleness);
        let records = metrics(&dir.join("metrics.jsonl"));
        assert_eq!(
            records.len() as u64,
            steps,
            "node {node}: one record per step"
        );
        for (step, loss, w) in &records {
            assert!(loss.is_finite(), "node {node} step {step}: loss {loss}");
            assert!(
                w.is_finite() && *w > 0.0,
                "node {node} step {step}: push-sum weight {w}"
            );
        }
        // With a staleness bound a call returns before the shares of its
        // own round are in, so a share of round k is mixed after step k and
        // the recorded weight leaves 1. The 1-peer exponential graph of 4
        // nodes is regular and halves every weight: with every share in by
        // the end of its step (staleness 0) every weight is exactly 1.
        late_shares += records.iter().filter(|r| r.2 != 1.0).count();
        let first: f64 = records[..10].iter().map(|r| r.1).sum::<f64>() / 10.0;
        let last = summary["final_train_loss"].as_f64().unwrap();
        assert!(
            last < 0.6 * first,
            "node {node}, staleness {staleness}: train loss {first:.3} -> {last:.3}"
        );
        let accuracy = summary["test_accuracy"].as_f64().unwrap();
        assert!(accuracy > 0.5, "node {node}: averaged accuracy {accuracy}");
    }
    println!("staleness {staleness}: {late_shares} records with a share still in flight");
    assert!(
        late_shares > 0,
        "staleness {staleness}: every share was in by the end of its step, as with staleness 0"
    );
    check_mass_and_average(&nodes);
}

/// The drained push-sum state loses no mass: the weights sum to the number
/// of nodes, and every node's final parameters (the exact average) sum to
/// `sum_i x_i / sum_i w_i` of that state (`sum_i x_i = w_i * params_sum_i`).
fn check_mass_and_average(nodes: &[(std::path::PathBuf, serde_json::Value)]) {
    let m = nodes.len() as f64;
    let (mut total_w, mut total_x) = (0.0, 0.0);
    let mut state = Vec::new();
    for (node, (_, summary)) in nodes.iter().enumerate() {
        let w = summary["push_sum_weight"]
            .as_f64()
            .unwrap_or_else(|| panic!("node {node}: no push_sum_weight in {summary}"));
        let z = summary["params_sum"]
            .as_f64()
            .unwrap_or_else(|| panic!("node {node}: no params_sum in {summary}"));
        assert!(w.is_finite() && w > 0.0, "node {node}: drained weight {w}");
        total_w += w;
        total_x += w * z;
        state.push((w, z));
    }
    assert!(
        (total_w - m).abs() < 1e-9,
        "the drained weights sum to {total_w}, not {m}: mass was lost or made"
    );
    let expected = total_x / total_w;
    for (node, (dir, _)) in nodes.iter().enumerate() {
        let got = params_sum(&dir.join("params.safetensors"));
        assert!(
            (got - expected).abs() <= 1e-4 * (1.0 + expected.abs()),
            "node {node}: the final average sums to {got}, sum(x)/sum(w) of the drained \
             state to {expected} (weight, parameter sum of each node: {state:?})"
        );
    }
}

#[test]
fn osgp_over_the_testnet_converges_with_staleness_one() {
    converges_with_staleness(1);
}

#[test]
fn osgp_over_the_testnet_converges_with_staleness_two() {
    converges_with_staleness(2);
}

#[test]
fn osgp_with_background_gossip_over_the_testnet_converges_and_loses_no_mass() {
    let dir = tempfile::tempdir().unwrap();
    // On few cores the nodes out-step their gossip by far (a round costs
    // tens of steps), so give the run time to mix a few rounds.
    let steps = 400u64;
    let nodes = osgp_testnet(&dir.path().join("net"), steps, &["--background-gossip"]);
    let (mut rounds, mut accuracies) = (Vec::new(), Vec::new());
    for (node, (dir, summary)) in nodes.iter().enumerate() {
        let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        let started = last["gossip_rounds"].as_u64().unwrap();
        assert!(
            (1..=steps).contains(&started),
            "node {node}: {started} rounds in {steps} steps"
        );
        rounds.push(started);
        let records = metrics(&dir.join("metrics.jsonl"));
        let mean = |r: &[(u64, f64, f64)]| r.iter().map(|r| r.1).sum::<f64>() / r.len() as f64;
        // The first and the last ten steps' mean loss: one step's batch
        // loss is too noisy to judge a run by.
        let first = mean(&records[..10]);
        let last = mean(&records[records.len() - 10..]);
        assert!(
            last < 0.6 * first,
            "node {node}: train loss {first:.3} -> {last:.3} (mean of ten steps)"
        );
        accuracies.push(summary["test_accuracy"].as_f64().unwrap());
    }
    // The drain at the end added every share: the weights hold all the mass
    // and the final average is that of all of it.
    check_mass_and_average(&nodes);
    println!("gossip rounds started by step {steps}: {rounds:?}");
    assert!(accuracies[0] > 0.5, "averaged accuracy {accuracies:?}");
    assert!(
        accuracies.iter().all(|a| *a == accuracies[0]),
        "nodes disagree on the averaged model: {accuracies:?}"
    );
}
