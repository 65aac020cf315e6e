//! All-reduce over the network: exact sums, identical bits on every rank,
//! whichever schedule.

use slowmo_gossip::p2p::DataLane;
use slowmo_gossip::{Communicator, DIRECT_MAX_BYTES, Schedule};

use crate::common::{floats, group, on_all, shutdown_all};

/// All-reduces a rank-specific buffer of `n` floats on a group of `m`
/// (chunks of 7 floats so that segments span several messages) and checks
/// the result against the exact sum and across ranks.
fn check(m: usize, n: usize) {
    let comms = group(m, n.max(1), |c| c.with_chunk_floats(7));
    let (comms, got) = on_all(comms, move |c| {
        let mut buf = floats(c.rank() as u64 + 11, n);
        let mut scalar = 0.5 + c.rank() as f64;
        c.all_reduce_sum(&mut buf, &mut scalar).unwrap();
        c.barrier().unwrap();
        (buf, scalar)
    });
    for i in 0..n {
        let exact: f64 = (0..m).map(|r| floats(r as u64 + 11, n)[i] as f64).sum();
        assert!(
            (got[0].0[i] as f64 - exact).abs() < 1e-5,
            "m={m} n={n} element {i}: {} vs {exact}",
            got[0].0[i]
        );
    }
    let exact_scalar: f64 = (0..m).map(|r| 0.5 + r as f64).sum();
    for (rank, (buf, scalar)) in got.iter().enumerate() {
        assert_eq!(*scalar, exact_scalar, "rank {rank} scalar");
        let same = buf
            .iter()
            .zip(&got[0].0)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "rank {rank} differs in bits from rank 0 (m={m}, n={n})"
        );
    }
    shutdown_all(comms);
}

#[test]
fn all_reduce_on_four_ranks_is_exact_and_bit_identical() {
    check(4, 1003);
}

#[test]
fn all_reduce_on_three_ranks_with_uneven_and_tiny_buffers() {
    check(3, 100);
    check(3, 2);
}

#[test]
fn repeated_all_reduces_stay_in_step() {
    let comms = group(3, 64, |c| c.with_chunk_floats(16));
    let (comms, got) = on_all(comms, |c| {
        let mut out = Vec::new();
        for k in 0..5 {
            let mut buf = vec![(c.rank() + k) as f32; 64];
            let mut s = 1.0;
            c.all_reduce_sum(&mut buf, &mut s).unwrap();
            out.push((buf[0], buf[63], s));
        }
        out
    });
    for per_rank in &got {
        for (k, (a, b, s)) in per_rank.iter().enumerate() {
            let want = (3 * k + 3) as f32;
            assert_eq!((*a, *b, *s), (want, want, 3.0));
        }
    }
    shutdown_all(comms);
}

/// Per rank, the bits of a sequence of collectives on 4 nodes: small
/// all-reduces (direct unless `direct_max_bytes` is 0), large ones (always
/// the ring: a segment takes several messages) and a gather between them.
fn mixed_sequence(lane: DataLane, direct_max_bytes: usize) -> Vec<Vec<(Vec<u32>, u64)>> {
    let comms = group(4, 5000, |c| {
        let mut c = c.with_data_lane(lane).with_chunk_floats(300);
        c.direct_max_bytes = direct_max_bytes;
        c
    });
    let (comms, got) = on_all(comms, |c| {
        let mut out = Vec::new();
        for k in 0..6u64 {
            let n = if k % 2 == 0 { 1003 } else { 5000 };
            let mut buf = floats(c.rank() as u64 * 7 + k, n);
            let mut scalar = 0.25 + c.rank() as f64 * 1e-3 + k as f64;
            if k >= 4 {
                // Scaled in the all-reduce: the bits of the sum, then the pass.
                let (mut sum, mut sum_scalar) = (buf.clone(), scalar);
                c.all_reduce_sum(&mut sum, &mut sum_scalar).unwrap();
                let factor = 1.0 / 3.0;
                c.all_reduce_sum_scaled(&mut buf, &mut scalar, factor)
                    .unwrap();
                assert_eq!(scalar.to_bits(), sum_scalar.to_bits());
                let want = sum.iter().map(|v| (v * factor).to_bits());
                assert!(want.eq(buf.iter().map(|v| v.to_bits())), "k {k}");
            } else {
                c.all_reduce_sum(&mut buf, &mut scalar).unwrap();
            }
            out.push((buf.iter().map(|v| v.to_bits()).collect(), scalar.to_bits()));
            let all = c.all_gather_u64(&[c.rank() as u64, k]).unwrap();
            assert_eq!(all.len(), 4);
        }
        out
    });
    shutdown_all(comms);
    got
}

#[test]
fn direct_and_ring_schedules_give_the_same_bits_back_to_back() {
    let config = |direct| {
        let mut c = slowmo_gossip::p2p::P2pConfig::new(
            slowmo_gossip::p2p::RunIdentity {
                run_id: "x".into(),
                config_hash: "x".into(),
                init_hash: "x".into(),
            },
            4,
            5000,
        )
        .with_chunk_floats(300);
        c.direct_max_bytes = direct;
        c
    };
    // The sizes take the schedules this test means.
    assert_eq!(config(DIRECT_MAX_BYTES).schedule(1003, 4), Schedule::Direct);
    assert_eq!(config(DIRECT_MAX_BYTES).schedule(5000, 4), Schedule::Ring);
    assert_eq!(config(0).schedule(1003, 4), Schedule::Ring);
    let ring_only = mixed_sequence(DataLane::Encrypted, 0);
    for (rank, r) in ring_only.iter().enumerate() {
        assert_eq!(
            *r, ring_only[0],
            "rank {rank} differs from rank 0 (ring only)"
        );
    }
    for lane in [DataLane::Encrypted, DataLane::Libp2p] {
        let mixed = mixed_sequence(lane, DIRECT_MAX_BYTES);
        for (rank, r) in mixed.iter().enumerate() {
            assert_eq!(
                *r, ring_only[0],
                "{lane:?}: rank {rank} differs from the ring's bits"
            );
        }
    }
}
