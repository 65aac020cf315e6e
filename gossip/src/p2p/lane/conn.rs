//! Lane connections: the set-up that proves key possession, the writer of
//! our parts and the reader of the peer's.
//!
//! A connection carries one direction. The dialer opens with
//! `SLOWLANE | version | mode | index (u16) | session id | nonce | MAC`, the
//! MAC (HMAC-SHA256 under the lane's MAC key) over everything before it and
//! the dialer's peer id; the listener answers `OK` and a MAC over the same nonce, so each end knows
//! the other holds the key. Then the dialer sends frames until its end
//! frame, and the listener confirms that with one byte.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::check::{check_frame, check_session_view};
use super::crypto::{SESSION_ID, TAG, random};
use super::frame::{FrameHeader, FrameKind, HEADER, RECORD};
use super::reader::{Reader, Stop};
use super::{DataLane, Job, Lanes, MAX_CONNECTIONS, Session, WRITER_QUEUE};
use crate::p2p::inbound::{self, Active, view_for};
use crate::p2p::links::Payload;
use crate::p2p::state::{ReduceMsg, Shared};
use crate::p2p::wire::{DType, Kind, Reject};
use crate::sync::lock;

const MAGIC: &[u8; 8] = b"SLOWLANE";
const VERSION: u8 = 3;
/// Bytes of the dialer's hello: magic, version, mode, index, id, nonce, MAC.
const HELLO: usize = 8 + 1 + 1 + 2 + SESSION_ID + 16 + 32;
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// The byte that confirms an end frame.
const DONE: u8 = 0x5a;
/// Name of the lane in logs and rejection counts.
pub(crate) const LANE: &str = "data-lane";

/// The hello's bytes before its MAC; the MAC also covers the dialer's peer
/// id, so that a hello only opens a connection on the other side (not on
/// the dialer's own listener, where the session's key is the same).
fn hello_mac_input(session: &Session, index: u16, nonce: &[u8; 16]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HELLO);
    b.extend_from_slice(MAGIC);
    b.push(VERSION);
    b.push(session.mode.code());
    b.extend_from_slice(&index.to_le_bytes());
    b.extend_from_slice(&session.id);
    b.extend_from_slice(nonce);
    b
}

/// Dials connection `index` of our direction to one of `addrs`.
pub(crate) async fn dial(
    session: &Session,
    addrs: &[String],
    index: u16,
) -> Result<TcpStream, String> {
    let mut last = String::from("the peer announced no address");
    for addr in addrs {
        let attempt = async {
            let mut s = TcpStream::connect(addr.as_str())
                .await
                .map_err(|e| format!("{addr}: {e}"))?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            let nonce: [u8; 16] = random()?;
            let mut hello = hello_mac_input(session, index, &nonce);
            let mac = session.keys.tag(&[&hello, &session.local.to_bytes()]);
            hello.extend_from_slice(&mac);
            s.write_all(&hello)
                .await
                .map_err(|e| format!("{addr}: {e}"))?;
            let mut answer = [0u8; 34];
            s.read_exact(&mut answer)
                .await
                .map_err(|e| format!("{addr}: refused ({e})"))?;
            let expect = session
                .keys
                .tag(&[b"accept", &session.id, &index.to_le_bytes(), &nonce]);
            if &answer[..2] != b"OK" || answer[2..] != expect {
                return Err(format!("{addr}: the answer does not prove the lane's key"));
            }
            // Our writer's connection: a short link's send buffer fixed.
            let (rtt, buffer) = super::tune::size_send_buffer(&s);
            tracing::debug!(%addr, ?rtt, ?buffer, "lane connection {index}: send buffer");
            Ok(s)
        };
        match tokio::time::timeout(SETUP_TIMEOUT, attempt).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = e,
            Err(_) => last = format!("{addr}: no answer within {SETUP_TIMEOUT:?}"),
        }
    }
    Err(last)
}

/// Dials our K connections to the peer and starts their writers.
pub(crate) async fn open(
    shared: Arc<Shared>,
    lanes: Arc<Lanes>,
    session: Arc<Session>,
    addrs: Vec<String>,
) {
    // Only at an IP where we reach the peer: behind a NAT its announced
    // (private) addresses are not dialable from here, and a dial there may
    // hang until its timeout, or reach another machine.
    let addrs = match shared.reach.peer(&session.peer).lane_addrs(&addrs) {
        Ok(a) => a,
        Err(why) => {
            tracing::debug!(peer = %session.peer, "no data lane to {}: {why}", session.peer);
            session.set_unreachable(why);
            return;
        }
    };
    *lock(&session.peer_addrs) = addrs.clone();
    let mut writers = Vec::new();
    for index in 0..session.per_peer as u16 {
        match dial(&session, &addrs, index).await {
            Ok(stream) => {
                let (tx, rx) = mpsc::channel(WRITER_QUEUE);
                tokio::spawn(write_loop(
                    shared.clone(),
                    lanes.clone(),
                    session.clone(),
                    index,
                    stream,
                    rx,
                ));
                writers.push(tx);
            }
            Err(e) if writers.is_empty() => {
                // Not even one: the port cannot be dialed from here (a
                // peer behind a NAT), and the others would fail alike.
                // The link names the port to open, once per peer.
                tracing::debug!(peer = %session.peer, "no data lane connection to {} could be opened: {e}", session.peer);
                session.set_unreachable(e);
                return;
            }
            Err(e) => {
                tracing::warn!(peer = %session.peer, "data lane connection {index} to {} failed: {e}", session.peer);
            }
        }
    }
    tracing::debug!(peer = %session.peer, connections = writers.len(), "data lane up");
    session.set_writers(writers);
}

async fn write_loop(
    shared: Arc<Shared>,
    lanes: Arc<Lanes>,
    session: Arc<Session>,
    index: u16,
    mut stream: TcpStream,
    mut rx: mpsc::Receiver<Job>,
) {
    let peer = session.peer;
    let mut sealer = session.keys.sealer(index);
    let encrypted = session.mode == DataLane::Encrypted;
    // The header's record apart: the payload's record buffer keeps its
    // length (it is sealed over, never zeroed again).
    let mut head = Vec::with_capacity(HEADER + TAG);
    let mut record = Vec::with_capacity(RECORD + TAG);
    while let Some(job) = rx.recv().await {
        let tensor = matches!(&job, Job::Frame { header, .. } if matches!(header.kind, FrameKind::Tensor(_) | FrameKind::Coded));
        let (header, payload, range, done) = match job {
            Job::Frame {
                header,
                payload,
                range,
            } => (header, Some(payload), range, None),
            Job::End(done) => (FrameHeader::of(FrameKind::End), None, 0..0, Some(done)),
        };
        let result = async {
            head.clear();
            head.extend_from_slice(&header.encode());
            if encrypted {
                let tag = sealer.seal(&mut head);
                head.extend_from_slice(&tag);
            }
            stream.write_all(&head).await?;
            match &payload {
                Some(p) if encrypted => {
                    // Each record sealed from the payload's bytes (a share
                    // lent unscaled as it is: its frame carries the scale)
                    // into the record buffer, which stays in the cache for
                    // the socket.
                    for start in range.clone().step_by(RECORD) {
                        let end = (start + RECORD).min(range.end);
                        let sealed = p
                            .with_bytes(start..end, |b| sealer.seal_from(b, &mut record))
                            .map_err(std::io::Error::other)?;
                        stream.write_all(&record[..sealed]).await?;
                        shared.activity.touch(&peer);
                    }
                }
                Some(Payload::Owned(p)) => {
                    for piece in p[range.clone()].chunks(RECORD) {
                        stream.write_all(piece).await?;
                        shared.activity.touch(&peer);
                    }
                }
                Some(Payload::Lent(lent)) => {
                    // Straight from the lent bytes (a share's unscaled, its
                    // frame carrying the scale) into the socket: one
                    // non-blocking write at a time under the loan's lock.
                    let mut at = range.start;
                    while at < range.end {
                        stream.writable().await?;
                        let wrote = lent
                            .with_bytes(at..range.end, |b| stream.try_write(b))
                            .map_err(std::io::Error::other)?;
                        match wrote {
                            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                            Ok(n) => at += n,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(e) => return Err(e),
                        }
                        shared.activity.touch(&peer);
                    }
                }
                None => {}
            }
            stream.flush().await
        }
        .await;
        if result.is_ok() && tensor {
            // Counted once on the wire, not when queued: the metrics'
            // bytes sent follow the link's real pace.
            let bytes = range.len() as u64;
            shared.counters.sent(bytes);
            shared.counters.sent_on_lane(bytes);
            shared.observed.sent(&peer, bytes);
        }
        if let Some(p) = payload {
            p.recycle(&shared.pool);
        }
        if let Err(e) = result {
            if !shared.stopping.load(Ordering::Relaxed) {
                tracing::warn!(%peer, "data lane connection {index} to {peer} broke: {e}");
                lanes.broken(&shared, &session);
            }
            return;
        }
        if let Some(done) = done {
            let mut byte = [0u8; 1];
            let wait = shared.cfg.peer_timeout.min(Duration::from_secs(10));
            match tokio::time::timeout(wait, stream.read_exact(&mut byte)).await {
                Ok(Ok(_)) => {}
                _ => {
                    tracing::debug!(%peer, "{peer} did not confirm the end of lane connection {index}")
                }
            }
            let _ = done.send(());
            return;
        }
    }
}

/// Accepts lane connections for as long as the node runs.
pub(crate) async fn accept_loop(shared: Arc<Shared>, lanes: Arc<Lanes>, listener: TcpListener) {
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("data lane listener: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (shared, lanes) = (shared.clone(), lanes.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(SETUP_TIMEOUT, accept(&lanes, stream)).await {
                Ok(Ok((session, index, stream))) => {
                    read_loop(shared, lanes, session, index, stream).await;
                }
                Ok(Err(Refusal::Probe)) => {
                    tracing::debug!(%from, "liveness probe from {from}");
                }
                Ok(Err(Refusal::Bad(e))) => {
                    shared.counters.dropped();
                    if let Some(held) = shared.warnings.admit("lane-refused") {
                        tracing::warn!(%from, "refused a data lane connection from {from}: {e}{held}");
                    }
                }
                Err(_) => {
                    shared.counters.dropped();
                    if let Some(held) = shared.warnings.admit("lane-silent") {
                        tracing::warn!(%from, "a data lane connection from {from} sent no hello within {SETUP_TIMEOUT:?}{held}");
                    }
                }
            }
        });
    }
}

/// Checks a dialer's hello; the connection is refused (closed without a
/// word) unless it proves the key of a session we offered or took.
async fn accept(
    lanes: &Lanes,
    mut stream: TcpStream,
) -> Result<(Arc<Session>, u16, TcpStream), Refusal> {
    let mut hello = [0u8; HELLO];
    // A connection closed before its first byte is a peer asking whether
    // we live (`Lanes::broken`): it got its answer.
    match stream.read(&mut hello[..1]).await {
        Ok(0) => return Err(Refusal::Probe),
        Ok(_) => {}
        Err(e) => return Err(Refusal::Bad(format!("incomplete hello: {e}"))),
    }
    stream
        .read_exact(&mut hello[1..])
        .await
        .map_err(|e| Refusal::Bad(format!("incomplete hello: {e}")))?;
    check_hello(lanes, stream, hello)
        .await
        .map_err(Refusal::Bad)
}

/// Why a lane connection was not taken.
enum Refusal {
    /// Closed before its first byte: a liveness probe.
    Probe,
    Bad(String),
}

async fn check_hello(
    lanes: &Lanes,
    mut stream: TcpStream,
    hello: [u8; HELLO],
) -> Result<(Arc<Session>, u16, TcpStream), String> {
    if &hello[..8] != MAGIC {
        return Err("not a slowmo data lane hello".into());
    }
    if hello[8] != VERSION {
        return Err(format!("lane version {}, we speak {VERSION}", hello[8]));
    }
    let index = u16::from_le_bytes([hello[10], hello[11]]);
    let id: [u8; SESSION_ID] = hello[12..12 + SESSION_ID].try_into().expect("16 bytes");
    let nonce: [u8; 16] = hello[28..44].try_into().expect("16 bytes");
    let session = lanes
        .wait_session(&id, SETUP_TIMEOUT / 2)
        .await
        .ok_or("unknown lane session")?;
    if !session
        .keys
        .verify(&[&hello[..44], &session.peer.to_bytes()], &hello[44..])
    {
        return Err(format!(
            "the hello for the lane of {} does not prove its key",
            session.peer
        ));
    }
    if hello[9] != session.mode.code() {
        return Err(format!("{} dialed in another lane mode", session.peer));
    }
    if index as usize >= MAX_CONNECTIONS {
        return Err(format!(
            "connection index {index} of at most {MAX_CONNECTIONS}"
        ));
    }
    {
        let mut taken = lock(&session.accepted);
        if taken.contains(&index) {
            return Err(format!("a second connection {index} from {}", session.peer));
        }
        taken.push(index);
    }
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let mac = session
        .keys
        .tag(&[b"accept", &session.id, &index.to_le_bytes(), &nonce]);
    let mut answer = b"OK".to_vec();
    answer.extend_from_slice(&mac);
    stream
        .write_all(&answer)
        .await
        .map_err(|e| format!("answering: {e}"))?;
    Ok((session, index, stream))
}

async fn read_loop(
    shared: Arc<Shared>,
    lanes: Arc<Lanes>,
    session: Arc<Session>,
    index: u16,
    stream: TcpStream,
) {
    let peer = session.peer;
    let _active = Active::new(&shared, peer);
    let mut reader = Reader {
        shared: &shared,
        lanes: &lanes,
        session: &session,
        stream,
        opener: session.keys.opener(index),
        encrypted: session.mode == DataLane::Encrypted,
    };
    let mut scratch = Vec::new();
    loop {
        match read_frame(&mut reader, &mut scratch).await {
            Ok(true) => {}
            Ok(false) => {
                let _ = reader.stream.write_all(&[DONE]).await;
                let _ = reader.stream.shutdown().await;
                return;
            }
            Err(Stop::Io(e)) => {
                if !shared.stopping.load(Ordering::Relaxed) {
                    tracing::debug!(%peer, "data lane connection {index} from {peer} broke: {e}");
                    lanes.broken(&shared, &session);
                }
                return;
            }
            Err(Stop::Rejected(reason)) => {
                shared.reject(&peer, LANE, &reason);
                return;
            }
            Err(Stop::Stale { view, ours }) => {
                tracing::debug!(%peer, "lane frame of view {view} from {peer} after our view {ours} began; closing connection {index}");
                return;
            }
        }
    }
}

/// Reads, checks and delivers one frame; `false` after the end frame.
async fn read_frame(r: &mut Reader<'_>, scratch: &mut Vec<u8>) -> Result<bool, Stop> {
    let mut raw = [0u8; HEADER];
    r.record(&mut raw).await?;
    let h = FrameHeader::decode(&raw).map_err(|e| Stop::Rejected(Reject::MalformedHeader(e)))?;
    let kind = match h.kind {
        FrameKind::End => return Ok(false),
        FrameKind::Probe => {
            // Benchmark bytes: read a record at a time and dropped.
            let mut left = h.len;
            super::reader::at_least(scratch, RECORD);
            while left > 0 {
                let n = left.min(RECORD as u64) as usize;
                r.record(&mut scratch[..n]).await?;
                left -= n as u64;
            }
            r.lanes.probe_bytes.fetch_add(h.len, Ordering::SeqCst);
            r.lanes.probe_arrived.notify_waiters();
            return Ok(true);
        }
        FrameKind::Tensor(kind) => kind,
        FrameKind::Coded => Kind::PushSum,
    };
    let coded = h.kind == FrameKind::Coded;
    let shared = r.shared;
    let peer = r.session.peer;
    check_session_view(r.session.view, &h).map_err(Stop::Rejected)?;
    // Ours, once we are there; a frame of a view we left is stale.
    let view = view_for(shared, h.view).await?;
    let push = kind == Kind::PushSum;
    let (as_frame, from) =
        check_frame(&shared.cfg, &view, &peer, &h, kind, coded).map_err(Stop::Rejected)?;
    if push {
        shared
            .push_inbox
            .admit_in(view.number, h.round, from)
            .map_err(refused)?;
    }
    let bytes = h.payload_bytes() as usize;
    if !push
        && !coded
        && let Some(claim) = shared.landing.claim(view.number, from, &as_frame)
    {
        // A part the ring waits for: written into its buffer as it comes.
        if r.encrypted || claim.add {
            r.land(&claim, bytes, scratch).await?;
        } else {
            r.land_in_place(&claim, bytes, scratch).await?;
        }
        let wire = (HEADER + bytes) as u64;
        shared.counters.received(wire);
        shared.counters.landed();
        shared.observed.received(&peer, wire);
        let msg = ReduceMsg {
            from,
            header: as_frame,
            payload: Vec::new(),
            landed: true,
        };
        return r
            .session
            .deliver_reduce(h.sequence, msg)
            .map(|()| true)
            .map_err(|e| Stop::Rejected(Reject::MalformedHeader(e)));
    }
    let mut buf = super::super::payload::sized(shared.pool.take(bytes), bytes);
    r.payload(&mut buf, !coded && DType::of(kind) == DType::F32)
        .await?;
    let wire = (HEADER + bytes) as u64;
    shared.counters.received(wire);
    shared.observed.received(&peer, wire);
    if push {
        let mut why = None;
        let mut deliver = |round, weight, share| {
            shared
                .push_inbox
                .deliver_in(view.number, round, from, weight, share)
                .map_err(|e| {
                    let stop = refused(e);
                    let text = match &stop {
                        Stop::Rejected(r) => r.to_string(),
                        _ => "stale".to_string(),
                    };
                    why = Some(stop);
                    text
                })
        };
        let codec = coded.then_some((shared.cfg.compress, shared.cfg.payload_floats));
        if let Err(e) = r.session.shares.add_part(&h, buf, codec, &mut deliver) {
            return Err(why.unwrap_or(Stop::Rejected(Reject::MalformedHeader(e))));
        }
    } else {
        let msg = ReduceMsg {
            from,
            header: as_frame,
            payload: buf,
            landed: false,
        };
        r.session
            .deliver_reduce(h.sequence, msg)
            .map_err(|e| Stop::Rejected(Reject::MalformedHeader(e)))?;
    }
    Ok(true)
}

/// A share the push-sum inbox refused, as the libp2p streams read it.
fn refused(r: crate::ledger::Refusal) -> Stop {
    inbound::refused(r).into()
}
