//! Loops over the parameters compiled for the widest vector unit the CPU
//! has, chosen at run time (x86-64: AVX-512F, then AVX2, else the baseline
//! SSE2 every x86-64 has), so one portable binary runs them at the machine's
//! speed. A release build targets the baseline, where an `f64` division
//! takes two values at a time; AVX-512 takes eight.
//!
//! The bits do not depend on the width. Every operation in these loops is
//! an IEEE add, multiply, divide, square root or conversion, each rounded
//! once, at any width; Rust never fuses a multiply and an add into one
//! rounding (a target feature that has FMA does not change that), and no
//! flush-to-zero mode is set. So a node on an AVX-512 machine and one on
//! an older CPU, the simulator and the network, compute the same bits. The
//! tests hold each dispatched loop to its portable body, bit for bit.

/// Defines `$name` running `$body` compiled for the best vector unit found
/// at run time, and `$portable`, the same body compiled for the baseline.
macro_rules! wide {
    ($(#[$m:meta])* $vis:vis fn $name:ident / $portable:ident ($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        /// The portable body of the dispatched loop of the same name.
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        $vis fn $portable($($arg: $ty),*) $body

        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) {
                    $portable($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) {
                    $portable($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F (checked above).
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2 (checked above).
                    return unsafe { avx2($($arg),*) };
                }
            }
            $portable($($arg),*)
        }
    };
}

pub(crate) use wide;

#[cfg(test)]
mod tests {
    use crate::optimizer::{
        Moments, adam, adam_portable, sgd, sgd_momentum, sgd_momentum_portable, sgd_portable,
    };
    use crate::push_sum::{
        divide_by_product, divide_by_product_portable, multiply, multiply_portable, scale,
        scale_portable,
    };
    use crate::slowmo::{
        Outer, outer, outer_portable, outer_without_gamma, outer_without_gamma_portable,
    };

    /// Values of every kind a loop meets: normal of all magnitudes, both
    /// zeros, subnormals, and ones whose products and quotients round.
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match i % 7 {
                    0 => 0.0,
                    1 => -0.0,
                    2 => f32::from_bits((s as u32) & 0x807f_ffff), // subnormal
                    3 => f32::from_bits((s as u32 & 0x8fff_ffff) | 0x3000_0000),
                    _ => ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.7,
                }
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn every_dispatched_loop_gives_the_bits_of_its_portable_body() {
        // Odd lengths: the vector loops' tails too.
        for n in [1, 7, 17, 1023, 4099] {
            let x = values(n as u64, n);
            let g = values(n as u64 + 1, n);
            for w in [2.0 / 3.0, 0.1, 3.0, 1e-30, 0.5] {
                let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
                divide_by_product(&x, w, &mut a);
                divide_by_product_portable(&x, w, &mut b);
                assert_eq!(bits(&a), bits(&b), "divide n {n} w {w}");
                multiply(&x, w, &mut a);
                multiply_portable(&x, w, &mut b);
                assert_eq!(bits(&a), bits(&b), "multiply n {n} w {w}");
                let (mut a, mut b) = (x.clone(), x.clone());
                scale(&mut a, w);
                scale_portable(&mut b, w);
                assert_eq!(bits(&a), bits(&b), "scale n {n} w {w}");
            }
            for (k, (alpha, beta)) in [(1.0, 0.0), (1.0, 0.5), (0.7, 0.6)].into_iter().enumerate() {
                let anchor = values(n as u64 + 2, n);
                for nesterov in [false, true] {
                    let c = Outer {
                        alpha,
                        beta,
                        gamma: 0.013,
                        nesterov,
                        identity: k == 0,
                    };
                    let (mut a, mut b) = (x.clone(), x.clone());
                    let (mut ua, mut ub) = (g.clone(), g.clone());
                    outer(&mut a, &anchor, &mut ua, c);
                    outer_portable(&mut b, &anchor, &mut ub, c);
                    assert_eq!(bits(&a), bits(&b), "outer n {n} k {k}");
                    assert_eq!(bits(&ua), bits(&ub), "outer momentum n {n} k {k}");
                    outer_without_gamma(&mut a, &anchor, &mut ua, alpha, beta, k == 0);
                    outer_without_gamma_portable(&mut b, &anchor, &mut ub, alpha, beta, k == 0);
                    assert_eq!(bits(&a), bits(&b), "outer without gamma n {n} k {k}");
                    assert_eq!(bits(&ua), bits(&ub), "outer momentum without gamma n {n}");
                }
            }
            for (lr, wd) in [(0.1f32, 0.0f32), (0.013, 1e-4)] {
                let (mut a, mut b) = (x.clone(), x.clone());
                sgd(&mut a, &g, lr, wd);
                sgd_portable(&mut b, &g, lr, wd);
                assert_eq!(bits(&a), bits(&b), "sgd n {n}");
                for nesterov in [false, true] {
                    let (mut a, mut b) = (x.clone(), x.clone());
                    let (mut ma, mut mb) = (g.clone(), g.clone());
                    for _ in 0..3 {
                        sgd_momentum(&mut a, &g, &mut ma, lr, wd, 0.9, nesterov);
                        sgd_momentum_portable(&mut b, &g, &mut mb, lr, wd, 0.9, nesterov);
                    }
                    assert_eq!(bits(&a), bits(&b), "momentum n {n} nesterov {nesterov}");
                    assert_eq!(bits(&ma), bits(&mb), "momentum buffer n {n}");
                }
                for decoupled in [false, true] {
                    let k = Moments {
                        b1: 0.9,
                        b2: 0.999,
                        eps: 1e-8,
                        wd,
                        decoupled,
                        decay: 1.0 - lr * wd,
                        step_size: lr / 0.1,
                        bc2_sqrt: 0.0316,
                    };
                    let (mut a, mut b) = (x.clone(), x.clone());
                    let (mut ma, mut mb) = (vec![0.0; n], vec![0.0; n]);
                    let (mut va, mut vb) = (vec![0.0; n], vec![0.0; n]);
                    for _ in 0..3 {
                        adam(&mut a, &g, &mut ma, &mut va, k);
                        adam_portable(&mut b, &g, &mut mb, &mut vb, k);
                    }
                    assert_eq!(bits(&a), bits(&b), "adam n {n} decoupled {decoupled}");
                    assert_eq!(bits(&va), bits(&vb), "adam second moment n {n}");
                }
            }
        }
    }
}
