//! Typed small collectives over the in-memory communicator: exact integers
//! near `u64::MAX`, `f64` sums in rank order, and clear errors for bad input.

use std::time::Duration;

use slowmo_gossip::memory::{MemoryComm, MemoryNetwork};
use slowmo_gossip::{CommError, Communicator, ReduceOp};

/// Runs `f` on every rank of a network of `m`, results in rank order.
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

#[test]
fn u64_max_min_and_sum_are_exact_near_the_top() {
    let m = 4;
    let got = on_all(m, |c| {
        let r = c.rank() as u64;
        let mine = [u64::MAX - r, r, (1 << 53) + 1 + r];
        let mut max = mine;
        c.all_reduce_u64(&mut max, ReduceOp::Max).unwrap();
        let mut min = mine;
        c.all_reduce_u64(&mut min, ReduceOp::Min).unwrap();
        let mut sum = [if r == 0 { u64::MAX - 100 } else { r }, (1 << 53) + 1];
        c.all_reduce_u64(&mut sum, ReduceOp::Sum).unwrap();
        (max, min, sum)
    });
    for (max, min, sum) in got {
        assert_eq!(max, [u64::MAX, 3, (1 << 53) + 4]);
        assert_eq!(min, [u64::MAX - 3, 0, (1 << 53) + 1]);
        assert_eq!(sum, [u64::MAX - 94, 4 * ((1 << 53) + 1)]);
    }
}

#[test]
fn a_u64_sum_past_the_top_fails_on_every_rank() {
    let got = on_all(3, |c| c.all_reduce_u64(&mut [u64::MAX / 2], ReduceOp::Sum));
    for r in got {
        let text = r.unwrap_err().to_string();
        assert!(text.contains("exceeds u64::MAX"), "{text}");
    }
}

#[test]
fn f64_sums_are_bit_identical_and_in_rank_order() {
    let m = 5;
    let input = |r: usize| {
        [
            (r as f64 + 0.1) * 1e15 * if r.is_multiple_of(2) { 1.0 } else { -1.0 },
            0.1 / (r + 1) as f64,
        ]
    };
    let got = on_all(m, |c| {
        let mut v = input(c.rank());
        c.all_reduce_f64(&mut v).unwrap();
        v
    });
    for i in 0..2 {
        let want = (1..m).fold(input(0)[i], |t, r| t + input(r)[i]);
        for (rank, v) in got.iter().enumerate() {
            assert_eq!(v[i].to_bits(), want.to_bits(), "rank {rank} element {i}");
        }
    }
}

#[test]
fn bad_contributions_fail_every_rank_and_the_collectives_stay_in_step() {
    let got = on_all(3, |c| {
        let r = c.rank();
        let mut values = vec![1u64; if r == 1 { 3 } else { 2 }];
        let lengths = c.all_reduce_u64(&mut values, ReduceOp::Max);
        let mut f = [if r == 2 { f64::NAN } else { 1.0 }];
        let nan = c.all_reduce_f64(&mut f);
        let mut after = [r as u64];
        c.all_reduce_u64(&mut after, ReduceOp::Sum).unwrap();
        (lengths, nan, after)
    });
    for (lengths, nan, after) in got {
        let text = lengths.unwrap_err().to_string();
        assert!(
            text.contains("different numbers of values (by rank: 2, 3, 2)"),
            "{text}"
        );
        let text = nan.unwrap_err().to_string();
        assert!(text.contains("rank 2") && text.contains("NaN"), "{text}");
        assert_eq!(after, [3]);
    }
}

#[test]
fn collectives_called_in_different_orders_are_an_error() {
    let got = on_all(2, |c| {
        if c.rank() == 0 {
            c.barrier()
        } else {
            c.all_reduce_u64(&mut [1], ReduceOp::Max)
        }
    });
    for r in got {
        let err = r.unwrap_err();
        assert!(
            matches!(&err, CommError::Protocol(t) if t.contains("different orders")),
            "{err}"
        );
    }
}
