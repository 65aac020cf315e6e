//! `--help` reads well: a node's help shows only what a node uses, grouped
//! under headings, and the simulator's shows none of a node's flags.

mod support;
use support::{slowmo, text};

fn help(command: &str) -> String {
    let out = slowmo().args([command, "--help"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// The long flags a help text lists (each at the start of its line).
fn flags(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            // `-h, --help`: the long form after the short one.
            let l = match l.as_bytes() {
                [b'-', c, b',', b' ', ..] if *c != b'-' => &l[4..],
                _ => l,
            };
            l.starts_with("--")
                .then(|| l.split([' ', '=', '<', '[']).next().unwrap().to_string())
        })
        .collect()
}

/// The simulator's own flags: in-process workers, its network model,
/// fault scripts and reference dumps.
const SIMULATOR_ONLY: [&str; 5] = [
    "--workers",
    "--network",
    "--faults",
    "--dump-reference",
    "--quiet",
];
/// A node's own: its run, its network, its device.
const NODE_ONLY: [&str; 9] = [
    "--nodes",
    "--join",
    "--run-id",
    "--listen",
    "--lane-port",
    "--bootstrap",
    "--identity",
    "--data-lane",
    "--ticket-file",
];

#[test]
fn a_nodes_help_lists_no_simulator_flag_and_the_simulators_no_node_flag() {
    let node = flags(&help("node"));
    let sim = flags(&help("simulate"));
    for f in SIMULATOR_ONLY {
        assert!(!node.iter().any(|n| n == f), "slowmo node --help lists {f}");
        assert!(
            sim.iter().any(|s| s == f),
            "slowmo simulate --help lacks {f}"
        );
    }
    for f in NODE_ONLY {
        assert!(node.iter().any(|n| n == f), "slowmo node --help lacks {f}");
        assert!(
            !sim.iter().any(|s| s == f),
            "slowmo simulate --help lists {f}"
        );
    }
    let text = help("node");
    assert!(!text.contains("(simulate)"), "{text}");
    // --workers is hidden from a node's help, not refused: a shared config
    // file or an old command line may still say it.
    let out = slowmo()
        .args([
            "node",
            "--workers",
            "0",
            "--steps",
            "1",
            "--join-timeout",
            "1",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("unexpected argument"), "{stderr}");
}

#[test]
fn a_nodes_help_is_grouped_under_headings() {
    let text = help("node");
    for heading in [
        "Run:",
        "Network:",
        "Compute:",
        "Outputs:",
        "Checkpoints:",
        "Admission:",
        "Training (the same on every node; --join brings them):",
    ] {
        assert!(
            text.lines().any(|l| l == heading),
            "no heading `{heading}`:\n{text}"
        );
    }
    // Every flag under "Options:" is clap's own.
    let options = text
        .split("\nOptions:\n")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .unwrap_or("");
    for f in flags(options) {
        assert!(
            ["--help", "--version"].contains(&f.as_str()),
            "{f} has no heading:\n{text}"
        );
    }
    // Defaults are sentences or values, not fragments.
    for line in text.lines().filter(|l| l.contains("[default:")) {
        let value = line.split("[default:").nth(1).unwrap();
        assert!(!value.contains(" is up to you"), "{line}");
    }
}
