//! Push-sum over libp2p against the in-memory reference.

use std::time::Duration;

use slowmo_gossip::compress::Compression;
use slowmo_gossip::memory::MemoryNetwork;
use slowmo_gossip::p2p::DataLane;
use slowmo_gossip::{Communicator, PushSumRound};
use slowmo_topologies::{DirectedExponential, Topology};

use crate::common::{floats, group, on_all, shutdown_all};

const N: usize = 1000;
const ROUNDS: u64 = 9;

/// Runs `ROUNDS` push-sum rounds over the exponential graph then drains;
/// returns (x, w) of this rank.
fn gossip(comm: &mut dyn Communicator, staleness: u64) -> (Vec<f32>, f64) {
    let m = comm.world_size();
    let graph = DirectedExponential::new(m).unwrap();
    let rank = comm.rank();
    let mut x = floats(rank as u64 + 1, N);
    let mut w = 1.0;
    for round in 0..ROUNDS {
        // A stand-in for the local step, different on every rank.
        for (i, v) in x.iter_mut().enumerate() {
            *v += 1e-3 * ((i + rank) % 7) as f32;
        }
        let out = graph.out_peers(rank, round);
        let inp = graph.in_peers(rank, round);
        let r = PushSumRound {
            round,
            out_peers: &out,
            in_peers: &inp,
            staleness,
        };
        comm.push_sum(&r, &mut x, &mut w).unwrap();
    }
    comm.drain(&mut x, &mut w).unwrap();
    (x, w)
}

fn reference(m: usize, staleness: u64) -> Vec<(Vec<f32>, f64)> {
    let handles: Vec<_> = MemoryNetwork::new(m, Duration::from_secs(10))
        .into_iter()
        .map(|mut c| std::thread::spawn(move || gossip(&mut c, staleness)))
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn sgp_over_libp2p_matches_the_memory_network() {
    let comms = group(4, N, |c| c);
    let (comms, got) = on_all(comms, |c| gossip(c, 0));
    let want = reference(4, 0);
    // Both add the shares in (round, sender) order once all have arrived:
    // the same bits, whatever order the network delivered them in.
    for (rank, ((x, w), (rx, rw))) in got.iter().zip(&want).enumerate() {
        assert_eq!(w.to_bits(), rw.to_bits(), "rank {rank}: w {w} vs {rw}");
        for (i, (a, b)) in x.iter().zip(rx).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "rank {rank} element {i}: {a} vs {b}"
            );
        }
    }
    let total_w: f64 = got.iter().map(|(_, w)| w).sum();
    assert!((total_w - 4.0).abs() < 1e-12, "sum of w {total_w}");
    for c in &comms {
        let s = c.stats();
        assert_eq!(s.messages_dropped, 0);
        assert_eq!(s.messages_sent, ROUNDS);
        assert_eq!(s.messages_received, ROUNDS);
        let mass = c.push_sum_mass();
        assert_eq!((mass.shares_sent, mass.shares_added), (ROUNDS, ROUNDS));
    }
    shutdown_all(comms);
}

#[test]
fn osgp_with_staleness_conserves_mass() {
    let comms = group(4, N, |c| c);
    let (comms, got) = on_all(comms, |c| gossip(c, 2));
    let want = reference(4, 2);
    let total_w: f64 = got.iter().map(|(_, w)| w).sum();
    assert!((total_w - 4.0).abs() < 1e-12, "sum of w {total_w}");
    // Sum of x depends only on the local steps, not on when shares landed.
    for i in (0..N).step_by(97) {
        let got_sum: f64 = got.iter().map(|(x, _)| x[i] as f64).sum();
        let want_sum: f64 = want.iter().map(|(x, _)| x[i] as f64).sum();
        assert!(
            (got_sum - want_sum).abs() < 1e-4,
            "element {i}: {got_sum} vs {want_sum}"
        );
    }
    shutdown_all(comms);
}

#[test]
fn a_run_of_one_needs_no_network() {
    let mut comms = group(1, 8, |c| c);
    let mut c = comms.pop().unwrap();
    assert_eq!((c.rank(), c.world_size()), (0, 1));
    let mut x = vec![2.0f32; 8];
    let mut w = 1.0;
    let r = PushSumRound {
        round: 0,
        out_peers: &[],
        in_peers: &[],
        staleness: 0,
    };
    c.push_sum(&r, &mut x, &mut w).unwrap();
    let mut s = 3.0;
    c.all_reduce_sum(&mut x, &mut s).unwrap();
    c.barrier().unwrap();
    assert_eq!((x, w, s), (vec![2.0f32; 8], 1.0, 3.0));
    assert_eq!(c.stats(), Default::default());
    c.shutdown();
}

/// Rounds with the given codec and staleness over the memory network.
fn compressed_reference(m: usize, codec: Compression, staleness: u64) -> Vec<(Vec<f32>, f64)> {
    let handles: Vec<_> = MemoryNetwork::new(m, Duration::from_secs(10))
        .into_iter()
        .map(|mut c| {
            c.set_compression(codec);
            std::thread::spawn(move || gossip(&mut c, staleness))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// The sum over ranks of element `i` of the starting values plus the
/// stand-in steps: what push-sum must conserve, compressed or not.
fn conserved(m: usize, i: usize) -> f64 {
    (0..m)
        .map(|rank| {
            let start = f64::from(floats(rank as u64 + 1, N)[i]);
            start + ROUNDS as f64 * f64::from(1e-3 * ((i + rank) % 7) as f32)
        })
        .sum()
}

#[test]
fn compressed_shares_keep_mass_exact_and_match_the_memory_network() {
    for (codec, lane) in [
        (Compression::Int8, DataLane::Encrypted),
        (Compression::TopK(0.05), DataLane::Encrypted),
        (Compression::Bf16, DataLane::Libp2p),
        (Compression::Int8, DataLane::Libp2p),
    ] {
        let comms = group(4, N, |c| c.with_compression(codec).with_data_lane(lane));
        let (comms, got) = on_all(comms, |c| gossip(c, 0));
        let want = compressed_reference(4, codec, 0);
        for (rank, ((x, w), (rx, rw))) in got.iter().zip(&want).enumerate() {
            assert_eq!(w.to_bits(), rw.to_bits(), "{codec} rank {rank}");
            let same = x.iter().zip(rx).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{codec} over {lane:?}: rank {rank} differs from memory"
            );
        }
        // The weights sum to m exactly, the numerators to what the steps
        // added, to rounding: the senders debited what receivers decoded.
        let total_w: f64 = got.iter().map(|(_, w)| w).sum();
        assert_eq!(total_w, 4.0, "{codec}: sum of w");
        for i in 0..N {
            let sum: f64 = got.iter().map(|(x, _)| f64::from(x[i])).sum();
            let want = conserved(4, i);
            assert!(
                (sum - want).abs() < 1e-5,
                "{codec} element {i}: {sum} vs {want}"
            );
        }
        // The wire carried the compressed size.
        let uncompressed = 4 * N as u64 * ROUNDS;
        for c in &comms {
            let s = c.stats();
            assert_eq!(s.messages_received, ROUNDS, "{codec}");
            let ratio = uncompressed as f64 / s.bytes_sent as f64;
            let least = match codec {
                Compression::Int8 => 2.5,
                Compression::TopK(_) => 5.0,
                _ => 1.5,
            };
            assert!(
                ratio > least,
                "{codec} over {lane:?}: {ratio:.2}x fewer bytes"
            );
        }
        shutdown_all(comms);
    }
}

#[test]
fn a_peer_with_another_codec_is_refused_naming_the_dtype() {
    // Node 0 sends int8, the others expect bf16: their shares never add.
    let codec = std::sync::atomic::AtomicUsize::new(0);
    let comms = group(2, N, |c| {
        let k = codec.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let c = c.with_peer_timeout(Duration::from_secs(3));
        if k == 0 {
            c.with_compression(Compression::Int8)
        } else {
            c.with_compression(Compression::Bf16)
        }
    });
    let (comms, got) = on_all(comms, |c| {
        let mut x = floats(1, N);
        let mut w = 1.0;
        let r = PushSumRound {
            round: 0,
            out_peers: &[1 - c.rank()],
            in_peers: &[1 - c.rank()],
            staleness: 0,
        };
        c.push_sum(&r, &mut x, &mut w).map(|_| ())
    });
    for r in &got {
        let e = r.as_ref().unwrap_err().to_string();
        assert!(e.contains("sent nothing") || e.contains("dtype"), "{e}");
    }
    let refused: u64 = comms.iter().map(|c| c.stats().messages_dropped).sum();
    assert!(refused >= 1, "no share was refused");
    shutdown_all(comms);
}
