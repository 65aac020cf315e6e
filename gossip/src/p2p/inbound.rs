//! Inbound tensor streams: every frame is checked before it reaches the
//! training thread, and a bad one is dropped with a warning naming the peer
//! and the reason. Nothing a peer sends can make the node panic.

use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncWriteExt, StreamExt};
use libp2p::{PeerId, Stream, StreamProtocol};

use super::config::P2pConfig;
use super::payload::LeBytes;
use super::state::{ReduceMsg, Shared, View};
use super::wire::{
    ALL_REDUCE_PROTOCOL, DType, Header, Kind, PUSH_SUM_PROTOCOL, READY, ReadError, Reject,
    WIRE_VERSION, check_payload, payload_bytes, read_header, read_payload,
};
use crate::sync::lock;

/// Registers our tensor protocols and serves them until the node stops.
pub(crate) fn spawn_acceptors(
    shared: &Arc<Shared>,
    control: &mut libp2p_stream::Control,
) -> Result<(), String> {
    for name in [PUSH_SUM_PROTOCOL, ALL_REDUCE_PROTOCOL] {
        let protocol = StreamProtocol::new(name);
        let mut incoming = control
            .accept(protocol)
            .map_err(|e| format!("{name}: {e}"))?;
        let shared = shared.clone();
        // The loop only spawns: libp2p-stream drops streams it cannot hand
        // over at once, so it must never wait on a handler.
        tokio::spawn(async move {
            while let Some((peer, stream)) = incoming.next().await {
                tokio::spawn(serve(shared.clone(), peer, stream, name));
            }
        });
    }
    Ok(())
}

/// Counts a served stream (or lane connection) from `peer` for as long as
/// it lives: a graceful shutdown waits for the last frames of the peers
/// still in the view (not for one the view went on without, which may be
/// stopped).
pub(crate) struct Active<'a>(&'a Shared, PeerId);

impl<'a> Active<'a> {
    pub(crate) fn new(shared: &'a Shared, peer: PeerId) -> Self {
        *lock(&shared.inbound_active).entry(peer).or_insert(0) += 1;
        Self(shared, peer)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        let mut active = lock(&self.0.inbound_active);
        if let Some(n) = active.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                active.remove(&self.1);
            }
        }
    }
}

async fn serve(shared: Arc<Shared>, peer: PeerId, mut stream: Stream, protocol: &'static str) {
    let _active = Active::new(&shared, peer);
    if stream.write_all(&[READY]).await.is_err() || stream.flush().await.is_err() {
        return;
    }
    // Frames may come before our own join has finished; hold them until we
    // know the view (the sender's flow control waits meanwhile).
    if wait_for_view(&shared, 0).await.is_none() {
        tracing::debug!(%peer, protocol, "no view within the join timeout; closing the stream");
        return;
    }
    loop {
        match serve_one(&shared, peer, &mut stream, protocol).await {
            Ok(()) => {}
            Err(ReadError::Stale { view, ours }) => {
                tracing::debug!(%peer, protocol, "frame of view {view} from {peer} after our view {ours} began; closing the stream");
                return;
            }
            Err(ReadError::Eof) => {
                // The sender closed its side after its last frame: confirm.
                let _ = stream.write_all(&[READY]).await;
                let _ = stream.close().await;
                return;
            }
            Err(ReadError::Io(e)) => {
                tracing::debug!(%peer, protocol, "stream from {peer} broke: {e}");
                return;
            }
            Err(ReadError::Rejected(reason)) => {
                // The stream may be out of frame now: close it; an honest
                // sender opens a new one.
                shared.reject(&peer, protocol, &reason);
                return;
            }
        }
    }
}

/// Waits for our view numbered `at_least` or later (a frame of a view
/// we have not installed yet waits for it: its sender installed it first).
async fn wait_for_view(shared: &Shared, at_least: u64) -> Option<Arc<View>> {
    let mut rx = shared.view.clone();
    let wait = if at_least == 0 {
        shared.cfg.join_timeout + Duration::from_secs(5)
    } else {
        shared.cfg.peer_timeout
    };
    let ready = |v: &Option<Arc<View>>| v.as_ref().is_some_and(|v| v.number >= at_least);
    match tokio::time::timeout(wait, rx.wait_for(ready)).await {
        Ok(Ok(v)) => v.clone(),
        _ => None,
    }
}

/// The view a frame of view `number` is checked against: ours, after
/// waiting for it if the sender is ahead; an older frame is stale.
pub(crate) async fn view_for(shared: &Shared, number: u64) -> Result<Arc<View>, ReadError> {
    let current = shared.view.borrow().clone();
    let ours = current.as_ref().map_or(0, |v| v.number);
    if number < ours {
        return Err(ReadError::Stale { view: number, ours });
    }
    match wait_for_view(shared, number).await {
        Some(v) => Ok(v),
        None => Err(ReadError::Rejected(Reject::View {
            expected: ours,
            got: number,
        })),
    }
}

/// Reads, checks and delivers one frame.
async fn serve_one(
    shared: &Shared,
    peer: PeerId,
    stream: &mut Stream,
    protocol: &'static str,
) -> Result<(), ReadError> {
    let (header, header_bytes) = read_header(stream).await?;
    let view = if header.version == WIRE_VERSION && header.run_id == shared.cfg.run.run_id {
        view_for(shared, header.view).await?
    } else {
        // check_header names what is wrong.
        shared
            .view
            .borrow()
            .clone()
            .ok_or(ReadError::Rejected(Reject::View {
                expected: 0,
                got: header.view,
            }))?
    };
    let from =
        check_header(&shared.cfg, &view, &peer, &header, protocol).map_err(ReadError::Rejected)?;
    // check_header capped the size.
    let bytes = payload_bytes(&header, shared.cfg.compress);
    if protocol == PUSH_SUM_PROTOCOL {
        shared
            .push_inbox
            .admit_in(view.number, header.round, from)
            .map_err(refused)?;
    }
    let buf = shared.pool.take(bytes as usize);
    let (payload, scan) =
        read_payload(stream, bytes, buf, &mut || shared.activity.touch(&peer)).await?;
    check_payload(&header, &payload, &scan).map_err(ReadError::Rejected)?;
    let wire_bytes = header_bytes + payload.len() as u64;
    if protocol == PUSH_SUM_PROTOCOL {
        let share = LeBytes::share(shared.cfg.compress, shared.cfg.payload_floats, payload)
            .map_err(|e| ReadError::Rejected(Reject::Coded(e)))?;
        shared
            .push_inbox
            .deliver_in(view.number, header.round, from, header.weight, share)
            .map_err(refused)?;
    } else {
        let msg = ReduceMsg {
            from,
            header,
            payload,
            landed: false,
        };
        if shared.reduce_tx.send(msg).await.is_err() {
            return Err(ReadError::Io(std::io::Error::other(
                "node is shutting down",
            )));
        }
    }
    shared.counters.received(wire_bytes);
    shared.observed.received(&peer, wire_bytes);
    Ok(())
}

/// A share the push-sum inbox refused: stale after a view change, or
/// the sender's fault.
pub(crate) fn refused(r: crate::ledger::Refusal) -> ReadError {
    match r {
        crate::ledger::Refusal::Stale { epoch, ours } => ReadError::Stale { view: epoch, ours },
        r => ReadError::Rejected(r.into()),
    }
}

/// Everything about a header that can be checked without the payload.
/// Returns the sender's rank.
pub(crate) fn check_header(
    cfg: &P2pConfig,
    view: &View,
    peer: &PeerId,
    h: &Header,
    protocol: &'static str,
) -> Result<usize, Reject> {
    if h.version != WIRE_VERSION {
        return Err(Reject::Version { got: h.version });
    }
    if h.run_id != cfg.run.run_id {
        return Err(Reject::RunId {
            expected: cfg.run.run_id.clone(),
            got: h.run_id.clone(),
        });
    }
    let name = super::addrs::name_of(peer);
    if h.sender != name {
        return Err(Reject::Sender {
            claimed: h.sender.clone(),
            actual: name,
        });
    }
    if h.view != view.number {
        return Err(Reject::View {
            expected: view.number,
            got: h.view,
        });
    }
    let from = view
        .rank_of(peer)
        .ok_or(Reject::NotMember { view: view.number })?;
    let push = protocol == PUSH_SUM_PROTOCOL;
    let kind_fits = match h.kind {
        Kind::PushSum => push,
        Kind::ReduceScatter | Kind::AllGather | Kind::Gather | Kind::Exchange => !push,
    };
    if !kind_fits {
        return Err(Reject::WrongKind {
            kind: h.kind,
            protocol,
        });
    }
    let dtype = match h.kind {
        Kind::PushSum => DType::of_share(cfg.compress),
        kind => DType::of(kind),
    };
    if h.dtype != dtype {
        return Err(Reject::WrongDType {
            kind: h.kind,
            dtype: h.dtype,
        });
    }
    let announced = payload_bytes(h, cfg.compress);
    if announced > cfg.max_message_bytes {
        return Err(Reject::TooLarge {
            announced,
            cap: cfg.max_message_bytes,
        });
    }
    if push && h.len != cfg.payload_floats as u64 {
        return Err(Reject::Shape {
            expected: cfg.payload_floats as u64,
            got: h.len,
        });
    }
    let members = view.members.len() as u64;
    if matches!(h.kind, Kind::Gather | Kind::Exchange)
        && (h.offset >= members || h.total != members)
    {
        return Err(Reject::MalformedHeader(format!(
            "{} block of rank {} in a view of {} ranks (ours has {members})",
            if h.kind == Kind::Gather {
                "gather"
            } else {
                "exchange"
            },
            h.offset,
            h.total
        )));
    }
    if matches!(h.kind, Kind::ReduceScatter | Kind::AllGather)
        && h.offset.checked_add(h.len).is_none_or(|end| end > h.total)
    {
        return Err(Reject::Layout {
            offset: h.offset,
            len: h.len,
            total: h.total,
        });
    }
    if !h.weight.is_finite() {
        return Err(Reject::Weight(h.weight));
    }
    Ok(from)
}
