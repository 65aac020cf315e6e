//! `slowmo simulate --dump-reference`: what tools/reference/ replays.

use std::path::Path;
use std::process::Command;

const RUN: &[&str] = &[
    "simulate",
    "--workers",
    "2",
    "--steps",
    "24",
    "--tau",
    "12",
    "--preset",
    "slowmo",
    "--hidden",
    "16",
    "--batch-size",
    "8",
    "--eval-every",
    "0",
    "--quiet",
];

fn slowmo(extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_slowmo"))
        .args(RUN)
        .args(extra)
        .output()
        .unwrap()
}

fn tensors(path: &Path) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| (name, t.shape().to_vec(), t.data().to_vec()))
        .collect();
    out.sort();
    out
}

fn i64s(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn the_dump_holds_the_run_the_simulator_trains() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("dump");
    let out = slowmo(&["--dump-reference", dump.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let saved = dir.path().join("final.safetensors");
    let out = slowmo(&["--save-params", saved.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // One file per outer step; the last one is the run's final parameters,
    // bit for bit.
    let mut outer: Vec<String> = std::fs::read_dir(dump.join("outer"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    outer.sort();
    assert_eq!(outer, ["step-12.safetensors", "step-24.safetensors"]);
    assert_eq!(
        tensors(&dump.join("outer/step-24.safetensors")),
        tensors(&saved)
    );
    assert_ne!(
        tensors(&dump.join("outer/step-12.safetensors")),
        tensors(&dump.join("init.safetensors"))
    );

    // Every worker's batches of every step; within the epoch no sample is
    // drawn twice, by one worker or by both (iid shards are disjoint), and
    // every drawn sample is among the samples written.
    let data = tensors(&dump.join("data.safetensors"));
    let find = |name: &str| data.iter().find(|(n, ..)| n == name).unwrap();
    let (_, shape, bytes) = find("batches");
    assert_eq!(shape, &[2, 24, 8]);
    let drawn = i64s(bytes);
    let mut unique = drawn.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        drawn.len(),
        "a sample drawn twice in one epoch"
    );
    assert_eq!(i64s(&find("index").2), unique);
    assert_eq!(find("images").1, [unique.len(), 784]);
}

#[test]
fn the_dump_refuses_what_it_cannot_describe() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("dump");
    let out = slowmo(&[
        "--dump-reference",
        dump.to_str().unwrap(),
        "--faults",
        "kill 1@5",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--dump-reference cannot be combined with --faults"),
        "{err}"
    );
}
