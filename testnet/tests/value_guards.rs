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
