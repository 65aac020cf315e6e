//! The simulated network: arrivals from the seed, link serialisation, loss,
//! faults, and the clock board's answers under real threads.

use std::sync::Arc;
use std::time::Duration;

use slowmo_gossip::simnet::{
    ClockBoard, Delivery, Message, MessageKey, MessageKind, NetworkProfile, SimNetwork,
};

fn network(text: &str, size: usize, seed: u64) -> SimNetwork {
    SimNetwork::new(&NetworkProfile::from_toml(text).unwrap(), size, seed).unwrap()
}

fn share(to: usize, seq: u64, bytes: u64) -> Message {
    Message {
        to,
        kind: MessageKind::Share,
        seq,
        bytes,
    }
}

/// Arrival times of `count` shares 0 -> 1, one per 10 ms of virtual time.
fn arrivals(net: &SimNetwork, count: u64) -> Vec<Option<f64>> {
    let mut out = net.out_links(0);
    (0..count)
        .map(|k| out.send(share(1, k, 1000), k as f64 * 0.01, k).arrival())
        .collect()
}

const JITTERY: &str = r#"
    compute_ms = 1
    [default]
    delay = "20ms"
    jitter = "5ms"
    rate = "1gbit"
"#;

#[test]
fn same_seed_same_arrivals_other_seed_other_jitter() {
    let a = arrivals(&network(JITTERY, 2, 7), 50);
    assert_eq!(a, arrivals(&network(JITTERY, 2, 7), 50));
    let b = arrivals(&network(JITTERY, 2, 8), 50);
    assert!(a.iter().zip(&b).filter(|(x, y)| x != y).count() > 40);
    // Every arrival lies in the jitter band around send + transmission + delay.
    for (k, t) in a.iter().enumerate() {
        let latency = t.unwrap() - k as f64 * 0.01 - 8000.0 / 1e9;
        assert!(
            (0.015 - 1e-12..=0.025 + 1e-12).contains(&latency),
            "{latency}"
        );
    }
}

#[test]
fn arrivals_do_not_depend_on_other_senders_or_other_messages_jitter() {
    let net = network(JITTERY, 3, 1);
    let mut out = net.out_links(0);
    // Sending to node 2 in between (another link) changes nothing on 0 -> 1.
    let mixed: Vec<_> = (0..20)
        .map(|k| {
            out.send(share(2, k, 1000), k as f64 * 0.01, k);
            out.send(share(1, k, 1000), k as f64 * 0.01, k).arrival()
        })
        .collect();
    assert_eq!(mixed, arrivals(&net, 20));
    // Another sender's out-links are its own.
    let mut other = net.out_links(2);
    other.send(share(1, 0, 1_000_000), 0.0, 0);
    assert_eq!(arrivals(&net, 20), mixed);
}

#[test]
fn a_20mbit_link_delivers_a_megabyte_share_about_0_4_s_later_and_serialises() {
    let net = network(
        "compute_ms = 1\n[link.\"0->1\"]\ndelay = \"10ms\"\nrate = \"20mbit\"",
        2,
        3,
    );
    let mut out = net.out_links(0);
    let transmission = 1e6 * 8.0 / 20e6;
    let first = out.send(share(1, 0, 1_000_000), 1.0, 0).arrival().unwrap();
    assert!(
        (first - (1.0 + transmission + 0.01)).abs() < 1e-9,
        "{first}"
    );
    assert!((0.4..0.42).contains(&(first - 1.0)));
    // A second share sent at once waits for the first to leave the link.
    let second = out.send(share(1, 1, 1_000_000), 1.0, 1).arrival().unwrap();
    assert!((second - first - transmission).abs() < 1e-9, "{second}");
    // The reverse link is unlimited and undelayed: only the floor latency.
    let mut back = net.out_links(1);
    let t = back.send(share(0, 0, 1_000_000), 1.0, 0).arrival().unwrap();
    assert!(t > 1.0 && t - 1.0 < 1e-5, "{t}");
}

#[test]
fn loss_drops_about_the_configured_fraction() {
    let net = network("compute_ms = 1\n[default]\nloss = 0.2", 2, 11);
    let sent = 20_000;
    let lost = arrivals(&net, sent).iter().filter(|a| a.is_none()).count() as f64;
    // Binomial(20000, 0.2): standard deviation about 57 messages.
    assert!((lost - 4000.0).abs() < 300.0, "{lost}");
}

#[test]
fn step_times_follow_slowdown_and_pauses() {
    let net = network(
        "compute_ms = 2\n[node.1]\ncpu_slowdown = 3\n[[fault]]\nkind = \"pause\"\nnode = 1\nat_step = 4\nsteps = 10",
        3,
        0,
    );
    assert!((net.step_time(0, 4) - 0.002).abs() < 1e-15);
    assert!((net.step_time(1, 3) - 0.006).abs() < 1e-15);
    assert!((net.step_time(1, 4) - 0.066).abs() < 1e-12);
    assert!((net.step_time(1, 5) - 0.006).abs() < 1e-15);
    assert_eq!(net.pause_time(0, 4), 0.0);
}

#[test]
fn crash_and_partition_windows() {
    let net = network(
        r#"
        compute_ms = 1
        [[fault]]
        kind = "crash"
        node = 2
        at_step = 10
        [[fault]]
        kind = "partition"
        groups = [[0, 1]]
        from_step = 20
        to_step = 30
        "#,
        4,
        0,
    );
    assert!(!net.is_crashed(2, 9) && net.is_crashed(2, 10) && net.is_crashed(2, 500));
    assert!(!net.is_crashed(1, 10));
    assert!(!net.partitioned(0, 3, 19) && net.partitioned(0, 3, 20) && net.partitioned(1, 3, 29));
    assert!(!net.partitioned(0, 3, 30));
    assert!(!net.partitioned(0, 1, 25) && !net.partitioned(3, 2, 25));
    let mut from0 = net.out_links(0);
    assert!(from0.send(share(2, 9, 8), 0.0, 9).arrival().is_some());
    assert_eq!(
        from0.send(share(2, 10, 8), 0.0, 10),
        Delivery::ReceiverCrashed
    );
    assert_eq!(from0.send(share(3, 25, 8), 0.0, 25), Delivery::Partitioned);
    assert!(from0.send(share(1, 25, 8), 0.0, 25).arrival().is_some());
    let mut from2 = net.out_links(2);
    assert_eq!(
        from2.send(share(0, 10, 8), 0.0, 10),
        Delivery::SenderCrashed
    );
}

/// What one worker saw: per query, the share asked about, the asker's clock
/// and the answer; then its final clock.
type Log = (Vec<(MessageKey, f64, bool)>, f64);

const STEPS: u64 = 60;
const STALENESS: u64 = 3;

/// A small push-sum-like run: each worker steps, sends a share to its two
/// successors, waits for shares `STALENESS` rounds old, and takes newer ones
/// that have arrived by its clock, each costing it a little time. Real-time
/// sleeps, different per `shuffle`, vary how the threads interleave.
fn board_run(net: &SimNetwork, shuffle: u64) -> (Vec<Log>, Vec<(MessageKey, Option<f64>)>) {
    let n = net.world_size();
    let board = Arc::new(net.clock_board(Duration::from_secs(30)));
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (net, board) = (net.clone(), board.clone());
            std::thread::spawn(move || {
                let mut out = net.out_links(rank);
                let mut queries = Vec::new();
                let mut sent = Vec::new();
                let mut pending: Vec<MessageKey> = Vec::new();
                for step in 0..STEPS {
                    if net.is_crashed(rank, step) {
                        break;
                    }
                    let nap = (rank as u64 * 7 + step * 13 + shuffle * 29) % 5;
                    std::thread::sleep(Duration::from_micros(nap * 150));
                    board.advance(rank, board.clock(rank) + net.step_time(rank, step));
                    for hop in [1, 2] {
                        let message = share((rank + hop) % n, step, 40_000);
                        let arrival = board.send(&mut out, message, step).arrival();
                        sent.push((key(rank, message), arrival));
                        let from = (rank + n - hop) % n;
                        pending.push(MessageKey {
                            from,
                            to: rank,
                            kind: MessageKind::Share,
                            seq: step,
                        });
                    }
                    let mut kept = Vec::new();
                    for k in pending.drain(..) {
                        let arrived = if k.seq + STALENESS <= step {
                            board.wait_arrival(k).unwrap();
                            true
                        } else {
                            let arrived = board.arrived_by(k).unwrap();
                            queries.push((k, board.clock(rank), arrived));
                            arrived
                        };
                        if arrived {
                            board.advance(rank, board.clock(rank) + 1e-4);
                        } else {
                            kept.push(k);
                        }
                    }
                    pending = kept;
                }
                board.finish(rank);
                ((queries, board.clock(rank)), sent)
            })
        })
        .collect();
    let mut logs = Vec::new();
    let mut sent = Vec::new();
    for h in handles {
        let (log, s) = h.join().unwrap();
        logs.push(log);
        sent.extend(s);
    }
    (logs, sent)
}

fn key(from: usize, m: Message) -> MessageKey {
    MessageKey {
        from,
        to: m.to,
        kind: m.kind,
        seq: m.seq,
    }
}

#[test]
fn the_clock_board_answers_the_same_under_any_thread_schedule() {
    let net = network(
        r#"
        compute_ms = 1
        [default]
        delay = "1ms"
        jitter = "0.8ms"
        rate = "400mbit"
        loss = 0.05
        [node.1]
        cpu_slowdown = 3
        [link."2->3"]
        delay = "4ms"
        [[fault]]
        kind = "crash"
        node = 4
        at_step = 40
        "#,
        5,
        42,
    );
    let (first, sent) = board_run(&net, 0);
    // Each answer is what the arrival times say, whatever the schedule was.
    let arrival: std::collections::HashMap<_, _> = sent.into_iter().collect();
    let answers: Vec<_> = first.iter().flat_map(|(q, _)| q.iter()).collect();
    for (k, clock, arrived) in &answers {
        let truth = arrival
            .get(k)
            .copied()
            .flatten()
            .is_some_and(|a| a <= *clock);
        assert_eq!(*arrived, truth, "{k:?} at {clock}");
    }
    let yes = answers.iter().filter(|(_, _, a)| *a).count();
    assert!(
        yes > 20 && answers.len() - yes > 20,
        "{yes} of {}",
        answers.len()
    );
    for shuffle in 1..4 {
        assert_eq!(board_run(&net, shuffle).0, first, "shuffle {shuffle}");
    }
}

#[test]
fn a_board_wait_for_a_slow_sender_ends_when_it_posts_or_passes_the_time() {
    let net = network("compute_ms = 1\n[default]\ndelay = \"1ms\"", 2, 0);
    let board = Arc::new(net.clock_board(Duration::from_secs(30)));
    board.advance(1, 0.0105);
    let sender = {
        let (net, board) = (net.clone(), board.clone());
        std::thread::spawn(move || {
            let mut out = net.out_links(0);
            for step in 0..20 {
                std::thread::sleep(Duration::from_millis(2));
                board.advance(0, (step + 1) as f64 * 1e-3);
                if step == 8 {
                    board.send(&mut out, share(1, 8, 8), step);
                }
            }
            board.finish(0);
        })
    };
    let k = |seq| MessageKey {
        from: 0,
        to: 1,
        kind: MessageKind::Share,
        seq,
    };
    // Sent at 9 ms, arrives at 10 ms: by 10.5 ms.
    assert!(board.arrived_by(k(8)).unwrap());
    // Never sent: "no" once the sender's clock + 1 ms passes 10.5 ms.
    assert!(!board.arrived_by(k(9)).unwrap());
    assert!(board.clock(0) > 0.0095 - 1e-12);
    // Waiting for a share the sender finished without: resumes at its final
    // clock plus the lookahead.
    assert_eq!(board.wait_arrival(k(30)).unwrap(), None);
    sender.join().unwrap();
    assert!((board.clock(1) - 0.021).abs() < 1e-9, "{}", board.clock(1));
}

#[test]
fn a_board_wait_times_out_naming_the_silent_sender() {
    let board = ClockBoard::new(2, |_, _| 1e-3, Duration::from_millis(50));
    board.advance(1, 1.0);
    let k = MessageKey {
        from: 0,
        to: 1,
        kind: MessageKind::Collective,
        seq: 3,
    };
    let err = board.arrived_by(k).unwrap_err();
    assert_eq!((err.waiting, err.key), (1, k));
    assert!(
        err.to_string()
            .contains("collective message 3 from worker 0"),
        "{err}"
    );
    let comm: slowmo_gossip::CommError = err.into();
    assert!(comm.to_string().contains("worker-0"), "{comm}");
    assert!(board.wait_arrival(k).is_err());
}

#[test]
fn a_worker_blocked_on_a_message_promises_no_earlier_send() {
    // Worker 1 blocks until worker 0's share arrives; worker 0, ahead in
    // virtual time, asks about a share from worker 1. Worker 1 cannot send
    // before 0's share reaches it, so the answer is "no" at once, not a wait
    // for worker 1 (which waits for worker 0: a deadlock).
    let board = Arc::new(ClockBoard::new(2, |_, _| 1e-3, Duration::from_secs(30)));
    board.advance(0, 0.5);
    let to_1 = MessageKey {
        from: 0,
        to: 1,
        kind: MessageKind::Share,
        seq: 0,
    };
    let to_0 = MessageKey {
        from: 1,
        to: 0,
        kind: MessageKind::Share,
        seq: 0,
    };
    let blocked = {
        let board = board.clone();
        std::thread::spawn(move || board.wait_arrival(to_1).unwrap())
    };
    assert!(!board.arrived_by(to_0).unwrap());
    board.post(to_1, 0.5, Some(0.7));
    assert_eq!(blocked.join().unwrap(), Some(0.7));
    assert_eq!(board.clock(1), 0.7);
}
