//! Shared by the compose_* tests: finding Docker and the slowmo binary,
//! building the local image, and a testnet that always tears itself down.

#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// True when a Docker Engine answers; otherwise prints why the test is
/// skipped (the only reason these tests skip), or fails it under CI=true.
pub fn docker_available(test: &str) -> bool {
    match slowmo_testnet::docker::engine_available() {
        Ok(()) => true,
        Err(why) => {
            // Under CI a test that cannot run is a failure, not a skip.
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "CI=true but no Docker Engine answers ({why}): {test} cannot run"
            );
            println!("SKIPPED {test}: no Docker Engine answers ({why})");
            false
        }
    }
}

/// The slowmo binary: $SLOWMO_BIN, else the one beside this crate's
/// `slowmo-testnet` in the same target folder. Missing is a failure, not a
/// skip: CI builds it before the tests.
pub fn slowmo_bin() -> PathBuf {
    let path = std::env::var_os("SLOWMO_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_BIN_EXE_slowmo-testnet"))
                .with_file_name(format!("slowmo{}", std::env::consts::EXE_SUFFIX))
        });
    assert!(
        path.is_file(),
        "slowmo binary not found at {} (build it first with `cargo build -p slowmo-node`, \
         or point SLOWMO_BIN at one)",
        path.display()
    );
    path
}

/// A name unique to this process and moment, usable as a compose project.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{}", std::process::id(), nanos % 100_000)
}

/// A private /24 for test `slot` (0..4) of this process, so that concurrent
/// test processes on one Docker Engine rarely pick the same one.
pub fn subnet(slot: u32) -> String {
    let third = (std::process::id() % 60) * 4 + slot;
    format!("10.213.{third}.0/24")
}

fn output(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A local image built from the slowmo binary; removed on drop.
pub struct Image {
    pub tag: String,
}

impl Image {
    pub fn build(tag: &str) -> Self {
        let bin = slowmo_bin();
        let out = output(
            Command::new("bash")
                .arg(workspace().join("docker/build-image.sh"))
                .args(["--local", "--bin"])
                .arg(&bin)
                .args(["--tag", tag]),
        );
        assert!(
            out.status.success(),
            "building the image failed:\n{}",
            text(&out)
        );
        Image {
            tag: tag.to_string(),
        }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rmi", "-f", &self.tag])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A compose testnet in a temporary folder; `down -v` on drop.
pub struct Testnet {
    pub dir: tempfile::TempDir,
    pub file: PathBuf,
    pub project: String,
    pub nodes: usize,
}

impl Testnet {
    /// Writes run.toml and the compose file (`slowmo-testnet compose`).
    pub fn new(
        project: &str,
        image: &Image,
        nodes: usize,
        profile: &str,
        run_config: &str,
        subnet: &str,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("run.toml");
        std::fs::write(&config, run_config).unwrap();
        let file = dir.path().join("docker-compose.yml");
        let out = output(
            Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
                .args([
                    "compose",
                    "--nodes",
                    &nodes.to_string(),
                    "--profile",
                    profile,
                ])
                .arg("--config")
                .arg(&config)
                .args([
                    "--image",
                    &image.tag,
                    "--subnet",
                    subnet,
                    "--join-timeout",
                    "120",
                ])
                .arg("-o")
                .arg(&file),
        );
        assert!(out.status.success(), "compose failed:\n{}", text(&out));
        Testnet {
            dir,
            file,
            project: project.to_string(),
            nodes,
        }
    }

    /// Runs `slowmo-testnet VERB -f FILE -p PROJECT ARGS...`.
    pub fn cli(&self, verb: &str, args: &[&str]) -> Output {
        output(
            Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
                .arg(verb)
                .arg("-f")
                .arg(&self.file)
                .args(["-p", &self.project])
                .args(args),
        )
    }

    /// The results folder `up --wait` writes.
    pub fn results(&self) -> PathBuf {
        self.dir.path().join("results")
    }

    /// `up --wait`: runs the testnet to the end and collects the results;
    /// panics with the nodes' logs when it fails.
    pub fn run_to_completion(&self, timeout_s: u64) {
        let results = self.results();
        let out = self.cli(
            "up",
            &[
                "--wait",
                "--interval",
                "5",
                "--timeout",
                &timeout_s.to_string(),
                "--results",
                results.to_str().unwrap(),
            ],
        );
        println!("{}", String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            let mut logs = String::new();
            for i in 0..self.nodes {
                let log = std::fs::read_to_string(results.join(format!("node-{i}/log.txt")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(25).collect();
                logs.push_str(&format!("--- node-{i} log (last lines)\n"));
                for line in tail.into_iter().rev() {
                    logs.push_str(line);
                    logs.push('\n');
                }
            }
            panic!("the testnet failed:\n{}\n{logs}", text(&out));
        }
    }

    /// Node `i`'s summary.json from the results folder.
    pub fn summary(&self, i: usize) -> Value {
        let path = self.results().join(format!("node-{i}/summary.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
    }

    /// Node `i`'s metrics records from the results folder.
    pub fn metrics(&self, i: usize) -> Vec<Value> {
        let path = self.results().join(format!("node-{i}/metrics.jsonl"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display()))
            })
            .collect()
    }

    /// `down -v`, then checks that Docker holds nothing of the project.
    pub fn teardown(&self) {
        let out = self.cli("down", &[]);
        assert!(out.status.success(), "down failed:\n{}", text(&out));
        let project = slowmo_testnet::docker::Project::new(&self.file, &self.project).unwrap();
        let left = project.leftovers().unwrap();
        assert!(left.is_empty(), "left behind after down: {left:?}");
    }
}

impl Drop for Testnet {
    fn drop(&mut self) {
        // Idempotent: after a successful teardown this finds nothing to remove.
        let _ = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
            .arg("down")
            .arg("-f")
            .arg(&self.file)
            .args(["-p", &self.project])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
