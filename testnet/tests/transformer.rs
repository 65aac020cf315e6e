//! The transformer language model on text the test writes: a 2-process
//! testnet gives byte-identical parameter files to the simulator for Local
//! SGD, as the MLP does (`equivalence.rs`), and each node's summary holds
//! the held-out perplexity and its tokens per second.

use std::process::Command;

mod local_support;
use local_support::slowmo_bin;

#[test]
fn testnet_matches_simulator_for_local_sgd_with_the_transformer() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
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
    let sim = dir.path().join("sim.safetensors");
    let status = Command::new(slowmo_bin())
        .args(["simulate", "--workers", "2", "--quiet"])
        .args(common)
        .arg("--save-params")
        .arg(&sim)
        .status()
        .unwrap();
    assert!(status.success(), "simulate");
    let out = dir.path().join("net");
    let status = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args([
            "local",
            "--nodes",
            "2",
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
        .status()
        .unwrap();
    assert!(status.success(), "local testnet");
    let a = std::fs::read(&sim).unwrap();
    assert!(
        a.windows(22).any(|w| w == b"transformer.wte.weight"),
        "the simulator's file holds the transformer's tensors"
    );
    for node in 0..2 {
        let path = out.join(format!("node-{node}/params.safetensors"));
        let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            a == b,
            "node {node}'s parameter file differs from the simulator's"
        );
        let path = out.join(format!("node-{node}/summary.json"));
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
