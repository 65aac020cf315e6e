//! `slowmo-testnet chaos` on a running compose testnet: the actions taken
//! are the schedule `--dry-run` prints for the seed, each is logged to
//! chaos.jsonl as it is taken, a killed node is down and a restarted one up
//! again with its first life's metrics kept, and never more than
//! `--max-down` nodes are down; on the `mixed` profile a restarted
//! CPU-capped node is admitted again and finishes with the others. Skipped
//! where no Docker Engine answers, except under CI=true, where that is a
//! failure.

mod compose_support;

use std::process::Command;

use compose_support::{Image, Testnet, docker_available, subnet, unique};
use serde_json::Value;

/// The tests of this file share the machine's cores: one testnet at a
/// time, so that the CPU-capped node's pace is its quota's.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The schedule `chaos --dry-run` prints, (action, target) per action
/// (`   4.0s kill node-2`).
fn dry_run(nodes: usize, actions: usize, schedule: &[String]) -> Vec<(String, String)> {
    let dry = Command::new(env!("CARGO_BIN_EXE_slowmo-testnet"))
        .args(["chaos", "--dry-run", &actions.to_string()])
        .args(["--nodes", &nodes.to_string()])
        .args(schedule)
        .output()
        .unwrap();
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    String::from_utf8_lossy(&dry.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].to_string(), f[2].to_string())
        })
        .collect()
}

/// The (action, target, result) rows of chaos.jsonl.
fn chaos_log(results: &std::path::Path) -> Vec<(String, String, String)> {
    std::fs::read_to_string(results.join("chaos.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_string(),
                e["target"].as_str().unwrap().to_string(),
                e["result"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

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
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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
    let schedule_args = schedule_args.map(String::from);
    let planned = dry_run(3, 3, &schedule_args);
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
    args.extend(schedule_args.iter().map(String::as_str));
    let chaos = net.cli("chaos", &args);
    let err = String::from_utf8_lossy(&chaos.stderr).to_string();
    assert!(chaos.status.success(), "{err}");

    let log: Vec<Value> = std::fs::read_to_string(results.join("chaos.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let taken = chaos_log(&results);
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

#[test]
fn compose_chaos_on_mixed_restarts_the_cpu_capped_node_and_it_finishes_with_the_others() {
    let name =
        "compose_chaos_on_mixed_restarts_the_cpu_capped_node_and_it_finishes_with_the_others";
    if !docker_available(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A seed whose first two actions kill node-3 (a third of an ordinary
    // node's CPU on `mixed`) and restart it; the duration ends chaos
    // before a third action.
    let schedule = |seed: String| -> Vec<String> {
        let fixed = [
            "--every",
            "8s",
            "--actions",
            "kill,restart",
            "--max-down",
            "1",
        ];
        let mut args = vec!["--seed".to_string(), seed];
        args.extend(fixed.map(String::from));
        args
    };
    let node3 = |action: &str| (action.to_string(), "node-3".to_string());
    let seed = (0..500u64)
        .map(|s| s.to_string())
        .find(|s| dry_run(4, 2, &schedule(s.clone())) == [node3("kill"), node3("restart")])
        .expect("no seed below 500 kills and restarts node-3 first");

    let project = unique("slowmo-chaos-mixed");
    let image = Image::build(&format!("slowmo-test:{project}"));
    // SlowMo over Local SGD: the exact average every tau steps paces the
    // run at the capped node's speed, so that it is mid-run when killed.
    const STEPS: u64 = 1200;
    let config = format!("steps = {STEPS}\neval_every = 0\nseed = 5\n");
    let net = Testnet::new(&project, &image, 4, "mixed", &config, &subnet(1));
    let up = net.cli("up", &[]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let results = net.results();
    let mut args = vec![
        "--duration".to_string(),
        "20s".to_string(),
        "--results".to_string(),
        results.to_str().unwrap().to_string(),
    ];
    args.extend(schedule(seed));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let chaos = net.cli("chaos", &args);
    let err = String::from_utf8_lossy(&chaos.stderr).to_string();
    assert!(chaos.status.success(), "{err}");
    let taken: Vec<(String, String)> = chaos_log(&results)
        .into_iter()
        .filter(|t| t.0 == "kill" || t.0 == "restart")
        .map(|t| {
            assert_eq!(t.2, "done", "{err}");
            (t.0, t.1)
        })
        .collect();
    assert_eq!(taken, [node3("kill"), node3("restart")], "{err}");

    net.run_to_completion(900);
    let summaries: Vec<Value> = (0..4).map(|i| net.summary(i)).collect();
    for (i, s) in summaries.iter().enumerate() {
        assert_eq!(s["completed"], true, "node-{i}: {s}");
        assert_eq!(s["steps"], STEPS, "node-{i}: {s}");
    }
    let events = |i: usize| {
        summaries[i]["view_changes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    assert!(
        events(3).iter().any(|e| e["rejoined"] == true),
        "node-3 was not admitted again after its restart: {}",
        summaries[3]
    );
    for (i, summary) in summaries.iter().enumerate().take(3) {
        assert!(
            events(i)
                .iter()
                .any(|e| e["joined"].as_array().is_some_and(|j| !j.is_empty())),
            "node-{i} saw no node join: {summary}"
        );
    }
    // The run's final model is the exact average: every node reports the
    // same accuracy of it, the restarted one included.
    let accuracy: Vec<f64> = summaries
        .iter()
        .map(|s| s["test_accuracy"].as_f64().expect("test accuracy"))
        .collect();
    assert!(
        accuracy.iter().all(|a| *a == accuracy[0]) && accuracy[0] > 0.5,
        "final accuracies {accuracy:?}"
    );
    assert!(
        results.join("node-3").join("metrics.1.jsonl").is_file(),
        "the first life's metrics of node-3 are kept"
    );
    net.teardown();
}
