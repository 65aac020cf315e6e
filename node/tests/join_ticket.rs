//! A join ticket over loopback: a node with no settings of its own joins by
//! ticket, runs the first node's settings and ends bit-identical with it
//! (and with the simulator); a damaged ticket, one of another run, one of
//! other settings, and a training flag beside `--join` are each refused
//! naming what did not match, without disturbing the run.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use slowmo_runspec::JoinTicket;

mod support;
use support::{slowmo, text};

/// The first node's settings: none of them the defaults a joiner would
/// fall back to.
const SETTINGS: [&str; 8] = [
    "--base", "sgp", "--steps", "60", "--lr", "0.07", "--hidden", "24",
];

fn first_node(dir: &Path) -> Child {
    slowmo()
        .args([
            "node",
            "--nodes",
            "2",
            "--threads",
            "1",
            "--join-timeout",
            "90",
        ])
        .args(SETTINGS)
        .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
        .arg("--ticket-file")
        .arg(dir.join("ticket.txt"))
        .arg("--save-params")
        .arg(dir.join("a.safetensors"))
        .env("RAYON_NUM_THREADS", "1")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("a.log")).unwrap())
        .spawn()
        .unwrap()
}

fn wait_ticket(dir: &Path) -> String {
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        if let Ok(t) = std::fs::read_to_string(dir.join("ticket.txt")) {
            return t.trim().to_string();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "no ticket within a minute; log:\n{}",
        std::fs::read_to_string(dir.join("a.log")).unwrap_or_default()
    );
}

/// `slowmo node --join ticket extra...` that must fail; its stderr.
fn refused(ticket: &str, extra: &[&str]) -> String {
    let out = slowmo()
        .args([
            "node",
            "--threads",
            "1",
            "--join-timeout",
            "20",
            "--join",
            ticket,
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a bad join went through: {}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_joiner_without_settings_runs_the_tickets_and_bad_tickets_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = first_node(dir.path());
    let ticket = wait_ticket(dir.path());
    let parsed = JoinTicket::decode(&ticket).expect("the printed ticket reads back");
    assert_eq!(parsed.run_id, "slowmo");
    assert!(
        parsed
            .addrs
            .iter()
            .all(|a| a.starts_with("/ip4/127.0.0.1/")),
        "{parsed:?}"
    );

    // Damaged in copying: one character changed in the middle.
    let mut damaged = ticket.clone().into_bytes();
    let mid = damaged.len() / 2;
    damaged[mid] = if damaged[mid] == b'x' { b'y' } else { b'x' };
    let e = refused(std::str::from_utf8(&damaged).unwrap(), &[]);
    assert!(e.contains("damaged") && e.contains("checksum"), "{e}");

    // Another run's id: the member refuses without saying its own.
    let mut other_run = parsed.clone();
    other_run.run_id = "another-run".into();
    let e = refused(&other_run.encode(), &[]);
    assert!(e.contains("the run id is not this node's run"), "{e}");
    assert!(!e.contains("\"slowmo\""), "{e}");

    // A hash of other settings.
    let mut other_hash = parsed.clone();
    other_hash.config_hash = "0".repeat(64);
    let e = refused(&other_hash.encode(), &[]);
    assert!(e.contains("the config hash is not this run's"), "{e}");

    // A training flag beside the ticket.
    let e = refused(&ticket, &["--lr", "0.5"]);
    assert!(e.contains("--lr") && e.contains("cannot be given"), "{e}");

    // The joiner: a ticket, its outputs, nothing else.
    let b = slowmo()
        .args(["node", "--threads", "1", "--join", &ticket])
        .arg("--save-params")
        .arg(dir.path().join("b.safetensors"))
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .unwrap();
    assert!(b.status.success(), "{}", text(&b));
    let a_out = a.wait().unwrap();
    assert!(
        a_out.success(),
        "the first node failed; log:\n{}",
        std::fs::read_to_string(dir.path().join("a.log")).unwrap_or_default()
    );
    let a_params = std::fs::read(dir.path().join("a.safetensors")).unwrap();
    let b_params = std::fs::read(dir.path().join("b.safetensors")).unwrap();
    assert!(a_params == b_params, "the two nodes' parameters differ");
    let sim = dir.path().join("sim.safetensors");
    let out = slowmo()
        .args(["simulate", "--quiet", "--workers", "2"])
        .args(SETTINGS)
        .arg("--save-params")
        .arg(&sim)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        std::fs::read(&sim).unwrap() == a_params,
        "not the simulator's parameters"
    );
    // The first node printed the ports and the same ticket.
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut a.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(stdout.contains("ports: libp2p on TCP"), "{stdout}");
    assert!(
        stdout.contains(&format!("slowmo node --join {ticket}")),
        "{stdout}"
    );
}
