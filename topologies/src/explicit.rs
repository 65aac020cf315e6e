//! Graphs given by their edges: random graphs, edge-list and schedule files.
//!
//! A static graph is a schedule of one round; a schedule of `T` rounds uses
//! round `k mod T` in round `k`.

use crate::{Topology, TopologyError, check_nonempty};

/// Out- and in-neighbour lists of every rank in one round.
#[derive(Debug, Clone, PartialEq, Default)]
struct Adjacency {
    out: Vec<Vec<usize>>,
    inn: Vec<Vec<usize>>,
}

/// A graph stored as adjacency lists, one set per round of its schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct ExplicitGraph {
    name: String,
    size: usize,
    rounds: Vec<Adjacency>,
}

impl ExplicitGraph {
    /// A schedule of directed edge lists `(src, dst)`, one list per round
    /// (an empty list of rounds means one round without edges). Duplicate
    /// edges count once. Ranks must be `< size` and an edge may not be a
    /// self-loop; callers that know line numbers check that earlier.
    pub fn from_rounds(
        name: impl Into<String>,
        size: usize,
        rounds: &[Vec<(usize, usize)>],
    ) -> Result<Self, TopologyError> {
        let name = name.into();
        check_nonempty(&name, size)?;
        let mut built = Vec::with_capacity(rounds.len().max(1));
        for (k, edges) in rounds.iter().enumerate() {
            let mut adj = Adjacency {
                out: vec![Vec::new(); size],
                inn: vec![Vec::new(); size],
            };
            for &(src, dst) in edges {
                if src >= size || dst >= size || src == dst {
                    return Err(TopologyError::InvalidParameter {
                        graph: name,
                        reason: format!(
                            "round {k}: edge {src} -> {dst} is a self-loop or names a rank >= {size}"
                        ),
                    });
                }
                adj.out[src].push(dst);
                adj.inn[dst].push(src);
            }
            for list in adj.out.iter_mut().chain(adj.inn.iter_mut()) {
                list.sort_unstable();
                list.dedup();
            }
            built.push(adj);
        }
        if built.is_empty() {
            built.push(Adjacency {
                out: vec![Vec::new(); size],
                inn: vec![Vec::new(); size],
            });
        }
        Ok(Self {
            name,
            size,
            rounds: built,
        })
    }

    /// A static graph from directed edges.
    pub fn from_edges(
        name: impl Into<String>,
        size: usize,
        edges: Vec<(usize, usize)>,
    ) -> Result<Self, TopologyError> {
        Self::from_rounds(name, size, &[edges])
    }

    /// A static graph from undirected edges (each becomes two directed ones).
    pub fn from_undirected_edges(
        name: impl Into<String>,
        size: usize,
        edges: &[(usize, usize)],
    ) -> Result<Self, TopologyError> {
        let both = edges.iter().flat_map(|&(a, b)| [(a, b), (b, a)]).collect();
        Self::from_edges(name, size, both)
    }

    fn round(&self, round: u64) -> &Adjacency {
        &self.rounds[(round % self.rounds.len() as u64) as usize]
    }
}

impl Topology for ExplicitGraph {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn size(&self) -> usize {
        self.size
    }
    fn period(&self) -> u64 {
        self.rounds.len() as u64
    }
    fn out_peers(&self, rank: usize, round: u64) -> Vec<usize> {
        self.round(round).out.get(rank).cloned().unwrap_or_default()
    }
    fn in_peers(&self, rank: usize, round: u64) -> Vec<usize> {
        self.round(round).inn.get(rank).cloned().unwrap_or_default()
    }
}

/// Number of connected components of the undirected graph on `0..size`
/// (edge directions ignored).
pub fn undirected_components(size: usize, edges: &[(usize, usize)]) -> usize {
    let mut parent: Vec<usize> = (0..size).collect();
    fn find(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    let mut components = size;
    for &(a, b) in edges {
        let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
        if ra != rb {
            parent[ra] = rb;
            components -= 1;
        }
    }
    components
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_rounds_cycle_and_dedupe() {
        let g = ExplicitGraph::from_rounds("s", 3, &[vec![(0, 1), (0, 1)], vec![(2, 0)]]).unwrap();
        assert_eq!(g.period(), 2);
        assert_eq!(g.out_peers(0, 0), vec![1]);
        assert_eq!(g.in_peers(0, 3), vec![2]);
        assert!(g.out_peers(0, 1).is_empty());
        assert!(ExplicitGraph::from_rounds("s", 3, &[vec![(0, 3)]]).is_err());
        assert!(ExplicitGraph::from_rounds("s", 3, &[vec![(1, 1)]]).is_err());
    }

    #[test]
    fn components_counts_pieces() {
        assert_eq!(undirected_components(4, &[(0, 1), (2, 3)]), 2);
        assert_eq!(undirected_components(4, &[(0, 1), (2, 3), (3, 1)]), 1);
        assert_eq!(undirected_components(1, &[]), 1);
    }
}
