//! Telling a member that a view went on without it.
//!
//! A member left out of a change because it stayed silent (a stopped
//! process, a long pause, a partition) does not know: it would go on in the
//! old view until its own waits time out and its own change finds no quorum,
//! several peer timeouts later. So every member that installs a view which
//! lost peers tells each of them, with [`ViewMsg::Excluded`] about the view
//! it was left out of, as soon as it can hear: the message is sent again
//! while a connection to the peer is open until it is taken (a stopped
//! process takes it right after it resumes), the peer asks to join, it is a member again, or [`NOTICE_LIMIT`] has
//! passed. The peer then gives up the old view at once and asks to join.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use libp2p::PeerId;

use super::board::Board;
use super::msg::{ViewDecision, ViewMsg};
use super::outbox::send;
use crate::p2p::comm::P2pComm;
use crate::p2p::state::Shared;
use crate::sync::lock;

/// How long members keep telling a peer it was left out.
pub(super) const NOTICE_LIMIT: Duration = Duration::from_secs(600);
/// Pause between two tries while the peer does not answer.
const RETRY: Duration = Duration::from_millis(500);

impl P2pComm {
    /// Tells every peer `d` lost that view `d.from_view` went on without it.
    pub(super) fn tell_left_out(&self, d: &ViewDecision) {
        let Some(rt) = self.rt.as_ref() else { return };
        for lost in d.lost.iter().filter_map(|p| p.parse::<PeerId>().ok()) {
            if lost == self.shared.local {
                continue;
            }
            let msg = ViewMsg::Excluded {
                view: d.from_view,
                reason: format!(
                    "view {} went on without this node (it was silent past the peer timeout, \
                     or unreachable)",
                    d.number
                ),
            };
            let (shared, board, control) = (
                self.shared.clone(),
                self.board.clone(),
                self.control.clone(),
            );
            let membership = self.membership.clone();
            rt.spawn(async move {
                let started = Instant::now();
                while !settled(&shared, &board, &lost) && started.elapsed() < NOTICE_LIMIT {
                    // Not dialled: a peer that is gone for good is not
                    // called after; one that comes back connects again.
                    if !membership.is_connected(&lost) {
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                    match send(control.clone(), lost, msg.clone()).await {
                        Ok(_) => {
                            tracing::info!(%lost, "told {lost} that the run went on without it");
                            return;
                        }
                        // It moved on already (it asked to join, or is in
                        // another view): nothing to tell.
                        Err(e) if e.starts_with("refused") => return,
                        Err(_) => tokio::time::sleep(RETRY).await,
                    }
                }
            });
        }
    }
}

/// Whether `peer` needs no telling any more: we stop, it asks to join, or
/// it is a member of our view again.
fn settled(shared: &Arc<Shared>, board: &Board, peer: &PeerId) -> bool {
    shared.stopping.load(Ordering::Relaxed)
        || lock(&board.0).joiners.contains_key(peer)
        || shared
            .view
            .borrow()
            .as_ref()
            .is_some_and(|v| v.rank_of(peer).is_some())
}
