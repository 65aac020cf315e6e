//! The in-memory all-reduce runs the ring written once for every transport:
//! it gives the bits of the reference summation order, and fails every rank
//! alike on bad input.

use std::time::{Duration, Instant};

use slowmo_gossip::memory::{MemoryComm, MemoryNetwork};
use slowmo_gossip::{
    CommError, Communicator, segment, sum_scalars_in_rank_order, sum_segment_in_ring_order,
    unit_weight_average, weighted_average,
};

fn on_all<T: Send>(m: usize, f: impl Fn(&mut MemoryComm) -> T + Sync) -> Vec<T> {
    let comms = MemoryNetwork::new(m, Duration::from_secs(30));
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                let f = &f;
                s.spawn(move || f(&mut c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `r`'s buffer: magnitudes far apart, so that another summation
/// order gives other bits, and some signed zeros.
fn contribution(r: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| match (i + r) % 5 {
            0 => -0.0,
            1 => 1e8 * (r as f32 + 1.0),
            2 => 0.1 / (i as f32 + r as f32 + 1.0),
            3 => -1e8 * (r as f32 + 1.0) + 0.3,
            _ => 1.0 / 3.0 * (i as f32 - r as f32),
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn the_ring_gives_the_bits_of_the_reference_order() {
    for m in 1..=7 {
        for n in [0, 1, 3, 7, 13, 101] {
            let inputs: Vec<Vec<f32>> = (0..m).map(|r| contribution(r, n)).collect();
            let scalars: Vec<f64> = (0..m).map(|r| 0.1 * (r as f64 + 1.0) / 3.0).collect();
            let views: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
            let mut want = vec![0f32; n];
            for j in 0..m {
                sum_segment_in_ring_order(&views, j, &mut want[segment(n, m, j)]);
            }
            let want_scalar = sum_scalars_in_rank_order(scalars.iter().copied());
            let got = on_all(m, |c| {
                let mut buf = inputs[c.rank()].clone();
                let mut scalar = scalars[c.rank()];
                c.all_reduce_sum(&mut buf, &mut scalar).unwrap();
                (buf, scalar)
            });
            for (rank, (buf, scalar)) in got.iter().enumerate() {
                assert_eq!(bits(buf), bits(&want), "m {m} n {n} rank {rank}");
                assert_eq!(scalar.to_bits(), want_scalar.to_bits(), "m {m} n {n}");
            }
        }
    }
}

#[test]
fn the_weighted_average_is_the_reference_sum_times_the_inverse_weight_sum() {
    let m = 3;
    let weights: Vec<f64> = (0..m).map(|r| 0.3 + 0.45 * r as f64).collect();
    let inv = (1.0 / sum_scalars_in_rank_order(weights.iter().copied())) as f32;
    // The direct schedule and the ring.
    for n in [1001, (1 << 20) + 5] {
        let inputs: Vec<Vec<f32>> = (0..m).map(|r| contribution(r, n)).collect();
        let views: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let mut want = vec![0f32; n];
        for j in 0..m {
            sum_segment_in_ring_order(&views, j, &mut want[segment(n, m, j)]);
        }
        want.iter_mut().for_each(|v| *v *= inv);
        let got = on_all(m, |c| {
            let (mut x, mut w) = (inputs[c.rank()].clone(), weights[c.rank()]);
            weighted_average(c, &mut x, &mut w).unwrap();
            (bits(&x), w)
        });
        for (rank, (x, w)) in got.iter().enumerate() {
            assert!(
                *x == bits(&want),
                "n {n}: rank {rank} differs from sum / weight"
            );
            assert_eq!(*w, 1.0);
        }
    }
}

#[test]
fn an_average_of_unit_weights_has_the_bits_of_the_weighted_one() {
    for (m, n) in [(1, 9), (3, 1001), (4, (1 << 20) + 3)] {
        let inputs: Vec<Vec<f32>> = (0..m).map(|r| contribution(r, n)).collect();
        let run = |unit: bool| {
            on_all(m, |c| {
                let (mut x, mut w) = (inputs[c.rank()].clone(), 1.0);
                match unit {
                    true => unit_weight_average(c, &mut x, &mut w).unwrap(),
                    false => weighted_average(c, &mut x, &mut w).unwrap(),
                }
                assert_eq!(w, 1.0);
                bits(&x)
            })
        };
        assert!(run(true) == run(false), "m {m} n {n}");
    }
    // A weight other than 1 is refused before anything is sent.
    let got = on_all(1, |c| {
        let (mut x, mut w) = (vec![1.0f32; 4], 0.5);
        unit_weight_average(c, &mut x, &mut w)
    });
    assert!(matches!(&got[0], Err(CommError::Misuse(_))), "{:?}", got[0]);
}

#[test]
fn signed_zeros_sum_as_in_the_reference() {
    // -0 + -0 is -0, -0 + 0 is 0: the ring must not start from a +0.
    let got = on_all(3, |c| {
        let mut buf = vec![-0.0f32, -0.0, if c.rank() == 1 { 0.0 } else { -0.0 }];
        c.all_reduce_sum(&mut buf, &mut 0.0).unwrap();
        bits(&buf)
    });
    for b in got {
        assert_eq!(b, bits(&[-0.0, -0.0, 0.0]));
    }
}

#[test]
fn buffers_of_different_lengths_fail_every_rank() {
    let got = on_all(3, |c| {
        let mut buf = vec![1.0f32; 4 + usize::from(c.rank() == 2)];
        c.all_reduce_sum(&mut buf, &mut 1.0)
    });
    for r in got {
        assert!(matches!(r, Err(CommError::ShapeMismatch { .. })), "{r:?}");
    }
}

#[test]
fn an_all_reduce_against_a_barrier_is_an_error_on_both() {
    let got = on_all(2, |c| {
        if c.rank() == 0 {
            c.barrier()
        } else {
            c.all_reduce_sum(&mut [1.0], &mut 1.0)
        }
    });
    for r in got {
        let err = r.unwrap_err();
        assert!(err.to_string().contains("different orders"), "{err}");
    }
}

#[test]
fn a_silent_neighbour_is_named_in_the_timeout() {
    let mut comms = MemoryNetwork::new(3, Duration::from_millis(200));
    let silent = comms.pop().unwrap();
    let got: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|mut c| s.spawn(move || c.all_reduce_sum(&mut [1.0; 6], &mut 1.0)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    drop(silent);
    for r in got {
        let text = r.unwrap_err().to_string();
        assert!(
            text.contains("worker-2") && text.contains("all-reduce"),
            "{text}"
        );
    }
}

/// How long the in-memory all-reduce takes: 8 workers, 200k floats, 200
/// times. A measurement, not a check (timings vary by machine): run it with
/// `cargo test -p slowmo-gossip --test all_reduce -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, run by hand"]
fn in_memory_all_reduce_speed() {
    let (m, n, reps) = (8, 200_000, 200);
    let started = Instant::now();
    on_all(m, |c| {
        let mut buf: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.01).collect();
        for _ in 0..reps {
            let mut w = 1.0;
            c.all_reduce_sum(&mut buf, &mut w).unwrap();
            let inv = 1.0 / w as f32;
            buf.iter_mut().for_each(|v| *v *= inv);
        }
    });
    let per = started.elapsed().as_secs_f64() * 1e3 / reps as f64;
    println!("{m} workers, {n} floats: {per:.3} ms per all-reduce");
}
