//! Shared by the tests that start local testnets of `slowmo node` processes.

use std::path::{Path, PathBuf};

/// The `slowmo` binary the nodes run: `$SLOWMO_BIN`, else the debug build
/// that `cargo test --workspace` makes beside this crate's.
pub fn slowmo_bin() -> PathBuf {
    let path = std::env::var_os("SLOWMO_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/slowmo"));
    assert!(
        path.is_file(),
        "slowmo binary missing at {} (cargo build -p slowmo-node)",
        path.display()
    );
    path
}
