//! The acceptors of `/slowmo/view/1` and `/slowmo/state/1`: every view
//! message is checked against what we know and recorded on the board.

use std::sync::Arc;

use futures::{AsyncWriteExt, StreamExt};
use libp2p::{PeerId, StreamProtocol};

use super::board::Board;
use super::msg::{
    MAX_MEMBERS, Report, SEND_TIMEOUT, STATE_PROTOCOL, VIEW_PROTOCOL, ViewDecision, ViewMsg,
    ViewReply, check_decision, parse_peer,
};
use super::transfer::receive_state;
use crate::CommError;
use crate::p2p::membership::join::Membership;
use crate::p2p::membership::msg::{read_msg, write_msg};
use crate::p2p::state::{Shared, View};
use crate::p2p::wire::Reject;
use crate::sync::lock;

/// Serves the view and state protocols for the life of the node.
pub(crate) fn spawn_acceptors(
    shared: &Arc<Shared>,
    board: &Arc<Board>,
    membership: &Arc<Membership>,
    control: &mut libp2p_stream::Control,
) -> Result<(), CommError> {
    let mut views = control
        .accept(StreamProtocol::new(VIEW_PROTOCOL))
        .map_err(|e| CommError::Network(format!("{VIEW_PROTOCOL}: {e}")))?;
    let mut states = control
        .accept(StreamProtocol::new(STATE_PROTOCOL))
        .map_err(|e| CommError::Network(format!("{STATE_PROTOCOL}: {e}")))?;
    let (s, b, m) = (shared.clone(), board.clone(), membership.clone());
    tokio::spawn(async move {
        while let Some((peer, mut stream)) = views.next().await {
            let (s, b, m) = (s.clone(), b.clone(), m.clone());
            tokio::spawn(async move {
                let served = tokio::time::timeout(SEND_TIMEOUT, async {
                    let msg: ViewMsg = match read_msg(&mut stream).await {
                        Ok(msg) => msg,
                        Err(e) => {
                            reject_view(
                                &s,
                                &peer,
                                VIEW_PROTOCOL,
                                &format!("bad view message: {e}"),
                            );
                            return;
                        }
                    };
                    let reply = match on_view_msg(&s, &b, &m, peer, msg) {
                        Ok(None) => ViewReply::Ok,
                        Ok(Some(d)) => ViewReply::Admitted(d),
                        Err(why) => {
                            reject_view(&s, &peer, VIEW_PROTOCOL, &why);
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
    let (s, b) = (shared.clone(), board.clone());
    tokio::spawn(async move {
        while let Some((peer, stream)) = states.next().await {
            let (s, b) = (s.clone(), b.clone());
            tokio::spawn(async move {
                if let Err(why) = receive_state(&s, &b, peer, stream).await {
                    reject_view(&s, &peer, STATE_PROTOCOL, &format!("state transfer: {why}"));
                }
            });
        }
    });
    Ok(())
}

/// A report of `peer` on our current view: every wait gives up, at once
/// when it lost somebody, after the collectives it completed when it lost
/// nobody (it admits joiners at its barrier: we finish that barrier too).
pub(super) fn heed(shared: &Shared, peer: &PeerId, r: &Report) {
    let why = format!("member {peer} began a change of view {}", r.view);
    if r.suspects.is_empty() {
        shared.raise_after(r.view, r.collectives, why);
    } else {
        shared.raise(r.view, why);
    }
}

/// Drops a view message (or state transfer, on `protocol`) of `peer`
/// that was bad or refused: counted, and logged with what was wrong.
fn reject_view(shared: &Shared, peer: &PeerId, protocol: &str, why: &str) {
    shared.reject(peer, protocol, &Reject::Membership(why.to_string()));
}

/// Checks a view message against what we know and records it.
fn on_view_msg(
    shared: &Shared,
    board: &Board,
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
            // A report on the view we are in. A node still joining has
            // none: the members of a first view it has not settled yet may
            // go on without it (background gossip waits for nobody) and
            // change it; their reports are kept for when it installs the
            // view, never held against the sender.
            let current = view.is_some() && r.view == ours;
            if current && !member_of(&view) {
                return Err(format!("report about view {ours} from a non-member"));
            }
            tracing::debug!(%peer, view = r.view, "report from {peer} on view {}", r.view);
            let mut b = lock(&board.0);
            b.reports.entry(r.view).or_default().insert(peer, r.clone());
            if r.view == ours
                && let Some(v) = &view
            {
                // What a member saw gone (its connection closed, its lane
                // port refused) we need not wait for either: the
                // coordinator decides once the others reported.
                for s in r.suspects.iter().filter_map(|s| s.parse::<PeerId>().ok()) {
                    if s != shared.local && v.rank_of(&s).is_some() {
                        b.suspects.insert(s);
                    }
                }
            }
            drop(b);
            if current {
                heed(shared, &peer, &r);
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
                lock(&board.0).decided.push((peer, d));
                shared.raise(ours, format!("member {peer} decided view {ours} + 1"));
            } else if d.members.iter().any(|m| m.peer == local) {
                // We wait to join (or were excluded): the decision admits us.
                lock(&board.0).decided.push((peer, d));
            } else {
                return Err(format!(
                    "decision of view {} that does not follow our view {ours}",
                    d.number
                ));
            }
            Ok(None)
        }
        ViewMsg::Excluded { view: v, reason } => {
            if v < ours || view.is_none() {
                // About a view we left already, or told to a new process
                // behind a left-out member's identity (still joining).
                return Ok(None);
            }
            if v != ours || !member_of(&view) {
                return Err(format!("exclusion from view {v}, ours is {ours}"));
            }
            lock(&board.0).excluded = Some((v, reason.clone()));
            shared.raise(v, format!("excluded from view {v}: {reason}"));
            Ok(None)
        }
        ViewMsg::Stop { view: v, reason } => {
            if v != ours || !member_of(&view) {
                return Err(format!("stop of view {v}, ours is {ours}"));
            }
            lock(&board.0).stopped = Some((v, reason.clone()));
            shared.raise(v, format!("the run stops: {reason}"));
            Ok(None)
        }
        ViewMsg::Join { addrs } => {
            if addrs.len() > 64 {
                return Err("join request with too many addresses".into());
            }
            if !membership.is_verified(&peer) {
                return Err("join request from a peer that did not pass the handshake".into());
            }
            if let Some(why) = shared.reach.relay_only(&peer) {
                // Not an offence: it cannot know. Its own log names us as
                // reachable only through the relay too.
                tracing::debug!(%peer, "join request of {peer} not taken: {why}");
                return Ok(None);
            }
            let fresh = lock(&board.0).fresh.contains(&peer);
            if fresh {
                // Admitted already: it has not heard yet.
                return Ok(lock(&board.0).last.clone());
            }
            if member_of(&view) {
                // Our member asks to join: a new process behind its identity
                // (the old one is gone), or it was excluded.
                board.restarted(shared, &peer, "it asks to join again (restarted)");
            }
            let mut b = lock(&board.0);
            if !b.joiners.contains_key(&peer) {
                tracing::info!(%peer, "peer {peer} asks to join; admitted at the next barrier");
            }
            b.joiners.insert(peer, addrs);
            Ok(None)
        }
    }
}
