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

/// `text` without ANSI colour sequences (`ESC [ ... m`).
fn plain(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Lines that look like tracing's output (`... INFO target: ...`).
fn log_lines(text: &str) -> Vec<String> {
    plain(text)
        .lines()
        .filter(|l| {
            [" TRACE ", " DEBUG ", " INFO ", " WARN ", " ERROR "]
                .iter()
                .any(|level| l.contains(level))
        })
        .map(str::to_string)
        .collect()
}

fn has_info(text: &str) -> bool {
    plain(text).contains(" INFO ")
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
    let out = bench(&args, None);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        log_lines(&stdout).is_empty(),
        "log lines on stdout:\n{stdout}"
    );
    assert!(stdout.lines().count() >= 2, "no table:\n{stdout}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!has_info(&stderr), "info logs without RUST_LOG:\n{stderr}");
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
    assert!(stdout.lines().count() >= 3, "no table:\n{stdout}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!has_info(&stderr), "info logs without RUST_LOG:\n{stderr}");

    // RUST_LOG still brings the logs back, on stderr only.
    let loud = bench(&args, Some("info"));
    let stdout = String::from_utf8(loud.stdout).unwrap();
    assert!(
        log_lines(&stdout).is_empty(),
        "log lines on stdout:\n{stdout}"
    );
    let stderr = String::from_utf8(loud.stderr).unwrap();
    assert!(has_info(&stderr), "RUST_LOG=info gave no logs:\n{stderr}");
}
