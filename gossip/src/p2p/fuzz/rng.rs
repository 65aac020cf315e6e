//! The seeded generator of inputs.

use super::ctx::*;

/// A small seeded generator (xorshift64*), the same on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub(super) fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }

    /// A value in [-1, 1).
    pub(super) fn unit(&mut self) -> f32 {
        (self.below(1 << 20) as f32 / (1 << 19) as f32) - 1.0
    }

    /// Hostile or ordinary `u64`s: edges, small numbers, anything.
    pub(super) fn wild(&mut self) -> u64 {
        match self.below(6) {
            0 => self.pick(&[0, 1, u64::MAX, u64::MAX - 1, 1 << 32, 1 << 63]),
            1 => self.pick(&[CAP / 4 + 1, CAP, TOTAL as u64, FLOATS as u64 + 1]),
            2 | 3 => self.below(64) as u64,
            _ => self.next_u64(),
        }
    }
}
