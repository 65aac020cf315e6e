//! Larger kernel buffers for QUIC's UDP sockets.
//!
//! libp2p-quic binds its sockets itself and leaves the kernel's defaults
//! (about 208 KiB on Linux), which a few hundred MB/s of QUIC overflow: the
//! kernel drops datagrams and QUIC retransmits them. Once a QUIC listener is
//! up we find its socket among our own file descriptors (a datagram socket
//! bound to the listen port) and raise its receive and send buffers:
//! `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` where we may (root, or CAP_NET_ADMIN in
//! a container), else `SO_RCVBUF`/`SO_SNDBUF`, which the kernel caps at
//! `net.core.rmem_max`/`wmem_max` (raise those for unprivileged nodes).

use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;

/// What we ask for per direction, unless `SLOWMO_UDP_BUFFER_BYTES` says
/// otherwise (0: leave the kernel's defaults).
pub(crate) const UDP_BUFFER_BYTES: usize = 8 << 20;

/// The buffer size to ask for: [`UDP_BUFFER_BYTES`] or the environment's.
pub(crate) fn buffer_bytes() -> usize {
    let Ok(text) = std::env::var("SLOWMO_UDP_BUFFER_BYTES") else {
        return UDP_BUFFER_BYTES;
    };
    text.trim().parse().unwrap_or_else(|_| {
        tracing::warn!(
            "SLOWMO_UDP_BUFFER_BYTES=`{text}` is not a byte count; asking for {UDP_BUFFER_BYTES}"
        );
        UDP_BUFFER_BYTES
    })
}

/// The buffers the kernel granted one socket, in bytes (as it reports them:
/// twice what it accounts for payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Granted {
    pub receive: usize,
    pub send: usize,
}

/// Raises the buffers of our UDP sockets bound to `port` to `bytes` each;
/// returns what each socket got.
#[cfg(target_os = "linux")]
pub(crate) fn raise(port: u16, bytes: usize) -> Vec<Granted> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut granted = Vec::new();
    for entry in dir.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if sys::is_udp_on(fd, port) {
            let want = bytes.min(i32::MAX as usize) as libc::c_int;
            sys::set(fd, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, want);
            sys::set(fd, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, want);
            granted.push(Granted {
                receive: sys::get(fd, libc::SO_RCVBUF),
                send: sys::get(fd, libc::SO_SNDBUF),
            });
        }
    }
    granted
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn raise(_port: u16, _bytes: usize) -> Vec<Granted> {
    Vec::new()
}

#[cfg(target_os = "linux")]
mod sys {
    use std::mem::{size_of, zeroed};

    /// An integer socket option of `fd` (0 if it cannot be read).
    pub fn get(fd: i32, option: libc::c_int) -> usize {
        let mut value: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `value` and `len` are valid for writes of the sizes given;
        // a descriptor that is not a socket makes the call fail, nothing more.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc == 0 { value.max(0) as usize } else { 0 }
    }

    /// Sets `forced` (which ignores the system cap, if we may) or else
    /// `capped` to `value`.
    pub fn set(fd: i32, forced: libc::c_int, capped: libc::c_int, value: libc::c_int) {
        let put = |option| {
            // SAFETY: the option value is a valid c_int of the size given.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    option,
                    (&value as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            }
        };
        if put(forced) != 0 {
            put(capped);
        }
    }

    /// Whether `fd` is a datagram socket bound to `port` (IPv4 or IPv6).
    pub fn is_udp_on(fd: i32, port: u16) -> bool {
        if get(fd, libc::SO_TYPE) != libc::SOCK_DGRAM as usize {
            return false;
        }
        // SAFETY: an all-zero sockaddr_storage is a valid value; getsockname
        // writes at most `len` bytes into it and updates `len`.
        let mut addr: libc::sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let rc = unsafe {
            libc::getsockname(
                fd,
                (&mut addr as *mut libc::sockaddr_storage).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return false;
        }
        let bound = match addr.ss_family as libc::c_int {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in.
                let a = unsafe {
                    &*(&addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>()
                };
                u16::from_be(a.sin_port)
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage holds a sockaddr_in6.
                let a = unsafe {
                    &*(&addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
                };
                u16::from_be(a.sin6_port)
            }
            _ => return false,
        };
        bound == port
    }
}

#[cfg(target_os = "linux")]
/// Raises the kernel buffers of the UDP socket of a QUIC listener at `address`.
pub(crate) fn raise_quic_buffers(address: &Multiaddr) {
    let mut port = None;
    let mut quic = false;
    for p in address.iter() {
        match p {
            Protocol::Udp(p) => port = Some(p),
            Protocol::QuicV1 => quic = true,
            _ => {}
        }
    }
    let (Some(port), true) = (port, quic) else {
        return;
    };
    let want = buffer_bytes();
    if want == 0 {
        return;
    }
    for got in raise(port, want) {
        if got.receive < want {
            tracing::info!(
                "QUIC socket on UDP port {port}: receive buffer {} bytes, send {} (asked {want}; \
                 the kernel caps unprivileged sockets at net.core.rmem_max / wmem_max)",
                got.receive,
                got.send
            );
        } else {
            tracing::debug!(
                "QUIC socket on UDP port {port}: receive buffer {} bytes, send {}",
                got.receive,
                got.send
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_udp_socket_gets_larger_buffers() {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        use std::os::fd::AsRawFd;
        let fd = socket.as_raw_fd();
        let before = (sys::get(fd, libc::SO_RCVBUF), sys::get(fd, libc::SO_SNDBUF));
        let granted = raise(port, 4 << 20);
        assert_eq!(granted.len(), 1, "exactly our socket is on port {port}");
        // Never smaller than before; as root (which may force sizes) the
        // full 4 MiB (the kernel reports twice what it accounts).
        assert!(granted[0].receive >= before.0 && granted[0].send >= before.1);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert!(granted[0].receive >= 4 << 20, "{granted:?}");
            assert!(granted[0].send >= 4 << 20, "{granted:?}");
        }
        // A TCP listener on some port is not touched.
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(raise(tcp.local_addr().unwrap().port(), 4 << 20).is_empty());
    }
}
