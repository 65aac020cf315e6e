//! Shared by the tests that run the `slowmo` binary.
#![allow(dead_code)] // each test file uses some of these

use std::process::{Command, Output};

/// The `slowmo` binary of this build.
pub fn slowmo() -> Command {
    Command::new(env!("CARGO_BIN_EXE_slowmo"))
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
