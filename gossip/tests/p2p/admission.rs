//! Admission: under an allowlist or invitations an intruder that knows the
//! run id (and whose peer id sorts first) is refused and the members run;
//! refusals tell an outsider nothing; the settings behind a differing config
//! hash are named; a duplicated identity is named as such.

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use slowmo_gossip::p2p::{
    Admission, P2pComm, P2pConfig, RunKey, peer_id_of_identity, read_allowlist,
};
use slowmo_gossip::{CommError, Communicator};

use crate::common::{config, init_logs, on_all, shutdown_all};

/// `n` identity files and their peer ids.
fn identities(dir: &Path, n: usize) -> Vec<(PathBuf, String)> {
    (0..n)
        .map(|i| {
            let path = dir.join(format!("node{i}.key"));
            let id = peer_id_of_identity(&path).unwrap();
            (path, id)
        })
        .collect()
}

/// An identity whose peer id sorts before every one of `members`: under the
/// old rule (smallest peer ids win) it would take a place.
fn grind_intruder(dir: &Path, members: &[(PathBuf, String)]) -> (PathBuf, String) {
    let smallest = members.iter().map(|m| m.1.clone()).min().unwrap();
    for i in 0.. {
        let path = dir.join(format!("intruder{i}.key"));
        let id = peer_id_of_identity(&path).unwrap();
        if id < smallest {
            return (path, id);
        }
    }
    unreachable!()
}

/// Starts the members (node 0 first, then the intruder, then the others,
/// all bootstrapped from node 0) and returns the members' nodes and the
/// intruder's outcome.
fn start_with_intruder(
    members: Vec<P2pConfig>,
    intruder: P2pConfig,
) -> (Vec<P2pComm>, Result<P2pComm, CommError>) {
    init_logs();
    let mut members = members.into_iter();
    let host = P2pComm::bind(members.next().unwrap()).unwrap();
    let boot = host.listen_addrs();
    let mut handles = vec![thread::spawn(move || host.join())];
    let bad = {
        let cfg = intruder.with_bootstrap(boot.clone());
        thread::spawn(move || P2pComm::start(cfg))
    };
    thread::sleep(Duration::from_millis(300));
    for cfg in members {
        let cfg = cfg.with_bootstrap(boot.clone());
        handles.push(thread::spawn(move || P2pComm::start(cfg)));
    }
    let comms = handles
        .into_iter()
        .map(|h| h.join().unwrap().expect("a member joins"))
        .collect();
    (comms, bad.join().unwrap())
}

/// The refused intruder learned nothing of the run: its error names the
/// refusal and none of the run's values.
fn assert_refused_blind(outcome: Result<P2pComm, CommError>) {
    match outcome {
        Err(CommError::Refused { field, reason, .. }) => {
            assert_eq!(field, "admission", "{reason}");
            for secret in ["test-run", "c0ffee", "5eed"] {
                assert!(!reason.contains(secret), "{reason}");
            }
        }
        Err(other) => panic!("expected a refusal at admission, got: {other}"),
        Ok(c) => panic!("the intruder was admitted: members {:?}", c.members()),
    }
}

/// The members finish an all-reduce among themselves.
fn members_run(comms: Vec<P2pComm>, expected: &[String]) {
    for c in &comms {
        assert_eq!(c.members(), expected);
    }
    let (comms, got) = on_all(comms, |c| {
        let mut buf = vec![c.rank() as f32 + 1.0; 64];
        let mut s = 0.0;
        c.all_reduce_sum(&mut buf, &mut s).unwrap();
        buf
    });
    for buf in got {
        assert!(buf.iter().all(|v| *v == 6.0), "{buf:?}");
    }
    shutdown_all(comms);
}

#[test]
fn under_an_allowlist_an_intruder_is_refused_and_places_follow_the_list() {
    let dir = tempfile::tempdir().unwrap();
    let ids = identities(dir.path(), 3);
    let (bad_key, _) = grind_intruder(dir.path(), &ids);
    // The list in descending peer-id order: ranks must follow it.
    let mut listed: Vec<String> = ids.iter().map(|i| i.1.clone()).collect();
    listed.sort_by(|a, b| b.cmp(a));
    let list = dir.path().join("allow.txt");
    std::fs::write(&list, format!("# the run\n{}\n", listed.join("\n"))).unwrap();
    let members = ids
        .iter()
        .map(|(key, _)| {
            let mut cfg = config(3, 4).with_identity_file(key);
            cfg.admission = Admission::Allow(read_allowlist(&list).unwrap());
            cfg
        })
        .collect();
    // The intruder knows the run id and config, and runs open.
    let intruder = config(3, 4).with_identity_file(bad_key);
    let (comms, bad) = start_with_intruder(members, intruder);
    assert_refused_blind(bad);
    members_run(comms, &listed);
}

#[test]
fn under_invitations_an_intruder_with_a_forged_invitation_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ids = identities(dir.path(), 3);
    let (bad_key, bad_id) = grind_intruder(dir.path(), &ids);
    let key = RunKey::generate("test-run");
    let invited = |id: &str| Admission::Invited {
        run_key: key.keypair.public(),
        invitation: key.invite_text(id).unwrap(),
    };
    let members = ids
        .iter()
        .map(|(path, id)| {
            let mut cfg = config(3, 4).with_identity_file(path);
            cfg.admission = invited(id);
            cfg
        })
        .collect();
    // Its own key signs its invitation; the members verify against theirs.
    let forger = RunKey::generate("test-run");
    let mut intruder = config(3, 4).with_identity_file(bad_key);
    intruder.admission = Admission::Invited {
        run_key: forger.keypair.public(),
        invitation: forger.invite_text(&bad_id).unwrap(),
    };
    let (comms, bad) = start_with_intruder(members, intruder);
    assert_refused_blind(bad);
    let expected = comms[0].members();
    let mut all: Vec<String> = ids.iter().map(|i| i.1.clone()).collect();
    let mut got = expected.clone();
    all.sort();
    got.sort();
    assert_eq!(got, all);
    members_run(comms, &expected);
}

#[test]
fn an_invitation_for_another_peer_is_refused_at_start() {
    init_logs();
    let key = RunKey::generate("test-run");
    let dir = tempfile::tempdir().unwrap();
    let ids = identities(dir.path(), 2);
    let mut cfg = config(2, 4).with_identity_file(&ids[0].0);
    cfg.admission = Admission::Invited {
        run_key: key.keypair.public(),
        invitation: key.invite_text(&ids[1].1).unwrap(),
    };
    let e = P2pComm::start(cfg)
        .err()
        .expect("a wrong invitation starts");
    assert!(e.to_string().contains(&ids[1].1), "{e}");
}

#[test]
fn an_outsider_with_another_run_id_learns_nothing() {
    init_logs();
    let host = P2pComm::bind(config(2, 4)).unwrap();
    let boot = host.listen_addrs();
    let host = thread::spawn(move || host.join());
    let mut cfg = config(2, 4).with_bootstrap(boot.clone());
    cfg.run.run_id = "probe".into();
    let started = Instant::now();
    assert_refused_blind(P2pComm::start(cfg));
    assert!(started.elapsed() < Duration::from_secs(10));
    let good = P2pComm::start(config(2, 4).with_bootstrap(boot)).unwrap();
    let host = host.join().unwrap().unwrap();
    shutdown_all(vec![host, good]);
}

#[test]
fn a_config_hash_that_differs_names_the_settings_that_differ() {
    init_logs();
    let settings = |lr: &str| {
        [
            ("lr", lr),
            ("steps", "100"),
            ("algorithm.slowmo.beta", "0.5"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    };
    let mut host_cfg = config(2, 4);
    host_cfg.settings = settings("0.01");
    let host = P2pComm::bind(host_cfg).unwrap();
    let boot = host.listen_addrs();
    let host = thread::spawn(move || host.join());
    let mut cfg = config(2, 4).with_bootstrap(boot);
    cfg.run.config_hash = "deadbeef".into();
    cfg.settings = settings("0.1");
    match P2pComm::start(cfg) {
        Err(CommError::Refused { field, reason, .. }) => {
            assert_eq!(field, "config hash");
            assert!(reason.contains("lr"), "{reason}");
            assert!(
                !reason.contains("steps") && !reason.contains("beta"),
                "{reason}"
            );
            assert!(!reason.contains("c0ffee"), "{reason}");
        }
        Err(other) => panic!("expected a config hash refusal, got: {other}"),
        Ok(_) => panic!("a joiner with another config was accepted"),
    }
    drop(host);
}

#[test]
fn two_processes_with_one_identity_file_are_named() {
    init_logs();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("shared.key");
    let first = P2pComm::bind(config(2, 4).with_identity_file(&key)).unwrap();
    let boot = first.listen_addrs();
    let first = thread::spawn(move || first.join());
    let started = Instant::now();
    let second = P2pComm::start(config(2, 4).with_identity_file(&key).with_bootstrap(boot));
    for outcome in [second, first.join().unwrap()] {
        match outcome {
            Err(CommError::DuplicateIdentity(text)) => {
                assert!(text.contains("shared.key"), "{text}");
            }
            Err(other) => panic!("expected a duplicated identity, got: {other}"),
            Ok(_) => panic!("a run started with one identity twice"),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[test]
fn two_processes_with_one_identity_are_named_by_a_third_peer() {
    init_logs();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("shared.key");
    peer_id_of_identity(&key).unwrap();
    let short = |c: P2pConfig| c.with_join_timeout(Duration::from_secs(8));
    let host = P2pComm::bind(short(config(3, 4))).unwrap();
    let boot = host.listen_addrs();
    let host = thread::spawn(move || host.join());
    let twins: Vec<_> = (0..2)
        .map(|_| {
            let cfg = short(config(3, 4))
                .with_identity_file(&key)
                .with_bootstrap(boot.clone());
            thread::spawn(move || P2pComm::start(cfg))
        })
        .collect();
    for t in twins {
        match t.join().unwrap() {
            Err(CommError::DuplicateIdentity(text)) => {
                assert!(text.contains("shared.key"), "{text}");
            }
            Err(other) => panic!("expected a duplicated identity, got: {other}"),
            Ok(_) => panic!("a run started with one identity twice"),
        }
    }
    match host.join().unwrap() {
        Err(CommError::JoinTimeout { detail, .. }) => {
            assert!(
                detail.contains("two processes sharing one identity"),
                "{detail}"
            );
        }
        Err(other) => panic!("expected a join timeout naming the twins, got: {other}"),
        Ok(_) => panic!("a run started with one identity twice"),
    }
}
