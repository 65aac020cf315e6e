//! OSGP over a local testnet of real `slowmo node` processes converges with
//! staleness 1 and 2: every node finishes, nothing is lost (weights stay
//! positive and finite), and the train loss ends well below where it began.

use std::path::Path;
use std::process::Command;

mod local_support;
use local_support::slowmo_bin;

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
        .arg("--slowmo-bin")
        .arg(slowmo_bin())
        .arg("--out")
        .arg(out)
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

fn converges_with_staleness(staleness: u64) {
    let dir = tempfile::tempdir().unwrap();
    let steps = 200;
    let staleness_flag = staleness.to_string();
    let nodes = osgp_testnet(
        &dir.path().join("net"),
        steps,
        &["--staleness", &staleness_flag],
    );
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
        let first: f64 = records[..10].iter().map(|r| r.1).sum::<f64>() / 10.0;
        let last = summary["final_train_loss"].as_f64().unwrap();
        assert!(
            last < 0.6 * first,
            "node {node}, staleness {staleness}: train loss {first:.3} -> {last:.3}"
        );
        let accuracy = summary["test_accuracy"].as_f64().unwrap();
        assert!(accuracy > 0.5, "node {node}: averaged accuracy {accuracy}");
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
        // The drain at the end added every share, so every node evaluates
        // the same exact average of all the mass.
        accuracies.push(summary["test_accuracy"].as_f64().unwrap());
    }
    println!("gossip rounds started by step {steps}: {rounds:?}");
    assert!(accuracies[0] > 0.5, "averaged accuracy {accuracies:?}");
    assert!(
        accuracies.iter().all(|a| *a == accuracies[0]),
        "nodes disagree on the averaged model: {accuracies:?}"
    );
}
