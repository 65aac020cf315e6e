//! Dense push-sum mixing matrices.
//!
//! Entry `(i, j)` is the fraction of node `j`'s `(x, w)` that ends up at node
//! `i` after one round, so one round of push-sum is `x <- W x`, `w <- W w` and
//! a product over rounds `k = 0..T` is `W_{T-1} ... W_1 W_0`.

use crate::Topology;

/// A dense `n x n` mixing matrix, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct MixingMatrix {
    size: usize,
    data: Vec<f64>,
}

impl MixingMatrix {
    /// The identity (no mixing).
    pub fn identity(size: usize) -> Self {
        let mut data = vec![0.0; size * size];
        for i in 0..size {
            data[i * size + i] = 1.0;
        }
        Self { size, data }
    }

    /// The uniform push-sum matrix of `topology` in `round`.
    pub fn from_topology<T: Topology + ?Sized>(topology: &T, round: u64) -> Self {
        let size = topology.size();
        let mut data = vec![0.0; size * size];
        for j in 0..size {
            let out = topology.out_peers(j, round);
            let share = 1.0 / (out.len() + 1) as f64;
            data[j * size + j] = share;
            for i in out {
                data[i * size + j] = share;
            }
        }
        Self { size, data }
    }

    /// Builds a matrix from row-major entries; `None` unless `data.len() == size * size`.
    pub fn from_row_major(size: usize, data: Vec<f64>) -> Option<Self> {
        (data.len() == size * size).then_some(Self { size, data })
    }

    /// Number of rows (= columns).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Entry `(row, col)`: the share of `col`'s mass that reaches `row`.
    pub fn get(&self, row: usize, col: usize) -> f64 {
        self.data[row * self.size + col]
    }

    /// Row-major entries.
    pub fn as_slice(&self) -> &[f64] {
        &self.data
    }

    /// Sum of each row.
    pub fn row_sums(&self) -> Vec<f64> {
        self.data
            .chunks(self.size.max(1))
            .take(self.size)
            .map(|row| row.iter().sum())
            .collect()
    }

    /// Sum of each column.
    pub fn column_sums(&self) -> Vec<f64> {
        let mut sums = vec![0.0; self.size];
        for row in self.data.chunks(self.size.max(1)).take(self.size) {
            for (s, v) in sums.iter_mut().zip(row) {
                *s += v;
            }
        }
        sums
    }

    /// Every column sums to 1 within `tol` and no entry is negative.
    pub fn is_column_stochastic(&self, tol: f64) -> bool {
        self.data.iter().all(|&v| v >= 0.0)
            && self.column_sums().iter().all(|s| (s - 1.0).abs() <= tol)
    }

    /// Column-stochastic and every row sums to 1 within `tol`: push-sum
    /// weights then stay at 1 and plain averaging would work too.
    pub fn is_doubly_stochastic(&self, tol: f64) -> bool {
        self.is_column_stochastic(tol) && self.row_sums().iter().all(|s| (s - 1.0).abs() <= tol)
    }

    /// `self * rhs` (apply `rhs` first, then `self`).
    pub fn mul(&self, rhs: &Self) -> Self {
        assert_eq!(self.size, rhs.size, "mixing matrices of different sizes");
        let n = self.size;
        let mut data = vec![0.0; n * n];
        for i in 0..n {
            for k in 0..n {
                let a = self.data[i * n + k];
                if a == 0.0 {
                    continue;
                }
                let out = &mut data[i * n..(i + 1) * n];
                for (o, b) in out.iter_mut().zip(&rhs.data[k * n..(k + 1) * n]) {
                    *o += a * b;
                }
            }
        }
        Self { size: n, data }
    }

    /// `self * v`.
    pub fn apply(&self, v: &[f64]) -> Vec<f64> {
        assert_eq!(v.len(), self.size, "vector length differs from matrix size");
        self.data
            .chunks(self.size.max(1))
            .take(self.size)
            .map(|row| row.iter().zip(v).map(|(a, b)| a * b).sum())
            .collect()
    }
}
