//! Is a peer's process still there? A connection attempt to its lane port
//! answers within a round trip when the process is gone but its machine is
//! up (the port refuses), which is how a killed node looks.

use std::time::Duration;

use tokio::net::TcpStream;

/// How long one attempt may take: past it the machine (or the path) is
/// silent, and silence is the peer timeout's to judge.
const ATTEMPT: Duration = Duration::from_secs(2);

/// `true` when every address refuses connections (nothing listens there
/// any more); `false` when one accepts (the process lives: the attempt is
/// closed at once, before any byte) or does not answer in time, or when
/// there is no address.
pub(crate) async fn process_gone(addrs: &[String]) -> bool {
    if addrs.is_empty() {
        return false;
    }
    for addr in addrs {
        match tokio::time::timeout(ATTEMPT, TcpStream::connect(addr.as_str())).await {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_port_is_gone_and_a_listening_one_lives() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = listener.local_addr().unwrap().to_string();
        let closed = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().to_string()
        };
        assert!(process_gone(std::slice::from_ref(&closed)).await);
        assert!(!process_gone(std::slice::from_ref(&live)).await);
        assert!(!process_gone(&[closed, live]).await, "one address answers");
        assert!(!process_gone(&[]).await);
    }
}
