//! Joining: identity checks, the join timeout, silent peers, transports.

use std::thread;
use std::time::{Duration, Instant};

use slowmo_gossip::p2p::{P2pComm, RunIdentity};
use slowmo_gossip::{CommError, Communicator, PushSumRound};

use crate::common::{config, group, init_logs, on_all, shutdown_all};

#[test]
fn joiners_with_another_identity_are_refused_naming_the_field() {
    init_logs();
    let host = P2pComm::bind(config(2, 4)).unwrap();
    let boot = host.listen_addrs();
    let host = thread::spawn(move || host.join());
    type Change = fn(&mut RunIdentity);
    // Another run id is refused at admission: the joiner is told nothing.
    let cases: [(&str, Change); 3] = [
        ("admission", |r| r.run_id = "another-run".into()),
        ("config hash", |r| r.config_hash = "deadbeef".into()),
        ("init hash", |r| r.init_hash = "0ther".into()),
    ];
    for (field, change) in cases {
        let mut cfg = config(2, 4).with_bootstrap(boot.clone());
        change(&mut cfg.run);
        let started = Instant::now();
        match P2pComm::start(cfg) {
            Err(CommError::Refused {
                field: f,
                peer,
                reason,
            }) => {
                assert_eq!(f, field, "{reason}");
                assert!(!peer.is_empty());
                // A refusal by the host carries none of its values. (When
                // both greet at once, the joiner may instead refuse the
                // host's hello, which an admitted peer sees by design; its
                // own log then names both values.)
                if reason.contains("refused us") {
                    for value in ["test-run", "c0ffee", "5eed"] {
                        assert!(!reason.contains(value), "{reason}");
                    }
                }
            }
            Err(other) => panic!("expected a refusal naming {field}, got: {other}"),
            Ok(_) => panic!("a joiner with a different {field} was accepted"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "refusal took {:?}",
            started.elapsed()
        );
    }
    // The host is still waiting and takes a proper peer.
    let good = P2pComm::start(config(2, 4).with_bootstrap(boot)).unwrap();
    let host = host.join().unwrap().unwrap();
    assert_eq!(host.members(), good.members());
    shutdown_all(vec![host, good]);
}

#[test]
fn join_timeout_lists_who_is_present_and_how_many_are_missing() {
    init_logs();
    let short = |c: slowmo_gossip::p2p::P2pConfig| c.with_join_timeout(Duration::from_secs(3));
    let first = P2pComm::bind(short(config(3, 4))).unwrap();
    let first_id = first.local_peer_id();
    let boot = first.listen_addrs();
    let a = thread::spawn(move || first.join());
    let second = P2pComm::start(short(config(3, 4)).with_bootstrap(boot));
    for result in [a.join().unwrap(), second] {
        match result {
            Err(CommError::JoinTimeout {
                present,
                missing,
                nodes,
                ..
            }) => {
                assert_eq!((present.len(), missing, nodes), (2, 1, 3));
                assert!(present.contains(&first_id));
            }
            Err(other) => panic!("expected a join timeout, got: {other}"),
            Ok(_) => panic!("a run of 3 started with 2 peers"),
        }
    }
}

#[test]
fn a_silent_peer_times_out_by_name_rank_round_and_operation() {
    let comms = group(2, 16, |c| c.with_peer_timeout(Duration::from_secs(1)));
    let mut it = comms.into_iter();
    let (mut a, b) = (it.next().unwrap(), it.next().unwrap());
    let mut x = vec![1.0f32; 16];
    let mut w = 1.0;
    let r = PushSumRound {
        round: 3,
        out_peers: &[],
        in_peers: &[1],
        staleness: 0,
    };
    match a.push_sum(&r, &mut x, &mut w) {
        Err(CommError::PeerTimeout {
            peer,
            rank,
            round,
            operation,
            ..
        }) => {
            assert_eq!(
                (peer, rank, round, operation),
                (b.local_peer_id(), 1, 3, "push-sum")
            );
        }
        other => panic!("expected a peer timeout, got {other:?}"),
    }
    match a.all_reduce_sum(&mut x, &mut w) {
        Err(CommError::PeerTimeout {
            peer, operation, ..
        }) => {
            assert_eq!((peer, operation), (b.local_peer_id(), "all-reduce"));
        }
        other => panic!("expected a peer timeout, got {other:?}"),
    }
    shutdown_all(vec![a, b]);
}

fn all_reduce_works(listen: &[&str]) {
    let listen: Vec<String> = listen.iter().map(|s| s.to_string()).collect();
    let comms = group(3, 1000, move |c| c.with_listen(listen.clone()));
    for c in &comms {
        assert!(!c.listen_addrs().is_empty());
    }
    let (comms, got) = on_all(comms, |c| {
        let mut buf = vec![c.rank() as f32 + 1.0; 1000];
        let mut s = 0.0;
        c.all_reduce_sum(&mut buf, &mut s).unwrap();
        buf
    });
    for buf in got {
        assert!(buf.iter().all(|v| *v == 6.0));
    }
    shutdown_all(comms);
}

#[test]
fn tcp_only_nodes_work() {
    all_reduce_works(&["/ip4/127.0.0.1/tcp/0"]);
}

#[test]
fn quic_only_nodes_work() {
    all_reduce_works(&["/ip4/127.0.0.1/udp/0/quic-v1"]);
}

#[test]
fn the_identity_file_keeps_the_peer_id() {
    init_logs();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys").join("node.key");
    let first = P2pComm::start(config(1, 4).with_identity_file(&path)).unwrap();
    let id = first.local_peer_id();
    first.shutdown();
    let second = P2pComm::start(config(1, 4).with_identity_file(&path)).unwrap();
    assert_eq!(second.local_peer_id(), id);
    second.shutdown();
}
