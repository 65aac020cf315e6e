//! The bulk-data lane: tensor bytes between two members of a view over K
//! plain TCP connections per direction, sealed with AEGIS-256X4 (or, by
//! explicit choice, sent in the clear), set up through the control plane.
//!
//! libp2p stays the control plane; it is authenticated and encrypted, and
//! only members of the current view speak our protocols. Over it, for each
//! view, the peer with the lower id offers a lane on `/slowmo/lane/2`
//! ([`offer`]); a view change retires the old view's lanes. Each side
//! contributes fresh random key material and announces a TCP address; the
//! lane's keys come from both contributions and both peer ids
//! ([`crypto`]). Each side then dials K connections to the other's address
//! and proves on each that it holds the key ([`conn`]): a peer that never
//! got an offer (one not in the view) cannot open a lane, and a connection
//! carries one direction, so its sender's records are sealed under one
//! key with counter nonces.
//!
//! A message (a push-sum share or an all-reduce chunk) is cut into up to K
//! parts, one per connection, each a fixed binary header ([`frame`]) and the
//! payload in records of 1 MiB. A synchronous push-sum share is not copied
//! into a buffer first, nor scaled: the writers read the caller's `x`, lent
//! for the round ([`super::lent`]), as it is, and the frame header carries
//! the share's scale, which the receiver applies as it adds (the product
//! rounded as the sender's would be, so the same bits). The sealing writer
//! seals each record from the lent bytes (a share's or a ring chunk's)
//! straight into its cache-sized record buffer; the plaintext writer sends
//! them straight into the socket. The receiver reads each record into the
//! part's own buffer and
//! opens it there (plaintext in 128 KiB pieces, scanned for non-finite
//! values while in the cache); push-sum parts are added straight from their
//! buffers, all-reduce parts are handed on in the sender's order. A ring
//! all-reduce part the ring already waits for takes no buffer of its own:
//! each record is opened in the reader's record buffer, checked, and added
//! into the ring's buffer at once; a part that is copied (the all-gather)
//! is opened from the record buffer straight into its place, or on the
//! plaintext lane read from the socket straight there
//! ([`super::landing`]).
//! A writer's connection over a short link (the same host, a rack: the
//! kernel's round trip at most 250 us) gets a fixed 512 KiB send buffer
//! instead of the kernel's autotuned one, and a longer link keeps the
//! autotuning ([`tune`]).
//! There is no checksum: the records are authenticated. Sizes, shapes, run,
//! view, round window and finiteness are checked as on the libp2p streams
//! ([`super::inbound::check_header`]).

pub(crate) mod alive;
pub(crate) mod check;
pub(crate) mod conn;
// Public for the cipher's benchmark (`benches/lane_cipher.rs`) only.
#[doc(hidden)]
pub mod crypto;
pub mod frame;
mod offer;
mod order;
mod port;
mod probe;
mod reader;
mod tune;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libp2p::{Multiaddr, PeerId};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, oneshot};

pub use super::config::{DataLane, MAX_CONNECTIONS, default_connections};
use super::links::{Link, Outgoing, Payload};
use super::reach::ip_of;
use super::state::{ReduceMsg, Shared, View};
use super::wire::{DType, Header, Kind};
use crate::sync::lock;
use crypto::{LaneKeys, SESSION_ID};
use frame::{FrameHeader, FrameKind};
pub(crate) use order::{ReduceOrder, ShareAssembly};
use port::{bind_error, listen_ip, log_fallback};

/// Smallest part a message is cut into (smaller messages go whole).
const MIN_PART: usize = 256 << 10;
/// Frames a connection's writer may hold queued.
const WRITER_QUEUE: usize = 2;
/// One part to write on a connection.
pub(crate) enum Job {
    Frame {
        header: FrameHeader,
        payload: Payload,
        range: std::ops::Range<usize>,
    },
    /// Writes the end frame and waits for the receiver's confirmation.
    End(oneshot::Sender<()>),
}

/// The lane between us and one peer in one view: a view change starts
/// new sessions (fresh keys, counts from zero) and retires the old ones.
pub(crate) struct Session {
    pub id: [u8; SESSION_ID],
    pub local: PeerId,
    pub peer: PeerId,
    /// The view whose frames the session carries.
    pub view: u64,
    pub keys: LaneKeys,
    pub mode: DataLane,
    /// Connections we dial ([`Lanes::per_peer_in`] of the view).
    pub per_peer: usize,
    /// Our connections' writers, once dialed.
    writers: Mutex<Vec<mpsc::Sender<Job>>>,
    ready: Notify,
    /// Inbound connection indices taken.
    accepted: Mutex<Vec<u16>>,
    /// Our count of all-reduce parts sent.
    sequence: AtomicU64,
    /// Messages sent (to spread single-part messages over connections).
    messages: AtomicU64,
    /// Links using the lane: the last one gone ends it.
    users: AtomicUsize,
    /// Retired (a later view, or a newer session with the same peer).
    closed: std::sync::atomic::AtomicBool,
    order: Mutex<ReduceOrder>,
    forward: mpsc::UnboundedSender<ReduceMsg>,
    /// Our count of push-sum shares sent.
    share_sequence: AtomicU64,
    pub(crate) shares: ShareAssembly,
    /// The peer's lane addresses (we dial them), for the liveness probe.
    peer_addrs: Mutex<Vec<String>>,
    /// A liveness probe is under way (one at a time).
    probing: std::sync::atomic::AtomicBool,
    /// Why none of our connections to the peer could be dialed (a peer
    /// behind a NAT): our frames to it take the libp2p connection instead.
    unreachable: Mutex<Option<String>>,
}

/// The lanes of one node: the listener and a session per peer.
pub(crate) struct Lanes {
    pub mode: DataLane,
    pub connections: usize,
    port: u16,
    bound: IpAddr,
    listen: Arc<Mutex<Vec<Multiaddr>>>,
    sessions: Mutex<HashMap<[u8; SESSION_ID], Arc<Session>>>,
    by_peer: Mutex<HashMap<(PeerId, u64), Arc<Session>>>,
    changed: Notify,
    /// Probe bytes received (the transport benchmark).
    pub probe_bytes: AtomicU64,
    pub probe_arrived: Notify,
    /// Told when a lane connection of a current session broke and the
    /// peer's lane port refuses connections: its process is gone.
    on_loss: std::sync::OnceLock<LossHook>,
    /// The control plane, for offers made from the acceptor.
    control: libp2p_stream::Control,
    /// Offers of ours under way (one per peer and view).
    offering: Mutex<std::collections::HashSet<(PeerId, u64)>>,
    /// Peers whose lane could not be dialed and whose tensors took libp2p:
    /// warned about once, not in every view.
    fallbacks: Mutex<std::collections::HashSet<PeerId>>,
}

/// Lane connections one node dials in one view, over all its peers: with
/// many lane peers (a large view) each gets fewer, so that a node's file
/// descriptors stay bounded.
pub const LANE_CONNECTION_BUDGET: usize = 16;

/// What the node does when a peer's process is found gone (the view
/// protocol suspects it).
pub(crate) type LossHook = Box<dyn Fn(&PeerId, &str) + Send + Sync>;

impl Lanes {
    /// Listens for lane connections and serves lane offers, unless the node
    /// sends tensors over libp2p.
    pub async fn start(
        shared: &Arc<Shared>,
        control: &mut libp2p_stream::Control,
        listen: Arc<Mutex<Vec<Multiaddr>>>,
    ) -> Result<Option<Arc<Lanes>>, String> {
        let mode = shared.cfg.data_lane;
        if mode == DataLane::Libp2p {
            return Ok(None);
        }
        let ip = listen_ip(&shared.cfg.listen);
        let wanted = shared.cfg.lane_port();
        let listener = TcpListener::bind(SocketAddr::new(ip, wanted))
            .await
            .map_err(|e| bind_error(ip, wanted, shared.cfg.lane_port.is_some(), &e))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("data lane: {e}"))?
            .port();
        let lanes = Arc::new(Lanes {
            mode,
            connections: shared.cfg.lane_connections.clamp(1, MAX_CONNECTIONS),
            port,
            bound: ip,
            listen,
            sessions: Mutex::new(HashMap::new()),
            by_peer: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            probe_bytes: AtomicU64::new(0),
            probe_arrived: Notify::new(),
            on_loss: std::sync::OnceLock::new(),
            control: control.clone(),
            offering: Mutex::new(Default::default()),
            fallbacks: Mutex::new(Default::default()),
        });
        tokio::spawn(conn::accept_loop(shared.clone(), lanes.clone(), listener));
        offer::spawn_acceptor(shared, &lanes, control)?;
        tracing::debug!(port, %mode, "data lane listening");
        Ok(Some(lanes))
    }

    /// Records that `peer`'s tensors take libp2p because its lane cannot be
    /// dialed; `true` the first time.
    fn first_fallback(&self, peer: PeerId) -> bool {
        lock(&self.fallbacks).insert(peer)
    }

    /// The TCP port the lane listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The lane connections (dialed and accepted) of view `view`, per peer.
    pub(crate) fn connections_in(&self, view: u64) -> Vec<(PeerId, usize)> {
        lock(&self.by_peer)
            .iter()
            .filter(|((_, v), _)| *v == view)
            .map(|((peer, _), s)| (*peer, lock(&s.writers).len() + lock(&s.accepted).len()))
            .collect()
    }

    /// Sets what happens when a peer's process is found gone.
    pub(crate) fn on_loss(&self, hook: LossHook) {
        let _ = self.on_loss.set(hook);
    }

    /// A connection of `session` broke without the end frame: a peer that
    /// ends or retires a lane says so, so either its process is gone or the
    /// path to it broke. A connection attempt to its lane port tells the
    /// first at once (refused: nothing listens there any more); the loss
    /// hook then suspects it. An accepted attempt (the peer lives) or no
    /// answer (the path, or its machine) leaves the verdict to the peer
    /// timeout.
    pub(crate) fn broken(self: &Arc<Self>, shared: &Arc<Shared>, session: &Arc<Session>) {
        if session.closed.load(Ordering::SeqCst)
            || shared.stopping.load(Ordering::Relaxed)
            || session.probing.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let addrs = lock(&session.peer_addrs).clone();
        let (lanes, shared, session) = (self.clone(), shared.clone(), session.clone());
        tokio::spawn(async move {
            let gone = alive::process_gone(&addrs).await;
            session.probing.store(false, Ordering::SeqCst);
            if gone
                && !session.closed.load(Ordering::SeqCst)
                && !shared.stopping.load(Ordering::Relaxed)
                && let Some(hook) = lanes.on_loss.get()
            {
                hook(
                    &session.peer,
                    "its data lane connection broke and its lane port refuses connections",
                );
            }
        });
    }

    /// The addresses we announce in an offer.
    pub(crate) fn announced(&self) -> Vec<String> {
        if !self.bound.is_unspecified() {
            return vec![SocketAddr::new(self.bound, self.port).to_string()];
        }
        let mut ips: Vec<IpAddr> = lock(&self.listen).iter().filter_map(ip_of).collect();
        // Loopback last: it only reaches a peer on this host.
        ips.sort_by_key(|ip| (ip.is_loopback(), *ip));
        ips.dedup();
        ips.into_iter()
            .map(|ip| SocketAddr::new(ip, self.port).to_string())
            .collect()
    }

    /// Retires the sessions of earlier views and offers lanes for `view` to
    /// its members whose id is above ours (they offer to us otherwise).
    pub fn connect_view(self: &Arc<Self>, shared: &Arc<Shared>, view: &View) {
        self.retire_before(view.number);
        let Some(rank) = view.rank_of(&shared.local) else {
            return;
        };
        let local = shared.local.to_bytes();
        for r in shared.cfg.lane_set(rank, view.members.len()) {
            let peer = view.members[r];
            if peer.to_bytes() > local {
                self.offer(shared, peer, view.number);
            }
        }
    }

    /// Connections per direction we dial to each peer in `view`: the
    /// configured number, fewer when the view's lanes go to many peers.
    /// A function of the view, not of the moment: a session set up from
    /// an offer that came before we connected the view's lanes dials the
    /// same number as one we offered.
    pub(crate) fn per_peer_in(&self, shared: &Shared, view: &View) -> usize {
        let set = view
            .rank_of(&shared.local)
            .map(|rank| shared.cfg.lane_set(rank, view.members.len()).len())
            .unwrap_or(1);
        (LANE_CONNECTION_BUDGET / set.max(1)).clamp(1, self.connections)
    }

    /// Offers a lane for `view` to `peer` (in the background), unless one
    /// is up or offered already.
    pub(crate) fn offer(self: &Arc<Self>, shared: &Arc<Shared>, peer: PeerId, view: u64) {
        if lock(&self.by_peer).contains_key(&(peer, view))
            || !lock(&self.offering).insert((peer, view))
        {
            return;
        }
        let (shared, lanes) = (shared.clone(), self.clone());
        tokio::spawn(async move {
            offer::offer(shared, lanes.clone(), lanes.control.clone(), peer, view).await;
            lock(&lanes.offering).remove(&(peer, view));
        });
    }

    /// Takes a session on; an earlier one for the same peer and view (an
    /// offer tried again after its answer was lost) is closed. Only the
    /// lower peer id of a pair offers, so both ends agree on the newest.
    fn register(&self, session: Arc<Session>) {
        lock(&self.sessions).insert(session.id, session.clone());
        let key = (session.peer, session.view);
        if let Some(old) = lock(&self.by_peer).insert(key, session) {
            lock(&self.sessions).remove(&old.id);
            old.close();
        }
        self.changed.notify_waiters();
    }

    /// Forgets the sessions of views before `view`: their writers end (a
    /// link of an old view was aborted mid-message, so its counts are no
    /// longer the receiver's), connections to them are refused, and their
    /// readers stop at the end of the peer's connections.
    pub(crate) fn retire_before(&self, view: u64) {
        let old: Vec<Arc<Session>> = {
            let mut by_peer = lock(&self.by_peer);
            let keys: Vec<_> = by_peer.keys().filter(|k| k.1 < view).copied().collect();
            keys.iter().filter_map(|k| by_peer.remove(k)).collect()
        };
        let mut sessions = lock(&self.sessions);
        for s in old {
            sessions.remove(&s.id);
            s.close();
        }
    }

    fn session_by_id(&self, id: &[u8; SESSION_ID]) -> Option<Arc<Session>> {
        lock(&self.sessions).get(id).cloned()
    }

    /// Waits up to `wait` for the session with `id` (its offer may still be
    /// on its way back to the side that made it).
    async fn wait_session(&self, id: &[u8; SESSION_ID], wait: Duration) -> Option<Arc<Session>> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let changed = self.changed.notified();
            if let Some(s) = self.session_by_id(id) {
                return Some(s);
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                return self.session_by_id(id);
            }
        }
    }

    /// Waits up to `wait` for our connections to `peer` in `view` to be up,
    /// or found impossible to dial ([`Session::unreachable`]).
    pub async fn ready(&self, peer: &PeerId, view: u64, wait: Duration) -> Option<Arc<Session>> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let changed = self.changed.notified();
            let session = lock(&self.by_peer).get(&(*peer, view)).cloned();
            if let Some(s) = session {
                let waker = s.clone();
                let ready = waker.ready.notified();
                if !lock(&s.writers).is_empty() || s.unreachable().is_some() {
                    return Some(s);
                }
                tokio::select! {
                    _ = ready => continue,
                    _ = changed => continue,
                    _ = tokio::time::sleep_until(until) => return None,
                }
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                return None;
            }
        }
    }
}

impl Session {
    fn new(
        id: [u8; SESSION_ID],
        peer: PeerId,
        view: u64,
        keys: LaneKeys,
        mode: DataLane,
        per_peer: usize,
        shared: &Arc<Shared>,
    ) -> Arc<Self> {
        let (forward, mut rx) = mpsc::unbounded_channel::<ReduceMsg>();
        // All-reduce parts wait here for the training thread, so that the
        // connections go on reading push-sum shares meanwhile.
        let reduce_tx = shared.reduce_tx.clone();
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                if reduce_tx.send(msg).await.is_err() {
                    return;
                }
            }
        });
        Arc::new(Self {
            id,
            local: shared.local,
            peer,
            view,
            keys,
            mode,
            per_peer,
            writers: Mutex::new(Vec::new()),
            ready: Notify::new(),
            accepted: Mutex::new(Vec::new()),
            sequence: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            users: AtomicUsize::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            order: Mutex::new(ReduceOrder::default()),
            forward,
            share_sequence: AtomicU64::new(0),
            shares: ShareAssembly::new(shared.cfg.round_window),
            peer_addrs: Mutex::new(Vec::new()),
            probing: std::sync::atomic::AtomicBool::new(false),
            unreachable: Mutex::new(None),
        })
    }

    fn set_writers(&self, writers: Vec<mpsc::Sender<Job>>) {
        if self.closed.load(Ordering::SeqCst) {
            // Retired while dialing: the writers end with the senders.
            return;
        }
        *lock(&self.writers) = writers;
        self.ready.notify_waiters();
    }

    /// None of our connections could be dialed: senders take the libp2p
    /// connection.
    pub(crate) fn set_unreachable(&self, why: String) {
        *lock(&self.unreachable) = Some(why);
        self.ready.notify_waiters();
    }

    /// Why the peer's lane port cannot be dialed, if it cannot.
    pub(crate) fn unreachable(&self) -> Option<String> {
        lock(&self.unreachable).clone()
    }

    /// Ends the session at once: the writers stop after what they hold.
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        lock(&self.writers).clear();
        self.ready.notify_waiters();
    }

    /// Cuts a tensor frame into parts and queues them on our connections.
    async fn send(&self, h: &Header, payload: Payload) -> Result<(), String> {
        let writers = lock(&self.writers).clone();
        if writers.is_empty() {
            return Err("the lane has no connections".into());
        }
        let size = h.dtype.size() as usize;
        let elements = payload.len() / size;
        // A compressed share is read whole by its decoder.
        let coded = h.kind == Kind::PushSum && h.dtype != DType::F32;
        // A gather or exchange block's offset is a rank, not a place: it
        // goes whole.
        let parts = if matches!(h.kind, Kind::Gather | Kind::Exchange) || coded {
            1
        } else {
            writers.len().min(payload.len().div_ceil(MIN_PART)).max(1)
        };
        let first = self.messages.fetch_add(1, Ordering::Relaxed) as usize;
        let push = h.kind == Kind::PushSum;
        let share = if push {
            self.share_sequence.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        for part in 0..parts {
            let start = elements * part / parts;
            let end = elements * (part + 1) / parts;
            let header = FrameHeader {
                kind: if coded {
                    FrameKind::Coded
                } else {
                    FrameKind::Tensor(h.kind)
                },
                part: part as u16,
                parts: parts as u16,
                sequence: if push {
                    share
                } else {
                    self.sequence.fetch_add(1, Ordering::Relaxed)
                },
                view: h.view,
                round: h.round,
                step: h.step,
                offset: if push {
                    start as u64
                } else {
                    h.offset + start as u64
                },
                len: (end - start) as u64,
                total: if coded { elements as u64 } else { h.total },
                // The scalar rides on the first part only.
                weight: if push || part == 0 { h.weight } else { 0.0 },
                scale: payload.scale(),
            };
            let job = Job::Frame {
                header,
                payload: payload.clone(),
                range: start * size..end * size,
            };
            writers[(first + part) % writers.len()]
                .send(job)
                .await
                .map_err(|_| "a lane connection is gone".to_string())?;
        }
        Ok(())
    }

    /// Ends our connections once every link using them is done: each
    /// writes the end frame and waits for the receiver to confirm.
    async fn finish(&self) {
        if self.users.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        let writers = std::mem::take(&mut *lock(&self.writers));
        let mut acks = Vec::new();
        for w in writers {
            let (tx, rx) = oneshot::channel();
            if w.send(Job::End(tx)).await.is_ok() {
                acks.push(rx);
            }
        }
        for a in acks {
            let _ = a.await;
        }
    }

    /// Hands an all-reduce part on once every earlier one has gone.
    fn deliver_reduce(&self, sequence: u64, msg: ReduceMsg) -> Result<(), String> {
        let mut order = lock(&self.order);
        for msg in order.file(sequence, msg)? {
            let _ = self.forward.send(msg);
        }
        Ok(())
    }
}

/// A link that sends its frames over the lane to `peer`: the same queue as
/// a libp2p link ([`Link`]), so the callers do not know which it is.
/// Where a link's lane comes from.
pub(crate) enum LaneSource {
    /// The view's lanes (`Lanes::connect_view`): waited for at once.
    View,
    /// A peer outside them: offered when the first message goes there.
    OnDemand,
}

/// A link to `peer` over the lane; `protocol` is the libp2p protocol its
/// frames take when the peer's lane port cannot be dialed.
pub(crate) fn spawn_link(
    shared: Arc<Shared>,
    lanes: Arc<Lanes>,
    peer: PeerId,
    view: u64,
    depth: usize,
    source: LaneSource,
    protocol: libp2p::StreamProtocol,
) -> Link {
    let (queue, rx) = mpsc::channel(depth.max(1));
    let task = tokio::spawn(run_link(shared, lanes, peer, view, rx, source, protocol));
    Link { peer, queue, task }
}

/// How long a link waits for a hole punch under way before it calls a
/// peer reachable only through a relay.
const DIRECT_WAIT: Duration = Duration::from_secs(10);

/// Waits (up to [`DIRECT_WAIT`]) until our connection to `peer` is not a
/// relayed one; `false` if it still is.
async fn wait_direct(shared: &Shared, peer: &PeerId) -> bool {
    let until = tokio::time::Instant::now() + DIRECT_WAIT;
    loop {
        if shared.reach.kind_of(peer) != Some(super::reach::ConnectionKind::Relayed) {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Gives the payloads of a link's frames back to the pool, unsent.
async fn drain(shared: &Shared, first: Option<Outgoing>, rx: &mut mpsc::Receiver<Outgoing>) {
    drop(first);
    while let Some(msg) = rx.recv().await {
        msg.payload.recycle(&shared.pool);
    }
}

async fn run_link(
    shared: Arc<Shared>,
    lanes: Arc<Lanes>,
    peer: PeerId,
    view: u64,
    mut rx: mpsc::Receiver<Outgoing>,
    source: LaneSource,
    protocol: libp2p::StreamProtocol,
) {
    let wait = shared.cfg.peer_timeout.max(shared.cfg.join_timeout);
    let mut first = None;
    if let LaneSource::OnDemand = source {
        // Nothing to set up until a message goes there.
        let Some(msg) = rx.recv().await else { return };
        // The lower id offers; from the higher one, the offer asks the
        // peer to make one (`offer::take`).
        lanes.offer(&shared, peer, view);
        first = Some(msg);
    }
    let Some(session) = lanes.ready(&peer, view, wait).await else {
        tracing::error!(%peer, "no data lane to {peer} in view {view} within {wait:?}; its frames are dropped");
        drain(&shared, first, &mut rx).await;
        return;
    };
    if let Some(why) = session.unreachable() {
        // Behind a NAT: the frames take our libp2p connection, once it is
        // direct (hole-punched); a relay carries no tensors.
        let direct = wait_direct(&shared, &peer).await;
        if !direct && !shared.cfg.relay_tensors {
            let punch = shared
                .reach
                .peer(&peer)
                .punch_error
                .unwrap_or_else(|| "no hole punch succeeded".into());
            tracing::error!(%peer, "{peer} is reachable only through a relay ({punch}) and its lane port cannot be dialed ({why}); relays carry no tensors, so the run goes on without it");
            let reason =
                format!("it is reachable only through a relay ({punch}), which carries no tensors");
            shared
                .reach
                .update(|r| r.relay_only.insert(peer, reason.clone()));
            if let Some(hook) = lanes.on_loss.get() {
                hook(&peer, &reason);
            }
            drain(&shared, first, &mut rx).await;
            return;
        }
        if direct {
            let first = lanes.first_fallback(peer);
            log_fallback(&peer, &why, &lock(&session.peer_addrs), first);
        } else {
            tracing::warn!(%peer, "{peer} is reachable only through a relay and its lane port cannot be dialed ({why}): its tensors go over the relay, as --relay-tensors allows; the relay's bandwidth paces them");
        }
        crate::p2p::links::run_link(
            shared,
            lanes.control.clone(),
            peer,
            protocol,
            rx,
            first,
            true,
        )
        .await;
        return;
    }
    session.users.fetch_add(1, Ordering::SeqCst);
    while let Some(msg) = match first.take() {
        Some(m) => Some(m),
        None => rx.recv().await,
    } {
        let header: Result<Header, _> = cbor4ii::serde::from_slice(&msg.header[4..]);
        match header {
            // The writers count the bytes as they go on the wire.
            Ok(h) => {
                if let Err(e) = session.send(&h, msg.payload.clone()).await {
                    tracing::error!(%peer, "dropped a frame to {peer}: {e}");
                }
            }
            Err(e) => tracing::error!(%peer, "a frame to {peer} has a bad header: {e}"),
        }
        drop(msg.header);
        // The writers hold the payload until written; the last one done
        // does not give it back to the pool (a small cost, no copy).
        drop(msg.payload);
    }
    session.finish().await;
}
