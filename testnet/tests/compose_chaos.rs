//! `slowmo-testnet chaos` on a running 3-node compose testnet: the actions
//! taken are the schedule `--dry-run` prints for the seed, each is logged to
//! chaos.jsonl as it is taken, a killed node is down and a restarted one up
//! again with its first life's metrics kept, and never more than
//! `--max-down` nodes are down. Skipped where no Docker Engine answers,
//! except under CI=true, where that is a failure.

mod compose_support;

use std::process::Command;

use compose_support::{Image, Testnet, docker_available, subnet, unique};
use serde_json::Value;

fn states(net: &Testnet) -> Vec<String> {
    let project = slowmo_testnet::docker::Project::new(&net.file, &net.project).unwrap();
    project
        .containers()
        .unwrap()
        .iter()
        .map(|c| format!("{} {}", c.service, c.status))
        .collect()
}

#[test]
fn compose_chaos_kills_and_restarts_as_the_seed_says_and_logs_it() {
    let name = "compose_chaos_kills_and_restarts_as_the_seed_says_and_logs_it";
    if !docker_available(name) {
        return;
    }
    let schedule_args = [
        "--seed",
        "5",
        "--every",
        "4s",
        "--actions",
        "kill,restart",
        "--max-down",
        "1",
    ];
    let dry = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["chaos", "--dry-run", "3", "--nodes", "3"])
        .args(schedule_args)
        .output()
        .unwrap();
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    // `   4.0s kill node-2`: offset, action, target.
    let planned: Vec<(String, String)> = String::from_utf8_lossy(&dry.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].to_string(), f[2].to_string())
        })
        .collect();
    assert_eq!(
        planned.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
        ["kill", "restart", "kill"],
        "with one node down at most, a kill is always followed by its restart"
    );
    assert_eq!(planned[0].1, planned[1].1);

    let project = unique("slowmo-chaos");
    let image = Image::build(&format!("slowmo-test:{project}"));
    // Far more steps than the test lasts: the nodes stay up while chaos acts.
    let config = "base = \"sgp\"\nsteps = 1000000\neval_every = 0\n";
    let net = Testnet::new(&project, &image, 3, "lan", config, &subnet(3));
    let up = net.cli("up", &[]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );

    let results = net.results();
    let mut args: Vec<&str> = vec!["--duration", "14s", "--results", results.to_str().unwrap()];
    args.extend(schedule_args);
    let chaos = net.cli("chaos", &args);
    let err = String::from_utf8_lossy(&chaos.stderr).to_string();
    assert!(chaos.status.success(), "{err}");

    let log: Vec<Value> = std::fs::read_to_string(results.join("chaos.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let taken: Vec<(String, String, String)> = log
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_string(),
                e["target"].as_str().unwrap().to_string(),
                e["result"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(taken.first().unwrap().0, "start", "{taken:?}");
    assert_eq!(taken.last().unwrap().0, "end", "{taken:?}");
    let actions: Vec<(String, String)> = taken
        .iter()
        .filter(|t| t.0 == "kill" || t.0 == "restart")
        .map(|t| {
            assert_eq!(t.2, "done", "{taken:?}\n{err}");
            (t.0.clone(), t.1.clone())
        })
        .collect();
    assert_eq!(actions, planned, "{err}");
    // Offsets follow --every.
    let times: Vec<f64> = log
        .iter()
        .filter(|e| e["action"] == "kill" || e["action"] == "restart")
        .map(|e| e["t"].as_f64().unwrap())
        .collect();
    for (i, t) in times.iter().enumerate() {
        let due = 4.0 * (i + 1) as f64;
        assert!(
            *t >= due && *t < due + 3.0,
            "action {i} at {t} s, due {due} s"
        );
    }

    // The last kill's node is down, the restarted one up again.
    let now = states(&net);
    let killed = &planned[2].1;
    let restarted = &planned[0].1;
    assert!(now.contains(&format!("{killed} exited")), "{now:?}");
    if killed != restarted {
        assert!(now.contains(&format!("{restarted} running")), "{now:?}");
    }
    assert_eq!(
        now.iter().filter(|s| !s.ends_with(" running")).count(),
        1,
        "--max-down 1: {now:?}"
    );
    assert!(
        results.join(restarted).join("metrics.1.jsonl").is_file(),
        "the first life's metrics of {restarted} are kept"
    );
    net.teardown();
}
