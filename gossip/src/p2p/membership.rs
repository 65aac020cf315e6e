//! Joining a run: prove the run identity, learn the other members, agree on
//! one view.
//!
//! `/slowmo/membership/1` is a request/response exchange of small CBOR
//! messages. The dialer of a connection sends a [`Hello`] (wire version,
//! node count, run identity, its addresses, the members it has verified and
//! the member list it proposes); the other side compares every field and
//! answers [`Reply::Welcome`] with its own hello, or [`Reply::Refused`]
//! naming the first field that differs. Both sides log a refusal with the
//! field and both values. Member lists travel in every hello, so peers that
//! only know a bootstrap node find each other; hellos repeat every 250 ms
//! until the view is settled.
//!
//! Agreement: once `nodes` verified peers (self included) are known, a node
//! proposes the `nodes` smallest peer ids; the view starts when every member
//! of that list proposes the same list. A view that some member has already
//! started is adopted as it is. Views are numbered; a later view may change
//! the members at a barrier, and no message format depends on the count.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, StreamExt};
use libp2p::{Multiaddr, PeerId, Stream, StreamProtocol};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, mpsc, watch};

use super::behaviour::{NetEvent, SwarmCmd, parse_addrs, peer_in, strip_peer};
use super::config::{P2pConfig, RunIdentity};
use super::state::{View, lock};
use super::wire::{MEMBERSHIP_PROTOCOL, WIRE_VERSION};
use crate::CommError;

/// Largest membership message we read.
const MAX_MESSAGE: u32 = 1 << 20;
/// Time for one hello exchange.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between rounds of hellos while the view is not settled.
const REFRESH: Duration = Duration::from_millis(250);

/// A member as other peers should dial it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct MemberInfo {
    pub peer: String,
    pub addrs: Vec<String>,
}

/// A view a peer has started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ViewInfo {
    pub number: u64,
    pub members: Vec<String>,
}

/// Who we are and what we know.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub version: u16,
    pub nodes: u64,
    pub identity: RunIdentity,
    pub peer: String,
    pub addrs: Vec<String>,
    pub members: Vec<MemberInfo>,
    pub proposal: Option<Vec<String>>,
    pub view: Option<ViewInfo>,
}

/// The first field in which two peers differ, from the refuser's side.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Refusal {
    pub field: String,
    pub ours: String,
    pub theirs: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Reply {
    Welcome(Hello),
    Refused(Refusal),
}

#[derive(Default)]
struct MemberState {
    connected: HashSet<PeerId>,
    bootstrap_peers: HashSet<PeerId>,
    verified: BTreeMap<PeerId, Vec<Multiaddr>>,
    proposals: HashMap<PeerId, Vec<String>>,
    started: HashMap<PeerId, ViewInfo>,
    /// Peers of another run: the first differing field, from our side.
    refused: HashMap<PeerId, Refusal>,
    refusals: Vec<String>,
    in_flight: HashSet<PeerId>,
    fatal: Option<CommError>,
    view: Option<Arc<View>>,
}

/// The membership protocol of one node.
pub(crate) struct Membership {
    local: PeerId,
    identity: RunIdentity,
    nodes: usize,
    listen: Arc<Mutex<Vec<Multiaddr>>>,
    bootstrap: Vec<Multiaddr>,
    swarm: mpsc::UnboundedSender<SwarmCmd>,
    view_tx: watch::Sender<Option<Arc<View>>>,
    state: Mutex<MemberState>,
    changed: Notify,
    stopping: Arc<AtomicBool>,
}

/// Writes one membership message: `u32 LE length`, then its CBOR.
pub(super) async fn write_msg<T: Serialize, W: AsyncWrite + Unpin>(
    s: &mut W,
    msg: &T,
) -> std::io::Result<()> {
    let body = cbor4ii::serde::to_vec(Vec::new(), msg).map_err(std::io::Error::other)?;
    s.write_all(&(body.len() as u32).to_le_bytes()).await?;
    s.write_all(&body).await?;
    s.flush().await
}

/// Reads one membership message (the decoder of every hello and reply).
pub(super) async fn read_msg<T: serde::de::DeserializeOwned, R: AsyncRead + Unpin>(
    s: &mut R,
) -> std::io::Result<T> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len);
    if len > MAX_MESSAGE {
        return Err(std::io::Error::other(format!(
            "membership message of {len} bytes exceeds {MAX_MESSAGE}"
        )));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).await?;
    cbor4ii::serde::from_slice(&body)
        .map_err(|e| std::io::Error::other(format!("malformed membership message: {e}")))
}

impl Membership {
    pub fn new(
        local: PeerId,
        cfg: &P2pConfig,
        listen: Arc<Mutex<Vec<Multiaddr>>>,
        bootstrap: Vec<Multiaddr>,
        swarm: mpsc::UnboundedSender<SwarmCmd>,
        view_tx: watch::Sender<Option<Arc<View>>>,
        stopping: Arc<AtomicBool>,
    ) -> Self {
        Self {
            local,
            identity: cfg.run.clone(),
            nodes: cfg.nodes,
            listen,
            bootstrap,
            swarm,
            view_tx,
            state: Mutex::new(MemberState::default()),
            changed: Notify::new(),
            stopping,
        }
    }

    fn hello_locked(&self, st: &MemberState) -> Hello {
        let addrs_of = |v: &[Multiaddr]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        Hello {
            version: WIRE_VERSION,
            nodes: self.nodes as u64,
            identity: self.identity.clone(),
            peer: self.local.to_string(),
            addrs: addrs_of(&lock(&self.listen)),
            members: st
                .verified
                .iter()
                .map(|(p, a)| MemberInfo {
                    peer: p.to_string(),
                    addrs: addrs_of(a),
                })
                .collect(),
            proposal: self.candidate(st).ok().flatten(),
            view: st.view.as_ref().map(|v| ViewInfo {
                number: v.number,
                members: v.names(),
            }),
        }
    }

    /// The first field in which `theirs` differs from us.
    fn compare(&self, theirs: &Hello) -> Option<Refusal> {
        let refuse = |field: &str, ours: String, theirs: String| Refusal {
            field: field.into(),
            ours,
            theirs,
        };
        if theirs.version != WIRE_VERSION {
            return Some(refuse(
                "protocol version",
                WIRE_VERSION.to_string(),
                theirs.version.to_string(),
            ));
        }
        if let Some((field, ours, other)) = self.identity.first_difference(&theirs.identity) {
            return Some(refuse(field, ours, other));
        }
        if theirs.nodes != self.nodes as u64 {
            return Some(refuse(
                "node count",
                self.nodes.to_string(),
                theirs.nodes.to_string(),
            ));
        }
        None
    }

    /// Records a verified peer and what it told us; dials the members it
    /// knows and we do not.
    fn learn(&self, peer: PeerId, hello: &Hello) {
        let mut st = lock(&self.state);
        let addrs = parse_addrs("hello", &hello.addrs).unwrap_or_default();
        st.verified.insert(peer, addrs);
        match &hello.proposal {
            Some(p) => st.proposals.insert(peer, p.clone()),
            None => st.proposals.remove(&peer),
        };
        if let Some(v) = &hello.view {
            st.started.insert(peer, v.clone());
        }
        for m in &hello.members {
            let Ok(id) = m.peer.parse::<PeerId>() else {
                continue;
            };
            if id == self.local || st.verified.contains_key(&id) || st.refused.contains_key(&id) {
                continue;
            }
            let addrs: Vec<Multiaddr> = m.addrs.iter().filter_map(|a| a.parse().ok()).collect();
            if !addrs.is_empty() && !st.connected.contains(&id) {
                let _ = self.swarm.send(SwarmCmd::Dial { peer: id, addrs });
            }
        }
        drop(st);
        self.changed.notify_one();
    }

    /// The member list we propose: the `nodes` smallest verified peer ids,
    /// once that many are known.
    fn candidate(&self, st: &MemberState) -> Result<Option<Vec<String>>, CommError> {
        let mut all: Vec<String> = st.verified.keys().map(|p| p.to_string()).collect();
        all.push(self.local.to_string());
        all.sort();
        if all.len() < self.nodes {
            return Ok(None);
        }
        all.truncate(self.nodes);
        if !all.contains(&self.local.to_string()) {
            return Err(CommError::Other(format!(
                "the run has {} members with smaller peer ids than ours ({}): {}",
                self.nodes,
                self.local,
                all.join(", ")
            )));
        }
        Ok(Some(all))
    }

    /// Settles the view if every proposed member agrees (or adopts a view
    /// a member has started).
    fn try_settle(&self, st: &mut MemberState) -> Result<Option<Arc<View>>, CommError> {
        if let Some(v) = &st.view {
            return Ok(Some(v.clone()));
        }
        let me = self.local.to_string();
        let mut adopt = None;
        for (peer, info) in &st.started {
            if !info.members.contains(&me) {
                return Err(CommError::Other(format!(
                    "peer {peer} already runs view {} without us: members {}",
                    info.number,
                    info.members.join(", ")
                )));
            }
            adopt = Some(info.clone());
        }
        let settled = match adopt {
            Some(info) => Some((info.number, info.members)),
            None => self.candidate(st)?.and_then(|cand| {
                let agreed = cand.iter().filter(|p| **p != me).all(|p| {
                    p.parse::<PeerId>()
                        .ok()
                        .and_then(|id| st.proposals.get(&id))
                        == Some(&cand)
                });
                agreed.then_some((0, cand))
            }),
        };
        let Some((number, names)) = settled else {
            return Ok(None);
        };
        let members: Result<Vec<PeerId>, _> = names.iter().map(|n| n.parse::<PeerId>()).collect();
        let members = members
            .map_err(|e| CommError::Other(format!("a member list holds a bad peer id: {e}")))?;
        let view = Arc::new(View::new(number, members));
        st.view = Some(view.clone());
        Ok(Some(view))
    }

    /// Serves inbound hellos for the life of the node.
    pub fn spawn_acceptor(
        self: &Arc<Self>,
        control: &mut libp2p_stream::Control,
    ) -> Result<(), CommError> {
        let mut incoming = control
            .accept(StreamProtocol::new(MEMBERSHIP_PROTOCOL))
            .map_err(|e| CommError::Other(format!("{MEMBERSHIP_PROTOCOL}: {e}")))?;
        let me = self.clone();
        tokio::spawn(async move {
            while let Some((peer, stream)) = incoming.next().await {
                let me = me.clone();
                tokio::spawn(async move {
                    if let Err(e) =
                        tokio::time::timeout(EXCHANGE_TIMEOUT, me.answer(peer, stream)).await
                    {
                        tracing::debug!(%peer, "hello from {peer} timed out: {e}");
                    }
                });
            }
        });
        Ok(())
    }

    async fn answer(self: Arc<Self>, peer: PeerId, mut stream: Stream) {
        let hello: Hello = match read_msg(&mut stream).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(%peer, "bad hello from peer {peer}: {e}");
                return;
            }
        };
        if hello.peer != peer.to_string() {
            tracing::warn!(%peer, claimed = %hello.peer, "hello from peer {peer} claims to be {}", hello.peer);
            return;
        }
        if let Some(r) = self.compare(&hello) {
            self.record_refusal(peer, r.clone(), false);
            let _ = write_msg(&mut stream, &Reply::Refused(r)).await;
            let _ = stream.close().await;
            // Let the refusal reach the peer before the connection goes.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let _ = self.swarm.send(SwarmCmd::Disconnect(peer));
            return;
        }
        self.learn(peer, &hello);
        let reply = Reply::Welcome(self.hello_locked(&lock(&self.state)));
        let _ = write_msg(&mut stream, &reply).await;
        let _ = stream.close().await;
    }

    /// One hello exchange with `peer`, started by us.
    async fn greet(self: Arc<Self>, mut control: libp2p_stream::Control, peer: PeerId) {
        let result = tokio::time::timeout(EXCHANGE_TIMEOUT, async {
            let mut stream = control
                .open_stream(peer, StreamProtocol::new(MEMBERSHIP_PROTOCOL))
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let hello = self.hello_locked(&lock(&self.state));
            write_msg(&mut stream, &hello).await?;
            let reply: Reply = read_msg(&mut stream).await?;
            let _ = stream.close().await;
            Ok::<Reply, std::io::Error>(reply)
        })
        .await;
        lock(&self.state).in_flight.remove(&peer);
        match result {
            Ok(Ok(Reply::Welcome(hello))) => {
                if hello.peer != peer.to_string() {
                    tracing::warn!(%peer, "welcome from peer {peer} claims to be {}", hello.peer);
                } else if let Some(r) = self.compare(&hello) {
                    self.record_refusal(peer, r, false);
                    let _ = self.swarm.send(SwarmCmd::Disconnect(peer));
                } else {
                    self.learn(peer, &hello);
                }
            }
            Ok(Ok(Reply::Refused(r))) => {
                // The refuser's "ours" is our "theirs".
                let ours_side = Refusal {
                    field: r.field,
                    ours: r.theirs,
                    theirs: r.ours,
                };
                self.record_refusal(peer, ours_side, true);
            }
            Ok(Err(e)) => tracing::debug!(%peer, "hello exchange with {peer} failed: {e}"),
            Err(_) => tracing::debug!(%peer, "hello exchange with {peer} timed out"),
        }
    }

    /// Logs a refusal in either direction (with the field and both values)
    /// and remembers the peer as one of another run. Being refused by, or
    /// refusing, a bootstrap peer ends our join: we were told that peer is
    /// in our run, so we are the odd one out.
    fn record_refusal(&self, peer: PeerId, r: Refusal, by_them: bool) {
        let text = if by_them {
            format!(
                "peer {peer} refused us: {} differs: ours {} theirs {}",
                r.field, r.ours, r.theirs
            )
        } else {
            format!(
                "peer {peer} refused: {} differs: ours {} theirs {}",
                r.field, r.ours, r.theirs
            )
        };
        if by_them {
            tracing::error!(%peer, field = %r.field, "{text}");
        } else {
            tracing::warn!(%peer, field = %r.field, "{text}");
        }
        let mut st = lock(&self.state);
        st.refusals.push(text);
        st.verified.remove(&peer);
        if st.bootstrap_peers.contains(&peer) && st.fatal.is_none() {
            st.fatal = Some(Self::fatal_refusal(peer, &r));
        }
        st.refused.insert(peer, r);
        drop(st);
        self.changed.notify_one();
    }

    fn fatal_refusal(peer: PeerId, r: &Refusal) -> CommError {
        CommError::Refused {
            peer: peer.to_string(),
            field: r.field.clone(),
            ours: r.ours.clone(),
            theirs: r.theirs.clone(),
        }
    }

    fn on_event(&self, ev: NetEvent) -> Option<PeerId> {
        let mut st = lock(&self.state);
        match ev {
            NetEvent::Connected { peer, dialed } => {
                st.connected.insert(peer);
                if let Some(addr) = dialed {
                    let plain = strip_peer(&addr);
                    if self
                        .bootstrap
                        .iter()
                        .any(|b| strip_peer(b) == plain || peer_in(b) == Some(peer))
                    {
                        st.bootstrap_peers.insert(peer);
                        if let Some(r) = st.refused.get(&peer)
                            && st.fatal.is_none()
                        {
                            st.fatal = Some(Self::fatal_refusal(peer, r));
                        }
                    }
                }
                Some(peer)
            }
            NetEvent::Disconnected { peer } => {
                st.connected.remove(&peer);
                let member = st.view.as_ref().is_some_and(|v| v.rank_of(&peer).is_some());
                if member && !self.stopping.load(Ordering::Relaxed) {
                    // A peer that left cleanly looks the same; a missing
                    // share or chunk is reported by the operation waiting
                    // for it (PeerTimeout names the peer).
                    tracing::info!(%peer, "the connection to member {peer} closed");
                }
                None
            }
        }
    }

    /// Peers to greet now: connected ones not yet verified, and verified
    /// ones whose proposal differs from ours.
    fn due(&self) -> Vec<PeerId> {
        let mut st = lock(&self.state);
        let cand = self.candidate(&st).ok().flatten();
        let mut out: Vec<PeerId> = st
            .connected
            .iter()
            .filter(|p| !st.refused.contains_key(p) && !st.in_flight.contains(p))
            .filter(|p| {
                !st.verified.contains_key(p)
                    || st.proposals.get(p) != cand.as_ref()
                    || cand.is_none()
            })
            .copied()
            .collect();
        out.sort();
        for p in &out {
            st.in_flight.insert(*p);
        }
        out
    }

    /// Waits until the view is settled, greeting peers as they connect.
    pub async fn join(
        self: Arc<Self>,
        control: libp2p_stream::Control,
        mut events: mpsc::UnboundedReceiver<NetEvent>,
        timeout: Duration,
    ) -> Result<Arc<View>, CommError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick = tokio::time::interval(REFRESH);
        let result = loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => { self.on_event(ev); }
                    None => break Err(CommError::Closed("the swarm stopped during the join".into())),
                },
                _ = tick.tick() => {
                    for peer in self.due() {
                        tokio::spawn(self.clone().greet(control.clone(), peer));
                    }
                },
                _ = self.changed.notified() => {},
                _ = tokio::time::sleep_until(deadline) => break Err(self.timeout_error(timeout)),
            }
            let mut st = lock(&self.state);
            if let Some(e) = st.fatal.take() {
                break Err(e);
            }
            match self.try_settle(&mut st) {
                Ok(Some(view)) => break Ok(view),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
        };
        if let Ok(view) = &result {
            tracing::info!(view = view.number, members = ?view.names(), "joined the run: view {} with {} members", view.number, view.members.len());
            let _ = self.view_tx.send(Some(view.clone()));
            let _ = self.swarm.send(SwarmCmd::StopDiscovery);
            // Keep answering late hellos (they learn the started view) and
            // keep track of connections.
            let me = self.clone();
            tokio::spawn(async move {
                while let Some(ev) = events.recv().await {
                    me.on_event(ev);
                }
            });
        }
        result
    }

    fn timeout_error(&self, timeout: Duration) -> CommError {
        let st = lock(&self.state);
        let mut present: Vec<String> = st.verified.keys().map(|p| p.to_string()).collect();
        present.push(self.local.to_string());
        present.sort();
        let missing = self.nodes.saturating_sub(present.len());
        let mut detail = Vec::new();
        if missing == 0 {
            let cand = self.candidate(&st).ok().flatten().unwrap_or_default();
            let silent: Vec<String> = cand
                .iter()
                .filter(|p| **p != self.local.to_string())
                .filter(|p| {
                    p.parse::<PeerId>()
                        .ok()
                        .and_then(|id| st.proposals.get(&id))
                        != Some(&cand)
                })
                .cloned()
                .collect();
            detail.push(format!(
                "not yet agreed on the member list: {}",
                silent.join(", ")
            ));
        }
        detail.extend(st.refusals.iter().cloned());
        CommError::JoinTimeout {
            timeout,
            nodes: self.nodes,
            present,
            missing,
            detail: detail.join("; "),
        }
    }
}
