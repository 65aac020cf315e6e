//! Real `slowmo node` processes that lose a member: one of four is killed
//! with SIGKILL mid-run and the other three finish in a view of three; a
//! killed node started again with its identity is admitted back with the
//! run's state and the run ends with all four.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

struct Node {
    name: String,
    child: Child,
    summary: PathBuf,
    metrics: PathBuf,
    params: PathBuf,
}

/// A node of a 4-node TCP run of `steps` steps on a port it picks,
/// bootstrapped from `boot` (a port picked here ahead could be taken by
/// another test's node before this one binds it).
fn spawn(dir: &Path, i: usize, boot: Option<&str>, steps: u64, tag: &str) -> Node {
    let name = format!("node{i}{tag}");
    let summary = dir.join(format!("{name}.json"));
    let metrics = dir.join(format!("{name}.jsonl"));
    let params = dir.join(format!("{name}.safetensors"));
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_slowmo"));
    cmd.args(["node", "--nodes", "4", "--eval-every", "0"])
        .args(["--steps", &steps.to_string()])
        .args(["--run-id", "faults", "--threads", "1"])
        .args(["--peer-timeout", "5", "--join-timeout", "60"])
        .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
        .arg("--identity")
        .arg(dir.join(format!("node{i}.key")))
        .arg("--summary-json")
        .arg(&summary)
        .arg("--metrics-jsonl")
        .arg(&metrics)
        .arg("--save-params")
        .arg(&params)
        .env("RAYON_NUM_THREADS", "1")
        .env("RUST_LOG", "slowmo=info,slowmo_gossip=info")
        .stdout(Stdio::null())
        .stderr(log);
    if let Some(b) = boot {
        cmd.args(["--bootstrap", b]);
    }
    Node {
        name,
        child: cmd.spawn().unwrap(),
        summary,
        metrics,
        params,
    }
}

/// The address `node` says it listens on (with its peer id).
fn listen_addr(node: &mut Node, dir: &Path) -> String {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let said = std::fs::read_to_string(dir.join(format!("{}.log", node.name)))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                let (_, rest) = l.split_once("listening on ")?;
                Some(rest.split_whitespace().next()?.to_string())
            });
        if let Some(addr) = said {
            return addr;
        }
        if Instant::now() > until || node.child.try_wait().unwrap().is_some() {
            let _ = node.child.kill();
            panic!(
                "{} did not say where it listens; the logs:\n{}",
                node.name,
                logs(dir)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Four nodes; the first one's address is the others' bootstrap, returned.
fn start(dir: &Path, steps: u64) -> (Vec<Node>, String) {
    let mut first = spawn(dir, 0, None, steps, "");
    let boot = listen_addr(&mut first, dir);
    let mut nodes = vec![first];
    nodes.extend((1..4).map(|i| spawn(dir, i, Some(&boot), steps, "")));
    (nodes, boot)
}

/// Steps recorded in a metrics file so far.
fn steps_done(metrics: &Path) -> usize {
    std::fs::read_to_string(metrics)
        .map(|t| t.lines().filter(|l| l.contains("\"step\"")).count())
        .unwrap_or(0)
}

/// Every node's log in `dir`, for a failure's message.
fn logs(dir: &Path) -> String {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| {
            format!(
                "--- {}\n{}",
                p.display(),
                std::fs::read_to_string(p).unwrap_or_default()
            )
        })
        .collect()
}

fn wait_for_steps(node: &Node, steps: usize) {
    let until = Instant::now() + Duration::from_secs(120);
    while steps_done(&node.metrics) < steps {
        assert!(
            Instant::now() < until,
            "{} never reached step {steps}; the logs:\n{}",
            node.name,
            logs(node.metrics.parent().unwrap())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn finish(node: &mut Node, dir: &Path) -> Value {
    let until = Instant::now() + Duration::from_secs(240);
    loop {
        if let Some(status) = node.child.try_wait().unwrap() {
            let log =
                std::fs::read_to_string(dir.join(format!("{}.log", node.name))).unwrap_or_default();
            assert!(status.success(), "{} failed ({status}):\n{log}", node.name);
            break;
        }
        if Instant::now() > until {
            let _ = node.child.kill();
            panic!("{} did not finish", node.name);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    serde_json::from_str(&std::fs::read_to_string(&node.summary).unwrap()).unwrap()
}

fn kill(node: &mut Node) {
    // SIGKILL: no goodbye, no summary.
    node.child.kill().unwrap();
    node.child.wait().unwrap();
}

#[test]
fn three_of_four_finish_after_one_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, _) = start(dir.path(), 600);
    wait_for_steps(&nodes[3], 150);
    let mut lost = nodes.pop().unwrap();
    kill(&mut lost);
    assert!(!lost.summary.exists(), "a killed node writes nothing");
    let mut sums = Vec::new();
    for node in &mut nodes {
        sums.push(finish(node, dir.path()));
    }
    let firsts: Vec<&Value> = sums.iter().map(|s| &s["members"]).collect();
    for s in &sums {
        assert_eq!(s["completed"], true, "{s}");
        assert_eq!(s["steps"], 600);
        assert_eq!(s["members"].as_array().unwrap().len(), 3, "{s}");
        let changes = s["view_changes"].as_array().expect("a view change");
        assert_eq!(changes.len(), 1, "{s}");
        assert_eq!(changes[0]["world"], 3);
        assert_eq!(changes[0]["lost"].as_array().unwrap().len(), 1);
        assert!(s["test_accuracy"].as_f64().unwrap() > 0.5, "{s}");
    }
    assert!(firsts.windows(2).all(|w| w[0] == w[1]), "one view");
}

#[test]
fn a_killed_node_restarted_with_its_identity_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, boot) = start(dir.path(), 800);
    wait_for_steps(&nodes[3], 150);
    kill(&mut nodes[3]);
    // Survivors notice at once and go on in a view of three; then the node
    // comes back with its identity and the same command.
    wait_for_steps(&nodes[0], 300);
    nodes[3] = spawn(dir.path(), 3, Some(&boot), 800, "-again");
    let sums: Vec<Value> = nodes.iter_mut().map(|n| finish(n, dir.path())).collect();
    for s in &sums {
        assert_eq!(s["completed"], true, "{s}");
        assert_eq!(s["steps"], 800);
        assert_eq!(s["members"].as_array().unwrap().len(), 4, "{s}");
    }
    let back = &sums[3];
    let changes = back["view_changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "{back}");
    assert_eq!(changes[0]["rejoined"], true);
    assert_eq!(changes[0]["world"], 4);
    // Everyone went through the loss and the rejoin.
    for s in &sums[..3] {
        let worlds: Vec<u64> = s["view_changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["world"].as_u64().unwrap())
            .collect();
        assert_eq!(worlds, [3, 4], "{s}");
    }
    // The run ends with one model: the restarted node holds the same
    // final parameters as the others.
    let bytes: Vec<Vec<u8>> = nodes
        .iter()
        .map(|n| std::fs::read(&n.params).unwrap())
        .collect();
    assert!(bytes.windows(2).all(|w| w[0] == w[1]));
}
