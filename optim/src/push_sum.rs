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
        debias_into(&self.x, self.w, z);
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

/// `z = x / w` ([`PushSum::debiased_into`] of a numerator and weight held
/// elsewhere, as in a checkpoint's state).
///
/// # Panics
/// If `z.len() != x.len()` (a bug in the caller).
pub fn debias_into(x: &[f32], w: f64, z: &mut [f32]) {
    assert_eq!(z.len(), x.len(), "debias_into: length");
    if w == 1.0 {
        z.copy_from_slice(x);
        return;
    }
    divide(x, w, z);
}

/// Elements [`divide`] takes a block at a time: one check per block.
const BLOCK: usize = 256;
/// Blocks [`divide`] may divide after all before it divides the rest.
const GIVE_UP: usize = 4;

/// How close (in units in the last place of an `f64`) the product
/// `x * (1 / w)` may come to a point where rounding to `f32` changes
/// before [`divide`] divides instead. The reciprocal, the product and the
/// `f64` quotient are each rounded once, each within half a unit of the
/// quotient's binade (a unit of the one below), so the product lies within
/// 3 units of the quotient; 8 leaves room.
const MARGIN: u64 = 8;

/// Nonzero when `q`, the product `x * (1 / w)` in `f64`, might round to
/// another `f32` than the quotient `x / w` does: its low 29 bits (the part
/// of an `f64`'s 52-bit fraction below an `f32`'s 23 bits) lie within
/// [`MARGIN`] of the half-way point where rounding to `f32` tips, or it is
/// below `f32`'s normal range (where the `f32` grid is coarser, and zero,
/// rare once training runs), or it is infinite or NaN.
#[inline(always)]
fn unclear(q: f64) -> u64 {
    let low = q.to_bits() & ((1 << 29) - 1);
    let tips = low.wrapping_sub((1 << 28) - MARGIN) <= 2 * MARGIN;
    // False for zero, f32's subnormal range, infinities and NaN.
    let normal = q.abs() >= f32::MIN_POSITIVE as f64 && q.abs() <= f64::MAX;
    (tips | !normal) as u64
}

/// `z = x / w`, each element divided in `f64` and rounded once to `f32`:
/// by [`divide_by_product`] where the CPU has 64-bit vector compares
/// (x86-64 with AVX2 or AVX-512, and other architectures), else by
/// [`divide_by_division`] (the baseline x86-64, where the product's checks
/// cost more than the division saves). The same bits either way.
pub fn divide(x: &[f32], w: f64, z: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if !std::arch::is_x86_feature_detected!("avx2") {
        return divide_by_division(x, w, z);
    }
    divide_by_product(x, w, z)
}

wide! {
    /// `z = x / w`, each element divided in `f64` and rounded once to `f32`,
    /// the division's bits from a product.
    ///
    /// A division per element is the slowest of the parameter loops (it
    /// runs every step once `w` is not 1), so the quotient is computed as
    /// `x * (1 / w)`, which is exact to within 3 units of the `f64`
    /// quotient, and that product is rounded to `f32`. The two round to
    /// the same `f32` unless the product lies within a few units of a point
    /// where the rounding tips (about 3 in 10^8 of elements); a block of
    /// [`BLOCK`] elements that holds one is divided after all. So the bits
    /// are those of the division (tested against it, and on quotients built
    /// to lie on those points).
    pub fn divide_by_product / divide_by_product_portable(x: &[f32], w: f64, z: &mut [f32]) {
        let r = 1.0 / w;
        let n = x.len().min(z.len());
        let (x, z) = (&x[..n], &mut z[..n]);
        let whole = if w.is_normal() && r.is_normal() { n - n % BLOCK } else { 0 };
        let mut divided = 0;
        for (k, (zb, xb)) in z[..whole]
            .chunks_exact_mut(BLOCK)
            .zip(x[..whole].chunks_exact(BLOCK))
            .enumerate()
        {
            if divided >= GIVE_UP {
                // A reciprocal whose products keep landing on the tipping
                // points (a `w` like 2/3, whose reciprocal has few bits):
                // the rest by division.
                divide_by_division_portable(&x[k * BLOCK..whole], w, &mut z[k * BLOCK..whole]);
                break;
            }
            let mut any = 0;
            for (zi, &xi) in zb.iter_mut().zip(xb) {
                let q = xi as f64 * r;
                any |= unclear(q);
                *zi = q as f32;
            }
            if any != 0 {
                divide_by_division_portable(xb, w, zb);
                divided += 1;
            }
        }
        divide_by_division_portable(&x[whole..], w, &mut z[whole..]);
    }
}

wide! {
    /// `z = x / w` by a division per element: what [`divide`] must equal.
    pub fn divide_by_division / divide_by_division_portable(x: &[f32], w: f64, z: &mut [f32]) {
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

    fn division(x: &[f32], w: f64) -> Vec<u32> {
        let mut z = vec![0.0; x.len()];
        divide_by_division_portable(x, w, &mut z);
        z.iter().map(|v| v.to_bits()).collect()
    }

    /// `divide` (dispatched and portable) against a division per element.
    fn assert_divides(x: &[f32], w: f64, what: &str) {
        let want = division(x, w);
        for (name, f) in [
            ("chosen", divide as fn(&[f32], f64, &mut [f32])),
            ("dispatched", divide_by_product),
            ("portable", divide_by_product_portable),
        ] {
            let mut z = vec![0.0; x.len()];
            f(x, w, &mut z);
            let got: Vec<u32> = z.iter().map(|v| v.to_bits()).collect();
            if let Some(i) = (0..x.len()).find(|&i| got[i] != want[i]) {
                panic!(
                    "{what}, {name}: {} / {w} gave {:e}, the division {:e}",
                    x[i],
                    f32::from_bits(got[i]),
                    f32::from_bits(want[i])
                );
            }
        }
    }

    #[test]
    fn divide_gives_the_bits_of_a_division_per_element() {
        let mut rng = crate::Rng::new(11);
        let n = 20 * BLOCK + 37;
        // Parameters of every size, and every kind of f32 bit pattern
        // (zeros, subnormals, infinities, NaNs, the largest values).
        let params: Vec<f32> = (0..n)
            .map(|_| ((rng.uniform() - 0.5) * 2.0f64.powi(rng.below(40) as i32 - 20)) as f32)
            .collect();
        let patterns: Vec<f32> = (0..n)
            .map(|_| f32::from_bits(rng.next_u64() as u32))
            .collect();
        let mut weights = vec![
            1.0,
            0.5,
            2.0,
            0.75,
            1.25,
            1.0 / 3.0,
            2.0 / 3.0,
            0.1,
            1e-30,
            1e30,
            f64::MIN_POSITIVE,
            5e-324,
            f64::MAX,
        ];
        weights.extend((0..40).map(|_| rng.uniform() * 4.0 + 1e-3));
        for w in weights {
            assert_divides(&params, w, "parameters");
            assert_divides(&patterns, w, "bit patterns");
        }
    }

    /// Elements whose quotient lies just past a point where rounding to
    /// `f32` tips, while `x * (1 / w)` lies at or before it, so that the
    /// product rounds the other way (pairs of `x` and `w` found by a
    /// search): in a few blocks they are divided (the blocks around them
    /// keep the product), and in many blocks the rest of the buffer is
    /// divided too. Either way the bits are the division's.
    #[test]
    fn quotients_at_a_tipping_point_are_divided() {
        let pairs: [(u32, u64); 10] = [
            (1066298694, 4611502707013379045),
            (1069673635, 4612952936275711727),
            (1072133671, 4614897653048841095),
            (1070061266, 4614188418181354240),
            (1067492696, 4607572517127302901),
            (1062079633, 4605517335380253801),
            // Quotients in f32's subnormal range, whose grid is coarser.
            (1069024433, 5179367599204753424),
            (1072150758, 5185929975627933598),
            (1063971418, 5181454838845249796),
            (1063378611, 5173652411461150262),
        ];
        let mut rng = crate::Rng::new(3);
        for (x_bits, w_bits) in pairs {
            let (tip, w) = (f32::from_bits(x_bits), f64::from_bits(w_bits));
            let product = (tip as f64 * (1.0 / w)) as f32;
            assert_ne!(product.to_bits(), division(&[tip], w)[0], "{tip} / {w}");
            let mut x: Vec<f32> = (0..8 * BLOCK)
                .map(|_| tip * (rng.uniform() * 2.0 + 0.5) as f32)
                .collect();
            for b in [1, 4, 6] {
                x[b * BLOCK + 17] = tip;
            }
            assert_divides(&x, w, "a few blocks");
            for b in 0..8 {
                x[b * BLOCK + 100] = tip;
            }
            assert_divides(&x, w, "every block");
        }
    }

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
