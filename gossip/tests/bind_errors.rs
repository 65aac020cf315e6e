//! Network errors carry their reason: a listen address in use names the OS
//! error, and a bootstrap address nobody listens on is logged with the
//! refused dial. (Its own test binary: it captures the process's logs.)

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
    cfg
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
