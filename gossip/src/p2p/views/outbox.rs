//! Sending view messages: one message and its acknowledgement, and the
//! communicator's background sends that try again.

use std::time::{Duration, Instant};

use futures::AsyncWriteExt;
use libp2p::{Multiaddr, PeerId, StreamProtocol};

use super::msg::{
    SEND_TIMEOUT, TICK, VIEW_PROTOCOL, ViewDecision, ViewMsg, ViewReply, check_decision,
};
use crate::CommError;
use crate::p2p::comm::P2pComm;
use crate::p2p::command::SwarmCmd;
use crate::p2p::membership::msg::{read_msg, write_msg};
use crate::sync::lock;

/// Sends one view message and waits for its acknowledgement.
pub(super) async fn send(
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

impl P2pComm {
    /// Sends `msg` to `peer` in the background, trying again (a stream can
    /// be dropped by a busy receiver) for up to the peer timeout; a report
    /// that never gets through makes us suspect the peer.
    pub(super) fn spawn_send(&self, peer: PeerId, msg: ViewMsg, suspect_on_failure: bool) {
        let control = self.control.clone();
        let (shared, board) = (self.shared.clone(), self.board.clone());
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
                        let mut b = lock(&board.0);
                        if valid && !b.decided.iter().any(|(_, k)| k.number == d.number) {
                            tracing::info!(%peer, "{peer} says view {} admitted us", d.number);
                            b.decided.push((peer, d));
                        }
                        return;
                    }
                    Err(e) if started.elapsed() >= interval => {
                        tracing::debug!(%peer, "{what} to {peer} failed: {e}");
                        if suspect_on_failure {
                            board.suspect(&shared, &peer);
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

    pub(super) fn sleep_tick(&self) -> Result<(), CommError> {
        self.shared.interrupt.check()?;
        std::thread::sleep(TICK);
        Ok(())
    }

    pub(super) fn dial(&self, peer: &PeerId, addrs: &[String]) {
        let addrs: Vec<Multiaddr> = addrs.iter().filter_map(|a| a.parse().ok()).collect();
        if !addrs.is_empty() {
            let _ = self
                .shared
                .swarm
                .send(SwarmCmd::Dial { peer: *peer, addrs });
        }
    }
}
