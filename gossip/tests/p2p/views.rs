//! View changes between real nodes: a lost member is left out and the
//! others go on; a restarted member is admitted again with the state.

use std::thread;
use std::time::{Duration, Instant};

use slowmo_gossip::p2p::{DataLane, P2pComm, P2pConfig};
use slowmo_gossip::{Communicator, ViewChange};

use super::common::{config, init_logs, shutdown_all};

const PAYLOAD: usize = 64;

fn cfg_for(dir: &std::path::Path, i: usize, nodes: usize) -> P2pConfig {
    cfg_with(dir, i, nodes, DataLane::default())
}

fn cfg_with(dir: &std::path::Path, i: usize, nodes: usize, lane: DataLane) -> P2pConfig {
    let mut cfg = config(nodes, PAYLOAD)
        .with_identity_file(dir.join(format!("node{i}.key")))
        .with_peer_timeout(Duration::from_secs(4))
        .with_data_lane(lane);
    cfg.listen = vec!["/ip4/127.0.0.1/tcp/0".into()];
    cfg
}

/// Starts `n` nodes with identity files in `dir`; returns them by rank and
/// the bootstrap addresses of the first.
fn start(dir: &std::path::Path, n: usize) -> (Vec<(usize, P2pComm)>, Vec<String>) {
    start_with(dir, n, DataLane::default())
}

fn start_with(
    dir: &std::path::Path,
    n: usize,
    lane: DataLane,
) -> (Vec<(usize, P2pComm)>, Vec<String>) {
    init_logs();
    let first = P2pComm::bind(cfg_with(dir, 0, n, lane)).expect("bind node 0");
    let boot = first.listen_addrs();
    let mut handles = vec![thread::spawn(move || (0, first.join()))];
    for i in 1..n {
        let cfg = cfg_with(dir, i, n, lane).with_bootstrap(boot.clone());
        handles.push(thread::spawn(move || (i, P2pComm::start(cfg))));
    }
    let mut comms: Vec<(usize, P2pComm)> = handles
        .into_iter()
        .map(|h| {
            let (i, c) = h.join().expect("join thread");
            (i, c.expect("node joins"))
        })
        .collect();
    comms.sort_by_key(|(_, c)| c.rank());
    (comms, boot)
}

/// Sums `rank + 1` over the view, changing the view whenever an operation
/// says it must; returns the sum and the last change.
fn sum_through_changes(c: &mut P2pComm, last_barrier: u64) -> (f32, Option<ViewChange>) {
    let mut change = None;
    for _ in 0..4 {
        let mut buf = vec![(c.rank() + 1) as f32; PAYLOAD];
        let mut w = 1.0;
        match c.all_reduce_sum(&mut buf, &mut w) {
            Ok(()) => return (buf[0], change),
            Err(e) if e.needs_view_change() => {
                change = Some(c.change_view(last_barrier).expect("view change"));
            }
            Err(e) => panic!("all-reduce failed without a view change: {e}"),
        }
    }
    panic!("no working view after four changes");
}

/// The data lane (the default) and libp2p streams both follow the change.
#[test]
fn a_lost_member_is_left_out_and_the_others_go_on() {
    for lane in [DataLane::Encrypted, DataLane::Libp2p] {
        lost_member_left_out(lane);
    }
}

fn lost_member_left_out(lane: DataLane) {
    let dir = tempfile::tempdir().unwrap();
    let (mut comms, _) = start_with(dir.path(), 4, lane);
    let lost = comms.pop().unwrap().1;
    let lost_id = lost.local_peer_id();
    // A crash: no goodbye, the connections just close.
    drop(lost);
    let started = Instant::now();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|(_, mut c)| {
            thread::spawn(move || {
                let out = sum_through_changes(&mut c, 7);
                (c, out)
            })
        })
        .collect();
    let mut survivors = Vec::new();
    for h in handles {
        let (c, (sum, change)) = h.join().unwrap();
        let Some(ViewChange::Member(view)) = change else {
            panic!("expected a new view, got {change:?}");
        };
        assert_eq!(view.number, 1);
        assert_eq!(view.world, 3);
        assert_eq!(view.lost, vec![lost_id.clone()]);
        assert_eq!(view.rollback_to, 7);
        assert!(view.joined.is_empty());
        assert_eq!(c.world_size(), 3);
        assert!(!c.members().contains(&lost_id));
        // 1 + 2 + 3 over the three live ranks.
        assert_eq!(sum, 6.0);
        survivors.push(c);
    }
    // Closed connections are noticed at once, not after the peer timeout.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{lane}: view change took {:?}",
        started.elapsed()
    );
    shutdown_all(survivors);
}

#[test]
fn a_restarted_member_is_admitted_again_with_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let (mut comms, _) = start(dir.path(), 3);
    let (index, lost) = comms.pop().unwrap();
    let lost_id = lost.local_peer_id();
    drop(lost);
    // The survivors change to a view of two.
    let handles: Vec<_> = comms
        .into_iter()
        .map(|(_, mut c)| {
            thread::spawn(move || {
                let (sum, _) = sum_through_changes(&mut c, 3);
                assert_eq!(sum, 3.0);
                c
            })
        })
        .collect();
    let survivors: Vec<P2pComm> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(survivors.iter().all(|c| c.world_size() == 2));

    // The same identity comes back: it finds the run under way without it.
    // (Through a survivor: the lost node may have been the first one.)
    let boot = survivors[0].listen_addrs();
    let cfg = cfg_for(dir.path(), index, 3).with_bootstrap(boot);
    let joiner = thread::spawn(move || {
        let mut c = P2pComm::start(cfg).expect("the restart binds and finds the run");
        assert!(!c.is_member(), "a restart must not take its old place");
        let admission = c.rejoin().expect("admitted");
        let mut buf = vec![(c.rank() + 1) as f32; PAYLOAD];
        let mut w = 1.0;
        c.all_reduce_sum(&mut buf, &mut w)
            .expect("all-reduce in the new view");
        (c, admission, buf[0])
    });
    let handles: Vec<_> = survivors
        .into_iter()
        .map(|mut c| {
            thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(20);
                // The member that heard the request turns true; its report
                // makes the other's wait end with "the view is changing".
                loop {
                    match c.at_barrier(5) {
                        Ok(true) => break,
                        Err(e) if e.needs_view_change() => break,
                        Ok(false) => {}
                        Err(e) => panic!("at barrier: {e}"),
                    }
                    assert!(Instant::now() < until, "the joiner never asked");
                    thread::sleep(Duration::from_millis(50));
                }
                let ViewChange::Member(view) = c.change_view(5).expect("change") else {
                    panic!("a survivor was excluded");
                };
                if view.sends_state {
                    c.send_state(b"the training state").expect("state sent");
                }
                let mut buf = vec![(c.rank() + 1) as f32; PAYLOAD];
                let mut w = 1.0;
                c.all_reduce_sum(&mut buf, &mut w).expect("all-reduce");
                (c, view, buf[0])
            })
        })
        .collect();
    let mut comms = Vec::new();
    let mut views = Vec::new();
    let mut senders = 0;
    for h in handles {
        let (c, view, sum) = h.join().unwrap();
        views.push(view.clone());
        assert_eq!(view.world, 3);
        assert_eq!(view.joined, vec![lost_id.clone()]);
        assert_eq!(view.rollback_to, 5);
        senders += usize::from(view.sends_state);
        assert_eq!(sum, 6.0);
        comms.push(c);
    }
    assert_eq!(senders, 1, "exactly one member hands the state over");
    let (c, admission, sum) = joiner.join().unwrap();
    assert_eq!(admission.state, b"the training state");
    assert_eq!(admission.view.world, 3);
    assert_eq!(admission.view.rank, 2);
    assert!(!admission.view.sends_state);
    // The rule both transports share: survivors in their old order, then
    // the joiner; rank 0 sends the state.
    assert_eq!(admission.view.members.last(), Some(&lost_id));
    assert_eq!(admission.view.state_sender, Some(0));
    for v in &views {
        assert_eq!(
            v.members, admission.view.members,
            "one view on every member"
        );
        assert_eq!(v.state_sender, Some(0));
    }
    assert_eq!(sum, 6.0);
    comms.push(c);
    shutdown_all(comms);
}

#[test]
fn an_outsider_cannot_take_part_without_being_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let (comms, boot) = start(dir.path(), 2);
    // A third node of the same run finds the run under way and stays out
    // until admitted: its shares go nowhere.
    let cfg = cfg_for(dir.path(), 9, 2).with_bootstrap(boot);
    let mut outsider = P2pComm::start(cfg).expect("binds");
    assert!(!outsider.is_member());
    let mut buf = vec![1.0f32; PAYLOAD];
    let mut w = 1.0;
    let err = outsider.all_reduce_sum(&mut buf, &mut w).unwrap_err();
    assert!(err.to_string().contains("outside the run"), "{err}");
    assert_eq!(buf[0], 1.0);
    assert!(matches!(
        outsider.change_view(0),
        Ok(ViewChange::Excluded(_))
    ));
    drop(outsider);
    shutdown_all(comms.into_iter().map(|(_, c)| c).collect());
}
