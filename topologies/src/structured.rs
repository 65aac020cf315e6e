//! Static graphs with a closed-form neighbourhood: ring, torus, hypercube,
//! complete graph, star.
//!
//! Neighbours are computed on the fly (nothing is stored per node), so even a
//! complete graph over many ranks costs no memory until it is queried.

use crate::{Topology, TopologyError, check_nonempty, ilog2, is_power_of_two, size_error};

/// Which structured graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StructuredKind {
    /// Directed ring: `r -> r + 1`.
    Ring,
    /// Undirected ring: `r <-> r - 1, r + 1`.
    UndirectedRing,
    /// Undirected 2-D torus, 4 neighbours, `rows x cols` with `rows <= cols`.
    Torus { rows: usize, cols: usize },
    /// Undirected hypercube: `r <-> r xor 2^i`.
    Hypercube,
    /// Everyone talks to everyone.
    Complete,
    /// Undirected star around rank 0.
    Star,
}

/// A static graph given by a formula.
#[derive(Debug, Clone, PartialEq)]
pub struct Structured {
    kind: StructuredKind,
    size: usize,
}

impl Structured {
    /// Directed ring `r -> r + 1 (mod size)`; every round's matrix is `(I + S) / 2`.
    pub fn ring(size: usize) -> Result<Self, TopologyError> {
        Self::checked(StructuredKind::Ring, "ring", size)
    }

    /// Undirected ring `r <-> r +- 1`; with 2 nodes each has one neighbour.
    pub fn undirected_ring(size: usize) -> Result<Self, TopologyError> {
        Self::checked(StructuredKind::UndirectedRing, "undirected-ring", size)
    }

    /// Undirected 4-neighbour 2-D torus over the most square factorisation
    /// `rows x cols` of `size` (`rows` the largest divisor with
    /// `rows * rows <= size`). Wrap-around neighbours that coincide are
    /// counted once (a 2 x 4 torus has 3 neighbours per node). A prime
    /// `size > 3` is an error: its only factorisation `1 x size` is just an
    /// undirected ring (use `undirected-ring`). Sizes 1, 2 and 3 are
    /// accepted as `1 x size` (the complete graph on them).
    pub fn torus(size: usize) -> Result<Self, TopologyError> {
        check_nonempty("torus", size)?;
        let rows = (1..=size)
            .take_while(|d| d * d <= size)
            .filter(|&d| size.is_multiple_of(d))
            .max();
        let rows = rows.unwrap_or(1);
        if rows == 1 && size > 3 {
            return Err(size_error(
                "torus",
                size,
                format!(
                    "{size} is prime, so the only torus is 1 x {size}, which is a ring; \
                     use `undirected-ring`, or a size with a factorisation rows x cols"
                ),
            ));
        }
        let cols = size / rows;
        Ok(Self {
            kind: StructuredKind::Torus { rows, cols },
            size,
        })
    }

    /// Undirected hypercube; `size` must be a power of two.
    pub fn hypercube(size: usize) -> Result<Self, TopologyError> {
        check_nonempty("hypercube", size)?;
        if !is_power_of_two(size) {
            return Err(size_error(
                "hypercube",
                size,
                "a hypercube needs a power-of-two number of nodes (1, 2, 4, 8, 16, ...)",
            ));
        }
        Ok(Self {
            kind: StructuredKind::Hypercube,
            size,
        })
    }

    /// The complete graph: one round gives the exact average.
    pub fn complete(size: usize) -> Result<Self, TopologyError> {
        Self::checked(StructuredKind::Complete, "complete", size)
    }

    /// Undirected star: rank 0 talks to everyone, everyone else only to 0.
    /// Its push-sum matrix is column- but not doubly stochastic.
    pub fn star(size: usize) -> Result<Self, TopologyError> {
        Self::checked(StructuredKind::Star, "star", size)
    }

    fn checked(kind: StructuredKind, name: &str, size: usize) -> Result<Self, TopologyError> {
        check_nonempty(name, size)?;
        Ok(Self { kind, size })
    }

    /// Which graph this is (and the torus shape).
    pub fn kind(&self) -> StructuredKind {
        self.kind
    }

    /// `(rows, cols)` of a torus.
    pub fn torus_shape(&self) -> Option<(usize, usize)> {
        match self.kind {
            StructuredKind::Torus { rows, cols } => Some((rows, cols)),
            _ => None,
        }
    }

    fn neighbours(&self, rank: usize, outgoing: bool) -> Vec<usize> {
        let n = self.size;
        if n <= 1 || rank >= n {
            return Vec::new();
        }
        let mut peers = match self.kind {
            StructuredKind::Ring if outgoing => vec![(rank + 1) % n],
            StructuredKind::Ring => vec![(rank + n - 1) % n],
            StructuredKind::UndirectedRing => vec![(rank + n - 1) % n, (rank + 1) % n],
            StructuredKind::Torus { rows, cols } => {
                let (row, col) = (rank / cols, rank % cols);
                let at = |r: usize, c: usize| r * cols + c;
                vec![
                    at((row + rows - 1) % rows, col),
                    at((row + 1) % rows, col),
                    at(row, (col + cols - 1) % cols),
                    at(row, (col + 1) % cols),
                ]
            }
            StructuredKind::Hypercube => (0..ilog2(n)).map(|i| rank ^ (1 << i)).collect(),
            StructuredKind::Complete => (0..n).collect(),
            StructuredKind::Star if rank == 0 => (1..n).collect(),
            StructuredKind::Star => vec![0],
        };
        peers.retain(|&p| p != rank);
        peers.sort_unstable();
        peers.dedup();
        peers
    }
}

impl Topology for Structured {
    fn name(&self) -> String {
        match self.kind {
            StructuredKind::Ring => "ring",
            StructuredKind::UndirectedRing => "undirected-ring",
            StructuredKind::Torus { .. } => "torus",
            StructuredKind::Hypercube => "hypercube",
            StructuredKind::Complete => "complete",
            StructuredKind::Star => "star",
        }
        .into()
    }
    fn size(&self) -> usize {
        self.size
    }
    fn period(&self) -> u64 {
        1
    }
    fn out_peers(&self, rank: usize, _round: u64) -> Vec<usize> {
        self.neighbours(rank, true)
    }
    fn in_peers(&self, rank: usize, _round: u64) -> Vec<usize> {
        self.neighbours(rank, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torus_is_most_square_and_rejects_primes() {
        assert_eq!(Structured::torus(12).unwrap().torus_shape(), Some((3, 4)));
        assert_eq!(Structured::torus(16).unwrap().torus_shape(), Some((4, 4)));
        assert_eq!(Structured::torus(8).unwrap().torus_shape(), Some((2, 4)));
        assert_eq!(Structured::torus(3).unwrap().torus_shape(), Some((1, 3)));
        let err = Structured::torus(7).unwrap_err();
        assert!(err.to_string().contains("prime"), "{err}");
        let t = Structured::torus(16).unwrap();
        assert_eq!(t.out_peers(5, 0), vec![1, 4, 6, 9]);
        assert_eq!(t.out_peers(0, 0), vec![1, 3, 4, 12]);
        // 2 x 4: up and down are the same rank
        assert_eq!(Structured::torus(8).unwrap().out_peers(0, 0), vec![1, 3, 4]);
    }

    #[test]
    fn hypercube_needs_power_of_two() {
        let err = Structured::hypercube(12).unwrap_err();
        assert!(
            matches!(err, TopologyError::UnsupportedSize { size: 12, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("power-of-two"));
        assert_eq!(
            Structured::hypercube(8).unwrap().out_peers(5, 0),
            vec![1, 4, 7]
        );
        assert!(Structured::hypercube(1).unwrap().out_peers(0, 0).is_empty());
    }

    #[test]
    fn star_and_rings() {
        let s = Structured::star(4).unwrap();
        assert_eq!(s.out_peers(0, 0), vec![1, 2, 3]);
        assert_eq!(s.in_peers(2, 0), vec![0]);
        let r = Structured::ring(5).unwrap();
        assert_eq!((r.out_peers(4, 0), r.in_peers(0, 0)), (vec![0], vec![4]));
        assert_eq!(
            Structured::undirected_ring(2).unwrap().out_peers(0, 0),
            vec![1]
        );
        assert_eq!(
            Structured::undirected_ring(5).unwrap().out_peers(0, 0),
            vec![1, 4]
        );
    }
}
