//! The communicator of one node ([`P2pComm`]): what it owns, its
//! accessors, its links in a view, and its shutdown. Its operations live
//! in [`super::exchange`] (push-sum and the collectives) and
//! [`super::views`] (view changes and joins).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{AsyncReadExt, AsyncWriteExt};
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::command::SwarmCmd;
use super::lane::{self, Lanes};
use super::links::Link;
use super::membership::join::Membership;
use super::observe::P2pObserver;
use super::state::{ReduceMsg, Shared, View};
use super::views::board::Board;
use super::wire::{ALL_REDUCE_PROTOCOL, PUSH_SUM_PROTOCOL};
use crate::ledger::Ledger;
use crate::sync::lock;
use crate::{CommError, Rank};

/// Frames a push-sum link may queue before the training thread waits.
const PUSH_QUEUE: usize = 16;
/// Frames an all-reduce link may queue (chunks in flight to one rank: a
/// direct schedule sends at most two per collective).
const RING_QUEUE: usize = 4;

/// A node of a run over libp2p. See the [module docs](super).
///
/// Its methods block the calling thread on the node's own runtime, so call
/// them from a plain thread (the training thread), not from inside an async
/// task of another tokio runtime.
pub struct P2pComm {
    pub(super) rt: Option<Runtime>,
    pub(super) shared: Arc<Shared>,
    pub(super) control: libp2p_stream::Control,
    pub(super) view: Arc<View>,
    pub(super) rank: Rank,
    pub(super) listen: Arc<Mutex<Vec<Multiaddr>>>,
    /// Push-sum links by rank (`None` for ourselves).
    pub(super) push_links: Vec<Option<Link>>,
    /// All-reduce links by rank (`None` for ourselves); the ring uses the
    /// right neighbour's, a direct schedule every one.
    pub(super) reduce_links: Vec<Option<Link>>,
    pub(super) reduce_rx: mpsc::Receiver<ReduceMsg>,
    /// Frames of the next collective that came while this one ran.
    pub(super) early: Vec<ReduceMsg>,
    pub(super) push: Ledger,
    /// All-reduce sequence number (also counts barriers).
    pub(super) seq: u64,
    pub(super) membership: Arc<Membership>,
    /// What the view protocol heard ([`super::views`]), shared with the
    /// view acceptors and the membership task.
    pub(super) board: Arc<Board>,
    /// The data lane, once it listens (none with `--data-lane libp2p`).
    pub(super) lanes: Option<Arc<Lanes>>,
    /// Joiners of the view just installed, waiting for the state.
    pub(super) pending_joiners: Vec<PeerId>,
    /// Set during a synchronous push-sum round's send: the share may be
    /// lent from `x` ([`super::lent`]).
    pub(super) lend: Option<super::lent::LendSlot>,
}

impl P2pComm {
    /// Our peer id (base58).
    pub fn local_peer_id(&self) -> String {
        self.shared.local.to_string()
    }

    /// A handle on this node's counters for another thread (a metrics
    /// endpoint); see [`P2pObserver`].
    pub fn observer(&self) -> P2pObserver {
        P2pObserver {
            shared: self.shared.clone(),
        }
    }

    /// Peer ids of the current view in rank order.
    pub fn members(&self) -> Vec<String> {
        self.view.names()
    }

    /// The data-lane connections of the current view, per peer rank
    /// (connections we dialed plus those the peer dialed); empty when
    /// tensors go over libp2p.
    pub fn lane_connections(&self) -> Vec<(Rank, usize)> {
        let Some(lanes) = &self.lanes else {
            return Vec::new();
        };
        let mut out: Vec<(Rank, usize)> = lanes
            .connections_in(self.view.number)
            .into_iter()
            .filter_map(|(peer, n)| self.view.rank_of(&peer).map(|r| (r, n)))
            .collect();
        out.sort_unstable();
        out
    }

    /// Number of the current membership view.
    pub fn view_number(&self) -> u64 {
        self.view.number
    }

    /// Addresses we listen on, each ending in `/p2p/<our id>` so that they
    /// can be handed to other nodes as bootstrap addresses.
    pub fn listen_addrs(&self) -> Vec<String> {
        with_peer_suffix(&self.listen, &self.shared.local)
    }

    /// The handle that interrupts this node's blocked operations (for a
    /// signal handler): they return [`CommError::Interrupted`] promptly.
    pub fn interrupt_handle(&self) -> crate::Interrupt {
        self.shared.interrupt.clone()
    }

    /// Sends `bytes` as they are on one of our protocols to `peer`: for
    /// conformance tests and fuzzing (a peer that speaks our protocols by
    /// hand). Waits for the receiver to take the stream and, briefly, for it
    /// to finish with it.
    pub fn send_raw(&self, peer: &str, protocol: &str, bytes: &[u8]) -> Result<(), CommError> {
        let peer: PeerId = peer
            .parse()
            .map_err(|e| CommError::Config(format!("`{peer}` is not a peer id: {e}")))?;
        let protocol = StreamProtocol::try_from_owned(protocol.to_string())
            .map_err(|e| CommError::Config(format!("`{protocol}` is not a protocol name: {e}")))?;
        let mut control = self.control.clone();
        let rt = self
            .rt
            .as_ref()
            .ok_or_else(|| CommError::Closed("node stopped".into()))?;
        rt.block_on(async move {
            let io = |e: std::io::Error| CommError::Network(format!("raw stream to {peer}: {e}"));
            let mut s = control
                .open_stream(peer, protocol)
                .await
                .map_err(|e| CommError::Network(format!("raw stream to {peer}: {e}")))?;
            let mut ready = [0u8; 1];
            s.read_exact(&mut ready).await.map_err(io)?;
            s.write_all(bytes).await.map_err(io)?;
            let _ = s.close().await;
            let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut ready)).await;
            Ok(())
        })
    }

    /// Stops the node after the links have delivered what they hold (each
    /// waits for its receiver's confirmation, at most the peer timeout).
    pub fn shutdown(mut self) {
        self.stop(true);
    }

    pub(super) fn stop(&mut self, graceful: bool) {
        let Some(rt) = self.rt.take() else { return };
        self.shared
            .stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let mut tasks = Vec::new();
        for link in self
            .push_links
            .drain(..)
            .flatten()
            .chain(self.reduce_links.drain(..).flatten())
        {
            drop(link.queue);
            tasks.push(link.task);
        }
        if graceful {
            // Our links finish (each receiver confirms our last frame), and
            // the members' links to us finish too: leaving earlier would cut
            // their confirmations off. A peer outside the view (left out,
            // perhaps stopped) is not waited for.
            let wait = self.shared.cfg.peer_timeout.min(Duration::from_secs(10));
            let shared = self.shared.clone();
            let view = self.view.clone();
            rt.block_on(async move {
                let until = tokio::time::Instant::now() + wait;
                let _ = tokio::time::timeout_at(until, futures::future::join_all(tasks)).await;
                let members_sending = || {
                    lock(&shared.inbound_active)
                        .keys()
                        .any(|p| view.rank_of(p).is_some())
                };
                while members_sending() && tokio::time::Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
        }
        let _ = self.shared.swarm.send(SwarmCmd::Shutdown);
        rt.shutdown_timeout(Duration::from_millis(if graceful { 500 } else { 0 }));
    }

    pub(super) fn runtime(&self) -> Result<&Runtime, CommError> {
        if !self.is_member() {
            return Err(CommError::NotAdmitted(format!(
                "this node ({}) is outside the run's view {}: it must be admitted first",
                self.shared.local, self.view.number
            )));
        }
        self.rt
            .as_ref()
            .ok_or_else(|| CommError::Closed("node stopped".into()))
    }
}

/// Our links in `view`: push-sum and all-reduce to every
/// member, over the data lane when the node has one. (A link opens its
/// stream with its first frame: the ring only ever uses the right
/// neighbour's all-reduce link.)
/// Call inside the node's runtime.
pub(super) fn spawn_links(
    shared: &Arc<Shared>,
    lanes: Option<&Arc<Lanes>>,
    control: &libp2p_stream::Control,
    view: &View,
) -> (Vec<Option<Link>>, Vec<Option<Link>>) {
    let local = shared.local;
    if let Some(lanes) = lanes {
        lanes.connect_view(shared, view);
    }
    // The view's lanes go to these; a link elsewhere offers one when it is
    // first used.
    let lane_set: Vec<PeerId> = view
        .rank_of(&local)
        .map(|r| shared.cfg.lane_set(r, view.members.len()))
        .unwrap_or_default()
        .into_iter()
        .map(|r| view.members[r])
        .collect();
    let spawn = |peer: PeerId, protocol: &'static str, depth: usize| match lanes {
        Some(lanes) => {
            let source = if lane_set.contains(&peer) {
                lane::LaneSource::View
            } else {
                lane::LaneSource::OnDemand
            };
            lane::spawn_link(
                shared.clone(),
                lanes.clone(),
                peer,
                view.number,
                depth,
                source,
                StreamProtocol::new(protocol),
            )
        }
        None => Link::spawn(
            shared.clone(),
            control.clone(),
            peer,
            StreamProtocol::new(protocol),
            depth,
        ),
    };
    let to_others = |protocol: &'static str, depth: usize| {
        view.members
            .iter()
            .map(|peer| (*peer != local).then(|| spawn(*peer, protocol, depth)))
            .collect()
    };
    (
        to_others(PUSH_SUM_PROTOCOL, PUSH_QUEUE),
        to_others(ALL_REDUCE_PROTOCOL, RING_QUEUE),
    )
}

pub(super) fn with_peer_suffix(listen: &Mutex<Vec<Multiaddr>>, local: &PeerId) -> Vec<String> {
    lock(listen)
        .iter()
        .map(|a| match a.iter().last() {
            // A relayed address names us already.
            Some(libp2p::multiaddr::Protocol::P2p(p)) if p == *local => a.to_string(),
            _ => format!("{a}/p2p/{local}"),
        })
        .collect()
}

impl Drop for P2pComm {
    fn drop(&mut self) {
        self.stop(false);
    }
}
