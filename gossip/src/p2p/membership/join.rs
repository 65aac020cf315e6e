//! Joining a run: the membership task of one node, from the first hello
//! to the agreed view (see [`super`] for the protocol).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use tokio::sync::{Notify, mpsc, watch};

use super::msg::{EXCHANGE_TIMEOUT, Hello, MemberInfo, Refused, ViewInfo};
use crate::CommError;
use crate::p2p::addrs::{parse_addrs, peer_in, strip_peer};
use crate::p2p::admission::{Admission, Proof};
use crate::p2p::behaviour::NetEvent;
use crate::p2p::command::SwarmCmd;
use crate::p2p::config::{P2pConfig, RunIdentity};
use crate::p2p::state::{Shared, View};
use crate::p2p::views::board::Board;
use crate::p2p::wire::{MEMBERSHIP_PROTOCOL, WIRE_VERSION};
use crate::sync::lock;

/// Pause between rounds of hellos while the view is not settled.
const REFRESH: Duration = Duration::from_millis(250);
/// How soon a peer is greeted again with nothing new to tell it.
const RETRY: Duration = Duration::from_secs(2);

/// How a join ended.
pub(crate) enum Joined {
    /// We are a member of the view that started.
    Member(Arc<View>),
    /// The run started without us (we are new, or a restart of a member):
    /// we ask to be admitted at a barrier.
    Outside(Arc<View>),
}

#[derive(Default)]
pub(super) struct MemberState {
    pub(super) connected: HashSet<PeerId>,
    pub(super) bootstrap_peers: HashSet<PeerId>,
    pub(super) verified: BTreeMap<PeerId, Vec<Multiaddr>>,
    pub(super) proposals: HashMap<PeerId, Vec<String>>,
    pub(super) started: HashMap<PeerId, ViewInfo>,
    /// Peers refused either way, with what we know of why.
    pub(super) refused: HashMap<PeerId, Refused>,
    /// Process instances seen behind each verified peer id, in order.
    pub(super) instances: HashMap<PeerId, Vec<u64>>,
    /// Peer ids seen from two live processes.
    pub(super) duplicates: HashSet<PeerId>,
    pub(super) refusals: Vec<String>,
    pub(super) in_flight: HashSet<PeerId>,
    /// When we last greeted each peer, and the proposal we sent.
    pub(super) greeted: HashMap<PeerId, (Instant, Option<Vec<String>>)>,
    pub(super) fatal: Option<CommError>,
    pub(super) view: Option<Arc<View>>,
    /// Each member's process instance in the current view.
    pub(super) view_instances: HashMap<PeerId, u64>,
    /// The data-lane addresses each verified peer announced.
    pub(super) lanes: HashMap<PeerId, Vec<String>>,
    /// A started view that runs without us (or with an earlier process of
    /// ours).
    pub(super) outside: Option<Arc<View>>,
}

/// The membership protocol of one node.
pub(crate) struct Membership {
    pub(super) local: PeerId,
    pub(super) identity: RunIdentity,
    pub(super) settings: BTreeMap<String, String>,
    pub(super) admission: Admission,
    pub(super) proof: Proof,
    pub(super) instance: u64,
    pub(super) identity_file: Option<std::path::PathBuf>,
    pub(super) nodes: usize,
    pub(super) listen: Arc<Mutex<Vec<Multiaddr>>>,
    pub(super) bootstrap: Vec<Multiaddr>,
    pub(super) swarm: mpsc::UnboundedSender<SwarmCmd>,
    pub(super) view_tx: watch::Sender<Option<Arc<View>>>,
    pub(super) state: Mutex<MemberState>,
    pub(super) changed: Notify,
    pub(super) stopping: Arc<AtomicBool>,
    /// Our data-lane addresses, announced in hellos.
    pub(super) lane: Mutex<Vec<String>>,
    pub(super) shared: Arc<Shared>,
    /// What the view protocol heard (the communicator's board).
    pub(super) board: Arc<Board>,
}

/// A random number for this process (the std hasher's random keys, the
/// clock and the process id).
fn random_instance() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

impl Membership {
    pub fn new(
        local: PeerId,
        cfg: &P2pConfig,
        listen: Arc<Mutex<Vec<Multiaddr>>>,
        bootstrap: Vec<Multiaddr>,
        view_tx: watch::Sender<Option<Arc<View>>>,
        shared: Arc<Shared>,
        board: Arc<Board>,
    ) -> Self {
        let stopping = shared.stopping.clone();
        let swarm = shared.swarm.clone();
        Self {
            local,
            identity: cfg.run.clone(),
            settings: cfg.settings.clone(),
            admission: cfg.admission.clone(),
            proof: cfg.admission.proof(&cfg.run.run_id, &local),
            instance: random_instance(),
            identity_file: cfg.identity_file.clone(),
            nodes: cfg.nodes,
            listen,
            bootstrap,
            swarm,
            view_tx,
            state: Mutex::new(MemberState::default()),
            changed: Notify::new(),
            stopping,
            lane: Mutex::new(Vec::new()),
            shared,
            board,
        }
    }

    /// The process instance of each member of `view` (0 when unknown).
    pub(super) fn instances_of(&self, st: &MemberState, view: &View) -> HashMap<PeerId, u64> {
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

    /// Whether a connection to `peer` is open.
    pub fn is_connected(&self, peer: &PeerId) -> bool {
        lock(&self.state).connected.contains(peer)
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
        self.shared.begin_view(view.number);
        let _ = self.view_tx.send(Some(view));
    }

    pub(super) fn hello_locked(&self, st: &MemberState) -> Hello {
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
            lane: lock(&self.lane).clone(),
        }
    }

    /// Sets the data-lane addresses our hellos announce.
    pub fn set_lane_addrs(&self, addrs: Vec<String>) {
        *lock(&self.lane) = addrs;
    }

    /// The data-lane addresses `peer` announced (only well-formed socket
    /// addresses, at most 8), for a probe of whether its process is gone.
    pub fn lane_addrs_of(&self, peer: &PeerId) -> Vec<String> {
        lock(&self.state)
            .lanes
            .get(peer)
            .cloned()
            .unwrap_or_default()
    }

    /// Records a verified peer and what it told us; dials the members it
    /// knows and we do not.
    pub(super) fn learn(&self, peer: PeerId, hello: &Hello) {
        let mut st = lock(&self.state);
        let addrs = parse_addrs("hello", &hello.addrs).unwrap_or_default();
        st.verified.insert(peer, addrs);
        let lane: Vec<String> = hello
            .lane
            .iter()
            .filter(|a| a.parse::<std::net::SocketAddr>().is_ok())
            .take(8)
            .cloned()
            .collect();
        st.lanes.insert(peer, lane);
        if lock(&self.board.0).fresh.contains(&peer) {
            // Admitted in this view: this is the process we admitted.
            st.view_instances.insert(peer, hello.instance);
        } else if st
            .view_instances
            .get(&peer)
            .is_some_and(|i| *i != 0 && *i != hello.instance)
        {
            // A new process behind a member's identity: the old one is gone.
            self.board.restarted(
                &self.shared,
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
    pub(super) fn candidate(&self, st: &MemberState) -> Result<Option<Vec<String>>, CommError> {
        let mut all: Vec<PeerId> = st.verified.keys().copied().collect();
        all.push(self.local);
        all.sort_by_cached_key(|p| self.admission.place(&self.identity.run_id, p));
        if all.len() < self.nodes {
            return Ok(None);
        }
        all.truncate(self.nodes);
        let all: Vec<String> = all.iter().map(|p| p.to_string()).collect();
        if !all.contains(&self.local.to_string()) {
            return Err(CommError::NotAdmitted(format!(
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
    pub(super) fn try_settle(&self, st: &mut MemberState) -> Result<Option<Arc<View>>, CommError> {
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
                    CommError::Protocol(format!("a started view holds a bad peer id: {e}"))
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
            .map_err(|e| CommError::Protocol(format!("a member list holds a bad peer id: {e}")))?;
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
            .map_err(|e| CommError::Network(format!("{MEMBERSHIP_PROTOCOL}: {e}")))?;
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

    pub(super) fn on_event(&self, ev: NetEvent) -> Option<PeerId> {
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
                    self.board
                        .lose(&self.shared, &peer, "its connection closed");
                }
                None
            }
        }
    }

    /// Peers to greet now. A hello carries our verified members and our
    /// proposal, and its answer the peer's; members spread through the
    /// answers (a peer we learn of is dialed and greeted). So we greet a
    /// connected peer not yet verified, and a verified one while we have no
    /// proposal, again after [`RETRY`]; once we have one, agreement runs
    /// through its first member, the coordinator: it greets every member
    /// when its proposal changed and, after [`RETRY`], those whose proposal
    /// still differs, and every other member greets only the coordinator
    /// (again after [`RETRY`] until it says it started: it starts the view
    /// and tells each member, see [`Membership::join`]). Greeting everyone
    /// on every tick made a start of 96 nodes exchange hundreds of MB of
    /// hellos a second and never settle; telling every member our proposal
    /// made it m^2 exchanges.
    pub(super) fn due(&self) -> Vec<PeerId> {
        let mut st = lock(&self.state);
        let cand = self.candidate(&st).ok().flatten();
        let coordinator = cand.as_ref().and_then(|c| c.first()).cloned();
        let me = self.local.to_string();
        let now = Instant::now();
        let mut out: Vec<PeerId> = st
            .connected
            .iter()
            .filter(|p| !st.refused.contains_key(p) && !st.in_flight.contains(p))
            .filter(|p| {
                let last = st.greeted.get(p);
                let waited = last.is_none_or(|(at, _)| now.duration_since(*at) >= RETRY);
                if !st.verified.contains_key(p) {
                    return waited;
                }
                let Some(coordinator) = &coordinator else {
                    return waited;
                };
                if *coordinator != me && *coordinator != p.to_string() {
                    return false;
                }
                let told = last.is_some_and(|(_, sent)| *sent == cand);
                // Until the coordinator says it started, ask again.
                let pending = st.proposals.get(p) != cand.as_ref()
                    || (*coordinator != me && !st.started.contains_key(p));
                !told || (waited && pending)
            })
            .copied()
            .collect();
        out.sort();
        for p in &out {
            st.in_flight.insert(*p);
            st.greeted.insert(*p, (now, cand.clone()));
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
                    self.tell_started(&control, view);
                    self.shared.begin_view(view.number);
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

    /// The coordinator of a view it started tells every member that has not
    /// said it started (a hello carries the view; the others greet only the
    /// coordinator, and adopt the view from its hello).
    fn tell_started(self: &Arc<Self>, control: &libp2p_stream::Control, view: &View) {
        if view.members.first() != Some(&self.local) {
            return;
        }
        let st = lock(&self.state);
        let untold: Vec<PeerId> = view
            .members
            .iter()
            .filter(|p| **p != self.local && !st.started.contains_key(p))
            .copied()
            .collect();
        drop(st);
        for peer in untold {
            tokio::spawn(self.clone().greet(control.clone(), peer));
        }
    }

    pub(super) fn timeout_error(&self, timeout: Duration) -> CommError {
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
