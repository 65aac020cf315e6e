//! Shared by the tests that start local testnets of `slowmo node` processes.

use std::path::PathBuf;

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
