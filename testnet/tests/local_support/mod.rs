//! Shared by the tests that start local testnets of `slowmo node` processes.
#![allow(dead_code)] // each test file uses some of these

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

/// The `slowmo` binary the nodes run: `$SLOWMO_BIN`, else the one beside
/// this crate's `slowmo-testnet` in the same target folder (built by
/// `cargo test --workspace`, or `cargo build -p slowmo-node` first).
pub fn slowmo_bin() -> PathBuf {
    let path = std::env::var_os("SLOWMO_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_BIN_EXE_slowmo-testnet"))
                .with_file_name(format!("slowmo{}", std::env::consts::EXE_SUFFIX))
        });
    assert!(
        path.is_file(),
        "slowmo binary missing at {} (cargo build -p slowmo-node)",
        path.display()
    );
    path
}

/// The flags of a `slowmo-testnet` run naming the `slowmo` binary its
/// nodes run ([`slowmo_bin`]) and the run's folder.
pub fn harness_files(out: &Path) -> [OsString; 4] {
    [
        "--slowmo-bin".into(),
        slowmo_bin().into(),
        "--out".into(),
        out.into(),
    ]
}

/// A JSON file a run wrote, parsed; a failure names the file.
pub fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A finished command's status, stdout and stderr, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether network namespaces can be made here (as root): a probe
/// namespace `PREFIX-probe` is made and removed. Where they cannot, `test`
/// says it is skipped, and under CI=true it fails instead.
pub fn can_make_namespaces(test: &str, prefix: &str) -> bool {
    use std::process::{Command, Stdio};
    let probe = format!("{prefix}-probe");
    let made = Command::new("ip")
        .args(["netns", "add", &probe])
        .stderr(Stdio::piped())
        .output();
    match made {
        Ok(out) if out.status.success() => {
            let _ = Command::new("ip").args(["netns", "del", &probe]).status();
            true
        }
        other => {
            let why = match other {
                Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
                Err(e) => format!("cannot run ip: {e}"),
            };
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "CI=true but network namespaces cannot be made ({why}): {test} cannot run"
            );
            println!("SKIPPED {test}: network namespaces cannot be made here ({why}; run as root)");
            false
        }
    }
}
