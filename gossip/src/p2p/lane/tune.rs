//! The send buffer of a lane connection, sized to its link.
//!
//! Linux grows a TCP socket's send buffer by itself (up to `tcp_wmem`'s
//! maximum, 4 MiB by default) so that a long link can keep a window of
//! bytes in flight. On a short link (the same host, a rack) that window is
//! a few hundred kilobytes, and the rest of the grown buffer only holds
//! bytes the kernel copied into fresh pages that went cold before the
//! receiver read them: on loopback a fixed 512 KiB buffer (the kernel
//! doubles it, so one record of [`super::frame::RECORD`] fits) moves the
//! lane's bytes 10-20% faster with less kernel time (README, "Speed").
//!
//! So a writer's connection whose round trip, as the kernel measured it
//! over the hello and its answer, is at most [`SHORT_LINK`] gets
//! [`SEND_BUFFER`]; any other keeps the kernel's tuning, which a long link
//! needs (a fixed buffer caps a connection at about buffer / round trip:
//! 1 MiB over 250 us is still 33 Gbit/s).

use std::time::Duration;

use tokio::net::TcpStream;

/// The longest round trip at which a connection gets a fixed send buffer.
pub(crate) const SHORT_LINK: Duration = Duration::from_micros(250);
/// The send buffer asked for on a short link (the kernel doubles it).
pub(crate) const SEND_BUFFER: usize = 512 << 10;

/// The send buffer a link of round trip `rtt` gets: `None` leaves the
/// kernel's autotuning.
pub(crate) fn send_buffer_for(rtt: Duration) -> Option<usize> {
    (rtt <= SHORT_LINK).then_some(SEND_BUFFER)
}

/// Fixes the send buffer of a short link's connection; returns the round
/// trip measured and the buffer set, if one was. Failing to read or set
/// the option leaves the kernel's tuning.
pub(crate) fn size_send_buffer(stream: &TcpStream) -> (Option<Duration>, Option<usize>) {
    let Some(rtt) = rtt(stream) else {
        return (None, None);
    };
    let set = send_buffer_for(rtt).filter(|&bytes| set_send_buffer(stream, bytes));
    (Some(rtt), set)
}

/// The kernel's smoothed round trip of the connection.
#[cfg(target_os = "linux")]
fn rtt(stream: &TcpStream) -> Option<Duration> {
    let (info, len) = option::<libc::tcp_info>(stream, libc::IPPROTO_TCP, libc::TCP_INFO)?;
    // `tcpi_rtt` lies well inside the part every kernel fills.
    (len >= 72).then(|| Duration::from_micros(info.tcpi_rtt.into()))
}

/// Socket option `name` of `level` as a `T` of plain data (zeroed where the
/// kernel wrote less), and the bytes the kernel wrote.
#[cfg(target_os = "linux")]
fn option<T: Copy>(
    stream: &TcpStream,
    level: libc::c_int,
    name: libc::c_int,
) -> Option<(T, usize)> {
    use std::os::fd::AsRawFd;
    // SAFETY: the options read here are plain data, valid when zeroed; the
    // kernel writes at most `len` bytes into the value and says how many.
    let mut value: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            level,
            name,
            (&mut value as *mut T).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some((value, len as usize))
}

#[cfg(not(target_os = "linux"))]
fn rtt(_stream: &TcpStream) -> Option<Duration> {
    None
}

#[cfg(target_os = "linux")]
fn set_send_buffer(stream: &TcpStream, bytes: usize) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(value) = libc::c_int::try_from(bytes) else {
        return false;
    };
    // SAFETY: an int option read from a live value of its size.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

#[cfg(not(target_os = "linux"))]
fn set_send_buffer(_stream: &TcpStream, _bytes: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_short_link_gets_a_fixed_buffer() {
        assert_eq!(
            send_buffer_for(Duration::from_micros(30)),
            Some(SEND_BUFFER)
        );
        assert_eq!(send_buffer_for(SHORT_LINK), Some(SEND_BUFFER));
        assert_eq!(send_buffer_for(SHORT_LINK + Duration::from_micros(1)), None);
        assert_eq!(send_buffer_for(Duration::from_millis(40)), None);
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_loopback_connection_is_measured_short_and_its_buffer_fixed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b).await.unwrap();
            s.write_all(b"world").await.unwrap();
        });
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"hello").await.unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).await.unwrap();
        accept.await.unwrap();
        let (rtt, set) = size_send_buffer(&s);
        let rtt = rtt.expect("the kernel reports a round trip");
        assert!(rtt <= SHORT_LINK, "loopback round trip {rtt:?}");
        assert_eq!(set, Some(SEND_BUFFER));
        // The kernel reports the doubled value it keeps.
        let sock = socket_send_buffer(&s);
        assert!((SEND_BUFFER..4 * SEND_BUFFER).contains(&sock), "{sock}");
    }

    #[cfg(target_os = "linux")]
    fn socket_send_buffer(s: &TcpStream) -> usize {
        let (v, _) = option::<libc::c_int>(s, libc::SOL_SOCKET, libc::SO_SNDBUF).unwrap();
        v as usize
    }
}
