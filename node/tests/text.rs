//! `--dataset text:PATH` and `--model transformer` through the `slowmo`
//! binary: a tiny run trains and reports perplexity and tokens/s; text that
//! is empty, too short or unreadable, and settings that do not fit
//! together, are clear errors naming the path or flag, never panics.

use std::path::Path;
use std::process::Output;

mod support;
use support::{slowmo, text};

const TINY: [&str; 14] = [
    "--layers",
    "1",
    "--heads",
    "2",
    "--width",
    "16",
    "--context",
    "16",
    "--batch-size",
    "4",
    "--eval-every",
    "0",
    "--optimizer",
    "adam",
];

fn simulate(dataset: &str, extra: &[&str]) -> Output {
    slowmo()
        .args(["simulate", "--workers", "2", "--steps", "8"])
        .args(["--dataset", dataset])
        .args(extra)
        .output()
        .unwrap()
}

fn corpus(dir: &Path) -> String {
    let path = dir.join("corpus.txt");
    let line = "a stitch in time saves nine; ";
    std::fs::write(&path, line.repeat(80)).unwrap();
    format!("text:{}", path.display())
}

#[test]
fn a_tiny_transformer_trains_and_reports_perplexity_and_tokens_per_second() {
    let dir = tempfile::tempdir().unwrap();
    let mut flags = vec!["--model", "transformer"];
    flags.extend(TINY);
    let out = simulate(&corpus(dir.path()), &flags);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("model transformer"), "{all}");
    let ppl: f64 = all
        .lines()
        .find_map(|l| l.split("perplexity ").nth(1))
        .and_then(|r| r.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no perplexity: {all}"));
    // below the 256 of a uniform guess after 8 steps on repetitive text
    assert!(ppl > 1.0 && ppl < 256.0, "{all}");
    assert!(all.contains("tokens/s"), "{all}");
}

#[test]
fn bad_text_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let short = dir.path().join("short.txt");
    std::fs::write(&short, b"shorter than two windows of 16").unwrap();
    let missing = dir.path().join("missing.txt");
    let mut flags = vec!["--model", "transformer"];
    flags.extend(TINY);
    for (path, why) in [
        (&empty, "is empty"),
        (&short, "need at least 34"),
        (&missing, "No such file"),
    ] {
        let out = simulate(&format!("text:{}", path.display()), &flags);
        let all = text(&out);
        assert!(!out.status.success(), "{all}");
        assert!(!all.contains("panicked"), "{all}");
        assert!(all.contains(&path.display().to_string()), "{all}");
        assert!(all.contains(why), "{all}");
    }
}

#[test]
fn text_and_the_transformer_go_together() {
    let dir = tempfile::tempdir().unwrap();
    let text_arg = corpus(dir.path());
    for (dataset, flags, named) in [
        (
            text_arg.as_str(),
            vec!["--model", "mlp"],
            "--model transformer",
        ),
        ("synthetic", vec!["--model", "transformer"], "text:PATH"),
        ("text", vec!["--model", "transformer"], "text:PATH"),
        ("synthetic", vec!["--layers", "2"], "--layers"),
        (
            text_arg.as_str(),
            vec!["--model", "transformer", "--heads", "3"],
            "heads",
        ),
    ] {
        let out = simulate(dataset, &flags);
        let all = text(&out);
        assert!(!out.status.success(), "{all}");
        assert!(!all.contains("panicked"), "{all}");
        assert!(all.contains(named), "{dataset} {flags:?}: {all}");
    }
}
