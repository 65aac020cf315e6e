//! Checkpoints end to end through the `slowmo` binary: a run resumed from a
//! checkpoint ends with the same bytes as the uninterrupted run, after a
//! SIGKILL too; a corrupt checkpoint is skipped for the next older one, and
//! a checkpoint of another configuration is refused, both with the reason.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

mod support;
use support::slowmo;

const SMALL: [&str; 10] = [
    "--workers",
    "4",
    "--eval-every",
    "0",
    "--hidden",
    "32",
    "--batch-size",
    "16",
    "--quiet",
    "--tau",
];

fn simulate(flags: &[&str], extra: &[&str], params: &Path, ckpt: &Path) -> Output {
    let out = slowmo()
        .arg("simulate")
        .args(SMALL)
        .args(flags)
        .args(extra)
        .arg("--save-params")
        .arg(params)
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "simulate {flags:?} {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "safetensors"));
    v.sort();
    v
}

/// Runs to the end, then forgets every checkpoint after step `crash_after`
/// (what a crash right after that checkpoint leaves) and resumes.
fn resume_matches_uninterrupted(flags: &[&str], crash_after: u64) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, ck) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("ck"),
    );
    simulate(flags, &["--checkpoint-keep", "100"], &a, &ck);
    for w in 0..4 {
        for file in checkpoints(&ck.join(format!("worker-{w}"))) {
            let name = file.file_name().unwrap().to_str().unwrap();
            let step: u64 = name[5..15].parse().unwrap();
            if step > crash_after {
                std::fs::remove_file(&file).unwrap();
            }
        }
    }
    simulate(flags, &["--resume"], &b, &ck);
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "{flags:?}: the resumed run's parameters differ"
    );
}

#[test]
fn resuming_reproduces_the_uninterrupted_run_bit_for_bit() {
    resume_matches_uninterrupted(&["6", "--steps", "60", "--preset", "local-sgd"], 30);
    resume_matches_uninterrupted(
        &[
            "6",
            "--steps",
            "60",
            "--base",
            "sgp",
            "--beta",
            "0.5",
            "--optimizer",
            "adam",
            "--buffer-policy",
            "reset",
            "--schedule",
            "warmup-cosine:10",
        ],
        24,
    );
    resume_matches_uninterrupted(
        &[
            "6",
            "--steps",
            "60",
            "--base",
            "sgp",
            "--beta",
            "0.5",
            "--no-average",
        ],
        36,
    );
    // Compressed shares and averages: the average's residual is state.
    resume_matches_uninterrupted(
        &[
            "6",
            "--steps",
            "60",
            "--base",
            "sgp",
            "--beta",
            "0.5",
            "--compress",
            "int8",
            "--compress-average",
            "int8",
        ],
        30,
    );
}

#[test]
fn a_killed_run_resumes_to_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["12", "--steps", "1200", "--base", "sgp", "--beta", "0.5"];
    let (a, b, ck_a, ck_b) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("ck-a"),
        dir.path().join("ck-b"),
    );
    simulate(&flags, &[], &a, &ck_a);
    let mut child = slowmo()
        .arg("simulate")
        .args(SMALL)
        .args(flags)
        .arg("--save-params")
        .arg(&b)
        .arg("--checkpoint-dir")
        .arg(&ck_b)
        .spawn()
        .unwrap();
    // Kill it once every worker has written a checkpoint (they finish the
    // same barrier in any order).
    let started = Instant::now();
    while (0..4).any(|w| checkpoints(&ck_b.join(format!("worker-{w}"))).is_empty()) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no checkpoint within 2 minutes"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(
        !status.success() && !b.exists(),
        "the run must die before its end: {status:?}"
    );
    simulate(&flags, &["--resume"], &b, &ck_b);
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
}

#[test]
fn corrupt_and_mismatched_checkpoints_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["6", "--steps", "24", "--base", "sgp"];
    let (a, ck) = (dir.path().join("a"), dir.path().join("ck"));
    simulate(&flags, &[], &a, &ck);
    // The newest checkpoint of worker 1 is damaged: everyone falls back one.
    let newest = checkpoints(&ck.join("worker-1")).pop().unwrap();
    let mut bytes = std::fs::read(&newest).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    std::fs::write(&newest, bytes).unwrap();
    let out = simulate(&flags, &["--resume"], &dir.path().join("b"), &ck);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("content hash mismatch"), "{err}");
    assert!(err.contains("resuming every worker at step 18"), "{err}");
    // Another learning rate is another run.
    let out = slowmo()
        .arg("simulate")
        .args(SMALL)
        .args(flags)
        .args(["--lr", "0.02", "--resume", "--checkpoint-dir"])
        .arg(&ck)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("no usable checkpoint") && err.contains("`lr` was 0.01, is 0.02"),
        "{err}"
    );
}

#[test]
fn a_run_extended_by_a_resume_ends_with_the_longer_runs_bits() {
    // SlowMo over Local SGD (the default preset), constant learning rate.
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    simulate(
        &["12", "--steps", "1200"],
        &[],
        &path("long"),
        &path("ck-long"),
    );
    simulate(&["12", "--steps", "600"], &[], &path("short"), &path("ck"));
    let out = simulate(
        &["12", "--steps", "1200"],
        &["--resume"],
        &path("extended"),
        &path("ck"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("resuming every worker at step 600"), "{err}");
    assert!(
        std::fs::read(path("long")).unwrap() == std::fs::read(path("extended")).unwrap(),
        "the run of 600 steps extended to 1200 differs from the run of 1200"
    );

    // A cosine schedule depends on the total: the rates of the steps taken
    // would differ, so the same extension is refused, naming the setting.
    let cosine = ["12", "--schedule", "cosine"];
    simulate(
        &[&cosine[..], &["--steps", "600"]].concat(),
        &[],
        &path("cos"),
        &path("ck-cos"),
    );
    let out = slowmo()
        .arg("simulate")
        .args(SMALL)
        .args(cosine)
        .args(["--steps", "1200", "--resume", "--checkpoint-dir"])
        .arg(path("ck-cos"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("`steps` was 600, is 1200"), "{err}");
}
