//! Properties every graph must have, and the mixing facts the docs promise.

use slowmo_topologies::analysis::{
    self, AnalysisOptions, max_deviation_from_average, product, rounds_to_consensus,
    second_singular_value,
};
use slowmo_topologies::{GraphKind, GraphSpec, Topology, TopologyError, build, is_power_of_two};
use std::f64::consts::PI;

fn spec(name: &str) -> GraphSpec {
    name.parse().unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn graph(name: &str, n: usize) -> Box<dyn Topology> {
    build(&spec(name), n).unwrap_or_else(|e| panic!("{name} n={n}: {e}"))
}

fn is_prime(n: usize) -> bool {
    n >= 2
        && (2..n)
            .take_while(|d| d * d <= n)
            .all(|d| !n.is_multiple_of(d))
}

/// Whether the deterministic graph `name` is documented to exist for `n` nodes.
fn exists(name: &str, n: usize) -> bool {
    let kind = spec(name).kind;
    match kind {
        GraphKind::Hypercube => is_power_of_two(n),
        GraphKind::Torus => !(is_prime(n) && n > 3),
        GraphKind::BipartiteExponential => n == 1 || n.is_multiple_of(2),
        GraphKind::RandomRegular { degree: d } => {
            d < n && (n * d).is_multiple_of(2) && !(n > 2 && d <= 1) && !(n == 2 && d == 0)
        }
        _ => true,
    }
}

const GRAPHS: &[&str] = &[
    "exponential",
    "exponential,peers=2",
    "exponential,peers=3",
    "bidirectional-exponential",
    "bidirectional-exponential,peers=2",
    "bipartite-exponential",
    "bipartite-exponential,peers=3",
    "linear",
    "linear,peers=4",
    "ring",
    "undirected-ring",
    "torus",
    "hypercube",
    "complete",
    "star",
    "random-regular:2,seed=1",
    "random-regular:3,seed=2",
    "random-regular:4,seed=3",
];

#[test]
fn every_graph_has_consistent_peers_and_column_stochastic_matrices() {
    for name in GRAPHS.iter().copied().chain(["erdos-renyi:0.5,seed=4"]) {
        for n in 1..=20 {
            let g = match build(&spec(name), n) {
                Ok(g) => g,
                Err(TopologyError::RandomGraph { .. }) if name.starts_with("erdos") => continue,
                Err(e) => {
                    assert!(!exists(name, n), "{name} n={n} should exist: {e}");
                    continue;
                }
            };
            assert!(exists(name, n), "{name} n={n} should not exist");
            assert_eq!(g.size(), n);
            let rounds = (2 * g.period()).clamp(3, 40);
            for k in 0..rounds {
                for r in 0..n {
                    let out = g.out_peers(r, k);
                    let inn = g.in_peers(r, k);
                    for list in [&out, &inn] {
                        assert!(
                            list.windows(2).all(|w| w[0] < w[1]),
                            "{name} n={n} r={r}: {list:?}"
                        );
                        assert!(
                            list.iter().all(|&j| j < n && j != r),
                            "{name} n={n} r={r}: {list:?}"
                        );
                    }
                    for &j in &out {
                        assert!(
                            g.in_peers(j, k).contains(&r),
                            "{name} n={n} k={k}: {r}->{j}"
                        );
                    }
                    for &j in &inn {
                        assert!(
                            g.out_peers(j, k).contains(&r),
                            "{name} n={n} k={k}: {j}->{r}"
                        );
                    }
                }
                let m = g.mixing_matrix(k);
                assert!(m.is_column_stochastic(1e-12), "{name} n={n} k={k}");
                for j in 0..n {
                    let share = 1.0 / (g.out_peers(j, k).len() + 1) as f64;
                    assert_eq!(m.get(j, j), share);
                    assert_eq!(g.mixing_weight(j, k), share);
                }
            }
            if n == 1 {
                assert!(
                    g.out_peers(0, 0).is_empty() && g.in_peers(0, 0).is_empty(),
                    "{name}"
                );
            }
        }
    }
}

#[test]
fn circulant_and_regular_graphs_are_doubly_stochastic_but_the_star_is_not() {
    let options = AnalysisOptions {
        max_rounds: 50,
        ..AnalysisOptions::default()
    };
    for name in [
        "exponential",
        "bidirectional-exponential",
        "linear",
        "ring",
        "torus",
        "hypercube",
    ] {
        let a = analysis::analyze(&spec(name), 16, &options).unwrap();
        assert!(a.doubly_stochastic, "{name}");
    }
    let star = analysis::analyze(&spec("star"), 6, &options).unwrap();
    assert!(!star.doubly_stochastic);
    assert_eq!((star.out_degree.min, star.out_degree.max), (1.0, 5.0));
}

#[test]
fn directed_ring_sigma2_matches_its_closed_form() {
    // W = (I + S) / 2 is circulant and normal: its singular values are
    // |1 + e^{2 pi i k / n}| / 2 = |cos(pi k / n)|, so sigma2 = cos(pi / n).
    for n in [2, 3, 4, 5, 8, 13, 32] {
        let sigma2 = second_singular_value(&graph("ring", n).mixing_matrix(0));
        let expected = (PI / n as f64).cos();
        assert!(
            (sigma2 - expected).abs() < 1e-10,
            "n={n}: {sigma2} vs {expected}"
        );
    }
}

#[test]
fn undirected_ring_sigma2_matches_its_closed_form() {
    // W = (I + S + S^T) / 3 is symmetric with eigenvalues
    // (1 + 2 cos(2 pi k / n)) / 3; sigma2 is the largest |.| over k != 0.
    for n in [3, 4, 5, 6, 9, 16, 31] {
        let sigma2 = second_singular_value(&graph("undirected-ring", n).mixing_matrix(0));
        let eig = |k: usize| ((1.0 + 2.0 * (2.0 * PI * k as f64 / n as f64).cos()) / 3.0).abs();
        let expected = eig(1).max(eig(n / 2));
        assert!(
            (sigma2 - expected).abs() < 1e-10,
            "n={n}: {sigma2} vs {expected}"
        );
    }
}

#[test]
fn one_peer_exponential_averages_exactly_in_log2_rounds_for_powers_of_two() {
    for log in 1..=6u32 {
        let n = 1usize << log;
        let g = graph("exponential", n);
        assert_eq!(g.period(), log as u64);
        let p = product(g.as_ref(), 0, log as u64);
        assert!(max_deviation_from_average(&p) < 1e-12, "n={n}");
        // starting at any round of the cycle works too
        let shifted = product(g.as_ref(), 1, log as u64);
        assert!(max_deviation_from_average(&shifted) < 1e-12, "n={n}");
        let (rounds, error) = rounds_to_consensus(g.as_ref(), 1e-12, 100, 7);
        assert_eq!(rounds, Some(log as u64), "n={n}, error {error}");
        assert!(second_singular_value(&p) < 1e-12);
    }
}

#[test]
fn one_peer_exponential_is_only_approximate_otherwise() {
    // Max deviation from 1/m after one cycle (docs/algorithm.md, section 7).
    for (n, expected) in [(3, 1.0 / 6.0), (6, 1.0 / 12.0), (12, 1.0 / 24.0)] {
        let g = graph("exponential", n);
        let p = product(g.as_ref(), 0, g.period());
        let deviation = max_deviation_from_average(&p);
        assert!((deviation - expected).abs() < 1e-12, "n={n}: {deviation}");
    }
    let a = analysis::analyze(&spec("exponential"), 6, &AnalysisOptions::default()).unwrap();
    assert!((a.period_deviation - 0.0833).abs() < 1e-3);
    assert!(a.rounds_to_epsilon.unwrap() > 3);
}

#[test]
fn multi_peer_exponential_averages_exactly_for_powers_of_peers_plus_one() {
    for (n, peers, period) in [(9, 2, 2), (27, 2, 3), (16, 3, 2)] {
        let g = build(&spec("exponential").with_peers(peers), n).unwrap();
        assert_eq!(g.period(), period);
        assert!(max_deviation_from_average(&product(g.as_ref(), 0, period)) < 1e-12);
    }
}

#[test]
fn complete_graph_mixes_in_one_round() {
    for n in [1, 2, 5, 16] {
        let g = graph("complete", n);
        assert!(max_deviation_from_average(&g.mixing_matrix(0)) < 1e-12);
        assert!(second_singular_value(&g.mixing_matrix(0)) < 1e-12);
        let expected = if n == 1 { 0 } else { 1 };
        assert_eq!(
            rounds_to_consensus(g.as_ref(), 1e-9, 10, 3).0,
            Some(expected),
            "n={n}"
        );
    }
}

#[test]
fn ring_consensus_is_slow_and_curves_match_rounds() {
    let g = graph("ring", 32);
    let (rounds, _) = rounds_to_consensus(g.as_ref(), 1e-4, 100, 0);
    assert_eq!(rounds, None, "a 32-ring cannot mix in 100 rounds");
    let e = graph("exponential", 32);
    let curve = analysis::consensus_curve(e.as_ref(), 6, 5);
    assert_eq!(curve[0], 1.0);
    assert!(curve[4] > 1e-6 && curve[5] < 1e-12, "{curve:?}");
}

#[test]
fn analysis_refuses_sizes_it_cannot_hold() {
    let err = analysis::analyze(&spec("ring"), 1 << 20, &AnalysisOptions::default()).unwrap_err();
    assert!(err.to_string().contains("limited to 2048 nodes"), "{err}");
    // the graph itself is fine at that size
    assert_eq!(graph("ring", 1 << 20).out_peers(0, 0), vec![1]);
}

#[test]
fn hypercube_of_twelve_is_an_error() {
    let err = build(&spec("hypercube"), 12).unwrap_err();
    assert!(matches!(
        err,
        TopologyError::UnsupportedSize { size: 12, .. }
    ));
    assert_eq!(
        err.to_string(),
        "graph `hypercube` cannot have 12 nodes: a hypercube needs a power-of-two number of nodes (1, 2, 4, 8, 16, ...)"
    );
}

#[test]
fn seeded_random_graphs_are_reproducible() {
    let peers = |g: &dyn Topology| (0..g.size()).map(|r| g.out_peers(r, 0)).collect::<Vec<_>>();
    for name in ["random-regular:3", "erdos-renyi:0.3"] {
        let a = graph(&format!("{name},seed=11"), 20);
        let b = graph(&format!("{name},seed=11"), 20);
        let c = graph(&format!("{name},seed=12"), 20);
        assert_eq!(peers(a.as_ref()), peers(b.as_ref()), "{name}");
        assert_ne!(peers(a.as_ref()), peers(c.as_ref()), "{name}");
    }
}

#[test]
fn disconnected_erdos_renyi_is_an_error() {
    let err = build(&spec("erdos-renyi:0.02,seed=1"), 30).unwrap_err();
    assert!(err.to_string().contains("not connected"), "{err}");
    assert!(err.to_string().contains("seed 1"), "{err}");
}

#[test]
fn edge_list_and_schedule_files() {
    let dir = tempfile::tempdir().unwrap();
    let edges = dir.path().join("edges.txt");
    std::fs::write(&edges, "# triangle\nundirected\n0 1\n1 2\n2 0\n").unwrap();
    let g = build(&spec(&format!("edges:{}", edges.display())), 3).unwrap();
    assert_eq!(g.out_peers(0, 0), vec![1, 2]);
    assert!(max_deviation_from_average(&g.mixing_matrix(0)) < 1e-12);

    let schedule = dir.path().join("rounds.txt");
    std::fs::write(&schedule, "0 1\n2 3\n---\n1 2\n3 0\n").unwrap();
    let s = build(&spec(&format!("schedule:{}", schedule.display())), 4).unwrap();
    assert_eq!(s.period(), 2);
    assert_eq!(
        (s.out_peers(1, 0), s.out_peers(1, 1), s.in_peers(0, 3)),
        (vec![], vec![2], vec![3])
    );

    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "0 1\n\n1 2 # ok\n2 zwei\n").unwrap();
    let err = build(&spec(&format!("edges:{}", bad.display())), 3).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}, line 4: `zwei` is not a rank (a non-negative integer)",
            bad.display()
        )
    );
    let err = build(&spec(&format!("edges:{}", edges.display())), 2).unwrap_err();
    assert!(
        err.to_string().contains("line 4: rank 2 is out of range"),
        "{err}"
    );
}

#[test]
fn analysis_reports_degrees_and_bytes() {
    let options = AnalysisOptions {
        model_floats: 100,
        max_rounds: 100,
        ..AnalysisOptions::default()
    };
    let a = analysis::analyze(&spec("hypercube"), 16, &options).unwrap();
    assert_eq!(a.message_bytes, 408);
    assert_eq!(
        (a.out_degree.min, a.out_degree.max, a.in_degree.mean),
        (4.0, 4.0, 4.0)
    );
    assert_eq!(a.bytes_per_round.mean, 4.0 * 408.0);
    // uniform weights over all 4 dimensions at once: eigenvalues (5 - 2m) / 5
    assert!((a.sigma2_round - 0.6).abs() < 1e-12);
    assert!(matches!(a.rounds_to_epsilon, Some(15..=25)), "{a:?}");
    let ring = analysis::analyze(&spec("ring"), 8, &options).unwrap();
    assert!((ring.sigma2_round - (PI / 8.0).cos()).abs() < 1e-10);
    assert_eq!(ring.sigma2_round, ring.sigma2_period);
    let json = serde_json::to_value(&ring).unwrap();
    assert_eq!(json["graph"], "ring");
    assert_eq!(json["nodes"], 8);
    let slow = analysis::analyze(&spec("ring"), 64, &options).unwrap();
    assert_eq!(slow.rounds_to_epsilon, None);
    assert!(slow.final_error > 1e-4);
}

#[test]
fn neighbours_are_symmetric_and_cover_every_round() {
    for name in GRAPHS {
        for n in [1usize, 2, 5, 8, 13, 96] {
            if !exists(name, n) {
                continue;
            }
            let g = graph(name, n);
            let nb: Vec<Vec<usize>> = (0..n).map(|r| g.neighbours(r)).collect();
            for (a, list) in nb.iter().enumerate() {
                assert!(!list.contains(&a), "{name} n={n}: {a} is its own neighbour");
                for &b in list {
                    assert!(
                        nb[b].contains(&a),
                        "{name} n={n}: {b} in N({a}) but not {a} in N({b})"
                    );
                }
                for t in 0..g.period() {
                    for p in g.out_peers(a, t).into_iter().chain(g.in_peers(a, t)) {
                        assert!(
                            list.contains(&p),
                            "{name} n={n}: round {t} peer {p} of {a} missing"
                        );
                    }
                }
            }
        }
    }
    // The default graph at 96 nodes: hops 1..64 each way, +-32 and +64 = -32
    // coinciding: 12 peers.
    assert_eq!(graph("exponential", 96).neighbours(0).len(), 12);
}
