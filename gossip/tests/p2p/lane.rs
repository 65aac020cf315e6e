//! The data lane: both modes carry shares and all-reduces bit for bit as
//! libp2p streams do, and connections that do not prove the lane's key are
//! refused, counted, and leave the node working.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use slowmo_gossip::p2p::{DataLane, P2pComm};
use slowmo_gossip::{Communicator, PushSumRound};

use crate::common::{group, on_all, shutdown_all};

const N: usize = 300_000;

fn values(rank: usize) -> Vec<f32> {
    (0..N)
        .map(|i| ((i * 7 + rank * 13) % 101) as f32 * 0.37 - 11.0)
        .collect()
}

/// Two push-sum rounds on a ring of 3 (one out-peer, then two: a factor
/// of 1/3 rounds) and one all-reduce; the results.
fn exchange(lane: DataLane) -> Vec<(Vec<u32>, f64, Vec<f32>, f64)> {
    let comms = group(3, N, |c| c.with_data_lane(lane).with_lane_connections(3));
    let (comms, out) = on_all(comms, |c| {
        let r = c.rank();
        let (right, left) = ((r + 1) % 3, (r + 2) % 3);
        let mut x = values(r);
        let mut w = 1.0;
        let round = PushSumRound {
            round: 0,
            out_peers: &[right],
            in_peers: &[left],
            staleness: 0,
        };
        c.push_sum(&round, &mut x, &mut w).expect("push-sum");
        let round = PushSumRound {
            round: 1,
            out_peers: &[right, left],
            in_peers: &[left, right],
            staleness: 0,
        };
        c.push_sum(&round, &mut x, &mut w).expect("push-sum");
        let x: Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
        let mut y = values(r + 5);
        let mut s = r as f64 + 0.5;
        c.all_reduce_sum(&mut y, &mut s).expect("all-reduce");
        (x, w, y, s)
    });
    shutdown_all(comms);
    out
}

#[test]
fn both_lane_modes_give_the_bits_of_libp2p_streams() {
    let reference = exchange(DataLane::Libp2p);
    for lane in [DataLane::Encrypted, DataLane::Plaintext] {
        let got = exchange(lane);
        for (rank, (a, b)) in reference.iter().zip(&got).enumerate() {
            assert!(a.0 == b.0 && a.1 == b.1, "{lane}: push-sum of rank {rank}");
            assert!(
                a.2.iter()
                    .map(|v| v.to_bits())
                    .eq(b.2.iter().map(|v| v.to_bits()))
                    && a.3 == b.3,
                "{lane}: all-reduce of rank {rank}"
            );
        }
    }
}

/// Ring all-reduces on 3 ranks whose segments go in several chunks, some
/// cut in two parts; per rank the bits, and the parts that landed in place.
fn rings(lane: DataLane) -> (Vec<Vec<u32>>, u64) {
    let comms = group(3, N, |c| {
        let mut c = c
            .with_data_lane(lane)
            .with_lane_connections(2)
            .with_chunk_floats(70_000);
        c.direct_max_bytes = 0;
        c
    });
    let (comms, out) = on_all(comms, |c| {
        let mut bits = Vec::new();
        for k in 0..4 {
            let mut y = values(c.rank() + 3 * k);
            let mut s = c.rank() as f64 + 0.5;
            c.all_reduce_sum(&mut y, &mut s).expect("all-reduce");
            bits.extend(y.iter().map(|v| v.to_bits()));
            bits.extend([s.to_bits() as u32, (s.to_bits() >> 32) as u32]);
        }
        (bits, c.stats().parts_landed)
    });
    shutdown_all(comms);
    let landed = out.iter().map(|o| o.1).sum();
    (out.into_iter().map(|o| o.0).collect(), landed)
}

#[test]
fn ring_parts_land_in_the_buffer_with_the_bits_of_libp2p_streams() {
    let (reference, none) = rings(DataLane::Libp2p);
    assert_eq!(none, 0, "libp2p streams land nothing");
    for (rank, bits) in reference.iter().enumerate() {
        assert!(*bits == reference[0], "rank {rank} differs from rank 0");
    }
    for lane in [DataLane::Encrypted, DataLane::Plaintext] {
        let (got, landed) = rings(lane);
        assert!(got == reference, "{lane}: the bits differ from libp2p's");
        // 4 collectives, 3 ranks, 4 steps of 2 chunks (3 parts) each: most
        // parts arrive while their ring waits for them.
        assert!(landed > 0, "{lane}: no part landed in place");
    }
}

fn wait_for_drops(victim: &P2pComm, want: u64) {
    let until = Instant::now() + Duration::from_secs(20);
    while victim.stats().messages_dropped < want {
        assert!(
            Instant::now() < until,
            "dropped {} connections, expected {want}",
            victim.stats().messages_dropped
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn connections_without_the_key_are_refused_and_the_node_keeps_working() {
    let comms = group(2, 1000, |c| c.with_data_lane(DataLane::Encrypted));
    let victim = &comms[0];
    let addr = victim.lane_addrs()[0].clone();
    // Garbage, a truncated hello, and a well-formed hello for a session
    // nobody offered.
    let mut hello = b"SLOWLANE".to_vec();
    hello.extend_from_slice(&[1, 1, 0, 0]);
    hello.extend_from_slice(&[0xab; 16 + 16 + 32]);
    let knocks: [&[u8]; 3] = [b"GET / HTTP/1.1\r\n\r\n", b"SLOWLANE\x01", &hello];
    for (i, knock) in knocks.iter().enumerate() {
        let mut s = TcpStream::connect(&addr).expect("connect to the lane");
        s.write_all(knock).expect("write");
        s.shutdown(std::net::Shutdown::Write).expect("half-close");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        assert!(answer.is_empty(), "knock {i} got an answer: {answer:?}");
        wait_for_drops(victim, i as u64 + 1);
    }
    let (comms, sums) = on_all(comms, |c| {
        let mut x = vec![c.rank() as f32 + 1.0; 1000];
        let mut s = 1.0;
        c.all_reduce_sum(&mut x, &mut s)
            .expect("all-reduce after the knocks");
        (x[999], s)
    });
    assert_eq!(sums, vec![(3.0, 2.0), (3.0, 2.0)]);
    shutdown_all(comms);
}

/// 24 nodes on the exponential graph: lanes go to a node's graph and ring
/// neighbours only (whatever the view's size), each node's lane connections
/// stay within the budget, and a message to a peer outside them still
/// arrives over a lane set up on demand.
#[test]
fn lanes_go_to_the_graph_neighbours_only() {
    use slowmo_gossip::p2p::LanePeers;
    use slowmo_topologies::{GraphSpec, Topology};
    const M: usize = 24;
    const FLOATS: usize = 1000;
    let graph: GraphSpec = "exponential".parse().unwrap();
    let neighbours = move |rank: usize, world: usize| {
        slowmo_topologies::build(&graph, world)
            .unwrap()
            .neighbours(rank)
    };
    let peers = neighbours.clone();
    let comms = group(M, FLOATS, move |mut c| {
        c.lane_peers = Some(LanePeers(std::sync::Arc::new(peers.clone())));
        c.with_lane_connections(4)
    });
    let topo: std::sync::Arc<dyn Topology> =
        slowmo_topologies::build(&"exponential".parse().unwrap(), M)
            .unwrap()
            .into();
    let (comms, out) = on_all(comms, move |c| {
        let r = c.rank();
        let mut x = vec![r as f32; FLOATS];
        let mut w = 1.0;
        for t in 0..topo.period() {
            let (o, i) = (topo.out_peers(r, t), topo.in_peers(r, t));
            let round = PushSumRound {
                round: t,
                out_peers: &o,
                in_peers: &i,
                staleness: 0,
            };
            c.push_sum(&round, &mut x, &mut w).expect("push-sum");
        }
        let mut y = vec![1.0f32; 5 * FLOATS];
        let mut s = 1.0;
        c.all_reduce_sum(&mut y, &mut s).expect("all-reduce");
        assert_eq!(s, M as f64);
        // Off the graph: rank r sends to r + M/2, which is no neighbour of
        // it for M = 24 (12 is not a power of two), over an on-demand lane.
        let far = (r + M / 2) % M;
        let back = (r + M / 2) % M;
        let round = PushSumRound {
            round: topo.period(),
            out_peers: &[far],
            in_peers: &[back],
            staleness: 0,
        };
        c.push_sum(&round, &mut x, &mut w)
            .expect("push-sum off the graph");
        (r, c.lane_connections())
    });
    shutdown_all(comms);
    // Each end dials the view's lane budget over its lane set (the graph's
    // neighbours and the ring's), at most the configured 4 per peer: a
    // function of the view, the same whichever end offered first.
    let per_peer = |r: usize| {
        let mut set = neighbours(r, M);
        set.extend([(r + 1) % M, (r + M - 1) % M]);
        set.sort_unstable();
        set.dedup();
        set.retain(|p| *p != r);
        (slowmo_gossip::p2p::lane::LANE_CONNECTION_BUDGET / set.len()).clamp(1, 4)
    };
    for (r, lanes) in out {
        let mut allowed = neighbours(r, M);
        allowed.extend([(r + 1) % M, (r + M - 1) % M, (r + M / 2) % M]);
        for (peer, n) in &lanes {
            assert!(
                allowed.contains(peer),
                "rank {r} has a lane to rank {peer}, no neighbour"
            );
            assert!(
                *n <= per_peer(r) + per_peer(*peer),
                "rank {r}: {n} connections to rank {peer}, where the two ends dial {} and {}",
                per_peer(r),
                per_peer(*peer)
            );
        }
        assert!(lanes.len() <= allowed.len(), "rank {r}: {lanes:?}");
        let total: usize = lanes.iter().map(|(_, n)| n).sum();
        // Each end dials at most its budget over the view's lanes, plus at
        // most the configured 4 on the on-demand lane.
        assert!(
            total <= 2 * (slowmo_gossip::p2p::lane::LANE_CONNECTION_BUDGET + 4),
            "rank {r}: {total} lane connections {lanes:?}"
        );
    }
}
