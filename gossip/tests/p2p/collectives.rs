//! Typed small collectives over libp2p: exact u64 and f64 values on the
//! wire, the same bits as the in-memory network, clear errors on bad input.

use std::time::Duration;

use slowmo_gossip::compress::{Compression, compressed_average};
use slowmo_gossip::memory::MemoryNetwork;
use slowmo_gossip::{Communicator, ReduceOp};

use crate::common::{group, on_all, shutdown_all};

/// What one rank gets from a fixed sequence of typed collectives (errors as
/// their text).
type Outcome = Vec<Result<Vec<u64>, String>>;

fn input_f64(rank: usize) -> [f64; 3] {
    let sign = if rank.is_multiple_of(2) { 1.0 } else { -1.0 };
    [
        sign * (rank as f64 + 0.1) * 1e15,
        0.1 / (rank + 1) as f64,
        -0.0,
    ]
}

fn exercise(c: &mut dyn Communicator) -> Outcome {
    let r = c.rank() as u64;
    let mut out = Vec::new();
    let mut u64_op = |c: &mut dyn Communicator, mut v: Vec<u64>, op| {
        out.push(
            c.all_reduce_u64(&mut v, op)
                .map(|()| v)
                .map_err(|e| e.to_string()),
        )
    };
    u64_op(c, vec![u64::MAX - r, r, (1 << 53) + 1 + r], ReduceOp::Max);
    u64_op(c, vec![u64::MAX - r, r, (1 << 53) + 1 + r], ReduceOp::Min);
    let big = if r == 0 { u64::MAX - 100 } else { r };
    u64_op(c, vec![big, (1 << 53) + 1], ReduceOp::Sum);
    // Past the top, then lengths that differ: errors on every rank, and
    // the next collective still runs.
    u64_op(c, vec![u64::MAX / 2], ReduceOp::Sum);
    u64_op(c, vec![7; if r == 1 { 3 } else { 2 }], ReduceOp::Max);
    let mut f = input_f64(r as usize);
    out.push(
        c.all_reduce_f64(&mut f)
            .map(|()| f.iter().map(|v| v.to_bits()).collect())
            .map_err(|e| e.to_string()),
    );
    let mut nan = [if r == 2 { f64::INFINITY } else { 1.0 }];
    out.push(
        c.all_reduce_f64(&mut nan)
            .map(|()| vec![nan[0].to_bits()])
            .map_err(|e| e.to_string()),
    );
    // Rank r sends rank j (r + j) % 3 + 1 copies of 100 r + j.
    let blocks: Vec<Vec<u64>> = (0..c.world_size() as u64)
        .map(|j| vec![100 * r + j; ((r + j) % 3 + 1) as usize])
        .collect();
    out.push(
        c.exchange_u64(&blocks)
            .map(|got| got.concat())
            .map_err(|e| e.to_string()),
    );
    out
}

#[test]
fn typed_collectives_over_libp2p_are_exact_and_match_the_memory_network() {
    let m = 3;
    let comms = group(m, 4, |c| c);
    let (comms, got) = on_all(comms, |c| exercise(c));
    let memory: Vec<Outcome> = std::thread::scope(|s| {
        let hs: Vec<_> = MemoryNetwork::new(m, Duration::from_secs(30))
            .into_iter()
            .map(|mut c| s.spawn(move || exercise(&mut c)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, memory, "libp2p and in-memory results differ");
    for (rank, outcome) in got.iter().enumerate() {
        assert_eq!(outcome[..7], got[0][..7], "rank {rank} differs from rank 0");
    }
    let o = &got[0];
    assert_eq!(o[0], Ok(vec![u64::MAX, 2, (1 << 53) + 3]));
    assert_eq!(o[1], Ok(vec![u64::MAX - 2, 0, (1 << 53) + 1]));
    assert_eq!(o[2], Ok(vec![u64::MAX - 97, 3 * ((1 << 53) + 1)]));
    assert!(o[3].as_ref().unwrap_err().contains("exceeds u64::MAX"));
    assert!(
        o[4].as_ref()
            .unwrap_err()
            .contains("different numbers of values (by rank: 2, 3, 2)"),
        "{:?}",
        o[4]
    );
    let want: Vec<u64> = (0..3)
        .map(|i| {
            (1..m)
                .fold(input_f64(0)[i], |t, r| t + input_f64(r)[i])
                .to_bits()
        })
        .collect();
    assert_eq!(o[5], Ok(want), "f64 sums in rank order");
    let text = o[6].as_ref().unwrap_err();
    assert!(text.contains("rank 2") && text.contains("inf"), "{text}");
    // Each rank got what every rank addressed to it, in rank order.
    for (me, outcome) in got.iter().enumerate() {
        let me = me as u64;
        let want: Vec<u64> = (0..m as u64)
            .flat_map(|r| vec![100 * r + me; ((r + me) % 3 + 1) as usize])
            .collect();
        assert_eq!(outcome[7], Ok(want), "rank {me}'s exchange");
    }
    for c in &comms {
        assert_eq!(c.stats().messages_dropped, 0);
    }
    shutdown_all(comms);
}

/// The compressed average of `n` values around a shared anchor, from a
/// rank-dependent model: the bits of `x` and of the residual kept.
fn compressed(c: &mut dyn Communicator, codec: Compression, n: usize) -> (Vec<u32>, Vec<u32>) {
    let r = c.rank() as f32;
    let anchor: Vec<f32> = (0..n).map(|i| (i as f32 * 0.013).sin()).collect();
    let mut x: Vec<f32> = anchor
        .iter()
        .enumerate()
        .map(|(i, a)| a - 0.05 * ((i as f32 + 3.0 * r) * 0.29).cos())
        .collect();
    let (mut w, mut e) = (1.0, vec![0f32; n]);
    compressed_average(c, codec, &mut x, &mut w, &anchor, &mut e).unwrap();
    assert_eq!(w, 1.0);
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect();
    (bits(&x), bits(&e))
}

#[test]
fn compressed_averages_over_libp2p_are_the_memory_networks_bits() {
    let (m, n) = (4, 10_001);
    let comms = group(m, n, |c| c);
    let codecs = [
        Compression::Int8,
        Compression::Bf16,
        Compression::TopK(0.05),
    ];
    let (comms, got) = on_all(comms, move |c| {
        codecs.map(|codec| compressed(c, codec, n)).to_vec()
    });
    let memory: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = MemoryNetwork::new(m, Duration::from_secs(30))
            .into_iter()
            .map(|mut c| s.spawn(move || codecs.map(|codec| compressed(&mut c, codec, n)).to_vec()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (net, mem)) in got.iter().zip(&memory).enumerate() {
        for (k, codec) in codecs.iter().enumerate() {
            assert!(net[k] == mem[k], "{codec}: rank {rank} differs from memory");
            assert!(
                net[k].0 == got[0][k].0,
                "{codec}: rank {rank}'s x differs from rank 0's"
            );
        }
    }
    for c in &comms {
        assert_eq!(c.stats().messages_dropped, 0);
    }
    shutdown_all(comms);
}

#[test]
fn a_run_of_one_gathers_its_own_values() {
    let mut comms = group(1, 4, |c| c);
    let mut c = comms.pop().unwrap();
    let mut v = [u64::MAX, 3];
    c.all_reduce_u64(&mut v, ReduceOp::Sum).unwrap();
    let mut f = [0.25, -1e300];
    c.all_reduce_f64(&mut f).unwrap();
    assert_eq!((v, f), ([u64::MAX, 3], [0.25, -1e300]));
    c.shutdown();
}
