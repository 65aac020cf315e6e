//! Scripted membership faults in the simulator (`simulate --faults`): a
//! killed worker does not stop the run, a restarted one is admitted with the
//! members' state, a partition's minority pauses and comes back, and every
//! scripted run replays bit for bit.

use slowmo_node::config::{RunConfig, TrainOptions};
use slowmo_node::engine::simulate::{Simulation, SimulationSummary};
use slowmo_runspec::faults::SimScript;

fn config(extra: &str) -> RunConfig {
    let base = "workers = 8\nhidden = [32]\nbatch_size = 16\neval_every = 0\nsteps = 96\ntau = 8\n";
    TrainOptions::from_toml(&format!("{base}{extra}"))
        .unwrap()
        .resolve()
        .unwrap()
}

fn run(config: &RunConfig, script: &str) -> SimulationSummary {
    let faults = SimScript::parse(script, config.workers).unwrap();
    Simulation::new(config).faults(&faults).run().unwrap()
}

#[test]
fn a_killed_worker_leaves_the_others_to_finish_from_the_last_barrier() {
    for preset in ["", "preset = \"sgp\"\n", "preset = \"osgp\"\n"] {
        let c = config(preset);
        let s = run(&c, "kill 3@30");
        assert_eq!(s.workers, 7, "{preset}");
        assert_eq!(s.steps, 96, "{preset}");
        assert_eq!(s.view_changes.len(), 1, "{preset}");
        let v = &s.view_changes[0];
        // Every member notices as it begins step 30 (however far the
        // others are), and all return to the barrier after step 24.
        assert_eq!(v.at_step, 30, "{preset}");
        assert_eq!((v.resumed_from, v.world), (24, 7), "{preset}");
        assert_eq!(v.lost, vec!["worker-3".to_string()], "{preset}");
        assert!(
            s.test_accuracy.is_finite() && s.test_accuracy > 0.3,
            "{preset}: {}",
            s.test_accuracy
        );
    }
}

#[test]
fn a_restarted_worker_is_admitted_at_the_next_barrier_and_every_run_replays() {
    for preset in [
        "",
        "preset = \"sgp\"\n",
        "base = \"sgp\"\nno_average = true\n",
    ] {
        let c = config(preset);
        let a = run(&c, "kill 2@20; restart 2@50");
        let b = run(&c, "kill 2@20; restart 2@50");
        assert_eq!(a.workers, 8, "{preset}");
        assert_eq!(a.view_changes.len(), 2, "{preset}");
        assert_eq!(a.view_changes[1].joined, vec!["worker-2".to_string()]);
        assert_eq!(a.view_changes[1].resumed_from, 56, "{preset}");
        assert_eq!(
            a.averaged_params, b.averaged_params,
            "{preset}: a scripted run replays"
        );
        // The fault changed the trajectory.
        let clean = Simulation::new(&c).run().unwrap();
        assert_ne!(clean.averaged_params, a.averaged_params, "{preset}");
    }
}

#[test]
fn survivors_keep_their_order_and_joiners_take_the_ranks_after_them() {
    let c = config("");
    let s = run(&c, "kill 2@20; restart 2@50; join 8@70");
    let names =
        |ws: &[usize]| -> Vec<String> { ws.iter().map(|w| format!("worker-{w}")).collect() };
    let views: Vec<_> = s
        .view_changes
        .iter()
        .map(|v| (v.view, v.members.clone(), v.resumed_from, v.state_sender))
        .collect();
    assert_eq!(
        views,
        vec![
            (1, names(&[0, 1, 3, 4, 5, 6, 7]), 16, None),
            (2, names(&[0, 1, 3, 4, 5, 6, 7, 2]), 56, Some(0)),
            (3, names(&[0, 1, 3, 4, 5, 6, 7, 2, 8]), 72, Some(0)),
        ]
    );
    assert_eq!(s.view_changes[2].joined, names(&[8]));
    assert_eq!(s.workers, 9);
    assert!(s.consensus_distance < 1e-6, "{}", s.consensus_distance);
}

#[test]
fn a_partition_pauses_the_minority_and_heals_into_one_model() {
    let c = config("");
    let s = run(&c, "partition 0-2|3-7@20..60");
    assert_eq!(s.workers, 8);
    assert_eq!(s.view_changes.len(), 2);
    // The majority (3-7) went on alone, then took the others back.
    assert_eq!(s.view_changes[0].world, 5);
    assert_eq!(s.view_changes[1].world, 8);
    assert_eq!(s.view_changes[1].resumed_from, 64);
    // One model at the end: every worker's parameters equal after the last
    // exact average.
    assert!(s.consensus_distance < 1e-6, "{}", s.consensus_distance);
}

#[test]
fn with_equal_halves_the_side_holding_rank_0_goes_on() {
    let c = config("");
    let t = run(&c, "partition 4-7|0-3@20..60");
    assert_eq!(t.view_changes[0].lost.len(), 4);
    assert!(t.view_changes[0].lost.contains(&"worker-4".to_string()));
}

#[test]
fn bad_scripts_are_refused_with_the_reason() {
    let cases = [
        ("kill 9@10", "no node 9 in 8 nodes"),
        ("restart 2@10", "needs an earlier `kill 2@...`"),
        ("kill 2@10; kill 2@20", "already down"),
        ("partition 0-3|3-7@10..20", "disjoint"),
        ("partition 0-3|4-7@20..10", "empty"),
        ("explode 1@2", "unknown fault"),
        ("kill 1", "no `@WHEN`"),
        ("join 9@10", "join 8 first"),
        (
            "join 8@10; kill 8@20",
            "only workers that were there from the start",
        ),
        ("restart 8@10", "no node 8 in 8 nodes"),
        ("pause 2@10", "cannot pause"),
        ("kill 2@5s", "base steps"),
    ];
    for (script, want) in cases {
        let e = SimScript::parse(script, 8).unwrap_err();
        assert!(e.contains(want), "{script}: {e}");
    }
    let ok = SimScript::parse("kill 3@200; restart 3@400", 8).unwrap();
    assert_eq!(ok.to_string(), "kill 3@200; restart 3@400");
}
