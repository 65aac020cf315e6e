//! Nodes behind NATs, on one machine: network namespaces joined by veth
//! pairs, a public segment with a relay, and private segments each behind
//! its own NAT router (nftables masquerade, unasked packets dropped, as a
//! home router does; `tools/nat/netns.sh` builds it). The nodes find each
//! other from the relay's one address (its rendezvous point), open direct
//! connections through both NATs (hole punching), send tensors over them (the data
//! lane cannot dial a private address, so the frames take the punched
//! libp2p connection), and end with parameter files byte-identical to the
//! simulator's. Behind a symmetric NAT no punch succeeds: the peer is named
//! with the reason and the run goes on without it.
//!
//! Needs root (`ip netns`, nftables); elsewhere the tests say they are
//! skipped, and under CI=true they fail instead.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

mod local_support;
use local_support::{can_make_namespaces, read_json, slowmo_bin};

/// The namespaces of one test; removed when dropped.
struct Internet {
    prefix: String,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/nat/netns.sh")
}

impl Internet {
    /// `nats` private segments of `hosts` each; `kinds`: the routers'
    /// kinds in turn (`cone`, `symmetric`). `None` (the test is skipped)
    /// where namespaces cannot be made, outside CI.
    fn up(test: &str, tag: &str, nats: usize, hosts: usize, kinds: &str) -> Option<Self> {
        let prefix = format!("s{}{tag}", std::process::id() % 100_000);
        if !can_make_namespaces(test, &prefix) {
            return None;
        }
        let net = Internet { prefix };
        let status = Command::new("bash")
            .arg(script())
            .args(["up", &nats.to_string(), &hosts.to_string()])
            .env("PREFIX", &net.prefix)
            .env("NAT_KIND", kinds)
            .status()
            .expect("running tools/nat/netns.sh");
        assert!(status.success(), "building the namespaces failed");
        Some(net)
    }

    /// `slowmo args...` in namespace `ns` (`inet`, `hK-J`), logging to
    /// `log`.
    fn spawn(&self, ns: &str, args: &[String], log: &Path) -> Child {
        let file = std::fs::File::create(log).unwrap();
        Command::new("ip")
            .args(["netns", "exec", &format!("{}-{ns}", self.prefix)])
            .arg("env")
            .args(["RAYON_NUM_THREADS=1", "RUST_LOG=info,libp2p=warn"])
            .arg(slowmo_bin())
            .args(args)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("starting slowmo in a namespace")
    }
}

impl Internet {
    /// A stand-alone relay at 10.200.0.1, port 4001 (QUIC, and TCP if
    /// `tcp`), with a new identity, for two minutes at most, with `extra`
    /// flags; and its QUIC address, the nodes' bootstrap.
    fn relay(&self, dir: &Path, tcp: bool, extra: &[&str]) -> (Child, String) {
        let (key, id) = identity(dir, "relay");
        let mut args: Vec<String> = ["relay", "--seconds", "120", "--identity"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(key.display().to_string());
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["--listen".into(), "/ip4/10.200.0.1/udp/4001/quic-v1".into()]);
        if tcp {
            args.extend(["--listen".into(), "/ip4/10.200.0.1/tcp/4001".into()]);
        }
        let child = self.spawn("inet", &args, &dir.join("relay.log"));
        (child, format!("/ip4/10.200.0.1/udp/4001/quic-v1/p2p/{id}"))
    }

    /// `slowmo flags...` in host namespace `name`, logging to `NAME.log`.
    fn node(&self, dir: &Path, name: &str, flags: &[String]) -> (String, Child) {
        let log = dir.join(format!("{name}.log"));
        (name.to_string(), self.spawn(name, flags, &log))
    }
}

/// Ends a helper process (the relay, a node left waiting).
fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Internet {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("down")
            .env("PREFIX", &self.prefix)
            .status();
    }
}

/// The flags of every run here: SlowMo over SGP, a small MLP.
fn train_flags(steps: u64) -> Vec<String> {
    [
        "--base",
        "sgp",
        "--steps",
        &steps.to_string(),
        "--eval-every",
        "0",
        "--hidden",
        "32",
        "--batch-size",
        "16",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `slowmo node` flags of a node at `ip`, listening on `port` (QUIC and
/// TCP). Hosts behind one NAT listen on ports of their own, as they would
/// with ports forwarded: a NAT that maps two hosts' same port keeps only
/// one of them at its own port, and the other's punches leave from a port
/// its peers never observed.
fn node_flags(
    ip: &str,
    port: u16,
    nodes: usize,
    bootstrap: &str,
    dir: &Path,
    name: &str,
) -> Vec<String> {
    let mut f: Vec<String> = vec![
        "node".into(),
        "--nodes".into(),
        nodes.to_string(),
        "--listen".into(),
        format!("/ip4/{ip}/udp/{port}/quic-v1"),
        "--listen".into(),
        format!("/ip4/{ip}/tcp/{port}"),
        "--threads".into(),
        "1".into(),
        "--join-timeout".into(),
        "60".into(),
        "--peer-timeout".into(),
        "20".into(),
        "--save-params".into(),
        dir.join(format!("{name}.safetensors"))
            .display()
            .to_string(),
        "--summary-json".into(),
        dir.join(format!("{name}.json")).display().to_string(),
    ];
    if !bootstrap.is_empty() {
        f.extend(["--bootstrap".into(), bootstrap.into()]);
    }
    f
}

/// An identity file `NAME.key` and the peer id it gives (`slowmo run
/// peer-id`), so that nodes can be given an address before it starts.
fn identity(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(format!("{name}.key"));
    let out = Command::new(slowmo_bin())
        .args(["run", "peer-id", "--identity"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "slowmo run peer-id: {out:?}");
    let id = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .last()
        .expect("a peer id")
        .to_string();
    (key, id)
}

/// The simulator's parameter file for `workers` and `flags`.
fn simulate(dir: &Path, workers: usize, flags: &[String]) -> Vec<u8> {
    let path = dir.join("sim.safetensors");
    let status = Command::new(slowmo_bin())
        .args(["simulate", "--quiet", "--workers", &workers.to_string()])
        .args(flags)
        .arg("--save-params")
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success(), "simulate {flags:?}");
    std::fs::read(&path).unwrap()
}

fn log_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

/// Waits for every node; a node that fails shows its log.
fn wait_all(dir: &Path, nodes: Vec<(String, Child)>) -> Vec<(String, bool)> {
    nodes
        .into_iter()
        .map(|(name, mut child)| {
            let ok = child.wait().unwrap().success();
            (name, ok)
        })
        .inspect(|(name, ok)| {
            if !ok {
                eprintln!("--- {name} failed; its log:\n{}", log_of(dir, name));
            }
        })
        .collect()
}

/// Every NATed node found the others, punched through, and wrote the
/// simulator's parameters.
fn check_run(dir: &Path, names: &[String], nated: &[String], sim: &[u8]) {
    for name in names {
        let params = std::fs::read(dir.join(format!("{name}.safetensors"))).unwrap_or_else(|e| {
            panic!(
                "{name}: no parameter file ({e}); log:\n{}",
                log_of(dir, name)
            )
        });
        assert!(
            params == sim,
            "{name}'s parameter file differs from the simulator's; log:\n{}",
            log_of(dir, name)
        );
        let summary = read_json(&dir.join(format!("{name}.json")));
        assert_eq!(summary["completed"], true, "{name}: {summary}");
    }
    // Every NATed node reached its peers directly: by a DCUtR punch from a
    // relayed connection, or by both sides dialing at once at addresses
    // AutoNAT confirmed through the relay (a NAT that filters by address
    // and port lets the relay's dial-back through, QUIC's always leaving
    // from the listen port; two peers dialing each other there open each
    // other's mappings, a punch without DCUtR). Never over the relay.
    for name in nated {
        let summary = read_json(&dir.join(format!("{name}.json")));
        let c = &summary["connections"];
        assert_eq!(
            c["relayed"], 0,
            "{name} ended with a relayed connection: {c}"
        );
        let direct = c["direct"].as_u64().unwrap_or(0) + c["hole_punched"].as_u64().unwrap_or(0);
        assert!(direct >= 1, "{name} has no direct connection: {c}");
        let log = log_of(dir, name);
        assert!(
            log.contains("its frames take the direct libp2p connection"),
            "{name}'s tensors did not take the direct libp2p connection; log:\n{log}"
        );
    }
}

#[test]
fn two_nodes_behind_nats_and_a_public_relay_member_train_like_the_simulator() {
    let test = "two_nodes_behind_nats_and_a_public_relay_member_train_like_the_simulator";
    let Some(net) = Internet::up(test, "a", 2, 1, "cone") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let train = train_flags(120);
    let sim = simulate(dir, 3, &train);
    // The public member serves as the relay; the others know its QUIC
    // address only.
    let (key, id) = identity(dir, "relay");
    let bootstrap = format!("/ip4/10.200.0.1/udp/4001/quic-v1/p2p/{id}");
    let mut public = node_flags("10.200.0.1", 4001, 3, "", dir, "public");
    public.extend([
        "--relay".into(),
        "--identity".into(),
        key.display().to_string(),
    ]);
    public.extend(train.iter().cloned());
    let mut nodes = vec![(
        "public".to_string(),
        net.spawn("inet", &public, &dir.join("public.log")),
    )];
    let mut nated = Vec::new();
    for k in 1..=2 {
        let name = format!("h{k}-1");
        let mut flags = node_flags(&format!("192.168.{k}.2"), 4001, 3, &bootstrap, dir, &name);
        flags.extend(train.iter().cloned());
        nodes.push(net.node(dir, &name, &flags));
        nated.push(name);
    }
    let results = wait_all(dir, nodes);
    assert!(results.iter().all(|(_, ok)| *ok), "{results:?}");
    let names: Vec<String> = results.into_iter().map(|(n, _)| n).collect();
    check_run(dir, &names, &nated, &sim);
}

#[test]
fn four_nodes_behind_two_nats_find_each_other_from_one_relay_address() {
    let test = "four_nodes_behind_two_nats_find_each_other_from_one_relay_address";
    let Some(net) = Internet::up(test, "b", 2, 2, "cone") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let train = train_flags(120);
    let sim = simulate(dir, 4, &train);
    // A stand-alone relay; the nodes know its QUIC address only, so they
    // punch over QUIC (20 of 20 in tools/nat/punch_trials.py; TCP's
    // simultaneous open got through 19 of 20 times there, and one failed
    // pair of the four would leave a node out of this run).
    let (relay, bootstrap) = net.relay(dir, true, &[]);
    let mut nodes = Vec::new();
    for k in 1..=2 {
        for j in 1..=2 {
            let name = format!("h{k}-{j}");
            let mut flags = node_flags(
                &format!("192.168.{k}.{}", j + 1),
                4000 + j as u16,
                4,
                &bootstrap,
                dir,
                &name,
            );
            flags.extend(train.iter().cloned());
            nodes.push(net.node(dir, &name, &flags));
        }
    }
    let results = wait_all(dir, nodes);
    stop(relay);
    assert!(results.iter().all(|(_, ok)| *ok), "{results:?}");
    let names: Vec<String> = results.into_iter().map(|(n, _)| n).collect();
    // Nodes behind one NAT reach each other on their LAN; each punches
    // through to the other NAT's nodes.
    check_run(dir, &names, &names, &sim);
}

#[test]
fn a_node_behind_a_symmetric_nat_is_named_and_the_run_goes_on_without_it() {
    let test = "a_node_behind_a_symmetric_nat_is_named_and_the_run_goes_on_without_it";
    let Some(net) = Internet::up(test, "c", 2, 1, "cone symmetric") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (relay, bootstrap) = net.relay(dir, false, &[]);
    let mut nodes = Vec::new();
    for k in 1..=2 {
        let name = format!("h{k}-1");
        let mut flags = node_flags(&format!("192.168.{k}.2"), 4001, 2, &bootstrap, dir, &name);
        flags.extend(["--min-nodes".into(), "1".into()]);
        flags.extend(train_flags(120));
        // The one left out waits this long to be admitted again.
        let at = flags.iter().position(|f| f == "--join-timeout").unwrap();
        flags[at + 1] = "30".into();
        nodes.push(net.node(dir, &name, &flags));
    }
    let results = wait_all(dir, nodes);
    stop(relay);
    // No punch gets through the symmetric NAT: each side names the other
    // as reachable only through the relay, one of them trains on alone
    // and the other is refused.
    for (name, _) in &results {
        let log = log_of(dir, name);
        assert!(
            log.contains("is reachable only through a relay"),
            "{name} did not name its peer as reachable only through a relay; log:\n{log}"
        );
        assert!(
            !log.contains("by hole punching"),
            "{name} punched through a symmetric NAT?\n{log}"
        );
    }
    let finished: Vec<&String> = results
        .iter()
        .filter(|(_, ok)| *ok)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(finished.len(), 1, "exactly one node trains on: {results:?}");
    let summary = read_json(&dir.join(format!("{}.json", finished[0])));
    assert_eq!(summary["completed"], true, "{summary}");
    let relay_only = summary["connections"]["relay_only"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        relay_only.len() == 1
            && relay_only[0]
                .as_str()
                .is_some_and(|s| s.contains("reachable only through a relay")),
        "the summary names the peer left out and why: {summary}"
    );
    assert_eq!(summary["steps"], 120, "{summary}");
    assert_eq!(
        summary["members"].as_array().map(|m| m.len()),
        Some(1),
        "it went on alone: {summary}"
    );
}

#[test]
fn doctor_behind_a_nat_names_the_relay_and_the_punched_path_to_a_peer() {
    let test = "doctor_behind_a_nat_names_the_relay_and_the_punched_path_to_a_peer";
    let Some(net) = Internet::up(test, "d", 2, 1, "cone") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (node_key, node) = identity(dir, "node");
    let (relay, quic) = net.relay(dir, false, &[]);
    // A node waiting for a run behind one NAT, the doctor behind the other.
    let mut flags = node_flags("192.168.1.2", 4001, 2, &quic, dir, "h1-1");
    flags.extend(["--identity".into(), node_key.display().to_string()]);
    let (_, waiting) = net.node(dir, "h1-1", &flags);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let report = Command::new("ip")
        .args(["netns", "exec", &format!("{}-h2-1", net.prefix)])
        .arg(slowmo_bin())
        .args([
            "doctor",
            "--bootstrap",
            &quic,
            "--listen",
            "/ip4/192.168.2.2/udp/4001/quic-v1",
        ])
        .args([
            "--peer",
            &format!("{quic}/p2p-circuit/p2p/{node}"),
            "--seconds",
            "8",
            // No router here answers UPnP: the doctor says so.
            "--upnp",
        ])
        .output()
        .unwrap();
    stop(waiting);
    stop(relay);
    let text = String::from_utf8_lossy(&report.stdout).to_string();
    assert!(report.status.success(), "doctor failed: {report:?}");
    assert!(
        text.contains(": reached"),
        "the bootstrap was reached:\n{text}"
    );
    assert!(
        text.contains("seen by peers at /ip4/10.200.0.12/"),
        "the NAT's address:\n{text}"
    );
    assert!(
        text.contains("holds a reservation"),
        "the relay's reservation:\n{text}"
    );
    // A direct path (by hole punching, or a dial that the punch's open
    // mappings let through first).
    assert!(
        text.contains(&format!("{node}: direct connection")),
        "a direct path to the peer:\n{text}"
    );
    assert!(
        text.contains("behind a NAT, reachable through a relay"),
        "the advice:\n{text}"
    );
    assert!(
        text.contains("UPnP             no gateway answered")
            && text.contains("no UPnP gateway answered: the router has UPnP IGD off"),
        "the router's silence to UPnP:\n{text}"
    );
}

#[test]
fn behind_a_symmetric_nat_tensors_cross_the_relay_when_both_opt_in() {
    let test = "behind_a_symmetric_nat_tensors_cross_the_relay_when_both_opt_in";
    let Some(net) = Internet::up(test, "e", 2, 1, "cone symmetric") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let train = train_flags(60);
    let sim = simulate(dir, 2, &train);
    let (relay, bootstrap) = net.relay(dir, false, &["--carry-tensors"]);
    let mut nodes = Vec::new();
    for k in 1..=2 {
        let name = format!("h{k}-1");
        let mut flags = node_flags(&format!("192.168.{k}.2"), 4001, 2, &bootstrap, dir, &name);
        flags.push("--relay-tensors".into());
        flags.extend(train.iter().cloned());
        nodes.push(net.node(dir, &name, &flags));
    }
    let results = wait_all(dir, nodes);
    stop(relay);
    assert!(results.iter().all(|(_, ok)| *ok), "{results:?}");
    for (name, _) in &results {
        let params = std::fs::read(dir.join(format!("{name}.safetensors"))).unwrap();
        assert!(
            params == sim,
            "{name}'s parameters differ from the simulator's"
        );
        let log = log_of(dir, name);
        assert!(
            log.contains("its tensors go over the relay, as --relay-tensors allows"),
            "{name} did not say its tensors take the relay; log:\n{log}"
        );
        let summary = read_json(&dir.join(format!("{name}.json")));
        assert_eq!(summary["connections"]["relayed"], 1, "{summary}");
    }
}

/// Waits up to `limit` for `ok`; whether it came.
fn wait_until(limit: std::time::Duration, mut ok: impl FnMut() -> bool) -> bool {
    let started = std::time::Instant::now();
    while !ok() {
        if started.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    true
}

#[test]
fn a_node_behind_a_third_nat_joins_mid_run_from_the_relay_address_alone() {
    use slowmo_runspec::gate;
    let test = "a_node_behind_a_third_nat_joins_mid_run_from_the_relay_address_alone";
    let Some(net) = Internet::up(test, "f", 3, 1, "cone") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (relay, bootstrap) = net.relay(dir, false, &[]);
    // Two members behind two NATs hold before step 100 (the local
    // testnet's step gate) until the joiner has asked to join.
    const AT: u64 = 100;
    let gate_of = |name: &str| dir.join(format!("gate-{name}"));
    let mut nodes = Vec::new();
    for k in 1..=2 {
        let name = format!("h{k}-1");
        let mut flags = node_flags(&format!("192.168.{k}.2"), 4001, 2, &bootstrap, dir, &name);
        flags.extend(train_flags(400));
        flags.extend([
            "--hold-at".into(),
            AT.to_string(),
            "--gate-dir".into(),
            gate_of(&name).display().to_string(),
        ]);
        nodes.push(net.node(dir, &name, &flags));
    }
    let members = ["h1-1", "h2-1"];
    let held = wait_until(std::time::Duration::from_secs(60), || {
        members
            .iter()
            .all(|m| gate::read_held(&gate_of(m), AT).is_some())
    });
    assert!(
        held,
        "the members did not reach step {AT}; logs:\n{}\n{}",
        log_of(dir, "h1-1"),
        log_of(dir, "h2-1")
    );
    // The joiner, behind a third NAT, knows the relay's address only: it
    // finds the members at the rendezvous point, punches through to both
    // and asks to join.
    let name = "h3-1".to_string();
    let mut flags = node_flags("192.168.3.2", 4001, 2, &bootstrap, dir, &name);
    flags.extend(train_flags(400));
    nodes.push(net.node(dir, &name, &flags));
    let asked = wait_until(std::time::Duration::from_secs(60), || {
        members
            .iter()
            .any(|m| gate::read_held(&gate_of(m), AT).is_some_and(|n| n >= 1))
    });
    for m in members {
        gate::open(&gate_of(m), AT).unwrap();
    }
    assert!(
        asked,
        "no member heard the joiner ask to join; its log:\n{}",
        log_of(dir, &name)
    );
    let results = wait_all(dir, nodes);
    stop(relay);
    assert!(results.iter().all(|(_, ok)| *ok), "{results:?}");

    // It was admitted from the members' barrier, and all three end with
    // the same model over direct connections.
    let joiner = read_json(&dir.join("h3-1.json"));
    assert_eq!(joiner["completed"], true, "{joiner}");
    let admitted = &joiner["view_changes"][0];
    assert_eq!(admitted["rejoined"], true, "{joiner}");
    assert_eq!(admitted["world"], 3, "{joiner}");
    assert!(
        admitted["resumed_from"].as_u64().unwrap_or(0) >= AT,
        "it went on from the members' barrier: {joiner}"
    );
    let joiner_id = joiner["peer_id"].as_str().unwrap().to_string();
    let first = std::fs::read(dir.join("h1-1.safetensors")).unwrap();
    for (name, _) in &results {
        let s = read_json(&dir.join(format!("{name}.json")));
        assert_eq!(s["steps"], 400, "{name}: {s}");
        assert_eq!(s["members"].as_array().map(|m| m.len()), Some(3), "{s}");
        if name != "h3-1" {
            let joined = s["view_changes"]
                .as_array()
                .map(|v| {
                    v.iter().any(|c| {
                        c["joined"]
                            .as_array()
                            .is_some_and(|j| j.iter().any(|p| p == &joiner_id))
                    })
                })
                .unwrap_or(false);
            assert!(
                joined,
                "{name} recorded no view change admitting the joiner: {s}"
            );
        }
        assert!(
            std::fs::read(dir.join(format!("{name}.safetensors"))).unwrap() == first,
            "{name}'s parameters differ from h1-1's"
        );
        let c = &s["connections"];
        assert_eq!(
            c["relayed"], 0,
            "{name} ended with a relayed connection: {c}"
        );
        let direct = c["direct"].as_u64().unwrap_or(0) + c["hole_punched"].as_u64().unwrap_or(0);
        assert!(direct >= 2, "{name} reaches both others directly: {c}");
    }
}
