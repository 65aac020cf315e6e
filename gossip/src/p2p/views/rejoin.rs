//! A node outside the view asks to be admitted, then waits for the state.

use std::time::Instant;

use super::msg::{JOIN_REPEAT, SEND_TIMEOUT, ViewMsg};
use crate::p2p::comm::P2pComm;
use crate::sync::lock;
use crate::{CommError, ViewChange};

impl P2pComm {
    /// Outside the view: ask to be admitted until a decision takes us in,
    /// then wait for the state.
    pub(crate) fn rejoin_p2p(&mut self) -> Result<crate::Admission, CommError> {
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
            if let Some(d) = lock(&self.board.0)
                .decided
                .iter()
                .filter(|(_, d)| d.number > known.number)
                .find(|(_, d)| d.members.iter().any(|m| m.peer == me.to_string()))
                .map(|(_, d)| d.clone())
            {
                break d;
            }
            if started.elapsed() >= limit {
                return Err(CommError::NotAdmitted(format!(
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
                let mut b = lock(&self.board.0);
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
            // Silence decides: the wait restarts with every byte of the
            // state that arrives.
            let heard = lock(&self.board.0).state_heard;
            let since = heard.map_or(started, |h| h.max(started));
            if since.elapsed() >= limit {
                return Err(CommError::NotAdmitted(format!(
                    "admitted to view {}, but no member sent the training state (no byte of it \
                     for {limit:?})",
                    view.number
                )));
            }
            self.sleep_tick()?;
        }
    }
}
