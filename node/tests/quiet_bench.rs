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

#[test]
fn json_documents_carry_the_figures_by_name() {
    let out = bench(
        &[
            "transport",
            "--sizes-mib",
            "1",
            "--rounds",
            "1",
            "--links",
            "plain,lane,lane-plaintext",
            "--json",
        ],
        None,
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let figures = doc["figures"].as_array().expect("figures");
    for (link, mode) in [
        ("plain-tcp", "bytes"),
        ("lane", "bytes"),
        ("lane", "push-sum"),
        ("lane-plaintext", "bytes"),
    ] {
        let f = figures
            .iter()
            .find(|f| f["link"] == link && f["mode"] == mode)
            .unwrap_or_else(|| panic!("no {link} {mode} figure in {doc}"));
        assert!(f["gbit_s"].as_f64().is_some_and(|g| g > 0.0), "{f}");
        assert_eq!(f["size_mib"], 1);
        if link != "plain-tcp" {
            assert!(f["ratio_to_plain_tcp"].as_f64().is_some(), "{f}");
        }
    }

    let out = bench(
        &[
            "allreduce",
            "--nodes",
            "3",
            "--floats",
            "1000",
            "--schedule",
            "auto,ring",
            "--repeats",
            "3",
            "--json",
        ],
        None,
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["data_lane"], "encrypted");
    assert_eq!(doc["nodes"], 3);
    let figures = doc["figures"].as_array().expect("figures");
    assert_eq!(figures.len(), 2, "{doc}");
    for f in figures {
        assert!(f["median_seconds"].as_f64().is_some_and(|s| s > 0.0), "{f}");
        assert!(f["bus_gbit_s"].as_f64().is_some(), "{f}");
        assert_eq!(f["seconds"].as_array().map(Vec::len), Some(3));
        assert_eq!(f["floats"], 1000);
    }
    // A small buffer over three nodes goes direct unless the ring is asked for.
    assert_eq!(figures[0]["schedule_asked"], "auto");
    assert_eq!(figures[0]["schedule"], "direct");
    assert_eq!(figures[1]["schedule_asked"], "ring");
    assert_eq!(figures[1]["schedule"], "ring");
}

#[test]
fn allreduce_over_processes_gathers_every_nodes_timings() {
    // Three nodes, each its own process: the two copies print their
    // timings for this one; a repeat lasts as long as its slowest node.
    let out = bench(
        &[
            "allreduce",
            "--nodes",
            "3",
            "--processes",
            "--floats",
            "1000",
            "--compress-average",
            "none,int8",
            "--repeats",
            "2",
            "--json",
        ],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["processes"], true, "{doc}");
    assert_eq!(doc["nodes"], 3);
    let figures = doc["figures"].as_array().expect("figures");
    assert_eq!(figures.len(), 2, "{doc}");
    for (f, codec) in figures.iter().zip(["none", "int8"]) {
        assert_eq!(f["compress_average"], codec, "{f}");
        assert_eq!(f["seconds"].as_array().map(Vec::len), Some(2), "{f}");
        assert!(f["median_seconds"].as_f64().is_some_and(|s| s > 0.0), "{f}");
    }
}
