//! A crash is noticed from the first signal, not after the peer timeout:
//! four `slowmo node` processes over QUIC (the default transport, where a
//! killed process sends nothing), one killed with SIGKILL mid-run, and the
//! survivors' largest pause between two consecutive steps stays far below
//! the peer timeout (the broken data-lane connection and the refused lane
//! port name the dead peer at once; before, silence decided: one peer
//! timeout until anyone suspected it, and one more while the coordinator
//! waited for its report).

use std::path::Path;
use std::process::Command;

mod local_support;
use local_support::harness_files;

/// The peer timeout of the run: a stall of two of them was the old cost.
const PEER_TIMEOUT: u64 = 30;
/// The bound the survivors' largest pause must stay under.
const MAX_PAUSE_S: f64 = 3.0;

/// The largest time between two consecutive step records of a node, and
/// the step after it.
fn largest_pause(metrics: &Path) -> (f64, u64) {
    let text = std::fs::read_to_string(metrics)
        .unwrap_or_else(|e| panic!("reading {}: {e}", metrics.display()));
    let records: Vec<(u64, f64)> = slowmo_runspec::step_records(&text)
        .map(|r| (r.step, r.time))
        .collect();
    assert!(
        records.len() > 100,
        "{}: {} records",
        metrics.display(),
        records.len()
    );
    records
        .windows(2)
        .map(|w| (w[1].1 - w[0].1, w[1].0))
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a })
}

#[test]
fn a_killed_node_stalls_the_survivors_for_well_under_the_peer_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let run = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["local", "--nodes", "4", "--quiet", "--no-report"])
        .args(["--transport", "quic", "--steps", "400"])
        .args(["--peer-timeout", &PEER_TIMEOUT.to_string()])
        .args(["--faults", "kill 2@200"])
        .args(["--eval-every", "0", "--hidden", "64"])
        .args(harness_files(&out))
        .output()
        .unwrap();
    let log = format!(
        "status {:?}\n{}\n{}",
        run.status.code(),
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.status.success(), "{log}");
    for i in [0, 1, 3] {
        let (pause, before) = largest_pause(&out.join(format!("node-{i}/metrics.jsonl")));
        println!("node-{i}: largest pause {pause:.2} s, before step {before}");
        assert!(
            pause < MAX_PAUSE_S,
            "node-{i} paused {pause:.1} s before step {before} (peer timeout {PEER_TIMEOUT} s)\n{log}"
        );
    }
}
