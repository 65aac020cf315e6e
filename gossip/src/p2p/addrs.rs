//! Multiaddr helpers, the dial-error log shared by the swarm task and the
//! modules that parse or print addresses, and peer ids as text.

use std::collections::HashMap;

use libp2p::multiaddr::Protocol;
use libp2p::swarm::DialError;
use libp2p::{Multiaddr, PeerId};

use crate::CommError;

/// Peer ids a thread keeps as text at most (then it forgets them all).
const NAMES_KEPT: usize = 1024;

/// `peer` in base58, as frames name their sender: remembered per thread,
/// since the encoding costs microseconds and each frame's check asks for
/// the same few peers again.
pub(crate) fn name_of(peer: &PeerId) -> String {
    thread_local! {
        static NAMES: std::cell::RefCell<HashMap<PeerId, String>> =
            std::cell::RefCell::new(HashMap::new());
    }
    NAMES.with(|names| {
        let mut names = names.borrow_mut();
        if names.len() >= NAMES_KEPT && !names.contains_key(peer) {
            names.clear();
        }
        names
            .entry(*peer)
            .or_insert_with(|| peer.to_string())
            .clone()
    })
}

/// `addr` without a trailing `/p2p/<id>`.
pub(crate) fn strip_peer(addr: &Multiaddr) -> Multiaddr {
    addr.iter()
        .filter(|p| !matches!(p, Protocol::P2p(_)))
        .collect()
}

/// The peer id in `addr`, if it ends with `/p2p/<id>`.
pub(crate) fn peer_in(addr: &Multiaddr) -> Option<PeerId> {
    addr.iter().find_map(|p| match p {
        Protocol::P2p(id) => Some(id),
        _ => None,
    })
}

/// QUIC addresses first: dials try addresses in order, one at a time.
pub(crate) fn quic_first(addrs: &mut [Multiaddr]) {
    addrs.sort_by_key(|a| !a.iter().any(|p| matches!(p, Protocol::QuicV1)));
}

/// Parses a list of multiaddrs, naming the first bad one.
pub(crate) fn parse_addrs(what: &str, addrs: &[String]) -> Result<Vec<Multiaddr>, CommError> {
    addrs
        .iter()
        .map(|s| {
            s.parse::<Multiaddr>()
                .map_err(|e| CommError::Config(format!("{what}: `{s}` is not a multiaddr: {e}")))
        })
        .collect()
}

/// An error and its sources, `: `-separated, on one line. libp2p's transport errors
/// display nothing themselves and keep the reason (the OS error) in their
/// sources.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        // On one line (some errors list their causes on lines of their own).
        let text = err
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    if parts.is_empty() {
        "no reason given".into()
    } else {
        parts.join(": ")
    }
}

/// Logs a failed dial: each address with its reason (a refused bootstrap
/// dial says `Connection refused`). A reason already logged for an address
/// goes to the debug log, so that re-dials once a second do not flood the
/// warnings.
pub(crate) fn log_dial_error(
    peer: Option<PeerId>,
    error: &DialError,
    logged: &mut HashMap<String, String>,
) {
    let mut report = |target: String, reason: String| {
        if logged.get(&target) == Some(&reason) {
            tracing::debug!(?peer, "cannot reach {target}: {reason}");
        } else {
            tracing::warn!(?peer, "cannot reach {target}: {reason}");
            logged.insert(target, reason);
        }
    };
    match error {
        // Our own doing (a disconnect, a dial superseded), not the peer's.
        DialError::Aborted | DialError::DialPeerConditionFalse(_) => {
            tracing::debug!(?peer, "dial given up: {error}");
        }
        DialError::Transport(errors) => {
            for (addr, e) in errors {
                // A bare `/p2p/<id>` (no transport) is libp2p trying a peer
                // id some behaviour knows without an address: nothing a
                // user can act on.
                if matches!(addr.iter().next(), Some(Protocol::P2p(_))) {
                    tracing::debug!(?peer, "cannot reach {addr}: {}", error_chain(e));
                    continue;
                }
                report(addr.to_string(), error_chain(e));
            }
        }
        other => {
            let target = peer.map_or_else(|| "a peer".to_string(), |p| format!("peer {p}"));
            report(target, error_chain(other));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_named_as_its_display_even_past_the_memo() {
        let first = PeerId::random();
        assert_eq!(name_of(&first), first.to_string());
        for _ in 0..NAMES_KEPT + 3 {
            let p = PeerId::random();
            assert_eq!(name_of(&p), p.to_string());
        }
        assert_eq!(name_of(&first), first.to_string());
    }
}
