//! A local testnet of real `slowmo node` processes over libp2p gives
//! byte-identical final parameters to the in-process simulator with the same
//! settings, for every synchronous algorithm, over hundreds of steps and
//! through an unstable learning rate: both run the same outer-loop state
//! machine, the same push-sum order and the same summation order
//! (docs/algorithm.md, "Summation order").

use std::process::Command;

mod local_support;
use local_support::{harness_files, slowmo_bin};

/// Runs `flags` in the simulator and on a local testnet of `nodes`
/// processes and asserts that every node's final parameter file equals the
/// simulator's byte for byte; returns the folder (`sim.safetensors`, and
/// the testnet's outputs under `net/`).
fn agree(nodes: usize, flags: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let sim = dir.path().join("sim.safetensors");
    let status = Command::new(slowmo_bin())
        .args(["simulate", "--quiet", "--workers", &nodes.to_string()])
        .args(flags)
        .arg("--save-params")
        .arg(&sim)
        .status()
        .unwrap();
    assert!(status.success(), "simulate {flags:?}");
    let out = dir.path().join("net");
    let status = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["local", "--quiet", "--nodes", &nodes.to_string()])
        .args(["--join-timeout", "60", "--peer-timeout", "60"])
        .args(harness_files(&out))
        .args(flags)
        .status()
        .unwrap();
    assert!(status.success(), "local testnet {flags:?}");
    let a = std::fs::read(&sim).unwrap();
    for node in 0..nodes {
        let path = out.join(format!("node-{node}/params.safetensors"));
        let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            a == b,
            "{flags:?}: node {node}'s parameter file differs from the simulator's"
        );
    }
    dir
}

/// [`agree`] on 4 nodes with the small MLP over 312 steps.
fn check(flags: &[&str]) {
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
    agree(4, &[&common[..], flags].concat());
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
fn testnet_matches_simulator_with_compressed_gossip_and_averages() {
    let slowmo_sgp = ["--base", "sgp", "--beta", "0.5", "--tau", "6"];
    check(
        &[
            &slowmo_sgp[..],
            &["--compress", "int8", "--compress-average", "int8"],
        ]
        .concat(),
    );
    check(&[&slowmo_sgp[..], &["--compress", "topk:0.05"]].concat());
    check(&["--preset", "sgp", "--compress", "bf16"]);
    check(&[
        "--base",
        "local-sgd",
        "--beta",
        "0.5",
        "--tau",
        "6",
        "--compress-average",
        "int8",
    ]);
}

/// The transformer language model on text the test writes: a 2-process
/// testnet gives the simulator's bytes for Local SGD, as the MLP does, and
/// each node's summary holds the held-out perplexity and its tokens per
/// second.
#[test]
fn testnet_matches_simulator_for_local_sgd_with_the_transformer() {
    let text_dir = tempfile::tempdir().unwrap();
    let corpus = text_dir.path().join("corpus.txt");
    let text: String = (0..400)
        .map(|i| format!("line {i}: pack my box with {} liquor jugs.\n", i % 7))
        .collect();
    std::fs::write(&corpus, text).unwrap();
    let dataset = format!("text:{}", corpus.display());
    let common = [
        "--model",
        "transformer",
        "--dataset",
        &dataset,
        "--layers",
        "1",
        "--heads",
        "2",
        "--width",
        "16",
        "--context",
        "16",
        "--optimizer",
        "adam",
        "--preset",
        "local-sgd",
        "--tau",
        "4",
        "--steps",
        "16",
        "--eval-every",
        "0",
        "--batch-size",
        "4",
    ];
    let dir = agree(2, &common);
    let a = std::fs::read(dir.path().join("sim.safetensors")).unwrap();
    assert!(
        a.windows(22).any(|w| w == b"transformer.wte.weight"),
        "the simulator's file holds the transformer's tensors"
    );
    for node in 0..2 {
        let path = dir.path().join(format!("net/node-{node}/summary.json"));
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let ppl = summary["test_perplexity"].as_f64().unwrap();
        let loss = summary["test_loss"].as_f64().unwrap();
        assert!((ppl.ln() - loss).abs() < 1e-4 && ppl < 256.0, "{summary}");
        assert!(
            summary["tokens_per_second"].as_f64().unwrap() > 0.0,
            "{summary}"
        );
    }
}
