//! Benchmarks print their tables on stdout and nothing else there; their
//! logs go to stderr, warnings only unless RUST_LOG asks for more.

use std::process::{Command, Output};

fn bench(args: &[&str], rust_log: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_slowmo"));
    cmd.arg("bench").args(args).env_remove("RUST_LOG");
    if let Some(level) = rust_log {
        cmd.env("RUST_LOG", level);
    }
    let out = cmd.output().expect("running slowmo bench");
    assert!(
        out.status.success(),
        "slowmo bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Lines that look like tracing's output (`... INFO target: ...`).
fn log_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| {
            [" TRACE ", " DEBUG ", " INFO ", " WARN ", " ERROR "]
                .iter()
                .any(|level| l.contains(level))
        })
        .collect()
}

#[test]
fn allreduce_prints_only_its_table_on_stdout() {
    let args = [
        "allreduce",
        "--nodes",
        "2",
        "--floats",
        "1000",
        "--repeats",
        "1",
    ];
    let quiet = bench(&args, None);
    let stdout = String::from_utf8(quiet.stdout).unwrap();
    assert!(
        log_lines(&stdout).is_empty(),
        "log lines on stdout:\n{stdout}"
    );
    assert!(stdout.lines().count() >= 2, "no table:\n{stdout}");
    let stderr = String::from_utf8(quiet.stderr).unwrap();
    assert!(
        !stderr.contains(" INFO "),
        "info logs without RUST_LOG:\n{stderr}"
    );

    // RUST_LOG still brings the logs back, on stderr only.
    let loud = bench(&args, Some("info"));
    let stdout = String::from_utf8(loud.stdout).unwrap();
    assert!(
        log_lines(&stdout).is_empty(),
        "log lines on stdout:\n{stdout}"
    );
    let stderr = String::from_utf8(loud.stderr).unwrap();
    assert!(
        stderr.contains(" INFO "),
        "RUST_LOG=info gave no logs:\n{stderr}"
    );
}

#[test]
fn transport_prints_only_its_table_on_stdout() {
    // two processes: the far end is a copy of this command
    let args = [
        "transport",
        "--sizes-mib",
        "1",
        "--rounds",
        "1",
        "--links",
        "plain,tcp",
    ];
    let out = bench(&args, None);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        log_lines(&stdout).is_empty(),
        "log lines on stdout:\n{stdout}"
    );
    assert!(
        stdout.contains("MiB") || stdout.lines().count() >= 3,
        "{stdout}"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!stderr.contains(" INFO "), "{stderr}");
}
