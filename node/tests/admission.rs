//! `slowmo run` and the admission flags of `slowmo node`, as a user runs
//! them: an intruder with the run id and config (and a peer id that sorts
//! first) joining during start-up is refused under an allowlist and under
//! invitations while the members finish; a config that differs names the
//! setting; two processes with one identity file are named.

use std::net::UdpSocket;
use std::path::Path;
use std::process::{Child, Output, Stdio};

mod support;
use support::slowmo;

fn run_ok(args: &[&str]) -> String {
    let out = slowmo().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "slowmo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn peer_id(identity: &Path) -> String {
    run_ok(&["run", "peer-id", "--identity", identity.to_str().unwrap()])
}

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A node of a 2-node run of a few steps on QUIC port `port` (slowmo's
/// first transport; over TCP only the dialing side of a shared identity
/// can tell), bootstrapped from `boot` if given.
fn node(dir: &Path, name: &str, port: u16, boot: Option<u16>, extra: &[&str]) -> Child {
    let identity = dir.join(format!("{name}.key"));
    let summary = dir.join(format!("{name}.json"));
    let mut cmd = slowmo();
    cmd.args(["node", "--nodes", "2", "--steps", "12", "--eval-every", "0"])
        .args(["--run-id", "adm-run", "--threads", "1"])
        .args(["--listen", &format!("/ip4/127.0.0.1/udp/{port}/quic-v1")])
        .arg("--summary-json")
        .arg(&summary)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // Defaults a test may replace.
    if !extra.contains(&"--identity") {
        cmd.arg("--identity").arg(&identity);
    }
    if !extra.contains(&"--join-timeout") {
        cmd.args(["--join-timeout", "40"]);
    }
    if let Some(b) = boot {
        cmd.args(["--bootstrap", &format!("/ip4/127.0.0.1/udp/{b}/quic-v1")]);
    }
    cmd.spawn().unwrap()
}

fn finish(child: Child) -> (bool, String) {
    let Output { status, stderr, .. } = child.wait_with_output().unwrap();
    (
        status.success(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// An identity whose peer id sorts before `members`' (it would have taken a
/// place when the smallest peer ids won).
fn grind_intruder(dir: &Path, members: &[String]) {
    let smallest = members.iter().min().unwrap().clone();
    for i in 0..500 {
        let path = dir.join(format!("try{i}.key"));
        if peer_id(&path) < smallest {
            std::fs::rename(&path, dir.join("intruder.key")).unwrap();
            return;
        }
    }
    panic!("no peer id below {smallest} in 500 tries");
}

/// Starts the two members under `policy(member index)` and the intruder
/// (open policy) during start-up; the members finish with each other, the
/// intruder is refused.
fn intruder_is_refused(dir: &Path, policy: &dyn Fn(usize) -> Vec<String>) {
    let ids: Vec<String> = (0..2)
        .map(|i| peer_id(&dir.join(format!("m{i}.key"))))
        .collect();
    grind_intruder(dir, &ids);
    let (p0, p1, p2) = (free_port(), free_port(), free_port());
    let args = |i: usize| policy(i);
    let a0 = args(0);
    let a0: Vec<&str> = a0.iter().map(String::as_str).collect();
    let m0 = node(dir, "m0", p0, None, &a0);
    // The intruder comes while m0 waits for its peer: under the old rule it
    // would have taken m1's place.
    let intruder = node(dir, "intruder", p2, Some(p0), &[]);
    let (ok_bad, err_bad) = finish(intruder);
    assert!(!ok_bad, "the intruder finished: {err_bad}");
    // Refused by its bootstrap peer, or refusing it (an open node sees a
    // proof it does not take): either way not a member.
    assert!(
        err_bad.contains("refused by the run at peer") && err_bad.contains("admit"),
        "{err_bad}"
    );
    let a1 = args(1);
    let a1: Vec<&str> = a1.iter().map(String::as_str).collect();
    let m1 = node(dir, "m1", p1, Some(p0), &a1);
    for (name, child) in [("m0", m0), ("m1", m1)] {
        let (ok, err) = finish(child);
        assert!(ok, "{name}: {err}");
        let summary = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
        let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
        let mut members: Vec<String> = summary["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_str().unwrap().to_string())
            .collect();
        members.sort();
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!(members, expected, "{name}");
        assert_eq!(summary["completed"], true, "{name}");
    }
}

#[test]
fn an_intruder_is_refused_under_an_allowlist() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let list = d.join("allow.txt");
    let ids: Vec<String> = (0..2)
        .map(|i| peer_id(&d.join(format!("m{i}.key"))))
        .collect();
    std::fs::write(
        &list,
        format!("# members\n{}\n{}  # second\n", ids[0], ids[1]),
    )
    .unwrap();
    let list = list.to_str().unwrap().to_string();
    intruder_is_refused(d, &|_| vec!["--allow".into(), list.clone()]);
}

#[test]
fn an_intruder_is_refused_under_invitations() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = d.join("run.key");
    let key_s = key.to_str().unwrap();
    let public = run_ok(&["run", "init", "--key", key_s, "--run-id", "adm-run"]);
    assert!(public.starts_with("ed25519:"), "{public}");
    // The key is never overwritten.
    let again = slowmo()
        .args(["run", "init", "--key", key_s])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists already"));
    let bad = slowmo()
        .args(["run", "invite", "--key", key_s, "nobody"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("`nobody` is not a peer id"));
    for i in 0..2 {
        let id = peer_id(&d.join(format!("m{i}.key")));
        let out = d.join(format!("inv{i}.toml"));
        run_ok(&[
            "run",
            "invite",
            "--key",
            key_s,
            &id,
            "--out",
            out.to_str().unwrap(),
        ]);
    }
    // The public key by value for one node, by file for the other.
    let pub_file = d.join("run.key.pub").to_str().unwrap().to_string();
    let inv = |i: usize| d.join(format!("inv{i}.toml")).to_str().unwrap().to_string();
    intruder_is_refused(d, &|i| {
        let key = if i == 0 {
            public.clone()
        } else {
            pub_file.clone()
        };
        vec![
            "--invitation".into(),
            inv(i),
            "--run-key-public".into(),
            key,
        ]
    });
}

#[test]
fn a_differing_setting_is_named_and_negative_values_parse() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p0 = free_port();
    let m0 = node(d, "m0", p0, None, &["--lr", "0.01", "--join-timeout", "8"]);
    let m1 = node(d, "m1", free_port(), Some(p0), &["--lr", "0.02"]);
    let (ok, err) = finish(m1);
    assert!(!ok);
    assert!(
        err.contains("config hash differs") && err.contains("lr"),
        "{err}"
    );
    let _ = finish(m0);
    // `--lr -1` is a value (validation refuses it), not an unknown flag.
    let out = slowmo()
        .args(["node", "--nodes", "1", "--lr", "-1", "--steps", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        !err.contains("unexpected argument") && err.contains("lr"),
        "{err}"
    );
}

#[test]
fn two_nodes_with_one_identity_file_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let shared = d.join("shared.key");
    peer_id(&shared);
    let p0 = free_port();
    let shared_s = shared.to_str().unwrap();
    let a = node(d, "a", p0, None, &["--identity", shared_s]);
    let b = node(d, "b", free_port(), Some(p0), &["--identity", shared_s]);
    for child in [b, a] {
        let (ok, err) = finish(child);
        assert!(!ok);
        assert!(
            err.contains("duplicated identity") && err.contains("shared.key"),
            "{err}"
        );
        assert!(!err.contains("peers present"), "{err}");
    }
}
