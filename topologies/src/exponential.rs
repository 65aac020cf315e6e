//! The time-varying directed exponential graph (one peer per round).

use crate::{Topology, TopologyError, ilog2};

/// Worker `r`'s phone book is `r + 2^0, r + 2^1, ..., r + 2^L (mod m)` with
/// `L = floor(log2(m - 1))`; in round `k` it sends to entry `k mod (L + 1)` and
/// receives from `r - 2^(k mod (L + 1))`. With `m` a power of two, one cycle of
/// rounds gives the exact average. `m = 1` has no peers.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectedExponential {
    size: usize,
    hops: Vec<usize>,
}

impl DirectedExponential {
    /// Builds the graph for `size >= 1` nodes.
    pub fn new(size: usize) -> Result<Self, TopologyError> {
        if size == 0 {
            return Err(TopologyError::UnsupportedSize {
                graph: "exponential".into(),
                size,
                reason: "a graph needs at least one node".into(),
            });
        }
        let hops = if size == 1 {
            Vec::new()
        } else {
            (0..=ilog2(size - 1)).map(|i| 1usize << i).collect()
        };
        Ok(Self { size, hops })
    }

    /// The hop distances, in the order they are used.
    pub fn hops(&self) -> &[usize] {
        &self.hops
    }

    fn hop(&self, round: u64) -> Option<usize> {
        if self.hops.is_empty() {
            None
        } else {
            Some(self.hops[(round % self.hops.len() as u64) as usize])
        }
    }
}

impl Topology for DirectedExponential {
    fn name(&self) -> String {
        "exponential".into()
    }
    fn size(&self) -> usize {
        self.size
    }
    fn period(&self) -> u64 {
        self.hops.len().max(1) as u64
    }
    fn out_peers(&self, rank: usize, round: u64) -> Vec<usize> {
        self.hop(round)
            .map(|h| vec![(rank + h) % self.size])
            .unwrap_or_default()
    }
    fn in_peers(&self, rank: usize, round: u64) -> Vec<usize> {
        self.hop(round)
            .map(|h| vec![(rank + self.size - h) % self.size])
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hops_use_integer_log() {
        assert_eq!(DirectedExponential::new(1).unwrap().hops(), &[] as &[usize]);
        assert_eq!(DirectedExponential::new(2).unwrap().hops(), &[1]);
        assert_eq!(DirectedExponential::new(8).unwrap().hops(), &[1, 2, 4]);
        assert_eq!(DirectedExponential::new(9).unwrap().hops(), &[1, 2, 4, 8]);
        assert_eq!(DirectedExponential::new(6).unwrap().hops(), &[1, 2, 4]);
    }

    #[test]
    fn in_and_out_peers_are_consistent() {
        for m in 1..20 {
            let g = DirectedExponential::new(m).unwrap();
            for k in 0..10 {
                for r in 0..m {
                    for &j in &g.out_peers(r, k) {
                        assert!(g.in_peers(j, k).contains(&r));
                    }
                }
            }
        }
    }
}
