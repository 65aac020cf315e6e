//! `simulate` over a simulated network: a slow worker holds synchronous
//! gossip back but not background gossip; runs replay from the seed; lost
//! shares do not hang a run.

use slowmo_gossip::simnet::{NetworkProfile, SimNetwork};
use slowmo_node::config::{RunConfig, TrainOptions};
use slowmo_node::engine::simulate::{Simulation, SimulationSummary};

const SMALL: &str = "workers = 4\nhidden = [32]\nbatch_size = 16\neval_every = 0\nsteps = 48\n";

const SLOW_WORKER_3: &str = r#"
    compute_ms = 10
    [default]
    delay = "1ms"
    jitter = "0.5ms"
    rate = "1gbit"
    [node.3]
    cpu_slowdown = 3
"#;

fn config(extra: &str) -> RunConfig {
    TrainOptions::from_toml(&format!("{SMALL}{extra}"))
        .unwrap()
        .resolve()
        .unwrap()
}

fn run(config: &RunConfig, profile: &str) -> SimulationSummary {
    let profile = NetworkProfile::from_toml(profile).unwrap();
    let net = SimNetwork::new(&profile, config.workers, config.seed).unwrap();
    Simulation::new(config).network(&net).run().unwrap()
}

/// Each worker's mean virtual step time.
fn paces(s: &SimulationSummary) -> Vec<f64> {
    let network = s.network.as_ref().expect("a network summary");
    network.workers.iter().map(|w| w.step_seconds).collect()
}

#[test]
fn background_gossip_leaves_the_fast_workers_at_their_own_pace_and_replays() {
    let c = config("preset = \"osgp\"\nbackground_gossip = true\n");
    let a = run(&c, SLOW_WORKER_3);
    let pace = paces(&a);
    let network = a.network.as_ref().unwrap();
    assert!((network.workers[3].compute_seconds - 0.03).abs() < 1e-12);
    for fast in &pace[..3] {
        assert!(*fast < 0.6 * pace[3], "{pace:?}");
    }
    let b = run(&c, SLOW_WORKER_3);
    assert_eq!(a.averaged_params, b.averaged_params);
    assert_eq!(pace, paces(&b));
}

#[test]
fn synchronous_gossip_holds_the_fast_workers_to_the_slow_one() {
    let a = run(&config("preset = \"sgp\"\n"), SLOW_WORKER_3);
    let pace = paces(&a);
    for fast in &pace[..3] {
        assert!(*fast > 0.8 * pace[3], "{pace:?}");
    }
}

#[test]
fn lost_shares_lose_mass_without_hanging_and_replay() {
    let lossy = "compute_ms = 1\n[default]\ndelay = \"2ms\"\nloss = 0.1\n";
    let c = config("preset = \"sgp\"\n");
    let a = run(&c, lossy);
    let dropped: u64 = a
        .network
        .as_ref()
        .unwrap()
        .workers
        .iter()
        .map(|w| w.messages_dropped)
        .sum();
    assert!(dropped > 0);
    assert!(a.final_train_loss.is_finite());
    let b = run(&c, lossy);
    assert_eq!(a.averaged_params, b.averaged_params);
}

#[test]
fn without_a_network_the_summary_has_no_network_part() {
    let c = config("preset = \"sgp\"\n");
    let s = Simulation::new(&c).run().unwrap();
    assert!(s.network.is_none());
    let json = serde_json::to_string(&s).unwrap();
    assert!(!json.contains("\"network\""));
}

fn load_error(path: &std::path::Path) -> String {
    match slowmo_node::engine::simulate::load_network(path, &config("")) {
        Ok(_) => panic!("{} was accepted", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn a_profile_that_does_not_fit_the_run_names_the_file_and_the_key() {
    let dir = std::env::temp_dir().join(format!("slowmo-network-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("net.toml");
    std::fs::write(&path, "compute_ms = 1\n[node.5]\ncpu_slowdown = 2\n").unwrap();
    let text = load_error(&path);
    assert!(
        text.contains("net.toml") && text.contains("node.5"),
        "{text}"
    );
    std::fs::write(&path, "compute_ms = 1\n[default]\ndelay = 5\n").unwrap();
    let text = load_error(&path);
    assert!(
        text.contains("net.toml") && text.contains("delay"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_example_profile_fits_a_four_worker_run() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/network-example.toml");
    slowmo_node::engine::simulate::load_network(&path, &config("")).unwrap();
}
