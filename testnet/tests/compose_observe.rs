//! A 2-node docker-compose testnet written with `--metrics-port`: each
//! node's Prometheus endpoint answers on this host while it trains, and
//! `up --wait` ends by writing the run's report. Skipped (with a printed
//! reason) only where no Docker Engine answers.

mod compose_support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use compose_support::{Image, Testnet, docker_available, subnet, unique};

/// The value of an unlabelled sample in a scrape.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text.split_once("\r\n\r\n")?.1.to_string())
}

/// A port with the next one free too.
fn free_pair() -> u16 {
    (0..50)
        .find_map(|_| {
            let p = TcpListener::bind("127.0.0.1:0")
                .ok()?
                .local_addr()
                .ok()?
                .port();
            (p < u16::MAX && TcpListener::bind(("127.0.0.1", p + 1)).is_ok()).then_some(p)
        })
        .expect("two free ports in a row")
}

#[test]
fn compose_nodes_publish_their_metrics_on_the_host() {
    if !docker_available("compose_nodes_publish_their_metrics_on_the_host") {
        return;
    }
    let project = unique("slowmo-observe");
    let image = Image::build(&format!("slowmo-test:{project}"));
    let port = free_pair();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("run.toml");
    std::fs::write(
        &config,
        "base = \"sgp\"\nsteps = 4000\neval_every = 0\nhidden = [8]\nbatch_size = 8\n",
    )
    .unwrap();
    let file = dir.path().join("docker-compose.yml");
    let out = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["compose", "--nodes", "2", "--image", &image.tag])
        .args(["--subnet", &subnet(3), "--metrics-port", &port.to_string()])
        .arg("--config")
        .arg(&config)
        .arg("-o")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let net = Testnet {
        dir,
        file,
        project,
        nodes: 2,
    };
    let results = net.results();
    let (up, seen) = std::thread::scope(|s| {
        let up = s.spawn(|| {
            net.cli(
                "up",
                &[
                    "--wait",
                    "--interval",
                    "5",
                    "--timeout",
                    "600",
                    "--results",
                    results.to_str().unwrap(),
                ],
            )
        });
        let mut seen = [None, None];
        let deadline = Instant::now() + Duration::from_secs(300);
        while seen.iter().any(Option::is_none) && !up.is_finished() && Instant::now() < deadline {
            for (i, slot) in seen.iter_mut().enumerate() {
                if slot.is_none()
                    && let Some(text) = scrape(port + i as u16)
                    && sample(&text, "slowmo_step").is_some_and(|s| s > 0.0)
                {
                    *slot = Some(text);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        (up.join().unwrap(), seen)
    });
    assert!(
        up.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&up.stdout),
        String::from_utf8_lossy(&up.stderr)
    );
    for (i, text) in seen.iter().enumerate() {
        let text = text
            .as_ref()
            .unwrap_or_else(|| panic!("node-{i}: no scrape on 127.0.0.1:{}", port + i as u16));
        assert_eq!(sample(text, "slowmo_view_size"), Some(2.0), "{text}");
        assert!(text.contains("libp2p_swarm_connections_established_total"));
    }
    let stdout = String::from_utf8_lossy(&up.stdout);
    assert!(stdout.contains("report: "), "{stdout}");
    assert!(results.join("report.html").is_file());
    net.teardown();
}
