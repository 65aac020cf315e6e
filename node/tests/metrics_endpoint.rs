//! The metrics endpoint under hostile clients: a request head far over the
//! limit and a client that sends one byte at a time leave the node's memory
//! bounded and the scrapes answered (README, "Watching a run").
//!
//! One test in its own process, so that the peak resident memory it reads
//! is this endpoint's doing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use slowmo_node::io::metrics_http::{HEADER_TIMEOUT, MAX_REQUEST_HEAD};
use slowmo_node::io::observe::Endpoint;

/// Peak resident memory of this process (`VmHWM`), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// A scrape that must be answered within `limit`.
fn scrape(addr: SocketAddr, limit: Duration) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("the scrape was not answered within {limit:?}: {e}"));
    text
}

#[test]
fn oversized_and_slow_clients_leave_scrapes_answered_and_memory_bounded() {
    let endpoint = Endpoint::start("127.0.0.1:0").unwrap();
    let addr = endpoint.addr();
    assert!(scrape(addr, Duration::from_secs(5)).starts_with("HTTP/1.1 200"));
    let before = peak_rss();

    // A client that sends its request head one byte every 100 ms, connected
    // first, so that a server taking one connection at a time serves it
    // before the scrapes below.
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    let slow_client = std::thread::spawn(move || {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if slow.write_all(b"x").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        started.elapsed()
    });

    // A request head of 64 MiB, sent as fast as the server takes it.
    let mut big = TcpStream::connect(addr).unwrap();
    big.set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut sent = 0usize;
    let chunk = vec![b'a'; 64 << 10];
    if big.write_all(b"GET /metrics HTTP/1.1\r\nX-Big: ").is_ok() {
        while sent < 64 << 20 {
            match big.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
    }
    // (What the sockets' buffers hold besides is a few MiB at most.)
    assert!(
        sent < 32 << 20,
        "the server took {sent} bytes of a request head (it reads at most {MAX_REQUEST_HEAD})"
    );

    // Scrapes are answered at once all the while.
    for _ in 0..3 {
        let text = scrape(addr, Duration::from_secs(2));
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }
    let grown = peak_rss().saturating_sub(before);
    assert!(
        grown < 16 << 20,
        "peak resident memory grew by {} MiB",
        grown >> 20
    );

    // The slow client is cut off once the head's time is up.
    let lasted = slow_client.join().unwrap();
    assert!(
        lasted < HEADER_TIMEOUT + Duration::from_secs(5),
        "a client sending a byte every 100 ms stayed connected for {lasted:?}"
    );
    let health = {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET /health HTTP/1.1\r\n\r\n").unwrap();
        let mut t = String::new();
        s.read_to_string(&mut t).unwrap();
        t
    };
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
}
