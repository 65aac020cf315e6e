//! `slowmo-testnet local` refuses node counts the machine cannot hold
//! before it starts a single process, naming the flag, the value and the
//! limit.

use std::process::Command;

#[test]
fn local_refuses_more_nodes_than_one_machine_holds_before_starting_any() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["local", "--nodes", "2000", "--out"])
        .arg(&out_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--nodes 2000") && stderr.contains("256"),
        "{stderr}"
    );
    assert!(!out_dir.exists(), "nothing is written before the check");
}

/// Runs `slowmo-testnet local` with `args`, killed after `limit`; whether it
/// succeeded in time, and what it printed.
fn local_within(
    args: &[&str],
    out: &std::path::Path,
    limit: std::time::Duration,
) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .arg("local")
        .args(args)
        .arg("--slowmo-bin")
        .arg(local_support::slowmo_bin())
        .arg("--out")
        .arg(out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let ok = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.success();
        }
        if started.elapsed() > limit {
            // SIGINT: the harness stops its nodes.
            interrupt(child.id());
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (ok, text)
}

fn interrupt(pid: u32) {
    let _ = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
}

mod local_support;

#[test]
fn a_local_run_of_no_steps_ends_at_once() {
    // It used to go round view changes for good: the peers refused the
    // NaN train loss of a worker that took no step.
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--nodes",
        "2",
        "--steps",
        "0",
        "--hidden",
        "8",
        "--peer-timeout",
        "5",
        "--quiet",
        "--no-report",
    ];
    let (ok, text) = local_within(
        &args,
        &dir.path().join("run"),
        std::time::Duration::from_secs(40),
    );
    assert!(ok, "{text}");
    assert!(!text.contains("non-finite"), "{text}");
}
