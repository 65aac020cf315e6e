//! `slowmo-testnet local` and its output folder: a reused `--out` is
//! refused unless `--force`, which clears the earlier run's files so that
//! two runs never mix; a non-UTF-8 data folder is a clear error; a node
//! that does not stop within `--stop-grace` is named.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod local_support;
use local_support::{harness_files, slowmo_bin, text};

fn local(out: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["local", "--nodes", "2", "--quiet", "--steps", "20"])
        .args(["--eval-every", "0", "--hidden", "8", "--batch-size", "8"])
        .args(["--join-timeout", "60", "--peer-timeout", "60"])
        .args(harness_files(out))
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn a_reused_out_folder_is_refused_unless_force_which_clears_the_earlier_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let first = local(&out, &[]);
    assert!(first.status.success(), "{}", text(&first));
    let params = out.join("node-0/params.safetensors");
    let before = std::fs::read(&params).unwrap();
    // What a failed earlier run of more nodes left behind.
    std::fs::create_dir_all(out.join("node-3")).unwrap();
    std::fs::write(out.join("node-3/params.safetensors"), b"stale").unwrap();

    let again = local(&out, &[]);
    let t = text(&again);
    assert!(!again.status.success(), "{t}");
    assert!(
        t.contains("--out") && t.contains("earlier run") && t.contains("--force"),
        "{t}"
    );
    assert_eq!(std::fs::read(&params).unwrap(), before, "nothing touched");
    assert!(out.join("node-3").exists());

    let forced = local(&out, &["--force", "--seed", "9"]);
    assert!(forced.status.success(), "{}", text(&forced));
    assert!(
        !out.join("node-3").exists(),
        "the earlier run's files are gone"
    );
    let after = std::fs::read(&params).unwrap();
    assert_ne!(after, before, "the new run's parameters (another seed)");
    let summary = std::fs::read_to_string(out.join("node-1/summary.json")).unwrap();
    assert!(summary.contains("\"completed\": true"), "{summary}");
}

#[test]
fn a_non_utf8_data_dir_is_a_clear_error_before_any_node_starts() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let data = dir.path().join(OsStr::from_bytes(b"data-\xff"));
    let out = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["local", "--nodes", "2", "--quiet"])
        .arg("--slowmo-bin")
        .arg(slowmo_bin())
        .arg("--data-dir")
        .arg(&data)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "an error, not a panic: {t}");
    assert!(t.contains("--data-dir") && t.contains("UTF-8"), "{t}");
    assert!(!out_dir.exists(), "{t}");
}

#[test]
fn a_node_that_does_not_stop_within_the_grace_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // A "node" that ignores SIGTERM.
    let bin = dir.path().join("stubborn");
    std::fs::write(&bin, "#!/bin/sh\ntrap '' TERM\nexec sleep 600\n").unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = dir.path().join("run");
    let mut harness = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["local", "--nodes", "2", "--quiet", "--stop-grace", "1"])
        .arg("--slowmo-bin")
        .arg(&bin)
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while !out.join("node-1/node.log").exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) on a child we started and have not reaped.
    unsafe {
        libc::kill(harness.id() as libc::pid_t, libc::SIGINT);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while harness.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = harness.kill();
    let result = harness.wait_with_output().unwrap();
    let t = text(&result);
    assert!(!result.status.success(), "{t}");
    assert!(
        t.contains("node-0 did not stop within 1 s")
            && t.contains("node-1 did not stop within 1 s"),
        "{t}"
    );
    assert!(t.contains("did not stop in time and were killed"), "{t}");
}
