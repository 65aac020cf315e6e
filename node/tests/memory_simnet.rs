//! The outer loop over the in-memory communicator on a simulated network:
//! background gossip at each worker's own pace, replay from the seed, lost
//! shares, crashes.

use std::time::Duration;

use slowmo_gossip::memory::MemoryNetwork;
use slowmo_gossip::simnet::{NetworkProfile, SimNetwork};
use slowmo_gossip::{CommError, CommStats, Communicator, VirtualTime};
use slowmo_node::engine::exchange::CommExchange;
use slowmo_optim::{Base, OptimizerConfig, OuterLoop, Preset};
use slowmo_topologies::DirectedExponential;

const SLOW_WORKER: &str = r#"
    compute_ms = 10
    [default]
    delay = "1ms"
    jitter = "0.5ms"
    rate = "100mbit"
    [node.3]
    cpu_slowdown = 3
"#;

struct Outcome {
    x: Vec<f32>,
    w: f64,
    rounds: u64,
    time: VirtualTime,
    stats: CommStats,
}

/// Every worker runs the outer loop for `steps` base steps with zero
/// gradients (so only gossip moves the state), SGP or, with `background`,
/// OSGP with background gossip (staleness 1: a round starts only once the
/// previous one arrived) and no boundary in the run; then the loop's own
/// finish brings every worker to the same round count and drains.
fn run(profile: &str, seed: u64, steps: u64, background: bool) -> Vec<Result<Outcome, CommError>> {
    let m = 4;
    let graph = DirectedExponential::new(m).unwrap();
    let profile = NetworkProfile::from_toml(profile).unwrap();
    let net = SimNetwork::new(&profile, m, seed).unwrap();
    let comms = MemoryNetwork::with_network(Duration::from_secs(30), net);
    let mut alg = if background {
        Preset::Osgp.algorithm(Base::Osgp)
    } else {
        Preset::Sgp.algorithm(Base::Sgp)
    };
    alg.background_gossip = background;
    alg.slowmo.tau = steps + 1;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                let (graph, alg) = (graph.clone(), alg.clone());
                s.spawn(move || -> Result<Outcome, CommError> {
                    let r = comm.rank();
                    let x0 = vec![r as f32, (r * r) as f32, 1.0];
                    let mut outer = OuterLoop::new(alg, &OptimizerConfig::default(), x0).unwrap();
                    let mut ex = CommExchange::new(&mut comm, &graph, false);
                    for k in 0..steps {
                        ex.comm.base_step(k)?;
                        let (mut grad, mut loss) = (vec![0.0; 3], 0.0);
                        outer.step(&mut ex, &mut grad, &mut loss, 0.0)?;
                    }
                    outer.finish(&mut ex)?;
                    let time = ex.comm.virtual_time().expect("a simulated network");
                    Ok(Outcome {
                        x: outer.push_sum().x.clone(),
                        w: outer.weight(),
                        rounds: outer.rounds(),
                        time,
                        stats: ex.comm.stats(),
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn pace(o: &Outcome) -> f64 {
    o.time.step_clock / o.time.steps as f64
}

#[test]
fn background_gossip_runs_at_each_workers_pace_and_replays_from_the_seed() {
    let a: Vec<Outcome> = run(SLOW_WORKER, 5, 60, true)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let slow = pace(&a[3]);
    assert!(
        (slow - 0.03).abs() < 1e-9,
        "the slow worker computes: {slow}"
    );
    for fast in &a[..3] {
        assert!(pace(fast) < 0.6 * slow, "{} vs {slow}", pace(fast));
        assert!((fast.time.compute - 0.01).abs() < 1e-12);
    }
    // Nothing was lost: the weights sum to the number of workers.
    let total: f64 = a.iter().map(|o| o.w).sum();
    assert!((total - 4.0).abs() < 1e-9, "{total}");
    assert!(a.iter().all(|o| o.rounds == a[0].rounds && o.rounds < 60));
    let b: Vec<Outcome> = run(SLOW_WORKER, 5, 60, true)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for (p, q) in a.iter().zip(&b) {
        assert_eq!(
            (&p.x, p.w.to_bits(), p.rounds),
            (&q.x, q.w.to_bits(), q.rounds)
        );
        assert_eq!(p.time, q.time);
    }
}

#[test]
fn synchronous_gossip_holds_every_worker_to_the_slow_one() {
    let a: Vec<Outcome> = run(SLOW_WORKER, 5, 40, false)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let slow = pace(&a[3]);
    for fast in &a[..3] {
        assert!(pace(fast) > 0.8 * slow, "{} vs {slow}", pace(fast));
    }
}

#[test]
fn lost_shares_are_lost_mass_and_the_run_still_replays() {
    let lossy = "compute_ms = 1\n[default]\ndelay = \"2ms\"\nloss = 0.2\n";
    let run_lossy = || -> Vec<Outcome> {
        run(lossy, 9, 50, false)
            .into_iter()
            .map(Result::unwrap)
            .collect()
    };
    let a = run_lossy();
    let dropped: u64 = a.iter().map(|o| o.stats.messages_dropped).sum();
    let sent: u64 = a.iter().map(|o| o.stats.messages_sent).sum();
    assert!(dropped > 0 && dropped < sent / 2, "{dropped} of {sent}");
    let total: f64 = a.iter().map(|o| o.w).sum();
    assert!(
        total < 4.0 - 1e-6,
        "mass went with the lost shares: {total}"
    );
    let b = run_lossy();
    for (p, q) in a.iter().zip(&b) {
        assert_eq!((&p.x, p.w.to_bits()), (&q.x, q.w.to_bits()));
    }
}

#[test]
fn a_crash_ends_the_worker_and_its_peers_learn_it_at_once() {
    let crash = "compute_ms = 1\n[[fault]]\nkind = \"crash\"\nnode = 2\nat_step = 5\n";
    // Background gossip: the loop's finish starts with a collective (the
    // round count to catch up to).
    let outcomes = run(crash, 1, 20, true);
    match &outcomes[2] {
        Err(CommError::Closed(why)) => assert!(why.contains("crashed at step 5"), "{why}"),
        other => panic!(
            "expected the crash, got {:?}",
            other.as_ref().map(|o| o.rounds)
        ),
    }
    for o in [&outcomes[0], &outcomes[1], &outcomes[3]] {
        // Not a timeout: the final collective fails as soon as it is entered.
        assert!(
            matches!(o, Err(CommError::Closed(_))),
            "{:?}",
            o.as_ref().err()
        );
    }
}
