//! The state transfer to joiners (`/slowmo/state/1`): the member that
//! sends it, and the joiner's side that checks it. Both sides give up only
//! after the peer timeout of silence (no byte moving), never after a fixed
//! time: a large state on a thin or loaded link takes what it takes.

use std::cell::Cell;
use std::time::{Duration, Instant};

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::{PeerId, StreamProtocol};
use sha2::{Digest, Sha256};

use super::board::Board;
use super::msg::{SEND_TIMEOUT, STATE_PROTOCOL, StateHeader, TICK};
use crate::CommError;
use crate::p2p::admission::hex;
use crate::p2p::comm::P2pComm;
use crate::p2p::membership::msg::{read_msg, write_msg};
use crate::p2p::state::Shared;
use crate::p2p::wire::READY;
use crate::sync::lock;

/// Writes `bytes`, failing only when the reader takes none for `silence`;
/// `moved` is called whenever some were taken.
pub(super) async fn write_unless_silent<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    silence: Duration,
    mut moved: impl FnMut(),
) -> Result<(), String> {
    let mut at = 0;
    while at < bytes.len() {
        let end = bytes.len().min(at + PIECE);
        match tokio::time::timeout(silence, w.write(&bytes[at..end])).await {
            Err(_) => {
                return Err(format!(
                    "no byte taken for {silence:?} after {at} of {} bytes",
                    bytes.len()
                ));
            }
            Ok(Err(e)) => return Err(e.to_string()),
            Ok(Ok(0)) => return Err("the stream closed".into()),
            Ok(Ok(n)) => {
                at += n;
                moved();
            }
        }
    }
    tokio::time::timeout(silence, w.flush())
        .await
        .map_err(|_| format!("no byte taken for {silence:?} at the end"))?
        .map_err(|e| e.to_string())
}

/// Fills `buf`, failing only when no byte comes for `silence`; `moved` is
/// called whenever some came.
pub(super) async fn read_unless_silent<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut [u8],
    silence: Duration,
    mut moved: impl FnMut(),
) -> Result<(), String> {
    let mut at = 0;
    while at < buf.len() {
        let end = buf.len().min(at + PIECE);
        match tokio::time::timeout(silence, r.read(&mut buf[at..end])).await {
            Err(_) => {
                return Err(format!(
                    "no byte for {silence:?} after {at} of {} bytes",
                    buf.len()
                ));
            }
            Ok(Err(e)) => return Err(format!("the stream broke: {e}")),
            Ok(Ok(0)) => {
                return Err(format!(
                    "the stream ended after {at} of {} bytes",
                    buf.len()
                ));
            }
            Ok(Ok(n)) => {
                at += n;
                moved();
            }
        }
    }
    Ok(())
}

/// The most bytes one read or write of a state transfer handles.
const PIECE: usize = 64 << 10;

/// How long one attempt at sending the state may go without a byte taken
/// before a new stream is tried (the transfer as a whole gives up after
/// the peer timeout of silence).
const ATTEMPT_STALL: Duration = Duration::from_secs(5);

/// The largest state a joiner accepts for a run exchanging `floats`.
fn state_cap(floats: usize) -> u64 {
    // Parameters, anchor, slow momentum, optimizer moments and headers.
    16 * 4 * floats as u64 + (16 << 20)
}

/// Takes a joiner's state from `peer`: checked against the decided view,
/// the cap and the announced hash before it goes on the board.
pub(super) async fn receive_state(
    shared: &Shared,
    board: &Board,
    peer: PeerId,
    mut stream: libp2p::Stream,
) -> Result<(), String> {
    let wait = shared.cfg.peer_timeout.max(SEND_TIMEOUT);
    let header: StateHeader = tokio::time::timeout(wait, read_msg(&mut stream))
        .await
        .map_err(|_| "no header in time".to_string())?
        .map_err(|e| format!("bad header: {e}"))?;
    // The decision may still be on its way (the coordinator sends it and
    // the state at about the same time).
    let until = Instant::now() + SEND_TIMEOUT;
    let decision = loop {
        let found = lock(&board.0)
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
    // Silence, not a fixed time, decides: a large state on a thin link
    // takes as long as it takes while bytes keep coming.
    let silence = shared.cfg.peer_timeout.max(SEND_TIMEOUT);
    read_unless_silent(&mut stream, &mut bytes, silence, || {
        lock(&board.0).state_heard = Some(Instant::now());
    })
    .await?;
    let digest = hex(&Sha256::digest(&bytes));
    if digest != header.sha256 {
        return Err(format!(
            "state hash {digest} differs from the announced {}",
            header.sha256
        ));
    }
    lock(&board.0).state_in = Some((header.view, peer, bytes));
    let _ = stream.write_all(&[READY]).await;
    let _ = stream.close().await;
    Ok(())
}

impl P2pComm {
    /// Hands the state to the joiners of the view just installed.
    pub(crate) fn send_state_p2p(&mut self, state: &[u8]) -> Result<(), CommError> {
        let joiners = std::mem::take(&mut self.pending_joiners);
        let number = self.view.number;
        let header = StateHeader {
            view: number,
            len: state.len() as u64,
            sha256: hex(&Sha256::digest(state)),
        };
        let rt = self.runtime()?;
        let silence = self.shared.cfg.peer_timeout.max(SEND_TIMEOUT);
        for peer in joiners {
            let control = self.control.clone();
            let header = header.clone();
            // Tried again while the joiner is not silent for `silence`: it
            // may not have heard of its admission yet, or a stream may be
            // dropped on the way. A slow transfer goes on as long as bytes
            // move. One attempt whose stream takes no byte for
            // `ATTEMPT_STALL` is given up and the next opens a new stream:
            // a stream opened on a relayed connection that is being closed
            // (a punched one just replaced it) neither moves nor fails.
            let sent = rt.block_on(async move {
                let heard = Cell::new(Instant::now());
                let attempt = |mut control: libp2p_stream::Control| {
                    let header = header.clone();
                    let heard = &heard;
                    async move {
                        let quiet =
                            |what: &str| format!("the joiner was silent for {silence:?} ({what})");
                        let mut s = tokio::time::timeout(
                            silence,
                            control.open_stream(peer, StreamProtocol::new(STATE_PROTOCOL)),
                        )
                        .await
                        .map_err(|_| quiet("opening the stream"))?
                        .map_err(|e| e.to_string())?;
                        tokio::time::timeout(silence, write_msg(&mut s, &header))
                            .await
                            .map_err(|_| quiet("the header"))?
                            .map_err(|e| e.to_string())?;
                        let stall = silence.min(ATTEMPT_STALL);
                        write_unless_silent(&mut s, state, stall, || heard.set(Instant::now()))
                            .await?;
                        let mut ack = [0u8; 1];
                        tokio::time::timeout(silence, s.read_exact(&mut ack))
                            .await
                            .map_err(|_| quiet("its confirmation"))?
                            .map_err(|e| e.to_string())?;
                        let _ = s.close().await;
                        Ok::<(), String>(())
                    }
                };
                loop {
                    let e = match attempt(control.clone()).await {
                        Ok(()) => return Ok(()),
                        Err(e) => e,
                    };
                    if heard.get().elapsed() >= silence {
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
                    self.board
                        .lose(&self.shared, &peer, "the state transfer failed");
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    /// A reader whose bytes come `piece` at a time, `gap` apart, with one
    /// pause of `stall` after the first half.
    fn trickle(
        total: usize,
        piece: usize,
        gap: Duration,
        stall: Duration,
    ) -> impl AsyncRead + Unpin {
        let (tx, rx) = futures::channel::mpsc::unbounded::<std::io::Result<Vec<u8>>>();
        tokio::spawn(async move {
            let mut sent = 0;
            while sent < total {
                if sent == total / 2 {
                    tokio::time::sleep(stall).await;
                }
                tokio::time::sleep(gap).await;
                let n = piece.min(total - sent);
                if tx.unbounded_send(Ok(vec![7u8; n])).is_err() {
                    return;
                }
                sent += n;
            }
        });
        rx.into_async_read()
    }

    #[tokio::test]
    async fn a_slow_transfer_goes_on_while_bytes_move_and_silence_ends_it() {
        let silence = Duration::from_millis(300);
        // 40 pieces 30 ms apart: 1.2 s in all, four times the silence.
        let mut slow = trickle(40 << 10, 1 << 10, Duration::from_millis(30), Duration::ZERO);
        let mut buf = vec![0u8; 40 << 10];
        let mut moved = 0;
        let started = Instant::now();
        read_unless_silent(&mut slow, &mut buf, silence, || moved += 1)
            .await
            .unwrap();
        assert!(started.elapsed() > 2 * silence, "{:?}", started.elapsed());
        assert!(moved >= 40 && buf.iter().all(|b| *b == 7));

        // The same, but the sender stops for longer than the silence.
        let mut stalled = trickle(40 << 10, 1 << 10, Duration::from_millis(1), 3 * silence);
        let mut buf = vec![0u8; 40 << 10];
        let e = read_unless_silent(&mut stalled, &mut buf, silence, || {})
            .await
            .unwrap_err();
        assert!(
            e.contains("no byte for 300ms after 20480 of 40960 bytes"),
            "{e}"
        );
    }
}
