//! A 4-node docker-compose testnet on the `lan` profile trains SlowMo-SGP to
//! completion, and leaves nothing behind. Skipped (with a printed reason)
//! only where no Docker Engine answers.

mod compose_support;

use compose_support::{Image, Testnet, docker_available, subnet, unique};

const STEPS: u64 = 200;

#[test]
fn compose_lan_trains_slowmo_sgp_to_completion() {
    if !docker_available("compose_lan_trains_slowmo_sgp_to_completion") {
        return;
    }
    let project = unique("slowmo-lan");
    let image = Image::build(&format!("slowmo-test:{project}"));
    let config = format!("base = \"sgp\"\nsteps = {STEPS}\neval_every = 0\nseed = 3\n");
    let net = Testnet::new(&project, &image, 4, "lan", &config, &subnet(0));
    net.run_to_completion(600);

    let mut ranks = Vec::new();
    let mut peers = Vec::new();
    for i in 0..4 {
        let s = net.summary(i);
        assert_eq!(s["completed"], true, "node-{i}: {s}");
        assert_eq!(s["steps"].as_u64(), Some(STEPS), "node-{i}: {s}");
        let loss = s["final_train_loss"].as_f64().unwrap();
        assert!(loss.is_finite() && loss > 0.0, "node-{i} loss {loss}");
        let acc = s["test_accuracy"].as_f64().unwrap();
        assert!(
            acc > 0.5,
            "node-{i} test accuracy {acc}: SlowMo-SGP did not learn"
        );
        assert!(
            s["bytes_sent"].as_u64().unwrap() > 0,
            "node-{i} sent nothing"
        );
        assert!(
            s["bytes_received"].as_u64().unwrap() > 0,
            "node-{i} received nothing"
        );
        // The run really was SlowMo over SGP: slow momentum on, exact averages.
        let alg = &s["config"]["algorithm"];
        assert_eq!(alg["base"], "sgp", "node-{i} config {alg}");
        assert_eq!(alg["slowmo"]["average"], true, "node-{i} config {alg}");
        assert!(
            alg["slowmo"]["beta"].as_f64().is_some_and(|b| b > 0.0),
            "node-{i}: slow momentum off: {alg}"
        );
        ranks.push(s["rank"].as_u64().unwrap());
        peers.push(s["peer_id"].as_str().unwrap().to_string());
        assert_eq!(
            net.metrics(i).len() as u64,
            STEPS,
            "node-{i}: one metrics line per step"
        );
    }
    ranks.sort();
    assert_eq!(ranks, vec![0, 1, 2, 3], "every node got its own rank");
    peers.sort();
    peers.dedup();
    assert_eq!(peers.len(), 4, "every node has its own identity");
    let table = std::fs::read_to_string(net.results().join("results.md")).unwrap();
    assert_eq!(
        table.lines().filter(|l| l.starts_with("| node")).count(),
        5,
        "{table}"
    );

    net.teardown();
}
