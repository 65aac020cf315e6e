//! A local testnet with `--metrics-base-port`: every node's Prometheus
//! endpoint answers scrapes while the run goes on, with real values (steps,
//! per-peer traffic, the view, libp2p's connection metrics), in a run too
//! long to end before the test ends it; at the end of a run the testnet
//! writes its HTML report and prints the path.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod local_support;
use local_support::{harness_files, slowmo_bin};

/// A base port with `n` free ports from it.
fn free_ports(n: u16) -> u16 {
    for _ in 0..50 {
        let base = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if base < u16::MAX - n && (0..n).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok())
        {
            return base;
        }
    }
    panic!("no {n} free ports in a row");
}

/// The body of `GET /metrics`, or `None` while nothing listens.
fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    Some(body.to_string())
}

/// The value of an unlabelled sample, or the sum over a family's samples
/// whose labels contain `labels`.
fn value(text: &str, name: &str, labels: &str) -> Option<f64> {
    let samples: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, v) = l.rsplit_once(' ')?;
            let (metric, rest) = key.split_once('{').unwrap_or((key, ""));
            (metric == name && rest.contains(labels)).then(|| v.parse().ok())?
        })
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

/// A local testnet of 2 SGP nodes with metrics endpoints from `base`, of
/// `steps` steps, writing into `out`.
fn metrics_testnet(base: u16, steps: u64, out: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"));
    cmd.args(["local", "--nodes", "2", "--quiet", "--base", "sgp"])
        .args([
            "--steps",
            &steps.to_string(),
            "--eval-every",
            "2000",
            "--tau",
            "100",
        ])
        .args(["--hidden", "8", "--batch-size", "8"])
        .args(["--metrics-base-port", &base.to_string()])
        .args(harness_files(out))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

#[test]
fn every_node_serves_live_metrics_while_the_run_goes_on() {
    let out = tempfile::tempdir().unwrap();
    let base = free_ports(2);
    // A run far longer than the test: it cannot end before both nodes were
    // seen; the test ends it (Ctrl-C) once they were.
    let mut testnet = metrics_testnet(base, 100_000_000, out.path())
        .spawn()
        .unwrap();

    // Scrape both nodes until each has trained and exchanged something.
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut seen = [None, None];
    while seen.iter().any(Option::is_none) {
        if let Some(status) = testnet.try_wait().unwrap() {
            let output = testnet.wait_with_output().unwrap();
            panic!(
                "the testnet ended ({status}) before every node was seen: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        assert!(
            Instant::now() < deadline,
            "no scrape showed training and traffic on every node within 300 s: {seen:?}"
        );
        for (i, slot) in seen.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            if let Some(text) = scrape(base + i as u16) {
                let step = value(&text, "slowmo_step", "").unwrap_or(0.0);
                let sent = value(&text, "slowmo_peer_bytes_total", "direction=\"sent\"");
                if step >= 50.0 && sent.is_some_and(|b| b > 0.0) {
                    *slot = Some(text);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on the child we started and have not reaped.
    unsafe {
        libc::kill(testnet.id() as libc::pid_t, libc::SIGINT);
    }
    let status = testnet.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(
        !status.status.success() && stderr.contains("interrupted: stopped every node"),
        "{stderr}"
    );
    for (i, text) in seen.iter().enumerate() {
        let text = text
            .as_ref()
            .unwrap_or_else(|| panic!("node {i}: no scrape showed training and traffic"));
        let v = |name: &str, labels: &str| {
            value(text, name, labels).unwrap_or_else(|| panic!("node {i}: no {name} in\n{text}"))
        };
        assert!(v("slowmo_step", "") >= 50.0);
        assert!(v("slowmo_loss", "").is_finite());
        assert!((v("slowmo_lr", "") - 0.01).abs() < 1e-9);
        assert!(v("slowmo_gossip_rounds", "") >= 50.0);
        assert!(v("slowmo_push_sum_weight", "") > 0.0);
        assert_eq!(v("slowmo_view_size", ""), 2.0);
        assert!(v("slowmo_step_seconds_count", "") >= 49.0);
        assert!(v("slowmo_bytes_sent_total", "") > 0.0);
        assert!(v("slowmo_peer_messages_total", "direction=\"received\"") > 0.0);
        // one peer, named by its id
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("slowmo_peer_bytes_total{") && l.contains("\"sent\""))
                .count(),
            1,
            "{text}"
        );
        // libp2p's own metrics: the connection to the other node
        assert!(
            v("libp2p_swarm_connections_established_total", "") >= 1.0,
            "{text}"
        );
        assert!(text.contains("libp2p_bandwidth_bytes_total"), "{text}");
    }
}

#[test]
fn the_run_writes_its_report_at_the_end() {
    let out = tempfile::tempdir().unwrap();
    let status = metrics_testnet(free_ports(2), 300, out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&status.stderr)
    );
    // the report, written at the end
    let page = out.path().join("report.html");
    assert!(
        stdout.contains(&format!("report: {}", page.display())),
        "{stdout}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    for id in ["loss-step", "loss-time", "bandwidth", "step-time"] {
        assert!(html.contains(&format!("<figure id=\"plot-{id}\">")), "{id}");
    }
    assert!(html.contains("node-1") && html.contains("local testnet"));
}

#[test]
fn a_metrics_port_range_past_65535_is_refused_before_anything_starts() {
    let out = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["local", "--nodes", "3", "--metrics-base-port", "65534"])
        .arg("--slowmo-bin")
        .arg(slowmo_bin())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--metrics-base-port 65534"), "{err}");
}

#[test]
fn the_compose_file_publishes_each_endpoint_and_a_scrape_config_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let (file, prom) = (dir.path().join("c.yml"), dir.path().join("prom.yml"));
    let out = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["compose", "--nodes", "3", "--metrics-port", "19500"])
        .arg("--prometheus-config")
        .arg(&prom)
        .arg("-o")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = std::fs::read_to_string(&file).unwrap();
    for i in 0..3 {
        assert!(
            yaml.contains(&format!("ports: [\"127.0.0.1:{}:9100\"]", 19500 + i)),
            "{yaml}"
        );
    }
    assert_eq!(
        yaml.matches("\"--metrics-addr\", \"0.0.0.0:9100\"").count(),
        3
    );
    // the metrics network is the one that is not internal
    let networks = yaml.split("\nnetworks:").nth(1).unwrap();
    let metrics = networks.split("\n  metrics:").nth(1).unwrap();
    assert!(!metrics.contains("internal"), "{networks}");
    let prom = std::fs::read_to_string(&prom).unwrap();
    assert_eq!(prom.matches("targets: [\"127.0.0.1:").count(), 3, "{prom}");
    assert!(prom.contains("127.0.0.1:19502") && prom.contains("node: \"node-2\""));

    // without the flags nothing is published
    let out = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["compose", "--nodes", "2"])
        .output()
        .unwrap();
    let plain = String::from_utf8_lossy(&out.stdout);
    assert!(!plain.contains("ports:") && !plain.contains("--metrics-addr"));
}

/// The runs of `slowmo-testnet bench`, in order.
const BENCH_RUNS: [&str; 6] = [
    "no communication",
    "sgp",
    "osgp",
    "osgp background",
    "slowmo-sgp",
    "ar-sgd",
];

/// Runs a short 2-node `slowmo-testnet bench` with `extra` flags; its
/// stdout, after checking it succeeded.
fn bench_stdout(extra: &[&str]) -> String {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["bench", "--nodes", "2", "--steps", "5"])
        .args(extra)
        .args(harness_files(out_dir.path()))
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_testnet_benchmark_prints_only_its_table_on_stdout() {
    let stdout = bench_stdout(&[]);
    let lines: Vec<&str> = stdout.lines().collect();
    // a title, the column names, one row per configuration
    assert_eq!(lines.len(), 2 + BENCH_RUNS.len(), "{stdout}");
    assert!(lines[1].starts_with("run "), "{stdout}");
    for (line, label) in lines[2..].iter().zip(BENCH_RUNS) {
        assert!(line.starts_with(label), "{line}");
    }
}

#[test]
fn the_testnet_benchmark_prints_one_json_document_with_json() {
    let stdout = bench_stdout(&["--json", "--data-lane", "plaintext"]);
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(doc["bench"], "testnet");
    assert_eq!(doc["data_lane"], "plaintext");
    let runs = doc["runs"].as_array().expect("runs");
    let labels: Vec<&str> = runs.iter().map(|r| r["run"].as_str().unwrap()).collect();
    assert_eq!(labels, BENCH_RUNS);
    for r in runs {
        assert!(r["ms_per_step"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert_eq!(runs[0]["overhead"].as_f64(), Some(0.0));
}
