//! View changes over libp2p: a lost member, a restarted or new node, a
//! partition (docs/algorithm.md, "Membership").
//!
//! `/slowmo/view/1` carries one small CBOR message per stream, answered by
//! an acknowledgement:
//! - [`ViewMsg::Report`]: a member of view `v` cannot go on in it (it lost a
//!   peer, or heard that another member began a change). It names the
//!   newest barrier it holds, the peers it suspects and the joiners it
//!   knows. Every member sends its report to every member it does not
//!   suspect, so a report also tells the receiver to stop and change.
//! - [`ViewMsg::Decided`]: the coordinator (the lowest-ranked member of `v`
//!   not suspected: a closed connection, or no report of its own within the
//!   peer timeout) waited for the reports of every member it does not
//!   suspect (at most the peer timeout), checked the quorum,
//!   and hands out view `v + 1`: the members that reported in their old
//!   order, then the joiners; the barrier everybody returns to (the oldest
//!   newest barrier among them); who was lost and who joined.
//! - [`ViewMsg::Excluded`]: the coordinator of a side without a quorum
//!   (less than half of `v`, or exactly half without `v`'s rank 0) tells
//!   its side to pause; they ask to join again ([`ViewMsg::Join`]) until
//!   the majority admits them at one of its barriers. Two sides therefore
//!   never both go on as the run.
//! - [`ViewMsg::Join`]: a node outside the view (new, restarted with its
//!   identity, or excluded) that passed the membership handshake asks to be
//!   admitted; the members admit it at their next barrier.
//!
//! `/slowmo/state/1` streams the training state to a joiner: a header
//! (view, length, SHA-256) and the bytes, checked against the cap, the
//! hash and the decided view before the joiner takes them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::membership::{MemberInfo, Membership, read_msg, write_msg};
use super::state::{Shared, View, lock};
use crate::view_rule::{self, Decision};
use crate::{CommError, NewView, Rank, ViewChange};

/// Protocol of view changes and joins.
pub const VIEW_PROTOCOL: &str = "/slowmo/view/1";
/// Protocol of the state transfer to joiners.
pub const STATE_PROTOCOL: &str = "/slowmo/state/1";

/// Time for one view message to be delivered and acknowledged.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the training thread looks at the board while it waits.
const TICK: Duration = Duration::from_millis(20);
/// How often a joiner repeats its request.
const JOIN_REPEAT: Duration = Duration::from_secs(2);
/// Most members a view message may list.
const MAX_MEMBERS: usize = 4096;

/// A member's account of why view `view` must end.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Report {
    pub view: u64,
    pub last_barrier: u64,
    pub suspects: Vec<String>,
    pub joiners: Vec<MemberInfo>,
}

/// The next view, as its coordinator decided it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ViewDecision {
    pub from_view: u64,
    pub number: u64,
    /// Members in rank order, with the addresses joiners dial.
    pub members: Vec<MemberInfo>,
    pub rollback_to: u64,
    pub lost: Vec<String>,
    pub joined: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ViewMsg {
    Report(Report),
    Decided(ViewDecision),
    Excluded {
        view: u64,
        reason: String,
    },
    /// The run cannot go on (fewer members than `--min-nodes` and nobody
    /// joined in time): every member stops with the reason.
    Stop {
        view: u64,
        reason: String,
    },
    Join {
        addrs: Vec<String>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ViewReply {
    Ok,
    Refused(String),
    /// The answer to a join request from a peer the current view already
    /// admitted: the decision, again (the first may have been lost while
    /// the connection to its earlier process was dropped).
    Admitted(ViewDecision),
}

/// The header of a state transfer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StateHeader {
    pub view: u64,
    pub len: u64,
    pub sha256: String,
}

/// What the view protocol has heard, for the training thread.
#[derive(Default)]
pub(crate) struct BoardState {
    /// Peers of the current view this node believes lost.
    pub suspects: HashSet<PeerId>,
    /// Reports by view, then sender.
    reports: BTreeMap<u64, HashMap<PeerId, Report>>,
    /// Decisions heard, with their sender.
    decided: Vec<(PeerId, ViewDecision)>,
    /// The view we were told to leave, and why.
    excluded: Option<(u64, String)>,
    /// The view whose members were told to stop, and why.
    stopped: Option<(u64, String)>,
    /// Nodes outside the view that asked to join, with their addresses.
    joiners: BTreeMap<PeerId, Vec<String>>,
    /// Peers admitted in the current view (a join request they repeated
    /// before they heard of it is no restart).
    pub fresh: HashSet<PeerId>,
    /// The decision that made the current view.
    last: Option<ViewDecision>,
    /// A state received while joining: (view, sender, bytes).
    state_in: Option<(u64, PeerId, Vec<u8>)>,
}

/// See [`BoardState`].
#[derive(Default)]
pub(crate) struct Board(pub Mutex<BoardState>);

/// The largest state a joiner accepts for a run exchanging `floats`.
fn state_cap(floats: usize) -> u64 {
    // Parameters, anchor, slow momentum, optimizer moments and headers.
    16 * 4 * floats as u64 + (16 << 20)
}

fn parse_peer(text: &str) -> Result<PeerId, String> {
    text.parse()
        .map_err(|e| format!("`{text}` is not a peer id: {e}"))
}

impl Shared {
    /// `peer` (a member of the current view) is gone: suspect it and make
    /// every wait give up, so that the view changes.
    pub fn lose(&self, peer: &PeerId, reason: &str) {
        if self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let Some(view) = self.view.borrow().clone() else {
            return;
        };
        let Some(rank) = view.rank_of(peer) else {
            return;
        };
        if *peer == self.local {
            return;
        }
        lock(&self.views.0).suspects.insert(*peer);
        let mut alarm = lock(&self.alarm);
        if alarm.is_none() {
            tracing::warn!(%peer, rank, "member {peer} (rank {rank}) is lost: {reason}");
            *alarm = Some(CommError::PeerLost {
                peer: peer.to_string(),
                rank,
                reason: reason.to_string(),
            });
        }
    }

    /// A new process runs behind member `peer`'s identity: the old one is
    /// lost, and its connection (which may look alive for a while, QUIC
    /// sees no close from a killed process) is dropped so that streams go
    /// to the new one. Only connections older than the newest go: by then
    /// the new process may already be admitted again over its own.
    pub fn restarted(&self, peer: &PeerId, reason: &str) {
        self.lose(peer, reason);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (swarm, peer) = (self.swarm.clone(), *peer);
            rt.spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = swarm.send(super::behaviour::SwarmCmd::DropStale(peer));
            });
        }
    }

    /// `peer` (a coordinator) stayed silent during a view change: the next
    /// member coordinates. (A timed-out data-plane wait suspects nobody: the
    /// peer waited for may itself wait on the one that is gone; whoever does
    /// not report during the change is left out.)
    pub fn suspect(&self, peer: &PeerId) {
        if *peer != self.local {
            lock(&self.views.0).suspects.insert(*peer);
        }
    }

    fn raise(&self, why: String) {
        let mut alarm = lock(&self.alarm);
        if alarm.is_none() {
            *alarm = Some(CommError::ViewChanging(why));
        }
    }
}

/// Serves the view and state protocols for the life of the node.
pub(crate) fn spawn_acceptors(
    shared: &Arc<Shared>,
    membership: &Arc<Membership>,
    control: &mut libp2p_stream::Control,
) -> Result<(), CommError> {
    let mut views = control
        .accept(StreamProtocol::new(VIEW_PROTOCOL))
        .map_err(|e| CommError::Other(format!("{VIEW_PROTOCOL}: {e}")))?;
    let mut states = control
        .accept(StreamProtocol::new(STATE_PROTOCOL))
        .map_err(|e| CommError::Other(format!("{STATE_PROTOCOL}: {e}")))?;
    let (s, m) = (shared.clone(), membership.clone());
    tokio::spawn(async move {
        while let Some((peer, mut stream)) = views.next().await {
            let (s, m) = (s.clone(), m.clone());
            tokio::spawn(async move {
                let served = tokio::time::timeout(SEND_TIMEOUT, async {
                    let msg: ViewMsg = match read_msg(&mut stream).await {
                        Ok(msg) => msg,
                        Err(e) => {
                            s.reject_view(&peer, &format!("bad view message: {e}"));
                            return;
                        }
                    };
                    let reply = match on_view_msg(&s, &m, peer, msg) {
                        Ok(None) => ViewReply::Ok,
                        Ok(Some(d)) => ViewReply::Admitted(d),
                        Err(why) => {
                            s.reject_view(&peer, &why);
                            ViewReply::Refused(why)
                        }
                    };
                    let _ = write_msg(&mut stream, &reply).await;
                    let _ = stream.close().await;
                })
                .await;
                if served.is_err() {
                    tracing::debug!(%peer, "view message from {peer} timed out");
                }
            });
        }
    });
    let s = shared.clone();
    tokio::spawn(async move {
        while let Some((peer, stream)) = states.next().await {
            let s = s.clone();
            tokio::spawn(async move {
                if let Err(why) = receive_state(&s, peer, stream).await {
                    s.reject_view(&peer, &format!("state transfer: {why}"));
                }
            });
        }
    });
    Ok(())
}

impl Shared {
    fn reject_view(&self, peer: &PeerId, why: &str) {
        let reason = super::wire::Reject::MalformedHeader(why.to_string());
        self.reject(peer, VIEW_PROTOCOL, &reason);
    }
}

/// Checks a view message against what we know and records it.
fn on_view_msg(
    shared: &Shared,
    membership: &Membership,
    peer: PeerId,
    msg: ViewMsg,
) -> Result<Option<ViewDecision>, String> {
    let view = shared.view.borrow().clone();
    let ours = view.as_ref().map_or(0, |v| v.number);
    let member_of = |v: &Option<Arc<View>>| v.as_ref().is_some_and(|v| v.rank_of(&peer).is_some());
    match msg {
        ViewMsg::Report(r) => {
            if r.suspects.len() > MAX_MEMBERS || r.joiners.len() > MAX_MEMBERS {
                return Err("report lists too many peers".into());
            }
            for p in r.suspects.iter().chain(r.joiners.iter().map(|j| &j.peer)) {
                parse_peer(p)?;
            }
            if r.view < ours {
                return Ok(None); // a change we are already past
            }
            if r.view == ours && !member_of(&view) {
                return Err(format!("report about view {ours} from a non-member"));
            }
            tracing::debug!(%peer, view = r.view, "report from {peer} on view {}", r.view);
            let mut b = lock(&shared.views.0);
            b.reports.entry(r.view).or_default().insert(peer, r.clone());
            drop(b);
            if r.view == ours {
                shared.raise(format!("member {peer} began a change of view {ours}"));
            }
            Ok(None)
        }
        ViewMsg::Decided(d) => {
            check_decision(&d)?;
            let inside = d.members.iter().any(|m| m.peer == peer.to_string());
            if d.number <= ours && view.is_some() {
                return Ok(None); // already installed (or superseded)
            }
            if !inside {
                return Err(format!(
                    "decision of view {} from a peer outside it",
                    d.number
                ));
            }
            let local = shared.local.to_string();
            if member_of(&view) && d.from_view == ours {
                lock(&shared.views.0).decided.push((peer, d));
                shared.raise(format!("member {peer} decided view {ours} + 1"));
            } else if d.members.iter().any(|m| m.peer == local) {
                // We wait to join (or were excluded): the decision admits us.
                lock(&shared.views.0).decided.push((peer, d));
            } else {
                return Err(format!(
                    "decision of view {} that does not follow our view {ours}",
                    d.number
                ));
            }
            Ok(None)
        }
        ViewMsg::Excluded { view: v, reason } => {
            if v != ours || !member_of(&view) {
                return Err(format!("exclusion from view {v}, ours is {ours}"));
            }
            lock(&shared.views.0).excluded = Some((v, reason.clone()));
            shared.raise(format!("excluded from view {v}: {reason}"));
            Ok(None)
        }
        ViewMsg::Stop { view: v, reason } => {
            if v != ours || !member_of(&view) {
                return Err(format!("stop of view {v}, ours is {ours}"));
            }
            lock(&shared.views.0).stopped = Some((v, reason.clone()));
            shared.raise(format!("the run stops: {reason}"));
            Ok(None)
        }
        ViewMsg::Join { addrs } => {
            if addrs.len() > 64 {
                return Err("join request with too many addresses".into());
            }
            if !membership.is_verified(&peer) {
                return Err("join request from a peer that did not pass the handshake".into());
            }
            let fresh = lock(&shared.views.0).fresh.contains(&peer);
            if fresh {
                // Admitted already: it has not heard yet.
                return Ok(lock(&shared.views.0).last.clone());
            }
            if member_of(&view) {
                // Our member asks to join: a new process behind its identity
                // (the old one is gone), or it was excluded.
                shared.restarted(&peer, "it asks to join again (restarted)");
            }
            let mut b = lock(&shared.views.0);
            if !b.joiners.contains_key(&peer) {
                tracing::info!(%peer, "peer {peer} asks to join; admitted at the next barrier");
            }
            b.joiners.insert(peer, addrs);
            Ok(None)
        }
    }
}

fn check_decision(d: &ViewDecision) -> Result<(), String> {
    if d.members.is_empty() || d.members.len() > MAX_MEMBERS {
        return Err(format!("decision with {} members", d.members.len()));
    }
    if d.number != d.from_view + 1 {
        return Err(format!(
            "decision of view {} after view {}",
            d.number, d.from_view
        ));
    }
    let mut seen = HashSet::new();
    for m in &d.members {
        parse_peer(&m.peer)?;
        if !seen.insert(&m.peer) {
            return Err(format!("decision lists {} twice", m.peer));
        }
        if m.addrs.len() > 64 {
            return Err("decision with too many addresses".into());
        }
    }
    for p in d.lost.iter().chain(&d.joined) {
        parse_peer(p)?;
    }
    Ok(())
}

async fn receive_state(
    shared: &Shared,
    peer: PeerId,
    mut stream: libp2p::Stream,
) -> Result<(), String> {
    let header: StateHeader = tokio::time::timeout(SEND_TIMEOUT, read_msg(&mut stream))
        .await
        .map_err(|_| "no header in time".to_string())?
        .map_err(|e| format!("bad header: {e}"))?;
    // The decision may still be on its way (the coordinator sends it and
    // the state at about the same time).
    let until = Instant::now() + SEND_TIMEOUT;
    let decision = loop {
        let found = lock(&shared.views.0)
            .decided
            .iter()
            .find(|(_, d)| d.number == header.view)
            .map(|(_, d)| d.clone());
        if found.is_some() || Instant::now() >= until {
            break found;
        }
        tokio::time::sleep(TICK).await;
    };
    let Some(decision) = decision else {
        return Err(format!(
            "state for view {} we were not admitted to",
            header.view
        ));
    };
    if !decision.members.iter().any(|m| m.peer == peer.to_string())
        || decision.joined.contains(&peer.to_string())
    {
        return Err(format!(
            "state for view {} from a peer that is not an old member of it",
            header.view
        ));
    }
    let cap = state_cap(shared.cfg.payload_floats);
    if header.len > cap {
        return Err(format!(
            "state of {} bytes exceeds the cap of {cap}",
            header.len
        ));
    }
    let mut bytes = vec![0u8; header.len as usize];
    let limit = shared.cfg.peer_timeout.max(SEND_TIMEOUT);
    tokio::time::timeout(limit, stream.read_exact(&mut bytes))
        .await
        .map_err(|_| format!("state not received within {limit:?}"))?
        .map_err(|e| format!("state stream broke: {e}"))?;
    let digest = super::admission::hex(&Sha256::digest(&bytes));
    if digest != header.sha256 {
        return Err(format!(
            "state hash {digest} differs from the announced {}",
            header.sha256
        ));
    }
    lock(&shared.views.0).state_in = Some((header.view, peer, bytes));
    let _ = stream.write_all(&[super::wire::READY]).await;
    let _ = stream.close().await;
    Ok(())
}

/// Sends one view message and waits for its acknowledgement.
async fn send(
    mut control: libp2p_stream::Control,
    peer: PeerId,
    msg: ViewMsg,
) -> Result<Option<ViewDecision>, String> {
    tokio::time::timeout(SEND_TIMEOUT, async move {
        let mut s = control
            .open_stream(peer, StreamProtocol::new(VIEW_PROTOCOL))
            .await
            .map_err(|e| e.to_string())?;
        write_msg(&mut s, &msg).await.map_err(|e| e.to_string())?;
        let reply: ViewReply = read_msg(&mut s).await.map_err(|e| e.to_string())?;
        let _ = s.close().await;
        match reply {
            ViewReply::Ok => Ok(None),
            ViewReply::Admitted(d) => Ok(Some(d)),
            ViewReply::Refused(why) => Err(format!("refused: {why}")),
        }
    })
    .await
    .map_err(|_| format!("no answer within {SEND_TIMEOUT:?}"))?
}

/// The coordinator's view of a change: the members that go on (in their
/// old order), the joiners their reports name, and the reports.
struct Plan {
    live: Vec<PeerId>,
    joiners: BTreeMap<PeerId, Vec<String>>,
    reports: HashMap<PeerId, Report>,
}

impl super::P2pComm {
    /// Sends `msg` to `peer` in the background, trying again (a stream can
    /// be dropped by a busy receiver) for up to the peer timeout; a report
    /// that never gets through makes us suspect the peer.
    fn spawn_send(&self, peer: PeerId, msg: ViewMsg, suspect_on_failure: bool) {
        let control = self.control.clone();
        let shared = self.shared.clone();
        let Some(rt) = self.rt.as_ref() else { return };
        let (interval, what) = match &msg {
            ViewMsg::Join { .. } => (Duration::ZERO, "join request".to_string()),
            ViewMsg::Report(r) => (
                shared.cfg.peer_timeout,
                format!("report on view {}", r.view),
            ),
            ViewMsg::Decided(d) => (
                shared.cfg.peer_timeout,
                format!("decision of view {}", d.number),
            ),
            ViewMsg::Excluded { view, .. } => (
                shared.cfg.peer_timeout,
                format!("exclusion from view {view}"),
            ),
            ViewMsg::Stop { view, .. } => (shared.cfg.peer_timeout, format!("stop of view {view}")),
        };
        rt.spawn(async move {
            let started = Instant::now();
            loop {
                match send(control.clone(), peer, msg.clone()).await {
                    Ok(None) => return,
                    Ok(Some(d)) => {
                        // Only to a join request: the decision that admitted us.
                        let me = shared.local.to_string();
                        let valid = matches!(msg, ViewMsg::Join { .. })
                            && check_decision(&d).is_ok()
                            && d.members.iter().any(|m| m.peer == peer.to_string())
                            && d.members.iter().any(|m| m.peer == me);
                        let mut b = lock(&shared.views.0);
                        if valid && !b.decided.iter().any(|(_, k)| k.number == d.number) {
                            tracing::info!(%peer, "{peer} says view {} admitted us", d.number);
                            b.decided.push((peer, d));
                        }
                        return;
                    }
                    Err(e) if started.elapsed() >= interval => {
                        tracing::debug!(%peer, "{what} to {peer} failed: {e}");
                        if suspect_on_failure {
                            shared.suspect(&peer);
                        }
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(%peer, "{what} to {peer} failed, trying again: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
    }

    fn sleep_tick(&self) -> Result<(), CommError> {
        self.shared.interrupt.check()?;
        std::thread::sleep(TICK);
        Ok(())
    }

    /// [`crate::Communicator::change_view`] over libp2p; see the module docs.
    /// The coordinator does not decide a view smaller than `min_nodes`: it
    /// waits (up to the join timeout) for joiners, then stops the run.
    pub(super) fn change_view_p2p(&mut self, last_barrier: u64) -> Result<ViewChange, CommError> {
        if !self.is_member() {
            return Ok(ViewChange::Excluded(format!(
                "outside view {}: waiting to be admitted",
                self.view.number
            )));
        }
        self.runtime()?;
        let old = self.view.clone();
        let me = self.shared.local;
        tracing::info!(
            view = old.number,
            last_barrier,
            "changing view {} (newest barrier {last_barrier})",
            old.number
        );
        let timeout = self.shared.cfg.peer_timeout;
        let mut reported: HashMap<PeerId, usize> = HashMap::new();
        let min = self.shared.cfg.min_nodes;
        let join_limit = self.shared.cfg.join_timeout;
        let mut coordinator: Option<(PeerId, Instant)> = None;
        let (mut warned, mut paused) = (false, false);
        loop {
            let (suspects, joiners) = {
                let mut b = lock(&self.shared.views.0);
                if let Some((v, why)) = b.excluded.clone()
                    && v == old.number
                {
                    return Ok(ViewChange::Excluded(why));
                }
                if let Some((v, why)) = b.stopped.clone()
                    && v == old.number
                {
                    return Err(CommError::Other(why));
                }
                if let Some((from, d)) = b
                    .decided
                    .iter()
                    .find(|(_, d)| d.from_view == old.number)
                    .cloned()
                {
                    drop(b);
                    tracing::info!(%from, "view {} decided by {from}", d.number);
                    return self.adopt_decision(&d);
                }
                b.suspects.retain(|p| old.rank_of(p).is_some());
                b.suspects.remove(&me);
                let joiners: Vec<MemberInfo> = b
                    .joiners
                    .iter()
                    .map(|(p, a)| MemberInfo {
                        peer: p.to_string(),
                        addrs: a.clone(),
                    })
                    .collect();
                let mine = Report {
                    view: old.number,
                    last_barrier,
                    suspects: b.suspects.iter().map(|p| p.to_string()).collect(),
                    joiners: joiners.clone(),
                };
                b.reports.entry(old.number).or_default().insert(me, mine);
                (b.suspects.clone(), joiners)
            };
            // Tell every member we do not suspect (again when we hear of
            // more joiners).
            for peer in old.members.iter().filter(|p| **p != me) {
                if !suspects.contains(peer) && reported.get(peer).is_none_or(|n| *n < joiners.len())
                {
                    reported.insert(*peer, joiners.len());
                    let report = Report {
                        view: old.number,
                        last_barrier,
                        suspects: suspects.iter().map(|p| p.to_string()).collect(),
                        joiners: joiners.clone(),
                    };
                    self.spawn_send(*peer, ViewMsg::Report(report), true);
                }
            }
            let coord = *old
                .members
                .iter()
                .find(|p| !suspects.contains(p))
                .expect("we are a member and never suspect ourselves");
            let since = match coordinator {
                Some((c, t)) if c == coord => t,
                _ => {
                    tracing::debug!(%coord, "coordinator of the change: {coord}");
                    let now = Instant::now();
                    coordinator = Some((coord, now));
                    now
                }
            };
            if coord == me {
                let heard: HashSet<PeerId> = lock(&self.shared.views.0)
                    .reports
                    .get(&old.number)
                    .map(|r| r.keys().copied().collect())
                    .unwrap_or_default();
                let waiting: Vec<&PeerId> = old
                    .members
                    .iter()
                    .filter(|p| !suspects.contains(p) && !heard.contains(p))
                    .collect();
                if waiting.is_empty() || since.elapsed() >= timeout {
                    if !waiting.is_empty() && !warned {
                        warned = true;
                        tracing::warn!(
                            "no report from {:?} within {timeout:?}: leaving them out",
                            waiting
                        );
                    }
                    let plan = self.plan(&old, &heard, &suspects);
                    let size = plan.live.len() + plan.joiners.len();
                    if size >= min {
                        return self.decide(&old, plan);
                    }
                    if since.elapsed() >= timeout + join_limit {
                        let reason = format!(
                            "the run would have {size} members, below --min-nodes {min}, and \
                             not enough nodes joined within {join_limit:?}"
                        );
                        for p in old.members.iter().filter(|p| **p != me) {
                            let msg = ViewMsg::Stop {
                                view: old.number,
                                reason: reason.clone(),
                            };
                            self.spawn_send(*p, msg, false);
                        }
                        // Let the stop reach them before the node goes.
                        std::thread::sleep(Duration::from_millis(500));
                        return Err(CommError::Other(reason));
                    }
                    if !paused {
                        paused = true;
                        tracing::warn!(
                            "view {} + 1 would have {size} members, below --min-nodes {min}: \
                             waiting up to {join_limit:?} for nodes to join",
                            old.number
                        );
                    }
                }
            } else if !self.heard_from(old.number, &coord) && since.elapsed() >= timeout {
                // A live coordinator reports as soon as it hears of the
                // change; one that stays silent is gone.
                tracing::warn!(%coord, "coordinator {coord} sent no report within {timeout:?}; suspecting it");
                self.shared.suspect(&coord);
            } else if since.elapsed()
                >= 2 * timeout
                    + SEND_TIMEOUT
                    + if old.members.len() - suspects.len() < min {
                        join_limit
                    } else {
                        Duration::ZERO
                    }
            {
                tracing::warn!(%coord, "coordinator {coord} decided nothing in time; suspecting it");
                self.shared.suspect(&coord);
            }
            self.sleep_tick()?;
        }
    }

    fn heard_from(&self, view: u64, peer: &PeerId) -> bool {
        lock(&self.shared.views.0)
            .reports
            .get(&view)
            .is_some_and(|r| r.contains_key(peer))
    }

    /// The members of view `old` that go on: those we heard from and do
    /// not suspect, in their old order.
    fn live(&self, old: &View, heard: &HashSet<PeerId>, suspects: &HashSet<PeerId>) -> Vec<PeerId> {
        let me = self.shared.local;
        old.members
            .iter()
            .filter(|p| heard.contains(p) && (**p == me || !suspects.contains(p)))
            .copied()
            .collect()
    }

    /// The joiners the reports of the `live` members name.
    fn joiners_in(
        reports: &HashMap<PeerId, Report>,
        live: &[PeerId],
    ) -> BTreeMap<PeerId, Vec<String>> {
        let mut joiners: BTreeMap<PeerId, Vec<String>> = BTreeMap::new();
        for r in live.iter().filter_map(|p| reports.get(p)) {
            for j in &r.joiners {
                if let Ok(p) = j.peer.parse::<PeerId>() {
                    joiners.entry(p).or_insert_with(|| j.addrs.clone());
                }
            }
        }
        joiners.retain(|p, _| !live.contains(p));
        joiners
    }

    /// What the coordinator would decide now: the members of `old` that go
    /// on, the joiners their reports name, and the reports.
    fn plan(&self, old: &View, heard: &HashSet<PeerId>, suspects: &HashSet<PeerId>) -> Plan {
        let live = self.live(old, heard, suspects);
        let reports = lock(&self.shared.views.0)
            .reports
            .get(&old.number)
            .cloned()
            .unwrap_or_default();
        let joiners = Self::joiners_in(&reports, &live);
        Plan {
            live,
            joiners,
            reports,
        }
    }

    /// The coordinator's decision from the reports of view `old`, by the
    /// rule both transports share ([`view_rule::decide`]).
    fn decide(&mut self, old: &Arc<View>, plan: Plan) -> Result<ViewChange, CommError> {
        let me = self.shared.local;
        let Plan {
            live,
            joiners,
            reports,
        } = plan;
        let barriers: Vec<(PeerId, u64)> = live
            .iter()
            .filter_map(|p| reports.get(p).map(|r| (*p, r.last_barrier)))
            .collect();
        let candidates: Vec<PeerId> = joiners.keys().copied().collect();
        let next = match view_rule::decide(&old.members, &barriers, &candidates, |p| {
            self.membership.place(p)
        }) {
            Decision::Go(next) => next,
            Decision::NoQuorum { reachable, of } => {
                let reason = format!(
                    "{reachable} of the {of} members of view {} are reachable, no quorum: \
                     waiting to rejoin the side that holds one",
                    old.number
                );
                tracing::warn!("{reason}");
                for p in live.iter().filter(|p| **p != me) {
                    let msg = ViewMsg::Excluded {
                        view: old.number,
                        reason: reason.clone(),
                    };
                    self.spawn_send(*p, msg, false);
                }
                return Ok(ViewChange::Excluded(reason));
            }
        };
        let addrs_of = |p: &PeerId| -> Vec<String> {
            let known = self.membership.addrs_of(p);
            if known.is_empty() {
                joiners.get(p).cloned().unwrap_or_default()
            } else {
                known
            }
        };
        let names = |ps: &[PeerId]| ps.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let decision = ViewDecision {
            from_view: old.number,
            number: old.number + 1,
            members: next
                .members
                .iter()
                .map(|p| MemberInfo {
                    peer: p.to_string(),
                    addrs: addrs_of(p),
                })
                .collect(),
            rollback_to: next.rollback_to,
            lost: names(&next.lost),
            joined: names(&next.joined),
        };
        for m in decision.members.iter().filter(|m| m.peer != me.to_string()) {
            if let Ok(p) = m.peer.parse::<PeerId>() {
                self.dial(&p, &m.addrs);
                self.spawn_send(p, ViewMsg::Decided(decision.clone()), false);
            }
        }
        self.adopt_decision(&decision)
    }

    fn dial(&self, peer: &PeerId, addrs: &[String]) {
        let addrs: Vec<Multiaddr> = addrs.iter().filter_map(|a| a.parse().ok()).collect();
        if !addrs.is_empty() {
            let _ = self
                .shared
                .swarm
                .send(super::behaviour::SwarmCmd::Dial { peer: *peer, addrs });
        }
    }

    /// Installs a decided view; `Excluded` when it leaves us out.
    fn adopt_decision(&mut self, d: &ViewDecision) -> Result<ViewChange, CommError> {
        let me = self.shared.local.to_string();
        let Some(rank) = d.members.iter().position(|m| m.peer == me) else {
            return Ok(ViewChange::Excluded(format!(
                "view {} goes on without us",
                d.number
            )));
        };
        let was_member = self.is_member();
        let members: Vec<PeerId> = d
            .members
            .iter()
            .map(|m| m.peer.parse::<PeerId>())
            .collect::<Result<_, _>>()
            .map_err(|e| CommError::Other(format!("decided view holds a bad peer id: {e}")))?;
        for (m, p) in d.members.iter().zip(&members) {
            if m.peer != me {
                self.dial(p, &m.addrs);
            }
        }
        let names: Vec<String> = d.members.iter().map(|m| m.peer.clone()).collect();
        let sender: Option<Rank> = view_rule::state_sender(&names, &d.joined);
        self.install(View {
            number: d.number,
            members,
        });
        {
            let mut b = lock(&self.shared.views.0);
            b.fresh = d
                .joined
                .iter()
                .filter_map(|p| p.parse::<PeerId>().ok())
                .collect();
            b.last = Some(d.clone());
        }
        self.pending_joiners = d
            .joined
            .iter()
            .filter_map(|p| p.parse::<PeerId>().ok())
            .collect();
        let view = NewView {
            number: d.number,
            rank,
            world: d.members.len(),
            rollback_to: d.rollback_to,
            lost: d.lost.clone(),
            joined: d.joined.clone(),
            sends_state: was_member && sender == Some(rank),
            members: names,
            state_sender: sender,
        };
        tracing::info!(
            view = d.number,
            rank,
            world = view.world,
            "view {}: rank {rank} of {} (lost {:?}, joined {:?})",
            d.number,
            view.world,
            d.lost,
            d.joined
        );
        Ok(ViewChange::Member(view))
    }

    /// `true` when nodes wait to join (they are admitted at this barrier).
    pub(super) fn at_barrier_p2p(&mut self) -> Result<bool, CommError> {
        self.shared.check()?;
        let view = self.view.clone();
        let b = lock(&self.shared.views.0);
        Ok(b.joiners.keys().any(|p| view.rank_of(p).is_none()))
    }

    /// Hands the state to the joiners of the view just installed.
    pub(super) fn send_state_p2p(&mut self, state: &[u8]) -> Result<(), CommError> {
        let joiners = std::mem::take(&mut self.pending_joiners);
        let number = self.view.number;
        let header = StateHeader {
            view: number,
            len: state.len() as u64,
            sha256: super::admission::hex(&Sha256::digest(state)),
        };
        let rt = self.runtime()?;
        let limit = self.shared.cfg.peer_timeout.max(SEND_TIMEOUT);
        for peer in joiners {
            let control = self.control.clone();
            let header = header.clone();
            // Tried again until the limit: the joiner may not have heard of
            // its admission yet, or a stream may be dropped on the way.
            let sent = rt.block_on(async move {
                let attempt = |mut control: libp2p_stream::Control| {
                    let header = header.clone();
                    async move {
                        let mut s = control
                            .open_stream(peer, StreamProtocol::new(STATE_PROTOCOL))
                            .await
                            .map_err(|e| e.to_string())?;
                        write_msg(&mut s, &header)
                            .await
                            .map_err(|e| e.to_string())?;
                        s.write_all(state).await.map_err(|e| e.to_string())?;
                        s.flush().await.map_err(|e| e.to_string())?;
                        let mut ack = [0u8; 1];
                        s.read_exact(&mut ack).await.map_err(|e| e.to_string())?;
                        let _ = s.close().await;
                        Ok::<(), String>(())
                    }
                };
                let until = tokio::time::Instant::now() + limit;
                loop {
                    let left = until.saturating_duration_since(tokio::time::Instant::now());
                    let e = match tokio::time::timeout(left, attempt(control.clone())).await {
                        Ok(Ok(())) => return Ok(()),
                        Ok(Err(e)) => e,
                        Err(_) => format!("not done within {limit:?}"),
                    };
                    if tokio::time::Instant::now() >= until {
                        return Err(e);
                    }
                    tracing::debug!(%peer, "state transfer to {peer} failed, trying again: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
            match sent {
                Ok(()) => {
                    tracing::info!(%peer, bytes = state.len(), "sent the training state to joiner {peer}")
                }
                // The joiner is lost then: the next operation changes the view.
                Err(e) => {
                    tracing::warn!(%peer, "sending the state to joiner {peer} failed: {e}");
                    self.shared.lose(&peer, "the state transfer failed");
                }
            }
        }
        Ok(())
    }

    /// Outside the view: ask to be admitted until a decision takes us in,
    /// then wait for the state.
    pub(super) fn rejoin_p2p(&mut self) -> Result<crate::Admission, CommError> {
        if self.rt.is_none() {
            return Err(CommError::Closed("node stopped".into()));
        }
        let me = self.shared.local;
        let known = self.view.clone();
        let limit = self.shared.cfg.join_timeout;
        let started = Instant::now();
        let mut asked: Option<Instant> = None;
        tracing::info!(
            "outside the run (view {} has {} members): asking to join",
            known.number,
            known.members.len()
        );
        let decision = loop {
            if let Some(d) = lock(&self.shared.views.0)
                .decided
                .iter()
                .filter(|(_, d)| d.number > known.number)
                .find(|(_, d)| d.members.iter().any(|m| m.peer == me.to_string()))
                .map(|(_, d)| d.clone())
            {
                break d;
            }
            if started.elapsed() >= limit {
                return Err(CommError::Other(format!(
                    "not admitted to the run within {limit:?} (asked members of view {})",
                    known.number
                )));
            }
            if asked.is_none_or(|t| t.elapsed() >= JOIN_REPEAT) {
                asked = Some(Instant::now());
                let addrs: Vec<String> = lock(&self.listen).iter().map(|a| a.to_string()).collect();
                for peer in self.membership.verified_peers() {
                    if peer != me {
                        let msg = ViewMsg::Join {
                            addrs: addrs.clone(),
                        };
                        self.spawn_send(peer, msg, false);
                    }
                }
            }
            self.sleep_tick()?;
        };
        let ViewChange::Member(view) = self.adopt_decision(&decision)? else {
            unreachable!("the decision lists us");
        };
        let started = Instant::now();
        let limit = 2 * self.shared.cfg.peer_timeout + SEND_TIMEOUT;
        loop {
            {
                let mut b = lock(&self.shared.views.0);
                if b.state_in
                    .as_ref()
                    .is_some_and(|(v, _, _)| *v == view.number)
                {
                    let (_, from, state) = b.state_in.take().expect("checked");
                    tracing::info!(%from, bytes = state.len(), "received the training state from {from}");
                    b.decided.clear();
                    return Ok(crate::Admission { view, state });
                }
            }
            if started.elapsed() >= limit {
                return Err(CommError::Other(format!(
                    "admitted to view {}, but no member sent the training state within {limit:?}",
                    view.number
                )));
            }
            self.sleep_tick()?;
        }
    }

    /// Switches every link, the inbox and the collective counter to `view`.
    pub(super) fn install(&mut self, view: View) {
        let view = Arc::new(view);
        let rank = view.rank_of(&self.shared.local);
        for link in self
            .push_links
            .drain(..)
            .flatten()
            .chain(self.reduce_links.drain(..).flatten())
        {
            link.task.abort();
        }
        for payload in self.shared.push_inbox.reset(view.number) {
            payload.recycle(&self.shared.pool);
        }
        while let Ok(msg) = self.reduce_rx.try_recv() {
            self.shared.pool.give(msg.payload);
        }
        for msg in self.early.drain(..) {
            self.shared.pool.give(msg.payload);
        }
        self.push = crate::ledger::Ledger::new(crate::ledger::Mixing::Arrived);
        self.seq = 0;
        {
            let mut b = lock(&self.shared.views.0);
            b.suspects.clear();
            b.reports.retain(|v, _| *v >= view.number);
            // A joiner's decision stays until its state has come.
            b.decided.retain(|(_, d)| d.number >= view.number);
            b.excluded = None;
            b.joiners.retain(|p, _| view.rank_of(p).is_none());
        }
        *lock(&self.shared.alarm) = None;
        self.membership.install(view.clone());
        if let Some(lanes) = self.shared.lanes.get() {
            // Lanes serve one view: the new one's are offered below.
            lanes.retire_before(view.number);
        }
        if let (Some(_), Some(rt)) = (rank, self.rt.as_ref()) {
            let _guard = rt.enter();
            let (push, reduce) = super::spawn_links(&self.shared, &self.control, &view);
            self.push_links = push;
            self.reduce_links = reduce;
        }
        self.rank = rank.unwrap_or(0);
        self.view = view;
    }

    /// Whether this node is a member of its current view.
    pub fn is_member(&self) -> bool {
        self.view.rank_of(&self.shared.local).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: usize) -> Vec<PeerId> {
        (0..n).map(|_| PeerId::random()).collect()
    }

    #[test]
    fn decisions_are_checked() {
        let p = peers(2);
        let good = ViewDecision {
            from_view: 3,
            number: 4,
            members: p
                .iter()
                .map(|p| MemberInfo {
                    peer: p.to_string(),
                    addrs: vec![],
                })
                .collect(),
            rollback_to: 2,
            lost: vec![],
            joined: vec![],
        };
        assert!(check_decision(&good).is_ok());
        let skip = ViewDecision {
            number: 6,
            ..good.clone()
        };
        assert!(check_decision(&skip).unwrap_err().contains("after view 3"));
        let mut twice = good.clone();
        twice.members.push(twice.members[0].clone());
        assert!(check_decision(&twice).unwrap_err().contains("twice"));
        let mut bad = good.clone();
        bad.members[1].peer = "not-a-peer".into();
        assert!(check_decision(&bad).unwrap_err().contains("not a peer id"));
        let empty = ViewDecision {
            members: vec![],
            ..good
        };
        assert!(check_decision(&empty).is_err());
    }
}
