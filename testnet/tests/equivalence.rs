//! A local testnet of real `slowmo node` processes over libp2p gives
//! byte-identical final parameters to the in-process simulator with the same
//! settings, for every synchronous algorithm, over hundreds of steps and
//! through an unstable learning rate: both run the same outer-loop state
//! machine, the same push-sum order and the same summation order
//! (docs/algorithm.md, "Summation order").

use std::process::Command;

mod local_support;
use local_support::slowmo_bin;

fn check(flags: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let common = [
        "--steps",
        "312",
        "--eval-every",
        "0",
        "--hidden",
        "32",
        "--batch-size",
        "16",
    ];
    let sim = dir.path().join("sim.safetensors");
    let status = Command::new(slowmo_bin())
        .args(["simulate", "--workers", "4", "--quiet"])
        .args(common)
        .args(flags)
        .arg("--save-params")
        .arg(&sim)
        .status()
        .unwrap();
    assert!(status.success(), "simulate {flags:?}");
    let out = dir.path().join("net");
    let status = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args([
            "local",
            "--nodes",
            "4",
            "--quiet",
            "--join-timeout",
            "60",
            "--peer-timeout",
            "60",
        ])
        .arg("--slowmo-bin")
        .arg(slowmo_bin())
        .arg("--out")
        .arg(&out)
        .args(common)
        .args(flags)
        .status()
        .unwrap();
    assert!(status.success(), "local testnet {flags:?}");
    let a = std::fs::read(&sim).unwrap();
    for node in 0..4 {
        let path = out.join(format!("node-{node}/params.safetensors"));
        let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            a == b,
            "{flags:?}: node {node}'s parameter file differs from the simulator's"
        );
    }
}

#[test]
fn testnet_matches_simulator_for_every_synchronous_algorithm() {
    check(&["--preset", "ar-sgd"]);
    check(&["--preset", "local-sgd", "--tau", "6"]);
    check(&["--preset", "sgp"]);
    for base in ["ar-sgd", "local-sgd", "sgp"] {
        check(&["--base", base, "--beta", "0.5", "--tau", "6"]);
    }
    for base in ["local-sgd", "sgp"] {
        check(&[
            "--base",
            base,
            "--beta",
            "0.5",
            "--tau",
            "6",
            "--no-average",
        ]);
    }
}

const UNSTABLE_LR: &str = "0.05";

/// A learning rate high enough that the loss spikes: rounding differences of
/// 1e-7 would grow to O(1) here, so only the same summation order passes.
#[test]
fn testnet_matches_simulator_through_an_unstable_learning_rate() {
    check(&["--preset", "local-sgd", "--tau", "6", "--lr", UNSTABLE_LR]);
}

/// Compressed gossip is the same code in both transports: SlowMo over SGP
/// with int8 and top-k shares, and over OSGP with int8, give the
/// simulator's bytes.
#[test]
fn testnet_matches_simulator_with_compressed_gossip() {
    for codec in ["int8", "topk:0.05"] {
        check(&[
            "--base",
            "sgp",
            "--beta",
            "0.5",
            "--tau",
            "6",
            "--compress",
            codec,
        ]);
    }
    check(&["--preset", "sgp", "--compress", "bf16"]);
}
