//! `slowmo-testnet partition|heal|pause|resume|kill|status` on a running
//! 3-node compose testnet: a partition really cuts traffic between the two
//! sides (and only there), heal restores it, and the node commands change
//! the containers' states. Skipped only where no Docker Engine answers.

mod compose_support;

use std::process::Command;

use compose_support::{Image, Testnet, docker_available, subnet, unique};

/// Whether node `from` reaches address `to` with one ping (busybox ping in
/// the local image; `docker compose exec` is avoided to stay tool-neutral).
fn reaches(net: &Testnet, from: usize, to: &str) -> bool {
    let project = slowmo_testnet::docker::Project::new(&net.file, &net.project).unwrap();
    let containers = project.containers().unwrap();
    let id = &containers
        .iter()
        .find(|c| c.service == format!("node-{from}"))
        .unwrap()
        .id;
    Command::new("docker")
        .args(["exec", id, "ping", "-c", "1", "-W", "1", to])
        .output()
        .unwrap()
        .status
        .success()
}

fn state_of(net: &Testnet, node: &str) -> String {
    let project = slowmo_testnet::docker::Project::new(&net.file, &net.project).unwrap();
    let c = project.containers().unwrap();
    let c = c.iter().find(|c| c.service == node).unwrap();
    format!("{} {}", c.status, c.exit_code)
}

#[test]
fn compose_control_partitions_heals_pauses_and_kills_nodes() {
    if !docker_available("compose_control_partitions_heals_pauses_and_kills_nodes") {
        return;
    }
    let project = unique("slowmo-ctl");
    let image = Image::build(&format!("slowmo-test:{project}"));
    // Far more steps than the test lasts: the nodes stay up while we poke.
    let config = "base = \"sgp\"\nsteps = 1000000\neval_every = 0\n";
    let net = Testnet::new(&project, &image, 3, "lan", config, &subnet(2));
    let ip = |i: u8| {
        let s = subnet(2);
        let prefix = s.trim_end_matches("0/24");
        format!("{prefix}{}", 10 + i)
    };
    let up = net.cli("up", &[]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );

    assert!(
        reaches(&net, 0, &ip(1)),
        "node-0 -> node-1 before any partition"
    );
    let cut = net.cli("partition", &["0"]);
    assert!(
        cut.status.success(),
        "{}",
        String::from_utf8_lossy(&cut.stderr)
    );
    assert!(
        !reaches(&net, 0, &ip(1)),
        "node-0 still reaches node-1 across the partition"
    );
    assert!(
        !reaches(&net, 2, &ip(0)),
        "node-2 still reaches node-0 across the partition"
    );
    assert!(
        reaches(&net, 1, &ip(2)),
        "node-1 and node-2 are on the same side"
    );

    let heal = net.cli("heal", &[]);
    assert!(
        heal.status.success(),
        "{}",
        String::from_utf8_lossy(&heal.stderr)
    );
    assert!(reaches(&net, 0, &ip(1)), "node-0 -> node-1 after heal");
    assert!(reaches(&net, 2, &ip(0)), "node-2 -> node-0 after heal");

    let bad = net.cli("partition", &["node-7"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("node-7"));

    assert!(net.cli("pause", &["1"]).status.success());
    assert!(state_of(&net, "node-1").starts_with("paused"));
    assert!(net.cli("resume", &["node-1"]).status.success());
    assert!(state_of(&net, "node-1").starts_with("running"));

    assert!(net.cli("kill", &["2"]).status.success());
    assert_eq!(state_of(&net, "node-2"), "exited 137");
    let status = net.cli("status", &[]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("node-2") && text.contains("exited 137"),
        "{text}"
    );
    assert!(text.contains(&ip(0)), "status shows addresses: {text}");

    net.teardown();
}
