//! Communication graphs for push-sum gossip.
//!
//! Every graph is a pure function of `(rank, round, size)`: it tells each rank
//! whom it sends to (out-peers) and whom it hears from (in-peers) in a given
//! round. Push-sum uses uniform, column-stochastic mixing: a node keeps
//! `1 / (out_degree + 1)` of its mass and sends the same share to each out-peer.
//!
//! All logs and powers use integer arithmetic: the reference implementation's
//! floating-point `log2` drops hops for some sizes.

pub mod exponential;

pub use exponential::DirectedExponential;

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
}

/// floor(log2(n)) for n >= 1, in integer arithmetic.
pub fn ilog2(n: usize) -> u32 {
    assert!(n >= 1, "ilog2 of zero");
    usize::BITS - 1 - n.leading_zeros()
}

/// Whether n is a power of two (n >= 1).
pub fn is_power_of_two(n: usize) -> bool {
    n >= 1 && n & (n - 1) == 0
}
