//! `slowmo report`: a simulate run with `--metrics-jsonl` becomes one HTML
//! page whose plots a real browser (headless Chromium) has in its DOM; a
//! folder without metrics is refused with what was expected. The report of
//! a local testnet is checked in `testnet/tests/observe.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn slowmo(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_slowmo"))
        .args(args)
        .output()
        .expect("running slowmo")
}

/// Chromium from Debian (`apt-get install chromium`), if installed.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|p| p.is_file())
}

/// The DOM a headless browser builds from the page.
fn rendered_dom(page: &Path) -> Option<String> {
    let Some(browser) = chromium() else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("chromium is not installed (.ci/run installs it with apt-get)");
        }
        eprintln!("skipped the browser check: no chromium (apt-get install chromium)");
        return None;
    };
    let out = Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}", page.canonicalize().unwrap().display()))
        .output()
        .expect("running chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).expect("the DOM is UTF-8"))
}

/// The ids of the `<figure id="plot-...">` elements whose SVG draws lines.
fn drawn_plots(html: &str) -> Vec<String> {
    html.split("<figure id=\"plot-")
        .skip(1)
        .filter_map(|chunk| {
            let (id, rest) = chunk.split_once('"')?;
            let body = rest.split("</figure>").next()?;
            (body.contains("<svg") && body.contains("<polyline")).then(|| id.to_string())
        })
        .collect()
}

#[test]
fn a_simulate_run_renders_its_plots_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let metrics = run.join("metrics.jsonl");
    let summary = run.join("summary.json");
    let out = slowmo(&[
        "simulate",
        "--quiet",
        "--workers",
        "3",
        "--base",
        "sgp",
        "--steps",
        "60",
        "--tau",
        "12",
        "--eval-every",
        "20",
        "--hidden",
        "16",
        "--metrics-jsonl",
        metrics.to_str().unwrap(),
        "--summary-json",
        summary.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // every worker's records, each tagged with its worker
    let text = std::fs::read_to_string(&metrics).unwrap();
    let mut per_worker = [0usize; 3];
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        per_worker[v["worker"].as_u64().unwrap() as usize] += 1;
    }
    assert_eq!(per_worker, [60, 60, 60]);

    let out = slowmo(&["report", run.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = run.join("report.html");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        page.display().to_string()
    );
    let html = std::fs::read_to_string(&page).unwrap();
    let expected = [
        "loss-step",
        "loss-time",
        "accuracy",
        "consensus",
        "weight",
        "bandwidth",
        "step-time",
    ];
    assert_eq!(drawn_plots(&html), expected);
    // self-contained: nothing to fetch
    assert!(!html.contains("src=") && !html.contains("href="));
    assert!(html.contains("worker 2") && html.contains("&quot;tau&quot;: 12"));
    // barriers at steps 12, 24, ...: grey marker lines in the loss plot
    assert!(html.contains("barrier"));

    if let Some(dom) = rendered_dom(&page) {
        assert_eq!(drawn_plots(&dom), expected, "plots missing from the DOM");
        assert!(
            dom.contains("<td>final train loss</td>"),
            "no results table"
        );
    }
}

#[test]
fn a_folder_without_metrics_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = slowmo(&["report", dir.path().to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no metrics.jsonl"), "{err}");
    assert!(err.contains("slowmo-testnet local --out"), "{err}");
}
