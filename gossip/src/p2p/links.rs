//! Outbound links: one long-lived stream per (peer, protocol), fed by a
//! queue, so the training thread only copies its data and goes on.
//!
//! Opening a stream costs a protocol negotiation, so a link opens one and
//! keeps it. The receiver writes [`READY`] when it takes the stream over
//! (libp2p-stream silently drops inbound streams when the application falls
//! behind, so an unconfirmed stream is retried), and once more after it has
//! read our end of stream: closing a link therefore tells us that everything
//! we sent was read.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{AsyncReadExt, AsyncWriteExt};
use libp2p::{PeerId, Stream, StreamProtocol};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::lent::{LentShare, Revoked};
use super::payload::BufferPool;
use super::state::Shared;
use super::wire::{READY, write_frame};

/// One frame to send: the encoded header and a payload shared by all the
/// out-peers it goes to.
#[derive(Clone)]
pub(crate) struct Outgoing {
    pub header: Vec<u8>,
    pub payload: Payload,
}

/// A frame's payload bytes: a pooled buffer, or the caller's own buffer
/// lent until the frame is on its way ([`super::lent`]).
#[derive(Clone)]
pub(crate) enum Payload {
    Owned(Arc<Vec<u8>>),
    Lent(LentShare),
}

impl Payload {
    /// Bytes of the payload.
    pub fn len(&self) -> usize {
        match self {
            Payload::Owned(b) => b.len(),
            Payload::Lent(l) => l.len(),
        }
    }

    /// The factor of a push-sum share lent unscaled ([`super::lent`]):
    /// the bytes are the sender's `x`, and a frame that carries them as
    /// they are says so, so that the receiver scales what it adds.
    pub fn scale(&self) -> Option<f32> {
        match self {
            Payload::Owned(_) => None,
            Payload::Lent(l) => l.scale(),
        }
    }

    /// Runs `f` on the bytes of `range` as they are (a lent payload's under
    /// its loan's lock: `f` must not wait), unscaled for a scaled loan
    /// ([`Payload::scale`]).
    pub fn with_bytes<R>(
        &self,
        range: Range<usize>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, Revoked> {
        match self {
            Payload::Owned(b) => Ok(f(&b[range])),
            Payload::Lent(l) => l.with_bytes(range, f),
        }
    }

    /// The bytes in a buffer of their own (a lent payload copied into one
    /// from `pool`), for writers that need them owned.
    pub fn owned(&self, pool: &BufferPool) -> Result<Arc<Vec<u8>>, Revoked> {
        match self {
            Payload::Owned(b) => Ok(b.clone()),
            Payload::Lent(l) => l.to_vec(pool).map(Arc::new),
        }
    }

    /// Hands a pooled buffer back to `pool` if this was its last holder.
    pub fn recycle(self, pool: &BufferPool) {
        if let Payload::Owned(b) = self
            && let Ok(buf) = Arc::try_unwrap(b)
        {
            pool.give(buf);
        }
    }
}

/// The sending end of a link.
pub(crate) struct Link {
    pub peer: PeerId,
    pub queue: mpsc::Sender<Outgoing>,
    pub task: JoinHandle<()>,
}

/// How long we wait for a receiver's [`READY`] before trying a new stream.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

impl Link {
    /// Spawns the task of a link to `peer` on `protocol`, holding up to
    /// `depth` queued frames.
    pub fn spawn(
        shared: Arc<Shared>,
        control: libp2p_stream::Control,
        peer: PeerId,
        protocol: StreamProtocol,
        depth: usize,
    ) -> Self {
        let (queue, rx) = mpsc::channel(depth.max(1));
        let task = tokio::spawn(run_link(shared, control, peer, protocol, rx, None, false));
        Self { peer, queue, task }
    }
}

/// Opens a stream and waits for the receiver to take it over.
async fn open(
    control: &mut libp2p_stream::Control,
    peer: PeerId,
    protocol: &StreamProtocol,
) -> Result<Stream, String> {
    let mut stream = control
        .open_stream(peer, protocol.clone())
        .await
        .map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    match tokio::time::timeout(READY_TIMEOUT, stream.read_exact(&mut byte)).await {
        Ok(Ok(())) if byte[0] == READY => Ok(stream),
        Ok(Ok(())) => Err(format!(
            "receiver answered {:#04x} instead of ready",
            byte[0]
        )),
        Ok(Err(e)) => Err(format!("receiver dropped the stream: {e}")),
        Err(_) => Err(format!("no ready byte within {READY_TIMEOUT:?}")),
    }
}

/// Sends `first` (if any), then what comes on `rx`, over one stream at a
/// time (also the data lane's way to a peer it cannot dial, whose frames
/// were made for the lane: `fill_checksum` gives them the checksum libp2p
/// streams carry and the authenticated lane does without).
pub(crate) async fn run_link(
    shared: Arc<Shared>,
    mut control: libp2p_stream::Control,
    peer: PeerId,
    protocol: StreamProtocol,
    mut rx: mpsc::Receiver<Outgoing>,
    mut first: Option<Outgoing>,
    fill_checksum: bool,
) {
    let mut stream: Option<Stream> = None;
    let give_up_after = shared.cfg.peer_timeout;
    while let Some(mut msg) = match first.take() {
        Some(m) => Some(m),
        None => rx.recv().await,
    } {
        // The streams write owned bytes.
        let payload = match msg.payload.owned(&shared.pool) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::error!(%peer, "a frame to {peer} was not sent: {e}");
                continue;
            }
        };
        if fill_checksum {
            match with_checksum(&msg.header, &payload) {
                Ok(header) => msg.header = header,
                Err(e) => {
                    tracing::error!(%peer, "a frame to {peer} has a bad header: {e}");
                    continue;
                }
            }
        }
        send_one(
            &shared,
            &mut control,
            peer,
            &protocol,
            &mut stream,
            &msg.header,
            &payload,
        )
        .await;
        // The last link done with a payload hands its buffer back.
        drop(msg);
        Payload::Owned(payload).recycle(&shared.pool);
    }
    if let Some(mut s) = stream {
        goodbye(
            &mut s,
            peer,
            &protocol,
            give_up_after.min(Duration::from_secs(10)),
        )
        .await;
    }
}

/// Writes one frame, reopening the stream as needed, for at most the peer
/// timeout.
async fn send_one(
    shared: &Shared,
    control: &mut libp2p_stream::Control,
    peer: PeerId,
    protocol: &StreamProtocol,
    stream: &mut Option<Stream>,
    header: &[u8],
    payload: &[u8],
) {
    let give_up_after = shared.cfg.peer_timeout;
    let started = Instant::now();
    let bytes = (header.len() + payload.len()) as u64;
    loop {
        if stream.is_none() {
            match open(control, peer, protocol).await {
                Ok(s) => *stream = Some(s),
                Err(e) => {
                    if started.elapsed() >= give_up_after {
                        tracing::error!(%peer, %protocol, "giving up on a message to {peer} after {give_up_after:?}: {e}");
                        return;
                    }
                    tracing::debug!(%peer, %protocol, "opening a stream failed, retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let s = stream.as_mut().expect("stream opened above");
        let mut progress = || shared.activity.touch(&peer);
        match write_frame(s, header, payload, &mut progress).await {
            Ok(()) => {
                shared.counters.sent(bytes);
                shared.observed.sent(&peer, bytes);
                return;
            }
            Err(e) => {
                // The receiver drops a frame that ends early and ignores a
                // repeated share, so sending again is safe.
                tracing::warn!(%peer, %protocol, "writing to {peer} failed, retrying on a new stream: {e}");
                *stream = None;
                if started.elapsed() >= give_up_after {
                    tracing::error!(%peer, %protocol, "giving up on a message to {peer} after {give_up_after:?}");
                    return;
                }
            }
        }
    }
}

/// The frame's header with the payload's checksum filled in.
fn with_checksum(header: &[u8], payload: &[u8]) -> Result<Vec<u8>, String> {
    let mut header: super::wire::Header =
        cbor4ii::serde::from_slice(&header[4..]).map_err(|e| format!("decoding it: {e}"))?;
    header.checksum = super::payload::checksum(payload);
    Ok(super::wire::encode_header(&header))
}

/// Closes our side and waits for the receiver's confirmation that it read
/// everything.
async fn goodbye(stream: &mut Stream, peer: PeerId, protocol: &StreamProtocol, wait: Duration) {
    let _ = stream.close().await;
    let mut byte = [0u8; 1];
    match tokio::time::timeout(wait, stream.read_exact(&mut byte)).await {
        Ok(Ok(())) => tracing::debug!(%peer, %protocol, "link closed, receiver confirmed"),
        Ok(Err(e)) => tracing::debug!(%peer, %protocol, "link closed without confirmation: {e}"),
        Err(_) => {
            tracing::warn!(%peer, %protocol, "{peer} did not confirm the end of our stream within {wait:?}")
        }
    }
}
