//! A member that speaks our protocols by hand sends bad frames: each is
//! dropped, counted, and the victim keeps working.

use std::time::{Duration, Instant};

use slowmo_gossip::p2p::P2pComm;
use slowmo_gossip::p2p::wire::{
    ALL_REDUCE_PROTOCOL, DType, Header, Kind, PUSH_SUM_PROTOCOL, WIRE_VERSION, checksum,
    encode_header, f32_to_bytes,
};
use slowmo_gossip::{Communicator, PushSumRound};

use crate::common::{group, on_all, run_identity, shutdown_all};

const N: usize = 32;

fn header(sender: &str, len: u64, payload: &[u8]) -> Header {
    Header {
        version: WIRE_VERSION,
        run_id: run_identity().run_id,
        view: 0,
        sender: sender.into(),
        round: 0,
        kind: Kind::PushSum,
        dtype: DType::F32,
        len,
        weight: 0.5,
        checksum: checksum(payload),
        step: 0,
        offset: 0,
        total: len,
    }
}

fn frame(h: &Header, payload: &[u8]) -> Vec<u8> {
    let mut out = encode_header(h);
    out.extend_from_slice(payload);
    out
}

fn wait_for_drops(victim: &P2pComm, want: u64) {
    let until = Instant::now() + Duration::from_secs(10);
    while victim.stats().messages_dropped < want {
        assert!(
            Instant::now() < until,
            "dropped {} messages, expected {want}",
            victim.stats().messages_dropped
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        victim.stats().messages_dropped,
        want,
        "one drop per bad frame"
    );
}

#[test]
fn bad_frames_are_dropped_counted_and_the_node_keeps_working() {
    let comms = group(2, N, |c| c);
    let (victim, attacker) = (&comms[0], &comms[1]);
    let to = victim.local_peer_id();
    let me = attacker.local_peer_id();
    let good = f32_to_bytes(&[1.0f32; N]);

    let mut bad: Vec<(&str, &str, Vec<u8>)> = Vec::new();
    bad.push((
        "malformed header",
        PUSH_SUM_PROTOCOL,
        b"\x05\x00\x00\x00hello world".to_vec(),
    ));
    let mut h = header(&me, 1 << 40, &good);
    h.total = 1 << 40;
    bad.push((
        "oversized announced length",
        PUSH_SUM_PROTOCOL,
        frame(&h, &good),
    ));
    let short = f32_to_bytes(&[1.0f32; N - 1]);
    bad.push((
        "wrong shape",
        PUSH_SUM_PROTOCOL,
        frame(&header(&me, N as u64 - 1, &short), &short),
    ));
    let mut nan = vec![1.0f32; N];
    nan[5] = f32::NAN;
    let nan = f32_to_bytes(&nan);
    bad.push((
        "NaN payload",
        PUSH_SUM_PROTOCOL,
        frame(&header(&me, N as u64, &nan), &nan),
    ));
    bad.push((
        "truncated payload",
        PUSH_SUM_PROTOCOL,
        frame(&header(&me, N as u64, &good), &good[..40]),
    ));
    let mut h = header(&me, N as u64, &good);
    h.run_id = "another-run".into();
    bad.push(("wrong run id", PUSH_SUM_PROTOCOL, frame(&h, &good)));
    let mut h = header(&me, N as u64, &good);
    h.checksum ^= 1;
    bad.push(("bad checksum", PUSH_SUM_PROTOCOL, frame(&h, &good)));
    bad.push((
        "spoofed sender",
        PUSH_SUM_PROTOCOL,
        frame(&header(&to, N as u64, &good), &good),
    ));
    let mut h = header(&me, N as u64, &good);
    h.version = 99;
    bad.push(("future version", PUSH_SUM_PROTOCOL, frame(&h, &good)));
    bad.push((
        "push-sum kind on the all-reduce protocol",
        ALL_REDUCE_PROTOCOL,
        frame(&header(&me, N as u64, &good), &good),
    ));
    let words: Vec<u8> = [1u64, u64::MAX]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let gather = |dtype, origin, total| Header {
        kind: Kind::Gather,
        dtype,
        offset: origin,
        total,
        weight: 0.0,
        ..header(&me, 2, &words)
    };
    bad.push((
        "gather block of f32",
        ALL_REDUCE_PROTOCOL,
        frame(&gather(DType::F32, 1, 2), &words),
    ));
    bad.push((
        "gather block of a rank outside the view",
        ALL_REDUCE_PROTOCOL,
        frame(&gather(DType::U64, 2, 2), &words),
    ));
    bad.push((
        "gather block on the push-sum protocol",
        PUSH_SUM_PROTOCOL,
        frame(&gather(DType::U64, 1, 2), &words),
    ));

    for (k, (what, protocol, bytes)) in bad.iter().enumerate() {
        attacker
            .send_raw(&to, protocol, bytes)
            .unwrap_or_else(|e| panic!("sending the {what} frame: {e}"));
        wait_for_drops(victim, k as u64 + 1);
    }
    assert_eq!(
        victim.stats().messages_received,
        0,
        "no bad frame was taken"
    );

    // Both still gossip and reduce correctly.
    let (comms, got) = on_all(comms, |c| {
        let mut x = vec![c.rank() as f32 * 2.0; N];
        let mut w = 1.0;
        let other = [1 - c.rank()];
        let r = PushSumRound {
            round: 0,
            out_peers: &other,
            in_peers: &other,
            staleness: 0,
        };
        c.push_sum(&r, &mut x, &mut w).unwrap();
        let mut s = w;
        c.all_reduce_sum(&mut x, &mut s).unwrap();
        (x[0], w, s)
    });
    for (x, w, s) in got {
        assert_eq!((x, w, s), (2.0, 1.0, 2.0));
    }
    assert_eq!(comms[0].stats().messages_dropped, bad.len() as u64);
    shutdown_all(comms);
}

/// A bare libp2p peer (no membership handshake) that opens our push-sum
/// protocol and sends a well-formed share: refused as a non-member.
#[test]
fn frames_from_a_peer_outside_the_view_are_dropped() {
    use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};

    let mut comms = group(1, N, |c| c);
    let victim = comms.pop().unwrap();
    let victim_id: libp2p::PeerId = victim.local_peer_id().parse().unwrap();
    let addr: libp2p::Multiaddr = victim.listen_addrs()[0].parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut swarm = libp2p::SwarmBuilder::with_new_identity()
            .with_tokio()
            .with_tcp(
                Default::default(),
                libp2p::noise::Config::new,
                libp2p::yamux::Config::default,
            )
            .unwrap()
            .with_quic()
            .with_behaviour(|_| libp2p_stream::Behaviour::new())
            .unwrap()
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(30)))
            .build();
        let me = swarm.local_peer_id().to_string();
        let mut control = swarm.behaviour().new_control();
        swarm.dial(addr).unwrap();
        tokio::spawn(async move { while swarm.next().await.is_some() {} });
        let good = f32_to_bytes(&[1.0f32; N]);
        let bytes = frame(&header(&me, N as u64, &good), &good);
        let mut s = control
            .open_stream(victim_id, libp2p::StreamProtocol::new(PUSH_SUM_PROTOCOL))
            .await
            .unwrap();
        let mut ready = [0u8; 1];
        s.read_exact(&mut ready).await.unwrap();
        s.write_all(&bytes).await.unwrap();
        s.close().await.unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut ready)).await;
    });
    wait_for_drops(&victim, 1);
    assert_eq!(victim.stats().messages_received, 0);
    victim.shutdown();
}
