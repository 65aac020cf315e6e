//! The time-varying directed exponential graph (one or more peers per round).

use crate::cycling::CyclingHops;
use crate::{Topology, TopologyError, check_nonempty, ilog};

/// Worker `r`'s phone book is `r + 2^0, r + 2^1, ..., r + 2^L (mod m)` with
/// `L = floor(log2(m - 1))`; in round `k` it sends to entry `k mod (L + 1)` and
/// receives from `r - 2^(k mod (L + 1))`. With `m` a power of two, one cycle of
/// rounds gives the exact average. `m = 1` has no peers.
///
/// With `p` peers per round ([`DirectedExponential::with_peers`]) the phone
/// book is `j * (p+1)^i` for `i = 0..=floor(log_{p+1}(m - 1))` and
/// `j = 1..=p` (hops that would reach `m` or beyond are dropped rather than
/// wrapped, so no entry repeats), cycled `p` at a time. With `m` a power of
/// `p + 1` one cycle again gives the exact average.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectedExponential {
    inner: CyclingHops,
}

impl DirectedExponential {
    /// Builds the one-peer graph for `size >= 1` nodes.
    pub fn new(size: usize) -> Result<Self, TopologyError> {
        Self::with_peers(size, 1)
    }

    /// Builds the graph with `peers >= 1` out-peers per round.
    pub fn with_peers(size: usize, peers: usize) -> Result<Self, TopologyError> {
        check_nonempty("exponential", size)?;
        if peers == 0 {
            return Err(TopologyError::InvalidParameter {
                graph: "exponential".into(),
                reason: "peers per round must be at least 1".into(),
            });
        }
        let mut hops = Vec::new();
        if size > 1 {
            let base = peers.saturating_add(1);
            let mut power = 1usize;
            for i in 0..=ilog(size - 1, base) {
                if i > 0 {
                    power *= base; // (p+1)^i <= size - 1: cannot overflow
                }
                for j in 1..=peers {
                    match j.checked_mul(power) {
                        Some(h) if h < size => hops.push(h),
                        _ => break,
                    }
                }
            }
        }
        Ok(Self {
            inner: CyclingHops::new("exponential", size, hops, peers)?,
        })
    }

    /// The hop distances, in the order they are used.
    pub fn hops(&self) -> &[usize] {
        self.inner.hops()
    }

    /// Out-peers per round.
    pub fn peers(&self) -> usize {
        self.inner.peers()
    }
}

impl Topology for DirectedExponential {
    fn name(&self) -> String {
        self.inner.name_str().into()
    }
    fn size(&self) -> usize {
        self.inner.size_value()
    }
    fn period(&self) -> u64 {
        self.inner.period_value()
    }
    fn out_peers(&self, rank: usize, round: u64) -> Vec<usize> {
        self.inner.out_of(rank, round)
    }
    fn in_peers(&self, rank: usize, round: u64) -> Vec<usize> {
        self.inner.in_of(rank, round)
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
    fn multi_peer_hops_are_base_p_plus_one_digits() {
        let g = DirectedExponential::with_peers(9, 2).unwrap();
        assert_eq!(g.hops(), &[1, 2, 3, 6]);
        assert_eq!(g.period(), 2);
        assert_eq!(g.out_peers(0, 0), vec![1, 2]);
        assert_eq!(g.out_peers(0, 1), vec![3, 6]);
        assert_eq!(g.in_peers(0, 1), vec![3, 6]);
        // 6 * 3 >= 10 is dropped; 2 * 9 too
        assert_eq!(
            DirectedExponential::with_peers(10, 2).unwrap().hops(),
            &[1, 2, 3, 6, 9]
        );
        assert_eq!(
            DirectedExponential::with_peers(3, 5).unwrap().hops(),
            &[1, 2]
        );
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
