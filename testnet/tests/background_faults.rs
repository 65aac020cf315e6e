//! Background gossip without exact averages (the `osgp` preset with
//! `--background-gossip`) through a kill and a restart over real processes:
//! rounds and steps run at each node's pace, so after a view change the
//! members hold different round counts and barriers, any number apart.
//! Each returns to its own newest barrier and the new view starts every
//! member's rounds at one count; before, every drain at the end of the run
//! waited on a round a peer never sent and the view changed for ever. Its
//! own test binary, so that no other test's nodes share the two cores.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod local_support;
use local_support::{harness_files, read_json, text};

/// The last lines of each node's log above DEBUG, for a failure message.
fn log_tails(out: &Path) -> String {
    let mut tails = String::new();
    for i in 0..4 {
        let log =
            std::fs::read_to_string(out.join(format!("node-{i}/node.log"))).unwrap_or_default();
        let kept: Vec<&str> = log.lines().filter(|l| !l.contains(" DEBUG ")).collect();
        tails.push_str(&format!("--- node-{i}\n"));
        for line in &kept[kept.len().saturating_sub(12)..] {
            tails.push_str(line);
            tails.push('\n');
        }
    }
    tails
}

#[test]
fn background_gossip_without_averages_finishes_after_a_kill_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // Background gossip waits for nobody: the tiny model's 4 nodes do a few
    // thousand steps a second here, so the run must outlast the restarted
    // process's start and admission. SIGINT after 150 s (the harness stops
    // every node) turns a run that hangs into a failure.
    let run = Command::new("timeout")
        .args(["-s", "INT", "150", env!("CARGO_BIN_EXE_slowmo-testnet")])
        .args(["local", "--nodes", "4", "--quiet", "--no-report"])
        .args([
            "--preset",
            "osgp",
            "--background-gossip",
            "--transport",
            "tcp",
        ])
        .args(["--steps", "10000", "--eval-every", "0"])
        .args(["--hidden", "8", "--batch-size", "8"])
        .args(["--join-timeout", "30", "--peer-timeout", "10"])
        .args(["--faults", "kill 2@300; restart 2@0.5s"])
        .args(harness_files(&out))
        .output()
        .unwrap();
    let t = format!("{}\n{}", text(&run), log_tails(&out));
    assert!(run.status.success(), "{t}");
    let fates = read_json(&out.join("fates.json"));
    for (i, f) in fates.as_array().unwrap().iter().enumerate() {
        assert_eq!(f["fate"], "finished", "node-{i}: {f}\n{t}");
    }
    let summaries: Vec<Value> = (0..4)
        .map(|i| read_json(&out.join(format!("node-{i}/summary.json"))))
        .collect();
    let rejoined = summaries[2]["view_changes"]
        .as_array()
        .is_some_and(|v| v.iter().any(|e| e["rejoined"] == true));
    assert!(rejoined, "node-2 was not admitted again: {}", summaries[2]);
    // The final exact average is the same model everywhere.
    let accuracy: Vec<f64> = summaries
        .iter()
        .map(|s| s["test_accuracy"].as_f64().expect("test accuracy"))
        .collect();
    assert!(
        accuracy.iter().all(|a| *a == accuracy[0]),
        "final accuracies {accuracy:?}"
    );
}
