//! Time-varying circulant graphs: every rank uses the same list of hops.
//!
//! Rank `r`'s phone book is `r + h (mod size)` for each hop `h` in a list; in
//! round `k` it sends to `p` consecutive entries of that list (`p` = peers per
//! round), starting at entry `k * p mod len`, so the list is cycled `p` at a
//! time. Because every rank uses the same hops, rank `r` hears from `r - h`
//! for the same hops and every round's mixing matrix is doubly stochastic.
//!
//! Hops are stored as residues in `1..size`, distinct, in the order they are
//! used. A hop `-h` is the residue `size - h`.

use crate::{TopologyError, check_nonempty, ilog2, size_error};

/// A circulant graph that cycles through a list of hops, `peers` per round.
#[derive(Debug, Clone, PartialEq)]
pub struct CyclingHops {
    name: String,
    size: usize,
    hops: Vec<usize>,
    peers: usize,
}

impl CyclingHops {
    /// A graph from explicit hop residues (each in `1..size`; duplicates are
    /// dropped, keeping the first) and `peers >= 1` per round.
    pub fn new(
        name: impl Into<String>,
        size: usize,
        hops: impl IntoIterator<Item = usize>,
        peers: usize,
    ) -> Result<Self, TopologyError> {
        let name = name.into();
        check_nonempty(&name, size)?;
        if peers == 0 {
            return Err(TopologyError::InvalidParameter {
                graph: name,
                reason: "peers per round must be at least 1".into(),
            });
        }
        let mut list = Vec::new();
        for h in hops {
            if h == 0 || h >= size {
                return Err(TopologyError::InvalidParameter {
                    graph: name,
                    reason: format!("hop {h} is not in 1..{size}"),
                });
            }
            if !list.contains(&h) {
                list.push(h);
            }
        }
        Ok(Self {
            name,
            size,
            hops: list,
            peers,
        })
    }

    /// Bidirectional exponential graph: hops `+1, -1, +2, -2, +4, -4, ...,
    /// +2^L, -2^L` with `L = floor(log2(size - 1))`, deduplicated modulo
    /// `size` (e.g. with 4 nodes `+2` and `-2` are the same rank).
    pub fn bidirectional_exponential(size: usize, peers: usize) -> Result<Self, TopologyError> {
        check_nonempty("bidirectional-exponential", size)?;
        let hops = signed_powers_of_two(size, 0);
        Self::new("bidirectional-exponential", size, hops, peers)
    }

    /// Bipartite exponential graph (the idea of fairscale's
    /// `DynamicBipartiteExponentialGraph`): hops `+1, -1, +(1+2), -(1+2),
    /// +(1+4), -(1+4), ..., +(1+2^L), -(1+2^L)` with `L = floor(log2(size - 1))`,
    /// deduplicated modulo `size`. Every hop is odd, so with an even `size`
    /// even ranks only talk to odd ranks and the other way round. An odd
    /// `size >= 3` is an error (the wrap-around would join two ranks of the
    /// same parity); `size = 1` has no peers.
    pub fn bipartite_exponential(size: usize, peers: usize) -> Result<Self, TopologyError> {
        let name = "bipartite-exponential";
        check_nonempty(name, size)?;
        if size > 1 && size % 2 == 1 {
            return Err(size_error(
                name,
                size,
                "the bipartite graph pairs even with odd ranks, so the size must be even (or 1)",
            ));
        }
        let hops = signed_powers_of_two(size, 1);
        Self::new(name, size, hops, peers)
    }

    /// Directed linear cycling graph: hops `+1, +2, ..., +(size - 1)`, one
    /// (or `peers`) per round, so every rank hears from every other rank once
    /// per cycle.
    pub fn linear(size: usize, peers: usize) -> Result<Self, TopologyError> {
        check_nonempty("linear", size)?;
        Self::new("linear", size, 1..size, peers)
    }

    /// The hop residues, in the order they are used.
    pub fn hops(&self) -> &[usize] {
        &self.hops
    }

    /// Peers per round (capped by the number of hops when used).
    pub fn peers(&self) -> usize {
        self.peers
    }

    /// The hops used in `round`.
    pub fn round_hops(&self, round: u64) -> Vec<usize> {
        cycled(&self.hops, self.peers, round)
    }

    pub(crate) fn name_str(&self) -> &str {
        &self.name
    }

    pub(crate) fn size_value(&self) -> usize {
        self.size
    }

    pub(crate) fn period_value(&self) -> u64 {
        cycle_period(self.hops.len(), self.peers)
    }

    pub(crate) fn out_of(&self, rank: usize, round: u64) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .round_hops(round)
            .iter()
            .map(|h| (rank + h) % self.size)
            .collect();
        out.sort_unstable();
        out
    }

    pub(crate) fn in_of(&self, rank: usize, round: u64) -> Vec<usize> {
        let mut inn: Vec<usize> = self
            .round_hops(round)
            .iter()
            .map(|h| (rank + self.size - h) % self.size)
            .collect();
        inn.sort_unstable();
        inn
    }
}

impl crate::Topology for CyclingHops {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn size(&self) -> usize {
        self.size
    }
    fn period(&self) -> u64 {
        self.period_value()
    }
    fn out_peers(&self, rank: usize, round: u64) -> Vec<usize> {
        self.out_of(rank, round)
    }
    fn in_peers(&self, rank: usize, round: u64) -> Vec<usize> {
        self.in_of(rank, round)
    }
}

/// `+(o+2^i), -(o+2^i)` residues for `i` in `0..=floor(log2(size-1))`, where
/// the offset `o` applies for `i >= 1` only (so the first pair is always ±1).
fn signed_powers_of_two(size: usize, offset: usize) -> Vec<usize> {
    if size <= 1 {
        return Vec::new();
    }
    let mut hops = Vec::new();
    for i in 0..=ilog2(size - 1) {
        let d = if i == 0 { 1 } else { (1usize << i) + offset };
        let d = d % size;
        for h in [d, (size - d) % size] {
            if h != 0 && !hops.contains(&h) {
                hops.push(h);
            }
        }
    }
    hops
}

/// Number of rounds before cycling `peers` at a time through `len` entries
/// repeats: `len / gcd(len, peers)`, or 1 when every entry is used each round.
pub(crate) fn cycle_period(len: usize, peers: usize) -> u64 {
    if len == 0 || peers >= len {
        1
    } else {
        (len / gcd(len, peers)) as u64
    }
}

/// The entries of `list` used in `round`: `peers` consecutive ones starting at
/// `round * peers mod len` (all of them when `peers >= len`).
pub(crate) fn cycled(list: &[usize], peers: usize, round: u64) -> Vec<usize> {
    let len = list.len();
    if len == 0 {
        return Vec::new();
    }
    if peers >= len {
        return list.to_vec();
    }
    let phase = (round % cycle_period(len, peers)) as usize;
    let start = (phase * peers) % len;
    (0..peers).map(|t| list[(start + t) % len]).collect()
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Topology;

    #[test]
    fn bidirectional_hops_are_deduplicated() {
        let g = CyclingHops::bidirectional_exponential(8, 1).unwrap();
        assert_eq!(g.hops(), &[1, 7, 2, 6, 4]);
        assert_eq!(g.period(), 5);
        assert_eq!(
            CyclingHops::bidirectional_exponential(2, 1).unwrap().hops(),
            &[1]
        );
        assert_eq!(
            CyclingHops::bidirectional_exponential(3, 1).unwrap().hops(),
            &[1, 2]
        );
        assert!(
            CyclingHops::bidirectional_exponential(1, 1)
                .unwrap()
                .hops()
                .is_empty()
        );
    }

    #[test]
    fn bidirectional_with_two_peers_sends_both_ways() {
        let g = CyclingHops::bidirectional_exponential(16, 2).unwrap();
        assert_eq!(g.out_peers(5, 0), vec![4, 6]);
        assert_eq!(g.out_peers(5, 1), vec![3, 7]);
        // seven hops cycled two at a time: the pairs drift, the period is 7
        assert_eq!(g.out_peers(5, 3), vec![6, 13]);
        assert_eq!(g.period(), 7);
    }

    #[test]
    fn bipartite_links_even_to_odd_and_rejects_odd_sizes() {
        let g = CyclingHops::bipartite_exponential(16, 1).unwrap();
        assert_eq!(g.hops(), &[1, 15, 3, 13, 5, 11, 9, 7]);
        for k in 0..g.period() {
            for r in 0..16 {
                for j in g.out_peers(r, k) {
                    assert_ne!(r % 2, j % 2, "rank {r} -> {j} in round {k}");
                }
            }
        }
        assert!(matches!(
            CyclingHops::bipartite_exponential(7, 1),
            Err(TopologyError::UnsupportedSize { size: 7, .. })
        ));
        assert!(CyclingHops::bipartite_exponential(1, 1).is_ok());
        assert_eq!(
            CyclingHops::bipartite_exponential(2, 1).unwrap().hops(),
            &[1]
        );
    }

    #[test]
    fn linear_visits_every_rank_once_per_cycle() {
        let g = CyclingHops::linear(5, 1).unwrap();
        assert_eq!(g.period(), 4);
        let heard: Vec<usize> = (0..4).flat_map(|k| g.in_peers(0, k)).collect();
        assert_eq!(heard, vec![4, 3, 2, 1]);
        let g3 = CyclingHops::linear(5, 3).unwrap();
        assert_eq!(g3.period(), 4);
        assert_eq!(g3.out_peers(0, 1), vec![1, 2, 4]);
    }

    #[test]
    fn zero_peers_is_rejected() {
        assert!(matches!(
            CyclingHops::linear(4, 0),
            Err(TopologyError::InvalidParameter { .. })
        ));
    }
}
