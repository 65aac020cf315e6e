//! Seeded random graphs: random d-regular and Erdos-Renyi G(n, p).
//!
//! Both use the workspace's SplitMix64 generator so the same seed gives the
//! same graph on every machine and with every version of every dependency
//! (every node of a run builds its graph independently and they must agree).

use crate::explicit::undirected_components;
use crate::{ExplicitGraph, TopologyError, check_nonempty};
pub use slowmo_optim::rng::SplitMix64;

/// How many pairings a random regular graph may try before giving up.
pub const REGULAR_ATTEMPTS: usize = 1000;

/// A connected simple `degree`-regular undirected graph drawn with the
/// pairing (configuration) model: every node gets `degree` points, random
/// pairs of points become edges, a pair that would make a self-loop or a
/// duplicate edge is redrawn, and when no valid pair is left the pairing
/// restarts. Disconnected results are redrawn too, up to
/// [`REGULAR_ATTEMPTS`] pairings. `size * degree` must be even and
/// `degree < size`.
pub fn random_regular(
    size: usize,
    degree: usize,
    seed: u64,
) -> Result<ExplicitGraph, TopologyError> {
    let name = format!("random-regular:{degree}");
    check_nonempty(&name, size)?;
    let invalid = |reason: String| TopologyError::InvalidParameter {
        graph: name.clone(),
        reason,
    };
    if degree >= size {
        return Err(invalid(format!(
            "degree {degree} needs more than {degree} nodes, the run has {size}"
        )));
    }
    if (size * degree) % 2 == 1 {
        return Err(invalid(format!(
            "nodes x degree = {size} x {degree} is odd, so no {degree}-regular graph exists"
        )));
    }
    let never_connected = (size > 2 && degree <= 1) || (size == 2 && degree == 0);
    if never_connected {
        return Err(invalid(format!(
            "a {degree}-regular graph on {size} nodes is never connected; use degree >= 2"
        )));
    }
    let mut rng = SplitMix64::new(seed);
    for _ in 0..REGULAR_ATTEMPTS {
        if let Some(edges) = try_pairing(size, degree, &mut rng)
            && undirected_components(size, &edges) == 1
        {
            return ExplicitGraph::from_undirected_edges(name, size, &edges);
        }
    }
    Err(TopologyError::RandomGraph {
        graph: name,
        size,
        seed,
        reason: format!(
            "no connected simple graph found in {REGULAR_ATTEMPTS} pairings; try another seed or degree"
        ),
    })
}

/// One pairing attempt; `None` when it got stuck.
fn try_pairing(size: usize, degree: usize, rng: &mut SplitMix64) -> Option<Vec<(usize, usize)>> {
    let mut points: Vec<usize> = (0..size)
        .flat_map(|v| std::iter::repeat_n(v, degree))
        .collect();
    let mut adjacent = vec![Vec::<usize>::with_capacity(degree); size];
    let mut edges = Vec::with_capacity(points.len() / 2);
    let valid = |adj: &[Vec<usize>], u: usize, v: usize| u != v && !adj[u].contains(&v);
    while !points.is_empty() {
        let len = points.len();
        let mut pick = None;
        for _ in 0..64 {
            let (i, j) = (rng.below(len), rng.below(len));
            if i != j && valid(&adjacent, points[i], points[j]) {
                pick = Some((i, j));
                break;
            }
        }
        if pick.is_none() {
            // Unlucky or stuck: choose among all valid pairs, if any remain.
            let candidates: Vec<(usize, usize)> = (0..len)
                .flat_map(|i| (i + 1..len).map(move |j| (i, j)))
                .filter(|&(i, j)| valid(&adjacent, points[i], points[j]))
                .collect();
            if candidates.is_empty() {
                return None;
            }
            pick = Some(candidates[rng.below(candidates.len())]);
        }
        let (i, j) = pick?;
        let (u, v) = (points[i], points[j]);
        adjacent[u].push(v);
        adjacent[v].push(u);
        edges.push((u.min(v), u.max(v)));
        let (hi, lo) = (i.max(j), i.min(j));
        points.swap_remove(hi);
        points.swap_remove(lo);
    }
    Some(edges)
}

/// Erdos-Renyi G(n, p): each unordered pair is an undirected edge with
/// probability `p`, independently. A graph that is not connected is an
/// error (gossip over it could never reach consensus), as is `p` outside
/// `[0, 1]`.
pub fn erdos_renyi(size: usize, p: f64, seed: u64) -> Result<ExplicitGraph, TopologyError> {
    let name = format!("erdos-renyi:{p}");
    check_nonempty(&name, size)?;
    if !(0.0..=1.0).contains(&p) {
        return Err(TopologyError::InvalidParameter {
            graph: name,
            reason: format!("edge probability {p} is not in [0, 1]"),
        });
    }
    let mut rng = SplitMix64::new(seed);
    let mut edges = Vec::new();
    for i in 0..size {
        for j in i + 1..size {
            if rng.next_f64() < p {
                edges.push((i, j));
            }
        }
    }
    let components = undirected_components(size, &edges);
    if components > 1 {
        let threshold = (size as f64).ln() / size as f64;
        return Err(TopologyError::RandomGraph {
            graph: name,
            size,
            seed,
            reason: format!(
                "the drawn graph is not connected ({components} components); \
                 use p well above ln(n)/n = {threshold:.3} or another seed"
            ),
        });
    }
    ExplicitGraph::from_undirected_edges(name, size, &edges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Topology;

    #[test]
    fn random_regular_is_regular_simple_connected_and_seeded() {
        for (n, d) in [(10, 3), (16, 4), (7, 2), (5, 4), (2, 1), (1, 0), (64, 6)] {
            let g = random_regular(n, d, 42).unwrap();
            let mut edges = Vec::new();
            for r in 0..n {
                let out = g.out_peers(r, 0);
                assert_eq!(out.len(), d, "n={n} d={d} rank {r}");
                assert_eq!(out, g.in_peers(r, 0));
                edges.extend(out.iter().map(|&j| (r, j)));
            }
            assert_eq!(undirected_components(n, &edges), 1);
            assert_eq!(g, random_regular(n, d, 42).unwrap());
        }
        assert_ne!(
            random_regular(16, 3, 1).unwrap(),
            random_regular(16, 3, 2).unwrap()
        );
    }

    #[test]
    fn random_regular_rejects_impossible_parameters() {
        assert!(
            random_regular(5, 3, 0)
                .unwrap_err()
                .to_string()
                .contains("odd")
        );
        assert!(
            random_regular(4, 4, 0)
                .unwrap_err()
                .to_string()
                .contains("more than 4 nodes")
        );
        assert!(
            random_regular(6, 1, 0)
                .unwrap_err()
                .to_string()
                .contains("never connected")
        );
    }

    #[test]
    fn erdos_renyi_is_seeded_and_rejects_disconnected_draws() {
        let a = erdos_renyi(20, 0.4, 3).unwrap();
        assert_eq!(a, erdos_renyi(20, 0.4, 3).unwrap());
        assert_ne!(a, erdos_renyi(20, 0.4, 4).unwrap());
        let err = erdos_renyi(20, 0.01, 3).unwrap_err();
        assert!(
            matches!(
                &err,
                TopologyError::RandomGraph {
                    seed: 3,
                    size: 20,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("not connected"), "{err}");
        assert!(erdos_renyi(3, 1.5, 0).is_err());
        assert!(erdos_renyi(3, f64::NAN, 0).is_err());
        assert_eq!(
            erdos_renyi(5, 1.0, 0).unwrap().out_peers(2, 0),
            vec![0, 1, 3, 4]
        );
    }
}
