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
