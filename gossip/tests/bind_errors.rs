//! Network errors carry their reason: a listen address in use names the OS
//! error (also where another node holds the port), and a bootstrap address
//! nobody listens on is logged with the refused dial. (Its own test binary:
//! it captures the process's logs.)

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slowmo_gossip::p2p::{P2pComm, P2pConfig, RunIdentity};

fn config() -> P2pConfig {
    let run = RunIdentity {
        run_id: "errors".into(),
        config_hash: "c0ffee".into(),
        init_hash: "5eed".into(),
    };
    let mut cfg = P2pConfig::new(run, 2, 8).with_join_timeout(Duration::from_secs(4));
    cfg.worker_threads = 1;
    // These tests are about the listeners: a lane on any free port, not on
    // the listen port plus one, which another program may hold.
    cfg.lane_port = Some(0);
    cfg
}

/// The data lane listens where a firewall rule can name it: on the given
/// port, by default on the TCP listen port plus one; a port in use stops
/// the node naming the port, where it came from and the flag to change it.
#[test]
fn the_lane_listens_on_its_port_and_a_taken_one_is_refused_by_name() {
    let free_pair = || loop {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    };
    let port = free_pair();
    let mut cfg = config().with_listen([format!("/ip4/127.0.0.1/tcp/{port}")]);
    cfg.lane_port = None;
    let node = P2pComm::bind(cfg.clone()).expect("both ports free");
    assert_eq!(node.lane_port(), Some(port + 1));
    drop(node);

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let lane = taken.local_addr().unwrap().port();
    let mut given = config();
    given.lane_port = Some(lane);
    match P2pComm::bind(given) {
        Err(slowmo_gossip::CommError::Network(text)) => {
            assert!(text.contains(&format!("TCP port {lane}")), "{text}");
            assert!(text.contains("configured lane port"), "{text}");
            assert!(text.contains("--lane-port"), "{text}");
        }
        Err(other) => panic!("expected the lane port named, got: {other}"),
        Ok(_) => panic!("a lane on a taken port"),
    }

    let port = free_pair();
    let _next = std::net::TcpListener::bind(("127.0.0.1", port + 1)).unwrap();
    let mut derived = config().with_listen([format!("/ip4/127.0.0.1/tcp/{port}")]);
    derived.lane_port = None;
    match P2pComm::bind(derived) {
        Err(slowmo_gossip::CommError::Network(text)) => {
            assert!(text.contains(&format!("TCP port {}", port + 1)), "{text}");
            assert!(text.contains("TCP listen port plus one"), "{text}");
        }
        Err(other) => panic!("expected the lane port named, got: {other}"),
        Ok(_) => panic!("a lane on a taken port"),
    }
}

#[test]
fn a_tcp_listen_address_in_use_gives_the_os_reason() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let addr = format!("/ip4/127.0.0.1/tcp/{port}");
    let err = P2pComm::bind(config().with_listen([addr.clone()]))
        .err()
        .expect("a port in use is refused")
        .to_string();
    assert!(err.contains(&addr), "{err}");
    assert!(err.to_lowercase().contains("in use"), "{err}");
}

/// libp2p's TCP listeners share a port with any other of the same user
/// (`SO_REUSEPORT`): without a check, a second node on a taken port would
/// start and receive half of the first one's connections.
#[test]
fn a_tcp_port_another_node_listens_on_is_refused_by_name() {
    let first = P2pComm::bind(config().with_listen(["/ip4/127.0.0.1/tcp/0"])).unwrap();
    let taken = first
        .listen_addrs()
        .into_iter()
        .find(|a| a.contains("/tcp/"))
        .expect("a TCP listen address");
    let plain = taken.split("/p2p/").next().unwrap().to_string();
    let port = plain.rsplit('/').next().unwrap().to_string();
    match P2pComm::bind(config().with_listen([plain.clone()])) {
        Err(slowmo_gossip::CommError::Network(text)) => {
            assert!(text.contains(&plain), "{text}");
            assert!(
                text.contains(&format!("TCP port {port} is in use")),
                "{text}"
            );
        }
        Err(other) => panic!("expected the taken port named, got: {other}"),
        Ok(second) => panic!(
            "a second node listens on the taken {plain}: {:?}",
            second.listen_addrs()
        ),
    }
    // Once the first is gone, the port is free again (connections it left
    // in TIME_WAIT do not hold it). Its runtime closes the listener after
    // `drop` returns, soon.
    drop(first);
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let again = loop {
        match P2pComm::bind(config().with_listen([plain.clone()])) {
            Ok(again) => break again,
            Err(e) if std::time::Instant::now() < until => {
                eprintln!("not yet free: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the port of a node that is gone stays taken: {e}"),
        }
    };
    assert!(
        again.listen_addrs().iter().any(|a| a.starts_with(&plain)),
        "{:?}",
        again.listen_addrs()
    );
}

/// One port on IPv4 and IPv6 at once (libp2p's IPv6 listeners are
/// IPv6-only): the probe of a taken port must not refuse the node's own
/// pair, in either order.
#[test]
fn one_tcp_port_on_ipv4_and_ipv6_is_not_taken_by_the_node_itself() {
    if std::net::TcpListener::bind("[::]:0").is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no IPv6 on this CI machine"
        );
        eprintln!("skipped: no IPv6 on this machine");
        return;
    }
    for v6_first in [false, true] {
        let port = std::net::TcpListener::bind("0.0.0.0:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut pair = vec![
            format!("/ip4/0.0.0.0/tcp/{port}"),
            format!("/ip6/::/tcp/{port}"),
        ];
        if v6_first {
            pair.reverse();
        }
        let node = P2pComm::bind(config().with_listen(pair.clone()))
            .unwrap_or_else(|e| panic!("listening on {pair:?}: {e}"));
        drop(node);
    }
}

#[test]
fn a_quic_listen_address_in_use_gives_the_os_reason() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let addr = format!("/ip4/127.0.0.1/udp/{port}/quic-v1");
    let err = P2pComm::bind(config().with_listen([addr.clone()]))
        .err()
        .expect("a port in use is refused")
        .to_string();
    assert!(err.contains(&addr), "{err}");
    assert!(err.to_lowercase().contains("in use"), "{err}");
}

/// A log writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_refused_bootstrap_dial_is_logged_with_the_reason() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("slowmo_gossip=debug")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    // A port that was free a moment ago: nobody listens on it.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let boot = format!("/ip4/127.0.0.1/tcp/{port}");
    let cfg = config()
        .with_listen(["/ip4/127.0.0.1/tcp/0"])
        .with_bootstrap([boot.clone()]);
    let err = P2pComm::start(cfg)
        .err()
        .expect("nobody to join")
        .to_string();
    assert!(err.contains("missing"), "{err}");
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("WARN") && l.contains(&format!("cannot reach {boot}")))
        .unwrap_or_else(|| panic!("no warning about {boot} in:\n{text}"));
    eprintln!("{line}");
    assert!(line.to_lowercase().contains("refused"), "{line}");
    // Re-dials once a second do not repeat the warning.
    let warnings = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(&boot))
        .count();
    assert_eq!(warnings, 1, "{text}");
}
