//! Push-sum state of one worker: numerator `x` and weight `w`.
//!
//! The model is evaluated at the de-biased point `z = x / w`; the base
//! optimizer steps the numerator; gossip moves shares of `(x, w)` together (the
//! weight always travels with the numerator, so a lost message loses both and
//! `z` stays a weighted average of live values). On regular graphs without
//! loss `w` stays 1 and de-biasing is exact (`x / 1 == x`).
//!
//! `w` is an `f64`: it is one number per worker, and the extra precision keeps
//! `sum_i w_i == m` to many digits over long runs. `w` must stay finite and
//! `> 0`; gossip rejects peer messages that would break that.

use crate::error::OptimError;
use crate::wide::wide;

/// Numerator and weight of push-sum gossip.
#[derive(Debug, Clone, PartialEq)]
pub struct PushSum {
    /// The numerator (the parameters scaled by `w`).
    pub x: Vec<f32>,
    /// The push-sum weight.
    pub w: f64,
}

impl PushSum {
    /// Starts with `x = x0`, `w = 1`.
    pub fn new(x0: Vec<f32>) -> Self {
        Self { x: x0, w: 1.0 }
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.x.len()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.x.is_empty()
    }

    /// Writes `z = x / w` into `z` (each element divided in f64, rounded once;
    /// bit-exact `x` when `w == 1`).
    ///
    /// # Panics
    /// If `z.len() != self.len()` (a bug in the caller).
    pub fn debiased_into(&self, z: &mut [f32]) {
        assert_eq!(z.len(), self.x.len(), "PushSum::debiased_into: length");
        if self.w == 1.0 {
            z.copy_from_slice(&self.x);
            return;
        }
        divide(&self.x, self.w, z);
    }

    /// `x / w` as a new vector.
    pub fn debiased(&self) -> Vec<f32> {
        let mut z = vec![0.0; self.x.len()];
        self.debiased_into(&mut z);
        z
    }

    /// Sets `x = w * z`, keeping `w`, so that the de-biased value becomes `z`
    /// (the loop writes back parameters changed in de-biased form, e.g. after
    /// the noaverage outer step).
    ///
    /// # Panics
    /// If `z.len() != self.len()` (a bug in the caller).
    pub fn set_debiased(&mut self, z: &[f32]) {
        assert_eq!(z.len(), self.x.len(), "PushSum::set_debiased: length");
        if self.w == 1.0 {
            self.x.copy_from_slice(z);
            return;
        }
        multiply(z, self.w, &mut self.x);
    }

    /// After an exact average: `x = z_bar`, `w = 1`.
    ///
    /// # Panics
    /// If `z.len() != self.len()` (a bug in the caller).
    pub fn set_average(&mut self, z: &[f32]) {
        assert_eq!(z.len(), self.x.len(), "PushSum::set_average: length");
        self.x.copy_from_slice(z);
        self.w = 1.0;
    }

    /// Multiplies `x` and `w` by `p` (keeping the share `p` of the mass).
    pub fn scale(&mut self, p: f64) {
        self.w *= p;
        scale(&mut self.x, p);
    }

    /// Adds a received share `(x, w)`. Length-checked, since shares come from peers.
    pub fn add_share(&mut self, x: &[f32], w: f64) -> Result<(), OptimError> {
        if x.len() != self.x.len() {
            return Err(OptimError::LengthMismatch {
                what: "push-sum share",
                expected: self.x.len(),
                got: x.len(),
            });
        }
        for (a, &b) in self.x.iter_mut().zip(x) {
            *a += b;
        }
        self.w += w;
        Ok(())
    }
}

wide! {
    /// `z = x / w`, each element divided in `f64` and rounded once.
    pub fn divide / divide_portable(x: &[f32], w: f64, z: &mut [f32]) {
        for (zi, &xi) in z.iter_mut().zip(x) {
            *zi = (xi as f64 / w) as f32;
        }
    }
}

wide! {
    /// `x = w * z`, each product in `f64` rounded once.
    pub fn multiply / multiply_portable(z: &[f32], w: f64, x: &mut [f32]) {
        for (xi, &zi) in x.iter_mut().zip(z) {
            *xi = (w * zi as f64) as f32;
        }
    }
}

wide! {
    /// `x *= p`, each product in `f64` rounded once.
    pub(crate) fn scale / scale_portable(x: &mut [f32], p: f64) {
        for xi in x.iter_mut() {
            *xi = (*xi as f64 * p) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_weight_one_and_debias_is_exact_there() {
        let x0 = vec![0.1f32, -3.7, 1e-30];
        let ps = PushSum::new(x0.clone());
        assert_eq!(ps.w, 1.0);
        assert_eq!(ps.debiased(), x0);
    }

    #[test]
    fn debias_and_set_debiased() {
        let mut ps = PushSum {
            x: vec![1.0, -2.0, 3.0],
            w: 0.5,
        };
        assert_eq!(ps.debiased(), vec![2.0, -4.0, 6.0]);
        let mut z = [0.0f32; 3];
        ps.debiased_into(&mut z);
        assert_eq!(z, [2.0, -4.0, 6.0]);
        ps.set_debiased(&[1.0, 1.5, -0.25]);
        assert_eq!(ps.x, vec![0.5, 0.75, -0.125]);
        assert_eq!(ps.w, 0.5);
        assert_eq!(ps.debiased(), vec![1.0, 1.5, -0.25]);
        ps.w = 3.0;
        ps.set_debiased(&[0.1, 0.2, 0.3]);
        let back = ps.debiased();
        for (b, z) in back.iter().zip([0.1f32, 0.2, 0.3]) {
            assert!((b - z).abs() <= 1e-7 * z.abs(), "{b} vs {z}");
        }
        ps.set_average(&[9.0, 8.0, 7.0]);
        assert_eq!((ps.x.as_slice(), ps.w), (&[9.0f32, 8.0, 7.0][..], 1.0));
    }

    #[test]
    fn shares_conserve_mass_and_debias_to_the_average() {
        // Two workers, worker 0 sends half its mass to worker 1.
        let mut a = PushSum::new(vec![2.0, 0.0]);
        let mut b = PushSum::new(vec![4.0, 8.0]);
        a.scale(0.5);
        let share = a.clone();
        b.add_share(&share.x, share.w).unwrap();
        assert_eq!(a.w + b.w, 2.0);
        assert_eq!([a.x[0] + b.x[0], a.x[1] + b.x[1]], [6.0, 8.0]);
        assert_eq!(a.debiased(), vec![2.0, 0.0]);
        // b holds (1 + 4, 0 + 8) with weight 1.5
        assert_eq!(b.debiased(), vec![5.0 / 1.5, 8.0 / 1.5]);
        assert!(b.add_share(&[1.0], 0.1).is_err());
        assert_eq!(b.w, 1.5);
    }
}
