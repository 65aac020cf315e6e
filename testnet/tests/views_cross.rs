//! One membership rule for both transports: the same fault script (a kill,
//! the killed node's restart, a new node joining) played by the simulator
//! (`slowmo simulate --faults`) and by real processes (`slowmo-testnet local
//! --faults`) gives the same sequence of views: members in the same order,
//! the same barrier to return to, the same member sending the state
//! (docs/algorithm.md, "The membership rule").
//!
//! The harness holds every node at the step of each step fault until the
//! fault is carried out (and a started node was heard asking to join), so
//! every fault lands at its step, as in the simulator.

use std::process::Command;

use serde_json::Value;

mod local_support;
use local_support::{harness_files, read_json, slowmo_bin};

const STEPS: u64 = 160;
const TAU: u64 = 40;
/// Killed in the second outer iteration: the members return to barrier 40.
const KILL: u64 = 50;
/// Started again when the survivors, back at 40 in the smaller view, reach
/// this step: admitted at barrier 80.
const RESTART: u64 = 60;
/// A fifth node, started in the third iteration: admitted at 120.
const JOIN: u64 = 90;

/// The run's options for both transports.
fn common() -> Vec<String> {
    let mut args: Vec<String> = ["--eval-every", "0", "--batch-size", "32"]
        .map(String::from)
        .to_vec();
    args.extend([
        "--steps".into(),
        STEPS.to_string(),
        "--tau".into(),
        TAU.to_string(),
    ]);
    args
}

/// A view change as both transports record it, members by worker number.
#[derive(Debug, PartialEq)]
struct Change {
    view: u64,
    members: Vec<usize>,
    resumed_from: u64,
    state_sender: Option<u64>,
}

fn changes(events: &Value, worker_of: impl Fn(&str) -> usize) -> Vec<Change> {
    events
        .as_array()
        .unwrap_or_else(|| panic!("no view changes: {events}"))
        .iter()
        .map(|v| Change {
            view: v["view"].as_u64().unwrap(),
            members: v["members"]
                .as_array()
                .unwrap_or_else(|| panic!("a change without members: {v}"))
                .iter()
                .map(|m| worker_of(m.as_str().unwrap()))
                .collect(),
            resumed_from: v["resumed_from"].as_u64().unwrap(),
            state_sender: v["state_sender"].as_u64(),
        })
        .collect()
}

#[test]
fn simulator_and_processes_agree_on_every_view() {
    let dir = tempfile::tempdir().unwrap();

    // Real processes first: the script names nodes, and a node's worker
    // number (its rank in the first view) is known once its identity is.
    let net = dir.path().join("net");
    let script = format!("kill 2@{KILL}; restart 2@{RESTART}; join 4@{JOIN}");
    let out = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["local", "--nodes", "4", "--quiet", "--no-report"])
        .args(["--transport", "tcp", "--join-timeout", "60"])
        .args(["--peer-timeout", "10", "--faults", &script])
        .args(harness_files(&net))
        .args(common())
        .output()
        .unwrap();
    let log = format!(
        "status {:?}\n{}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{log}");
    let summaries: Vec<Value> = (0..5)
        .map(|i| read_json(&net.join(format!("node-{i}/summary.json"))))
        .collect();
    let peer = |i: usize| summaries[i]["peer_id"].as_str().unwrap().to_string();
    // The first view is in place order: sorted peer ids (open admission).
    let mut first: Vec<String> = (0..4).map(peer).collect();
    first.sort();
    let joiner = peer(4);
    let worker_of = |p: &str| {
        first
            .iter()
            .position(|q| q == p)
            .or((p == joiner).then_some(4))
            .unwrap_or_else(|| panic!("peer {p} is no node of the run"))
    };
    let killed = worker_of(&peer(2));

    // Every process that was a member throughout saw the same changes.
    let steady: Vec<usize> = (0..4).filter(|i| *i != 2).collect();
    let seen = changes(&summaries[steady[0]]["view_changes"], worker_of);
    for i in &steady[1..] {
        assert_eq!(
            changes(&summaries[*i]["view_changes"], worker_of),
            seen,
            "node-{i}\n{log}"
        );
    }

    // The same script in the simulator, the killed node named by its
    // worker number.
    let sim_json = dir.path().join("sim.json");
    let sim_script = format!("kill {killed}@{KILL}; restart {killed}@{RESTART}; join 4@{JOIN}");
    let status = Command::new(slowmo_bin())
        .args(["simulate", "--workers", "4", "--quiet"])
        .args(["--faults", &sim_script])
        .args(common())
        .arg("--summary-json")
        .arg(&sim_json)
        .status()
        .unwrap();
    assert!(status.success(), "simulate --faults {sim_script}");
    let sim = read_json(&sim_json);
    let want = changes(&sim["view_changes"], |p| {
        p.strip_prefix("worker-").unwrap().parse().unwrap()
    });

    let others: Vec<usize> = (0..4).filter(|w| *w != killed).collect();
    let with = |extra: &[usize]| [others.as_slice(), extra].concat();
    assert_eq!(
        want,
        vec![
            Change {
                view: 1,
                members: others.clone(),
                resumed_from: TAU,
                state_sender: None
            },
            Change {
                view: 2,
                members: with(&[killed]),
                resumed_from: 2 * TAU,
                state_sender: Some(0)
            },
            Change {
                view: 3,
                members: with(&[killed, 4]),
                resumed_from: 3 * TAU,
                state_sender: Some(0)
            },
        ],
        "the simulator's views"
    );
    assert_eq!(
        seen, want,
        "the processes' views against the simulator's\n{log}"
    );
}
