//! Joining a run: prove the run identity, learn the other members, agree on
//! one view.
//!
//! `/slowmo/membership/1` is a request/response exchange of small CBOR
//! messages. The dialer of a connection first knocks ([`super::admission`]):
//! both sides prove that the run's admission policy admits them, and an
//! outsider is turned away with a bare `Closed`. Admitted, the dialer sends
//! a [`Hello`] (wire version, node count, run identity and settings, its
//! addresses, the members it has verified and the member list it proposes);
//! the other side compares every field and answers [`Reply::Welcome`] with
//! its own hello, or [`Reply::Refused`] naming the field that differs (and
//! the differing settings), never a value. Both sides log a refusal; the
//! refuser's log line has both values. Member lists travel in every hello,
//! so peers that only know a bootstrap node find each other; hellos repeat
//! every 250 ms until the view is settled.
//!
//! Agreement: once `nodes` verified peers (self included) are known, a node
//! proposes the first `nodes` of them in the policy's place order (peer ids
//! when open, the allowlist's order, or a hash of run id and peer id for
//! invitations); ranks follow that order. The view starts when every member
//! of that list proposes the same list. A view that some member has already
//! started is adopted as it is. Views are numbered; a later view may change
//! the members at a barrier, and no message format depends on the count.
//!
//! A duplicated identity (two processes with one key) is named: a
//! connection that authenticates as our own peer id, or a peer whose hellos
//! come from two live instances, ends the join with
//! [`CommError::DuplicateIdentity`] there.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, StreamExt};
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, mpsc, watch};

use super::admission::{Admission, Proof};
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MemberInfo {
    pub peer: String,
    pub addrs: Vec<String>,
}

/// A view a peer has started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ViewInfo {
    pub number: u64,
    pub members: Vec<String>,
    /// The process instance of each member when it entered the view: a
    /// node that finds its peer id there with another instance is a
    /// restart and must join again.
    #[serde(default)]
    pub instances: Vec<u64>,
}

/// How a join ended.
pub(crate) enum Joined {
    /// We are a member of the view that started.
    Member(Arc<View>),
    /// The run started without us (we are new, or a restart of a member):
    /// we ask to be admitted at a barrier.
    Outside(Arc<View>),
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
    /// The settings behind the config hash, by name.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Digest of the admission policy (every node of a run has the same).
    #[serde(default)]
    pub admission: String,
    /// Random per process: two instances behind one peer id are two
    /// processes sharing one identity.
    #[serde(default)]
    pub instance: u64,
}

/// Why an admitted peer was refused: the field that differs and, for the
/// config hash, the names of the settings that differ. No values: the
/// refuser's log has them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Refusal {
    pub field: String,
    pub settings: Vec<String>,
}

/// Field of the refusal sent to a peer id seen from two processes.
pub(crate) const DUPLICATE: &str = "duplicated identity";

/// A refusal as this node records it: the field and the log text.
#[derive(Debug, Clone)]
struct Refused {
    field: String,
    reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)] // one per exchange
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
    /// Peers refused either way, with what we know of why.
    refused: HashMap<PeerId, Refused>,
    /// Process instances seen behind each verified peer id, in order.
    instances: HashMap<PeerId, Vec<u64>>,
    /// Peer ids seen from two live processes.
    duplicates: HashSet<PeerId>,
    refusals: Vec<String>,
    in_flight: HashSet<PeerId>,
    fatal: Option<CommError>,
    view: Option<Arc<View>>,
    /// Each member's process instance in the current view.
    view_instances: HashMap<PeerId, u64>,
    /// A started view that runs without us (or with an earlier process of
    /// ours).
    outside: Option<Arc<View>>,
}

/// The membership protocol of one node.
pub(crate) struct Membership {
    local: PeerId,
    identity: RunIdentity,
    settings: BTreeMap<String, String>,
    admission: Admission,
    proof: Proof,
    instance: u64,
    identity_file: Option<std::path::PathBuf>,
    nodes: usize,
    listen: Arc<Mutex<Vec<Multiaddr>>>,
    bootstrap: Vec<Multiaddr>,
    swarm: mpsc::UnboundedSender<SwarmCmd>,
    view_tx: watch::Sender<Option<Arc<View>>>,
    state: Mutex<MemberState>,
    changed: Notify,
    stopping: Arc<AtomicBool>,
    shared: Arc<super::state::Shared>,
}

#[path = "handshake.rs"]
mod handshake;

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
        shared: Arc<super::state::Shared>,
    ) -> Self {
        let stopping = shared.stopping.clone();
        Self {
            local,
            identity: cfg.run.clone(),
            settings: cfg.settings.clone(),
            admission: cfg.admission.clone(),
            proof: cfg.admission.proof(&cfg.run.run_id, &local),
            instance: handshake::random_instance(),
            identity_file: cfg.identity_file.clone(),
            nodes: cfg.nodes,
            listen,
            bootstrap,
            swarm,
            view_tx,
            state: Mutex::new(MemberState::default()),
            changed: Notify::new(),
            stopping,
            shared,
        }
    }

    /// The process instance of each member of `view` (0 when unknown).
    fn instances_of(&self, st: &MemberState, view: &View) -> HashMap<PeerId, u64> {
        view.members
            .iter()
            .map(|p| {
                let i = if *p == self.local {
                    self.instance
                } else {
                    st.instances
                        .get(p)
                        .and_then(|v| v.last().copied())
                        .unwrap_or(0)
                };
                (*p, i)
            })
            .collect()
    }

    /// Whether `peer` passed the handshake with us.
    pub fn is_verified(&self, peer: &PeerId) -> bool {
        lock(&self.state).verified.contains_key(peer)
    }

    /// Peers that passed the handshake with us.
    pub fn verified_peers(&self) -> Vec<PeerId> {
        lock(&self.state).verified.keys().copied().collect()
    }

    /// The key that orders `peer` into its place (and rank) under the run's
    /// admission policy: the order of the first view, and of joiners.
    pub fn place(&self, peer: &PeerId) -> (u64, String) {
        self.admission.place(&self.identity.run_id, peer)
    }

    /// The addresses `peer` announced (ours for ourselves).
    pub fn addrs_of(&self, peer: &PeerId) -> Vec<String> {
        if *peer == self.local {
            return lock(&self.listen).iter().map(|a| a.to_string()).collect();
        }
        lock(&self.state)
            .verified
            .get(peer)
            .map(|a| a.iter().map(|a| a.to_string()).collect())
            .unwrap_or_default()
    }

    /// A view change installed `view`: hellos show it, and the inbound
    /// streams check frames against it.
    pub fn install(&self, view: Arc<View>) {
        let mut st = lock(&self.state);
        st.view_instances = self.instances_of(&st, &view);
        st.view = Some(view.clone());
        st.outside = None;
        drop(st);
        let _ = self.view_tx.send(Some(view));
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
                instances: v
                    .members
                    .iter()
                    .map(|p| st.view_instances.get(p).copied().unwrap_or(0))
                    .collect(),
            }),
            settings: self.settings.clone(),
            admission: self.admission.digest(),
            instance: self.instance,
        }
    }

    /// Records a verified peer and what it told us; dials the members it
    /// knows and we do not.
    fn learn(&self, peer: PeerId, hello: &Hello) {
        let mut st = lock(&self.state);
        let addrs = parse_addrs("hello", &hello.addrs).unwrap_or_default();
        st.verified.insert(peer, addrs);
        if lock(&self.shared.views.0).fresh.contains(&peer) {
            // Admitted in this view: this is the process we admitted.
            st.view_instances.insert(peer, hello.instance);
        } else if st
            .view_instances
            .get(&peer)
            .is_some_and(|i| *i != 0 && *i != hello.instance)
        {
            // A new process behind a member's identity: the old one is gone.
            self.shared.restarted(
                &peer,
                "a new process with its identity said hello (a restart)",
            );
        }
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

    /// The member list we propose: the first `nodes` verified peers in the
    /// policy's place order, once that many are known.
    fn candidate(&self, st: &MemberState) -> Result<Option<Vec<String>>, CommError> {
        let mut all: Vec<PeerId> = st.verified.keys().copied().collect();
        all.push(self.local);
        all.sort_by_cached_key(|p| self.admission.place(&self.identity.run_id, p));
        if all.len() < self.nodes {
            return Ok(None);
        }
        all.truncate(self.nodes);
        let all: Vec<String> = all.iter().map(|p| p.to_string()).collect();
        if !all.contains(&self.local.to_string()) {
            return Err(CommError::Other(format!(
                "the run's {} places are taken by admitted peers placed before us ({}, {} policy): {}",
                self.nodes,
                self.local,
                self.admission.name(),
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
        for info in st.started.values() {
            let place = info.members.iter().position(|p| *p == me);
            let restarted = place
                .and_then(|i| info.instances.get(i))
                .is_some_and(|i| *i != 0 && *i != self.instance);
            if place.is_none() || restarted {
                let newest = st
                    .started
                    .values()
                    .max_by_key(|i| i.number)
                    .unwrap_or(info)
                    .clone();
                let members: Result<Vec<PeerId>, _> =
                    newest.members.iter().map(|n| n.parse::<PeerId>()).collect();
                let members = members.map_err(|e| {
                    CommError::Other(format!("a started view holds a bad peer id: {e}"))
                })?;
                st.outside = Some(Arc::new(View {
                    number: newest.number,
                    members,
                }));
                return Ok(None);
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
        let mut members = members
            .map_err(|e| CommError::Other(format!("a member list holds a bad peer id: {e}")))?;
        // Ranks follow the agreed list's order (the policy's place order).
        let mut seen = HashSet::new();
        members.retain(|p| seen.insert(*p));
        let view = Arc::new(View { number, members });
        st.view_instances = self.instances_of(st, &view);
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
            NetEvent::SameIdentity { address, outbound } => {
                let text = if outbound {
                    format!("the node at {address} has our own peer id {}", self.local)
                } else {
                    format!(
                        "a connection from {address} authenticated as our own peer id {}",
                        self.local
                    )
                };
                let text = format!(
                    "{text}: another process uses this node's identity{}",
                    self.identity_file_note()
                );
                tracing::error!("duplicated identity: {text}");
                if st.fatal.is_none() && st.view.is_none() {
                    st.fatal = Some(CommError::DuplicateIdentity(text));
                }
                None
            }
            NetEvent::Disconnected { peer } => {
                st.connected.remove(&peer);
                let member = st.view.as_ref().is_some_and(|v| v.rank_of(&peer).is_some());
                if member && !self.stopping.load(Ordering::Relaxed) {
                    tracing::info!(%peer, "the connection to member {peer} closed");
                    drop(st);
                    self.shared.lose(&peer, "its connection closed");
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
    ) -> Result<Joined, CommError> {
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
                Ok(Some(view)) => break Ok(Joined::Member(view)),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
            if let Some(view) = st.outside.clone() {
                break Ok(Joined::Outside(view));
            }
        };
        if let Ok(joined) = &result {
            match joined {
                Joined::Member(view) => {
                    tracing::info!(view = view.number, members = ?view.names(), "joined the run: view {} with {} members", view.number, view.members.len());
                    let _ = self.view_tx.send(Some(view.clone()));
                }
                Joined::Outside(view) => {
                    tracing::info!(view = view.number, members = ?view.names(), "the run is under way (view {} with {} members) without this process: asking to be admitted", view.number, view.members.len());
                }
            }
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
