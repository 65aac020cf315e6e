//! The parameter loops dispatched by CPU features against their portable
//! bodies (the baseline x86-64 build): microseconds per call on the MLP's
//! 203 530 parameters and on 10M, median of 51 calls after a warm-up.
//! `cargo bench -p slowmo-optim`.

use std::hint::black_box;
use std::time::Instant;

use slowmo_optim::kernels::*;

fn median_us(mut f: impl FnMut()) -> f64 {
    for _ in 0..5 {
        f();
    }
    let mut t: Vec<f64> = (0..51)
        .map(|_| {
            let at = Instant::now();
            f();
            at.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    println!(
        "{:>10} {:>18} {:>12} {:>12} {:>8}",
        "floats", "loop", "portable us", "dispatched us", "speedup"
    );
    for n in [203_530usize, 10_000_000] {
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37 - 11.0) * 1e-3).collect();
        let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11 - 3.0) * 1e-4).collect();
        let mut z = vec![0f32; n];
        let mut buf = vec![0f32; n];
        let mut rows: Vec<(&str, f64, f64)> = Vec::new();
        // A push-sum weight, and one whose reciprocal (1.5) puts half the
        // products on a tipping point of the rounding (divided instead).
        for (w, quotient, division) in [
            (0.75, "x / w", "x / w by div"),
            (2.0 / 3.0, "x / (2/3)", "x / (2/3) by div"),
        ] {
            let a = median_us(|| divide_by_product_portable(black_box(&x), w, &mut z));
            let b = median_us(|| divide(black_box(&x), w, &mut z));
            rows.push((quotient, a, b));
            let a = median_us(|| divide_by_division_portable(black_box(&x), w, &mut z));
            let b = median_us(|| divide_by_division(black_box(&x), w, &mut z));
            rows.push((division, a, b));
        }
        let w = 0.75;
        let a = median_us(|| multiply_portable(black_box(&x), w, &mut z));
        let b = median_us(|| multiply(black_box(&x), w, &mut z));
        rows.push(("w * z", a, b));
        z.copy_from_slice(&x);
        let a = median_us(|| {
            sgd_momentum_portable(&mut z, black_box(&g), &mut buf, 0.01, 0.0, 0.9, false)
        });
        let b = median_us(|| sgd_momentum(&mut z, black_box(&g), &mut buf, 0.01, 0.0, 0.9, false));
        rows.push(("sgd momentum", a, b));
        for (name, a, b) in rows {
            println!("{n:>10} {name:>18} {a:>12.1} {b:>12.1} {:>7.2}x", a / b);
        }
    }
}
