//! Requests to the swarm task, from every task that needs a connection
//! opened or closed.

use libp2p::{Multiaddr, PeerId};

/// Requests to the swarm task.
#[derive(Debug)]
pub(crate) enum SwarmCmd {
    /// Connect to a peer learned from a member list (no-op if connected).
    Dial { peer: PeerId, addrs: Vec<Multiaddr> },
    /// Close every connection to a peer.
    Disconnect(PeerId),
    /// Close every connection to a peer but the newest: a restarted
    /// member's new process holds the newest, the old process's may linger
    /// (QUIC sees no close from a killed process).
    DropStale(PeerId),
    /// The view is settled: stop re-dialing bootstrap addresses and mDNS
    /// finds.
    StopDiscovery,
    /// Stop the swarm task.
    Shutdown,
}
