//! A local testnet of real `slowmo node` processes over libp2p gives the same
//! final parameters as the in-process simulator with the same settings.

use std::path::Path;
use std::process::Command;

mod local_support;
use local_support::slowmo_bin;

fn load(path: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let t = st.tensor(&n).unwrap();
            let v = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (n, v)
        })
        .collect()
}

fn check(flags: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let common = [
        "--steps",
        "36",
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
    let a = load(&sim);
    for node in 0..4 {
        let b = load(&out.join(format!("node-{node}/params.safetensors")));
        assert_eq!(a.len(), b.len());
        for ((na, va), (nb, vb)) in a.iter().zip(&b) {
            assert_eq!(na, nb);
            for (x, y) in va.iter().zip(vb) {
                let tol = 1e-5 * x.abs().max(y.abs()).max(1e-2);
                assert!(
                    (x - y).abs() <= tol,
                    "{flags:?} node {node} {na}: {x} vs {y}"
                );
            }
        }
    }
}

#[test]
fn testnet_matches_simulator_for_every_synchronous_algorithm() {
    check(&["--preset", "ar-sgd"]);
    check(&["--preset", "local-sgd", "--tau", "6"]);
    check(&["--preset", "sgp"]);
    check(&["--base", "local-sgd", "--beta", "0.5", "--tau", "6"]);
    check(&["--base", "sgp", "--beta", "0.5", "--tau", "6"]);
    check(&[
        "--base",
        "sgp",
        "--beta",
        "0.5",
        "--tau",
        "6",
        "--no-average",
    ]);
}
