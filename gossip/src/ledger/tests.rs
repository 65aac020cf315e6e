use super::*;

const TIMEOUT: Duration = Duration::from_millis(50);

fn name(r: Rank) -> String {
    format!("peer-{r}")
}

fn fixed(_: Rank, started: Instant) -> Instant {
    started + TIMEOUT
}

const WAITING: Waiting<'static> = Waiting {
    timeout: TIMEOUT,
    deadline: &fixed,
    peer_name: &name,
    check: &no_alarm,
};

fn no_alarm() -> Result<(), CommError> {
    Ok(())
}

fn collect(
    ledger: &mut Ledger,
    inbox: &Inbox<Vec<f32>>,
    wait_up_to: Option<u64>,
    x: &mut [f32],
    w: &mut f64,
) -> Result<(), CommError> {
    ledger.collect(inbox, &WAITING, wait_up_to, x, w, "push-sum", &mut drop)
}

#[test]
fn repeats_far_rounds_and_floods_are_refused() {
    let inbox = Inbox::new(4);
    inbox.deliver(3, 1, 0.5, vec![1.0]).unwrap();
    assert_eq!(inbox.admit(3, 1), Err(Refusal::Duplicate { round: 3 }));
    assert_eq!(inbox.admit(2, 1), Err(Refusal::Duplicate { round: 2 }));
    inbox.set_current(10);
    assert!(matches!(
        inbox.admit(15, 2),
        Err(Refusal::RoundWindow { .. })
    ));
    for r in 11..15 {
        inbox.deliver(r, 2, 0.5, vec![1.0]).unwrap();
    }
    // Rank 2 has 4 shares buffered, the limit; rank 3 has none.
    assert!(inbox.admit(14, 3).is_ok());
    assert_eq!(
        inbox.deliver(14, 3, 0.5, vec![1.0]),
        Ok(()),
        "another sender is not held to rank 2's buffer"
    );
    let mut fresh = Inbox::<Vec<f32>>::new(4);
    fresh.window = 1;
    fresh.deliver(0, 2, 0.5, vec![1.0]).unwrap();
    assert!(matches!(
        fresh.admit(1, 2),
        Err(Refusal::TooManyBuffered {
            buffered: 1,
            limit: 1
        })
    ));
}

#[test]
fn shares_ahead_wait_and_late_shares_are_still_added() {
    let inbox = Inbox::new(8);
    let mut ledger = Ledger::new(Mixing::Arrived);
    let (mut x, mut w) = (vec![1.0f32], 1.0);
    // Round 0 expects rank 1; its round-1 share arrives first.
    ledger.begin(&inbox, 0, &[1]).unwrap();
    inbox.deliver(1, 1, 0.25, vec![10.0]).unwrap();
    match collect(&mut ledger, &inbox, Some(0), &mut x, &mut w) {
        Err(CommError::PeerTimeout {
            peer, rank, round, ..
        }) => assert_eq!((peer.as_str(), rank, round), ("peer-1", 1, 0)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!((x[0], w), (1.0, 1.0), "a share of a later round waits");
    assert!(!ledger.arrived(&inbox, 0));
    // With staleness the call returns; the round-1 share lands in round 1.
    ledger.begin(&inbox, 1, &[]).unwrap();
    collect(&mut ledger, &inbox, None, &mut x, &mut w).unwrap();
    assert_eq!((x[0], w), (11.0, 1.25));
    // Round 0 from rank 1 never comes: the drain names it.
    match collect(&mut ledger, &inbox, Some(u64::MAX), &mut x, &mut w) {
        Err(CommError::PeerTimeout { rank, round, .. }) => assert_eq!((rank, round), (1, 0)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    // Rank 1 already sent round 1, so a round-0 share from it is a repeat.
    assert_eq!(
        inbox.deliver(0, 1, 0.5, vec![1000.0]),
        Err(Refusal::Duplicate { round: 0 })
    );
    assert!(
        ledger.begin(&inbox, 1, &[]).is_err(),
        "rounds must increase"
    );
}

#[test]
fn shares_are_added_in_round_and_sender_order_whatever_the_arrival_order() {
    // Values whose float sum depends on the order of addition.
    let shares = [
        (0u64, 1usize, 1e8f32, 0.125),
        (0, 2, 1.0, 0.25),
        (0, 3, -1e8, 0.5),
        (1, 1, 3.0, 0.0625),
        (1, 3, 0.5, 0.03125),
    ];
    let in_order = {
        let mut x = 1.0f32;
        for s in &shares {
            x += s.2;
        }
        x
    };
    // Each sender's rounds increase; the senders interleave differently.
    let orders: [[usize; 5]; 3] = [[0, 1, 2, 3, 4], [2, 4, 1, 0, 3], [1, 2, 0, 4, 3]];
    for order in orders {
        let inbox = Inbox::new(8);
        let mut ledger = Ledger::new(Mixing::Arrived);
        ledger.begin(&inbox, 0, &[1, 2, 3]).unwrap();
        ledger.begin(&inbox, 1, &[1, 3]).unwrap();
        for i in order {
            let (round, from, v, weight) = shares[i];
            inbox.deliver(round, from, weight, vec![v]).unwrap();
        }
        let (mut x, mut w) = (vec![1.0f32], 1.0);
        collect(&mut ledger, &inbox, Some(1), &mut x, &mut w).unwrap();
        assert_eq!(x[0].to_bits(), in_order.to_bits(), "order {order:?}");
        assert_eq!(w, 1.96875);
        let mass = ledger.mass();
        assert_eq!((mass.shares_added, mass.weight_added), (5, 0.96875));
    }
}

#[test]
fn due_mixing_adds_a_share_exactly_staleness_rounds_later() {
    let inbox = Inbox::new(8);
    let mut ledger = Ledger::new(Mixing::Due);
    let (mut x, mut w) = (vec![0.0f32], 1.0);
    // Staleness 1: round 0 waits for nothing and adds nothing, even though
    // its share is already there.
    ledger.begin(&inbox, 0, &[1]).unwrap();
    inbox.deliver(0, 1, 0.5, vec![1.0]).unwrap();
    collect(&mut ledger, &inbox, None, &mut x, &mut w).unwrap();
    assert_eq!((x[0], w), (0.0, 1.0));
    assert!(ledger.arrived(&inbox, 0));
    // Round 1 adds round 0's share only; round 1's waits for the drain.
    ledger.begin(&inbox, 1, &[1]).unwrap();
    inbox.deliver(1, 1, 0.25, vec![2.0]).unwrap();
    collect(&mut ledger, &inbox, Some(0), &mut x, &mut w).unwrap();
    assert_eq!((x[0], w), (1.0, 1.5));
    ledger
        .wait_arrived(&inbox, 1, &WAITING, "push-sum")
        .unwrap();
    collect(&mut ledger, &inbox, Some(u64::MAX), &mut x, &mut w).unwrap();
    assert_eq!((x[0], w), (3.0, 1.75));
    ledger.sent(2, 0.5);
    let mass = ledger.mass();
    assert_eq!(
        (
            mass.shares_sent,
            mass.weight_sent,
            mass.shares_added,
            mass.weight_added
        ),
        (2, 1.0, 2, 0.75)
    );
}

#[test]
fn a_share_of_the_wrong_length_is_an_error_and_nothing_is_added() {
    let inbox = Inbox::new(8);
    let mut ledger = Ledger::new(Mixing::Arrived);
    ledger.begin(&inbox, 0, &[1, 2]).unwrap();
    inbox.deliver(0, 1, 0.5, vec![1.0, 2.0]).unwrap();
    inbox.deliver(0, 2, 0.5, vec![1.0]).unwrap();
    let (mut x, mut w) = (vec![0.0f32, 0.0], 1.0);
    let err = collect(&mut ledger, &inbox, Some(0), &mut x, &mut w).unwrap_err();
    assert!(err.to_string().contains("peer-2"), "{err}");
    assert_eq!((x, w), (vec![0.0, 0.0], 1.0));
}

#[test]
fn a_share_still_arriving_is_waited_for_past_the_timeout() {
    let inbox = Inbox::new(8);
    // The receive task notes progress every 20 ms (bytes of a slow share),
    // for four timeouts, and then the share lands.
    let last = Mutex::new(Instant::now());
    let deadline = |_: Rank, started: Instant| (*lock(&last)).max(started) + TIMEOUT;
    let waiting = Waiting {
        timeout: TIMEOUT,
        deadline: &deadline,
        peer_name: &name,
        check: &no_alarm,
    };
    let mut ledger = Ledger::new(Mixing::Arrived);
    let (mut x, mut w) = (vec![1.0f32], 1.0);
    ledger.begin(&inbox, 0, &[1]).unwrap();
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..10 {
                std::thread::sleep(Duration::from_millis(20));
                *lock(&last) = Instant::now();
            }
            inbox.deliver(0, 1, 0.5, vec![2.0]).unwrap();
        });
        ledger
            .collect(
                &inbox,
                &waiting,
                Some(0),
                &mut x,
                &mut w,
                "push-sum",
                &mut drop,
            )
            .expect("progress keeps the wait alive");
    });
    assert!(
        started.elapsed() >= 4 * TIMEOUT,
        "the share came after 200 ms"
    );
    assert_eq!((x[0], w), (3.0, 1.5));

    // Once progress stops, the same wait gives up and names the peer.
    ledger.begin(&inbox, 1, &[1]).unwrap();
    match ledger.collect(
        &inbox,
        &waiting,
        Some(1),
        &mut x,
        &mut w,
        "push-sum",
        &mut drop,
    ) {
        Err(CommError::PeerTimeout { rank, round, .. }) => assert_eq!((rank, round), (1, 1)),
        other => panic!("expected a timeout, got {other:?}"),
    }
}
