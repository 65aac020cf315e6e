//! The `mixed` profile shows in the metrics of a 4-node OSGP testnet with
//! background gossip: node-2's uplink is held to 20 Mbit/s while on `lan` the
//! same node sends far faster, node-3 runs under a third of the CPU quota and
//! steps far slower, and the fast nodes (0 and 1) keep stepping within 20%
//! of their `lan` rate, because a slow link or peer slows the gossip rounds,
//! not the steps. Skipped only where no Docker Engine answers.

mod compose_support;

use compose_support::{Image, Testnet, docker_available, subnet, unique};
use serde_json::Value;

const STEPS: u64 = 400;
/// The mixed profile's cap on node-2's uplink, in bytes per second.
const CAP: f64 = 20e6 / 8.0;

/// Step rate and egress bytes per second over the middle of a run (steps
/// between 10% and 90% of the last), so joining and the end do not count.
fn middle_rates(records: &[Value]) -> (f64, f64) {
    let points: Vec<(f64, f64, f64)> = records
        .iter()
        .filter_map(|r| {
            Some((
                r.get("step")?.as_f64()?,
                r.get("time")?.as_f64()?,
                r.get("bytes_sent")?.as_f64()?,
            ))
        })
        .collect();
    let last = points.last().expect("no metrics records").0;
    let middle: Vec<_> = points
        .iter()
        .filter(|(s, _, _)| *s >= 0.1 * last && *s <= 0.9 * last)
        .collect();
    let (s0, t0, b0) = *middle[0];
    let (s1, t1, b1) = **middle.last().unwrap();
    assert!(t1 > t0, "metrics times do not advance");
    ((s1 - s0) / (t1 - t0), (b1 - b0) / (t1 - t0))
}

struct Run {
    steps_per_s: Vec<f64>,
    egress: Vec<f64>,
    shaping: Vec<String>,
}

fn osgp_run(image: &Image, profile: &str, slot: u32) -> Run {
    let project = unique(&format!("slowmo-{profile}"));
    let config = format!(
        "preset = \"osgp\"\nbackground_gossip = true\nsteps = {STEPS}\neval_every = 0\nseed = 5\n"
    );
    let net = Testnet::new(&project, image, 4, profile, &config, &subnet(slot));
    net.run_to_completion(600);
    let mut run = Run {
        steps_per_s: vec![],
        egress: vec![],
        shaping: vec![],
    };
    for i in 0..4 {
        let s = net.summary(i);
        assert_eq!(s["completed"], true, "{profile} node-{i}: {s}");
        let (rate, egress) = middle_rates(&net.metrics(i));
        run.steps_per_s.push(rate);
        run.egress.push(egress);
        let shaping = net.results().join(format!("node-{i}/shaping.txt"));
        run.shaping.push(std::fs::read_to_string(shaping).unwrap());
    }
    println!(
        "{profile}: steps/s {:.2?}, egress MB/s {:.2?}",
        run.steps_per_s,
        run.egress.iter().map(|b| b / 1e6).collect::<Vec<_>>()
    );
    net.teardown();
    run
}

#[test]
fn compose_mixed_profile_shows_in_the_metrics() {
    if !docker_available("compose_mixed_profile_shows_in_the_metrics") {
        return;
    }
    let image = Image::build(&format!("slowmo-test:{}", unique("mixed")));
    let lan = osgp_run(&image, "lan", 0);
    let mixed = osgp_run(&image, "mixed", 1);

    // node-2: unshaped on lan, held to its 20 Mbit/s uplink on mixed.
    assert!(
        !lan.shaping[2].contains("tbf"),
        "lan shapes node-2:\n{}",
        lan.shaping[2]
    );
    assert!(
        mixed.shaping[2].contains("tbf"),
        "mixed does not shape node-2:\n{}",
        mixed.shaping[2]
    );
    assert!(
        lan.egress[2] > 1.5 * CAP,
        "on lan node-2 sends only {:.2} MB/s: the 20 Mbit/s cap would not bind",
        lan.egress[2] / 1e6
    );
    // The metrics count bytes when a writer hands them to the kernel: the
    // send buffers of the data lane's connections (K per peer, up to a few
    // MB each) sit in front of the shaper, so over a few seconds the count
    // runs up to about a third ahead of the wire.
    assert!(
        mixed.egress[2] <= 1.6 * CAP,
        "node-2 sends {:.2} MB/s through a 20 Mbit/s (2.5 MB/s) link",
        mixed.egress[2] / 1e6
    );
    // node-3: a third of an ordinary node's CPU quota (cgroup v1 or v2).
    let quota = |shaping: &str| -> f64 {
        let line = shaping
            .lines()
            .find(|l| l.starts_with("cfs_quota_us:") || l.starts_with("cpu.max:"))
            .unwrap_or_else(|| panic!("no CPU quota recorded:\n{shaping}"));
        let numbers: Vec<f64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        numbers[0] / numbers[1]
    };
    assert!(
        (quota(&mixed.shaping[0]) - 0.5).abs() < 0.01,
        "{}",
        mixed.shaping[0]
    );
    assert!(
        (quota(&mixed.shaping[3]) - 0.17).abs() < 0.01,
        "{}",
        mixed.shaping[3]
    );
    // The slow node steps far slower than the fast ones beside it (on lan
    // all four keep one pace). Against its own lan pace the drop is
    // smaller and depends on the host: on lan the four 0.5-CPU quotas add
    // up to two cores, so on a 2-core host each node gets less than its
    // quota there, and node-3's lan pace is the host's, not the quota's.
    let fast = (mixed.steps_per_s[0] + mixed.steps_per_s[1]) / 2.0;
    assert!(
        mixed.steps_per_s[3] < 0.6 * fast,
        "node-3 under a third of the CPU steps at {:.2}/s, the fast nodes at {fast:.2}/s",
        mixed.steps_per_s[3],
    );
    assert!(
        mixed.steps_per_s[3] < lan.steps_per_s[3],
        "node-3 steps at {:.2}/s under a third of the CPU, at {:.2}/s on lan",
        mixed.steps_per_s[3],
        lan.steps_per_s[3]
    );
    // The fast ones keep their lan pace.
    for i in [0, 1] {
        assert!(
            mixed.steps_per_s[i] >= 0.8 * lan.steps_per_s[i],
            "fast node-{i} steps at {:.2}/s on mixed against {:.2}/s on lan: the stragglers held it back",
            mixed.steps_per_s[i],
            lan.steps_per_s[i]
        );
    }
}
