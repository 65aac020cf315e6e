//! README stays a manual that matches the code: at most 300 lines, every
//! page it links exists, and its quick start runs as written (the
//! walkthrough's commands run in `walkthrough.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

mod local_support;
use local_support::{slowmo_bin, text};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

/// The relative link targets of a Markdown text (`](target)`), without
/// their `#anchor`.
fn links(text: &str) -> Vec<String> {
    text.match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &text[i + 2..];
            let end = rest.find(')')?;
            let target = &rest[..end];
            let path = target.split('#').next().unwrap_or("");
            (!path.is_empty() && !path.contains("://") && !path.starts_with("mailto:"))
                .then(|| path.to_string())
        })
        .collect()
}

#[test]
fn readme_is_a_manual_of_at_most_300_lines() {
    let lines = readme().lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; move detail to docs/"
    );
}

#[test]
fn every_page_readme_and_docs_link_exists() {
    let mut pages = vec![root().join("README.md")];
    for dir in ["docs", "docs/benchmarks"] {
        if let Ok(entries) = std::fs::read_dir(root().join(dir)) {
            pages.extend(
                entries
                    .map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_some_and(|e| e == "md")),
            );
        }
    }
    let mut missing = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for target in links(&text) {
            let at = page.parent().unwrap().join(&target);
            if !at.exists() {
                missing.push(format!("{} -> {target}", page.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "links to nothing:\n{}",
        missing.join("\n")
    );
    // README links every docs page.
    let readme = readme();
    let linked = links(&readme);
    for page in pages.iter().skip(1) {
        let rel = page
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel.starts_with("docs/benchmarks/") {
            continue; // linked from docs/benchmarks.md
        }
        assert!(linked.contains(&rel), "README does not link {rel}");
    }
}

/// The quick start is the two commands: the main job, which this test runs
/// (the testnet as written, from the build the tests use, its folder given
/// so that it can be checked), and the tests.
#[test]
fn the_quick_start_runs_as_written() {
    let readme = readme();
    let at = readme.find("## Quick start").expect("a quick start");
    let rest = &readme[at..];
    let start = rest.find("```sh\n").unwrap() + 6;
    let end = rest[start..].find("```").unwrap() + start;
    let lines: Vec<&str> = rest[start..end]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[1], "cargo test --workspace");
    let job = lines[0]
        .strip_prefix("cargo build --release && target/release/slowmo-testnet ")
        .expect("the main job builds the release binaries and runs slowmo-testnet");
    let out = tempfile::tempdir().unwrap();
    let run = out.path().join("run");
    let output = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(job.split_whitespace())
        .arg("--slowmo-bin")
        .arg(slowmo_bin())
        .arg("--out")
        .arg(&run)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("report: "), "{}", text(&output));
    // The files README's table lists.
    for file in [
        "node-0/metrics.jsonl",
        "node-0/summary.json",
        "node-0/params.safetensors",
        "node-0/node.log",
        "run.toml",
        "report.html",
    ] {
        assert!(
            run.join(file).is_file(),
            "{file} missing; {}",
            text(&output)
        );
        assert!(
            readme.contains(file.trim_start_matches("node-0/")),
            "README does not name {file}"
        );
    }
}
