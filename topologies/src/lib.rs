//! Communication graphs for push-sum gossip.
//!
//! Every graph is a pure function of `(rank, round, size)`: it tells each rank
//! whom it sends to (out-peers) and whom it hears from (in-peers) in a given
//! round. Push-sum uses uniform, column-stochastic mixing: a node keeps
//! `1 / (out_degree + 1)` of its mass and sends the same share to each out-peer.
//!
//! All logs and powers use integer arithmetic: the reference implementation's
//! floating-point `log2` drops hops for some sizes.
//!
//! Graphs are usually built from a [`GraphSpec`] (its string form, e.g.
//! `"exponential"`, `"random-regular:4,seed=7"`, lives in the TOML config):
//!
//! ```
//! use slowmo_topologies::{GraphSpec, Topology, build};
//! let spec: GraphSpec = "exponential".parse().unwrap();
//! let graph = build(&spec, 8).unwrap();
//! assert_eq!(graph.out_peers(0, 0), vec![1]);
//! assert_eq!(graph.in_peers(0, 2), vec![4]);
//! assert!(build(&"hypercube".parse().unwrap(), 12).is_err());
//! ```
//!
//! [`analysis`] measures how fast a graph mixes (singular values, rounds to
//! consensus, bytes per round) and [`report`] compares graphs in CSV and plots.

use std::sync::Arc;

#[cfg(feature = "analysis")]
pub mod analysis;
pub mod cycling;
pub mod edgelist;
pub mod explicit;
pub mod exponential;
pub mod mixing;
pub mod random;
#[cfg(feature = "analysis")]
pub mod report;
pub mod spec;
pub mod structured;

pub use cycling::CyclingHops;
pub use explicit::ExplicitGraph;
pub use exponential::DirectedExponential;
pub use mixing::MixingMatrix;
pub use spec::{GraphKind, GraphSpec, build, peers_clamped};
pub use structured::{Structured, StructuredKind};

/// Errors building or querying a graph.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum TopologyError {
    /// The graph cannot be built for this number of nodes.
    #[error("graph `{graph}` cannot have {size} nodes: {reason}")]
    UnsupportedSize {
        graph: String,
        size: usize,
        reason: String,
    },
    /// A parameter of the graph is out of range.
    #[error("graph `{graph}`: {reason}")]
    InvalidParameter { graph: String, reason: String },
    /// A graph name (or its argument / options) could not be parsed.
    #[error("unknown graph `{name}`: {reason}; accepted: {accepted}", accepted = spec::ACCEPTED_NAMES)]
    UnknownGraph { name: String, reason: String },
    /// A random graph was drawn but does not have the required property.
    #[error("graph `{graph}` with {size} nodes and seed {seed}: {reason}")]
    RandomGraph {
        graph: String,
        size: usize,
        seed: u64,
        reason: String,
    },
    /// An edge-list or schedule file could not be read.
    #[error("cannot read graph file `{path}`: {reason}")]
    File { path: String, reason: String },
    /// A line of an edge-list or schedule text is malformed or out of range.
    #[error("{source_name}, line {line}: {reason}")]
    Parse {
        /// The file path (or another name for the text).
        source_name: String,
        /// 1-based line number.
        line: usize,
        reason: String,
    },
}

/// A (possibly time-varying) directed communication graph over `size()` ranks.
pub trait Topology: Send + Sync + std::fmt::Debug {
    /// Short name, as accepted on the command line.
    fn name(&self) -> String;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Number of rounds after which the schedule repeats (1 for static graphs).
    fn period(&self) -> u64;
    /// Ranks that `rank` sends to in `round`, sorted, without `rank` itself.
    fn out_peers(&self, rank: usize, round: u64) -> Vec<usize>;
    /// Ranks that send to `rank` in `round`, sorted, without `rank` itself.
    fn in_peers(&self, rank: usize, round: u64) -> Vec<usize>;

    /// The push-sum share of `rank` in `round`: it keeps this fraction of its
    /// `(x, w)` and sends the same fraction to each out-peer, i.e.
    /// `1 / (out_degree + 1)`.
    fn mixing_weight(&self, rank: usize, round: u64) -> f64 {
        1.0 / (self.out_peers(rank, round).len() + 1) as f64
    }

    /// The uniform push-sum mixing matrix of `round`: column `j` holds
    /// `1 / (out_degree_j + 1)` at `(j, j)` and at `(i, j)` for each out-peer
    /// `i` of `j`, so it is column-stochastic (mass is conserved).
    fn mixing_matrix(&self, round: u64) -> MixingMatrix {
        MixingMatrix::from_topology(self, round)
    }

    /// Every rank `rank` sends to or receives from in some round of one
    /// period, sorted: the peers it needs a link to. The relation is
    /// symmetric (`b` is a neighbour of `a` exactly when `a` is one of `b`).
    fn neighbours(&self, rank: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.period().max(1))
            .flat_map(|t| {
                let mut p = self.out_peers(rank, t);
                p.extend(self.in_peers(rank, t));
                p
            })
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

macro_rules! forward_topology {
    ($($wrapper:ident),*) => {$(
        /// Forwards to the wrapped graph, so `Box<dyn Topology>` and
        /// `Arc<dyn Topology>` can be used wherever a `Topology` is expected.
        impl<T: Topology + ?Sized> Topology for $wrapper<T> {
            fn name(&self) -> String {
                (**self).name()
            }
            fn size(&self) -> usize {
                (**self).size()
            }
            fn period(&self) -> u64 {
                (**self).period()
            }
            fn out_peers(&self, rank: usize, round: u64) -> Vec<usize> {
                (**self).out_peers(rank, round)
            }
            fn in_peers(&self, rank: usize, round: u64) -> Vec<usize> {
                (**self).in_peers(rank, round)
            }
            fn mixing_weight(&self, rank: usize, round: u64) -> f64 {
                (**self).mixing_weight(rank, round)
            }
            fn mixing_matrix(&self, round: u64) -> MixingMatrix {
                (**self).mixing_matrix(round)
            }
        }
    )*};
}

forward_topology!(Box, Arc);

/// floor(log2(n)) for n >= 1, in integer arithmetic.
pub fn ilog2(n: usize) -> u32 {
    assert!(n >= 1, "ilog2 of zero");
    usize::BITS - 1 - n.leading_zeros()
}

/// Whether n is a power of two (n >= 1).
pub fn is_power_of_two(n: usize) -> bool {
    n >= 1 && n & (n - 1) == 0
}

/// floor(log_base(n)) for n >= 1 and base >= 2, in integer arithmetic.
pub fn ilog(n: usize, base: usize) -> u32 {
    assert!(n >= 1 && base >= 2, "ilog needs n >= 1 and base >= 2");
    n.ilog(base)
}

pub(crate) fn size_error(graph: &str, size: usize, reason: impl Into<String>) -> TopologyError {
    TopologyError::UnsupportedSize {
        graph: graph.into(),
        size,
        reason: reason.into(),
    }
}

pub(crate) fn check_nonempty(graph: &str, size: usize) -> Result<(), TopologyError> {
    if size == 0 {
        Err(size_error(graph, size, "a graph needs at least one node"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_logs() {
        assert_eq!(ilog2(1), 0);
        assert_eq!(ilog2(7), 2);
        assert_eq!(ilog2(8), 3);
        assert_eq!(ilog(8, 3), 1);
        assert_eq!(ilog(9, 3), 2);
        assert!(is_power_of_two(1) && is_power_of_two(64) && !is_power_of_two(12));
        assert!(!is_power_of_two(0));
    }

    #[test]
    fn boxed_and_shared_graphs_are_graphs() {
        fn hops_of<T: Topology>(g: &T) -> Vec<usize> {
            (0..g.period()).flat_map(|k| g.out_peers(0, k)).collect()
        }
        let boxed = build(&GraphSpec::default(), 8).unwrap();
        assert_eq!(hops_of(&boxed), vec![1, 2, 4]);
        let shared: std::sync::Arc<dyn Topology> = boxed.into();
        assert_eq!(hops_of(&shared), vec![1, 2, 4]);
        assert_eq!(shared.mixing_weight(3, 0), 0.5);
    }
}
