//! Inbound tensor streams: every frame is checked before it reaches the
//! training thread, and a bad one is dropped with a warning naming the peer
//! and the reason. Nothing a peer sends can make the node panic.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{AsyncWriteExt, StreamExt};
use libp2p::{PeerId, Stream, StreamProtocol};

use super::config::P2pConfig;
use super::payload::LeBytes;
use super::state::{ReduceMsg, Shared, View};
use super::wire::{
    ALL_REDUCE_PROTOCOL, DType, Header, Kind, PUSH_SUM_PROTOCOL, READY, ReadError, Reject,
    WIRE_VERSION, check_payload, read_header, read_payload,
};

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

/// Counts a served stream for as long as it lives.
struct Active<'a>(&'a Shared);

impl<'a> Active<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.inbound_active.fetch_add(1, Ordering::SeqCst);
        Self(shared)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.inbound_active.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve(shared: Arc<Shared>, peer: PeerId, mut stream: Stream, protocol: &'static str) {
    let _active = Active::new(&shared);
    if stream.write_all(&[READY]).await.is_err() || stream.flush().await.is_err() {
        return;
    }
    // Frames may come before our own join has finished; hold them until we
    // know the view (the sender's flow control waits meanwhile).
    let Some(view) = wait_for_view(&shared).await else {
        tracing::debug!(%peer, protocol, "no view within the join timeout; closing the stream");
        return;
    };
    loop {
        match serve_one(&shared, &view, peer, &mut stream, protocol).await {
            Ok(()) => {}
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

async fn wait_for_view(shared: &Shared) -> Option<Arc<View>> {
    let mut rx = shared.view.clone();
    let wait = shared.cfg.join_timeout + Duration::from_secs(5);
    match tokio::time::timeout(wait, rx.wait_for(|v| v.is_some())).await {
        Ok(Ok(v)) => v.clone(),
        _ => None,
    }
}

/// Reads, checks and delivers one frame.
async fn serve_one(
    shared: &Shared,
    view: &View,
    peer: PeerId,
    stream: &mut Stream,
    protocol: &'static str,
) -> Result<(), ReadError> {
    let (header, header_bytes) = read_header(stream).await?;
    let from =
        check_header(&shared.cfg, view, &peer, &header, protocol).map_err(ReadError::Rejected)?;
    // check_header capped the size.
    let bytes = header.dtype.size() * header.len;
    if protocol == PUSH_SUM_PROTOCOL {
        shared
            .push_inbox
            .admit(header.round, from)
            .map_err(|r| ReadError::Rejected(r.into()))?;
    }
    let buf = shared.pool.take(bytes as usize);
    let (payload, scan) =
        read_payload(stream, bytes, buf, &mut || shared.activity.touch(&peer)).await?;
    check_payload(&header, &payload, &scan).map_err(ReadError::Rejected)?;
    let wire_bytes = header_bytes + payload.len() as u64;
    if protocol == PUSH_SUM_PROTOCOL {
        shared
            .push_inbox
            .deliver(header.round, from, header.weight, LeBytes::whole(payload))
            .map_err(|r| ReadError::Rejected(r.into()))?;
    } else {
        let msg = ReduceMsg {
            from,
            header,
            payload,
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
    if h.sender != peer.to_string() {
        return Err(Reject::Sender {
            claimed: h.sender.clone(),
            actual: peer.to_string(),
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
        Kind::ReduceScatter | Kind::AllGather | Kind::Gather => !push,
    };
    if !kind_fits {
        return Err(Reject::WrongKind {
            kind: h.kind,
            protocol,
        });
    }
    if h.dtype != DType::of(h.kind) {
        return Err(Reject::WrongDType {
            kind: h.kind,
            dtype: h.dtype,
        });
    }
    let announced = h.len.saturating_mul(h.dtype.size());
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
    if h.kind == Kind::Gather && (h.offset >= members || h.total != members) {
        return Err(Reject::MalformedHeader(format!(
            "gather block of rank {} in a view of {} ranks (ours has {members})",
            h.offset, h.total
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
