//! Push-sum over the in-memory communicator: mass conservation, exact
//! averaging on the exponential graph, and the drain-and-average barrier.

use std::time::Duration;

use slowmo_gossip::memory::{Arrival, MemoryNetwork};
use slowmo_gossip::{CommError, Communicator, PushSumMass, PushSumRound, exact_average};
use slowmo_topologies::{DirectedExponential, Topology};

/// Runs `rounds` push-sum rounds (no gradient steps) on every worker and
/// returns each worker's (x, w), finishing with a drain or the exact average.
fn gossip(
    m: usize,
    rounds: u64,
    staleness: u64,
    finish_with_average: bool,
) -> Vec<(Vec<f32>, f64)> {
    let graph = DirectedExponential::new(m).unwrap();
    let comms = MemoryNetwork::new(m, Duration::from_secs(30));
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                let graph = graph.clone();
                s.spawn(move || -> Result<(Vec<f32>, f64), CommError> {
                    let r = comm.rank();
                    // Distinct start values: worker r holds [r, r^2, 1].
                    let mut x = vec![r as f32, (r * r) as f32, 1.0];
                    let mut w = 1.0;
                    for k in 0..rounds {
                        let out = graph.out_peers(r, k);
                        let inn = graph.in_peers(r, k);
                        let round = PushSumRound {
                            round: k,
                            out_peers: &out,
                            in_peers: &inn,
                            staleness,
                        };
                        comm.push_sum(&round, &mut x, &mut w)?;
                    }
                    if finish_with_average {
                        exact_average(&mut comm, &mut x, &mut w)?;
                    } else {
                        comm.drain(&mut x, &mut w)?;
                    }
                    Ok((x, w))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    })
}

fn exact_mean(m: usize) -> [f64; 3] {
    let n = m as f64;
    let s1: f64 = (0..m).map(|r| r as f64).sum();
    let s2: f64 = (0..m).map(|r| (r * r) as f64).sum();
    [s1 / n, s2 / n, 1.0]
}

#[test]
fn sum_of_weights_and_numerators_is_conserved() {
    for m in [1, 2, 3, 5, 6, 8, 12] {
        for staleness in [0, 1, 2] {
            let out = gossip(m, 17, staleness, false);
            let total_w: f64 = out.iter().map(|(_, w)| w).sum();
            assert!(
                (total_w - m as f64).abs() < 1e-9,
                "m={m} s={staleness}: sum w = {total_w}"
            );
            let total_x: f64 = out.iter().map(|(x, _)| f64::from(x[1])).sum();
            let expected: f64 = (0..m).map(|r| (r * r) as f64).sum();
            assert!(
                (total_x - expected).abs() < 1e-3 * expected.max(1.0),
                "m={m} s={staleness}: sum x = {total_x}, expected {expected}"
            );
        }
    }
}

#[test]
fn one_cycle_of_the_exponential_graph_averages_exactly_for_powers_of_two() {
    for m in [2usize, 4, 8, 16] {
        let rounds = u64::from(m.ilog2());
        let mean = exact_mean(m);
        for (x, w) in gossip(m, rounds, 0, false) {
            for (i, v) in x.iter().enumerate() {
                let z = f64::from(*v) / w;
                assert!(
                    (z - mean[i]).abs() < 1e-5 * mean[i].abs().max(1.0),
                    "m={m}: z={z}, mean={}",
                    mean[i]
                );
            }
        }
    }
}

#[test]
fn one_cycle_is_not_exact_for_six_workers() {
    let m = 6;
    let rounds = 3; // floor(log2(5)) + 1 hops
    let mean = exact_mean(m);
    let worst = gossip(m, rounds, 0, false)
        .iter()
        .map(|(x, w)| (f64::from(x[0]) / w - mean[0]).abs())
        .fold(0.0, f64::max);
    assert!(
        worst > 1e-3,
        "m=6 averaged exactly after one cycle: {worst}"
    );
}

#[test]
fn drain_and_average_gives_the_exact_average_for_any_size_and_staleness() {
    for m in [1, 3, 5, 6, 7] {
        for staleness in [0, 2] {
            let mean = exact_mean(m);
            for (x, w) in gossip(m, 5, staleness, true) {
                assert_eq!(w, 1.0);
                for (i, v) in x.iter().enumerate() {
                    assert!(
                        (f64::from(*v) - mean[i]).abs() < 1e-5 * mean[i].abs().max(1.0),
                        "m={m} s={staleness}: {v} vs {}",
                        mean[i]
                    );
                }
            }
        }
    }
}

#[test]
fn all_reduce_is_identical_on_every_rank() {
    let m = 5;
    let comms = MemoryNetwork::new(m, Duration::from_secs(30));
    let results: Vec<(Vec<f32>, f64)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                s.spawn(move || {
                    let r = c.rank() as f32;
                    let mut buf = vec![r * 0.1, 1.0 / (r + 1.0), -r];
                    let mut scalar = f64::from(r);
                    c.all_reduce_sum(&mut buf, &mut scalar).unwrap();
                    (buf, scalar)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results {
        assert_eq!(r, &results[0]);
    }
    assert_eq!(results[0].1, 10.0);
}

#[test]
fn a_silent_peer_is_named_in_the_timeout() {
    let mut comms = MemoryNetwork::new(2, Duration::from_millis(100));
    let _silent = comms.pop().unwrap();
    let mut comm = comms.pop().unwrap();
    let mut x = vec![1.0f32];
    let mut w = 1.0;
    let round = PushSumRound {
        round: 0,
        out_peers: &[1],
        in_peers: &[1],
        staleness: 0,
    };
    let err = comm.push_sum(&round, &mut x, &mut w).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("rank 1") && text.contains("round 0") && text.contains("push-sum"),
        "{text}"
    );
}

#[test]
fn the_mass_sent_is_the_mass_added_after_a_drain() {
    let m = 5;
    let graph = DirectedExponential::new(m).unwrap();
    let comms = MemoryNetwork::new(m, Duration::from_secs(30));
    let masses: Vec<PushSumMass> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                let graph = graph.clone();
                s.spawn(move || {
                    let r = c.rank();
                    let (mut x, mut w) = (vec![r as f32; 4], 1.0);
                    for k in 0..9 {
                        let (out, inn) = (graph.out_peers(r, k), graph.in_peers(r, k));
                        let round = PushSumRound {
                            round: k,
                            out_peers: &out,
                            in_peers: &inn,
                            staleness: 2,
                        };
                        c.push_sum(&round, &mut x, &mut w).unwrap();
                    }
                    c.drain(&mut x, &mut w).unwrap();
                    c.push_sum_mass()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let sent: u64 = masses.iter().map(|m| m.shares_sent).sum();
    let added: u64 = masses.iter().map(|m| m.shares_added).sum();
    assert_eq!((sent, added), (9 * m as u64, 9 * m as u64));
    let weight_sent: f64 = masses.iter().map(|m| m.weight_sent).sum();
    let weight_added: f64 = masses.iter().map(|m| m.weight_added).sum();
    assert!(
        (weight_sent - weight_added).abs() < 1e-12,
        "{weight_sent} vs {weight_added}"
    );
}

#[test]
fn shares_arrived_tells_what_has_arrived_when_shares_count_as_sent() {
    let mut comms = MemoryNetwork::with_arrival(2, Duration::from_secs(30), Arrival::AsSent);
    let mut one = comms.pop().unwrap();
    let mut zero = comms.pop().unwrap();
    let (mut x, mut w) = (vec![1.0f32], 1.0);
    let round = PushSumRound {
        round: 0,
        out_peers: &[1],
        in_peers: &[1],
        staleness: 1,
    };
    zero.push_sum(&round, &mut x, &mut w).unwrap();
    assert!(!zero.shares_arrived(0).unwrap(), "rank 1 has sent nothing");
    assert!(zero.shares_arrived(0).is_ok(), "asking never blocks");
    let (mut y, mut v) = (vec![3.0f32], 1.0);
    let back = PushSumRound {
        round: 0,
        out_peers: &[0],
        in_peers: &[0],
        staleness: 1,
    };
    one.push_sum(&back, &mut y, &mut v).unwrap();
    assert!(zero.shares_arrived(0).unwrap());
    assert!(one.shares_arrived(0).unwrap());
    // Asking adds nothing; the drain does.
    assert_eq!((x[0], w), (0.5, 0.5));
    zero.drain(&mut x, &mut w).unwrap();
    assert_eq!((x[0], w), (2.0, 1.0));
}

#[test]
fn in_lockstep_shares_arrived_waits_for_the_share_and_names_a_silent_peer() {
    let mut comms = MemoryNetwork::new(2, Duration::from_millis(100));
    let _silent = comms.pop().unwrap();
    let mut zero = comms.pop().unwrap();
    let (mut x, mut w) = (vec![1.0f32], 1.0);
    let round = PushSumRound {
        round: 0,
        out_peers: &[1],
        in_peers: &[1],
        staleness: 1,
    };
    zero.push_sum(&round, &mut x, &mut w).unwrap();
    let err = zero.shares_arrived(0).unwrap_err();
    assert!(
        matches!(
            err,
            CommError::PeerTimeout {
                rank: 1,
                round: 0,
                ..
            }
        ),
        "{err}"
    );
}
