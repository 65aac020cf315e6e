//! Values that would break a run are refused up front with the flag, the
//! value and the limit; negative numbers reach validation.

use std::process::Command;

fn slowmo(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_slowmo"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn simulate_refuses_more_workers_than_the_memory_holds() {
    // 10^8 workers of the default MLP need about 1.4 PiB.
    let (ok, stderr) = slowmo(&["simulate", "--workers", "100000000", "--steps", "1"]);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("--workers 100000000") && stderr.contains("MemAvailable"),
        "{stderr}"
    );
}

#[test]
fn negative_numbers_are_values_not_flags() {
    for (flag, name) in [("--lr", "lr"), ("--momentum", "optimizer")] {
        let (ok, stderr) = slowmo(&["simulate", flag, "-1", "--steps", "1"]);
        assert!(!ok, "{stderr}");
        assert!(!stderr.contains("unexpected argument"), "{flag}: {stderr}");
        assert!(stderr.contains(name), "{flag}: {stderr}");
    }
}

#[test]
fn node_names_the_flags_the_user_typed() {
    let (ok, stderr) = slowmo(&["node", "--nodes", "0"]);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("--nodes"), "{stderr}");
    assert!(!stderr.contains("workers"), "{stderr}");
}

#[test]
fn a_run_id_over_the_limit_is_refused_before_the_node_joins_anyone() {
    // A run id that would overflow the 4 KiB frames (lane offers, headers)
    // was accepted and hung the run at its first lane; now it is refused
    // up front, with the limit.
    let long = "r".repeat(slowmo_gossip::p2p::MAX_RUN_ID_BYTES + 1);
    let started = std::time::Instant::now();
    let (ok, stderr) = slowmo(&[
        "node",
        "--nodes",
        "2",
        "--join-timeout",
        "20",
        "--run-id",
        &long,
    ]);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("--run-id") && stderr.contains("at most 256"),
        "{stderr}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("run.key");
    let key = key.to_str().unwrap();
    let (ok, stderr) = slowmo(&["run", "init", "--key", key, "--run-id", &long]);
    assert!(!ok && stderr.contains("at most 256"), "{stderr}");
}

#[test]
fn a_clamped_peer_count_is_logged_without_colour_codes_off_a_terminal() {
    // Two workers have one peer each; --peers 5 cannot be met. The warning
    // says so, and stderr (a pipe here) carries no ANSI colour codes.
    let (ok, stderr) = slowmo(&[
        "simulate",
        "--workers",
        "2",
        "--steps",
        "1",
        "--peers",
        "5",
        "--hidden",
        "8",
        "--eval-every",
        "0",
        "--quiet",
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("--peers 5: the exponential graph of 2 nodes has 1 out-peers"),
        "{stderr}"
    );
    assert!(!stderr.contains('\u{1b}'), "colour codes in {stderr:?}");
}
