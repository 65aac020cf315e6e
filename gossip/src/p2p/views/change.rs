//! The member's side of a view change ([`P2pComm::change_view_p2p`]):
//! report, follow the coordinator, or coordinate.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use libp2p::PeerId;

use super::msg::{Report, SEND_TIMEOUT, ViewMsg};
use crate::p2p::comm::P2pComm;
use crate::p2p::lane::alive;
use crate::p2p::membership::msg::MemberInfo;
use crate::p2p::state::View;
use crate::sync::lock;
use crate::{CommError, ViewChange};

/// How long after the start of a change a member that has not reported is
/// probed (live members report within milliseconds), and how often again.
const PROBE_AFTER: Duration = Duration::from_millis(500);
const PROBE_EVERY: Duration = Duration::from_secs(2);

impl P2pComm {
    /// [`crate::Communicator::change_view`] over libp2p; see the module docs.
    /// The coordinator does not decide a view smaller than `min_nodes`: it
    /// waits (up to the join timeout) for joiners, then stops the run.
    pub(crate) fn change_view_p2p(&mut self, last_barrier: u64) -> Result<ViewChange, CommError> {
        if !self.is_member() {
            return Ok(ViewChange::Excluded(format!(
                "outside view {}: waiting to be admitted",
                self.view.number
            )));
        }
        self.runtime()?;
        let old = self.view.clone();
        let me = self.shared.local;
        tracing::info!(
            view = old.number,
            last_barrier,
            "changing view {} (newest barrier {last_barrier})",
            old.number
        );
        let timeout = self.shared.cfg.peer_timeout;
        let mut reported: HashMap<PeerId, usize> = HashMap::new();
        let min = self.shared.cfg.min_nodes;
        let join_limit = self.shared.cfg.join_timeout;
        let mut coordinator: Option<(PeerId, Instant)> = None;
        let (mut warned, mut paused) = (false, false);
        let collectives = self.shared.collectives_done();
        let began = Instant::now();
        let mut probed: HashMap<PeerId, Instant> = HashMap::new();
        loop {
            let (suspects, joiners) = {
                let mut b = lock(&self.board.0);
                if let Some((v, why)) = b.excluded.clone()
                    && v == old.number
                {
                    return Ok(ViewChange::Excluded(why));
                }
                if let Some((v, why)) = b.stopped.clone()
                    && v == old.number
                {
                    return Err(CommError::RunStopped(why));
                }
                if let Some((from, d)) = b
                    .decided
                    .iter()
                    .find(|(_, d)| d.from_view == old.number)
                    .cloned()
                {
                    drop(b);
                    tracing::info!(%from, "view {} decided by {from}", d.number);
                    return self.adopt_decision(&d);
                }
                b.suspects.retain(|p| old.rank_of(p).is_some());
                b.suspects.remove(&me);
                let joiners: Vec<MemberInfo> = b
                    .joiners
                    .iter()
                    .map(|(p, a)| MemberInfo {
                        peer: p.to_string(),
                        addrs: a.clone(),
                    })
                    .collect();
                let mine = Report {
                    view: old.number,
                    last_barrier,
                    suspects: b.suspects.iter().map(|p| p.to_string()).collect(),
                    joiners: joiners.clone(),
                    collectives,
                };
                b.reports.entry(old.number).or_default().insert(me, mine);
                (b.suspects.clone(), joiners)
            };
            // Tell every member we do not suspect (again when we hear of
            // more joiners).
            for peer in old.members.iter().filter(|p| **p != me) {
                if !suspects.contains(peer) && reported.get(peer).is_none_or(|n| *n < joiners.len())
                {
                    reported.insert(*peer, joiners.len());
                    let report = Report {
                        view: old.number,
                        last_barrier,
                        suspects: suspects.iter().map(|p| p.to_string()).collect(),
                        joiners: joiners.clone(),
                        collectives,
                    };
                    self.spawn_send(*peer, ViewMsg::Report(report), true);
                }
            }
            // The members whose report on this change we hold.
            let heard: HashSet<PeerId> = lock(&self.board.0)
                .reports
                .get(&old.number)
                .map(|r| r.keys().copied().collect())
                .unwrap_or_default();
            if began.elapsed() >= PROBE_AFTER {
                self.probe_silent(&old, &suspects, &heard, &mut probed);
            }
            let coord = *old
                .members
                .iter()
                .find(|p| !suspects.contains(p))
                .expect("we are a member and never suspect ourselves");
            let since = match coordinator {
                Some((c, t)) if c == coord => t,
                _ => {
                    tracing::debug!(%coord, "coordinator of the change: {coord}");
                    let now = Instant::now();
                    coordinator = Some((coord, now));
                    now
                }
            };
            if coord == me {
                let waiting: Vec<&PeerId> = old
                    .members
                    .iter()
                    .filter(|p| !suspects.contains(p) && !heard.contains(p))
                    .collect();
                if waiting.is_empty() || since.elapsed() >= timeout {
                    if !waiting.is_empty() && !warned {
                        warned = true;
                        tracing::warn!(
                            "no report from {:?} within {timeout:?}: leaving them out",
                            waiting
                        );
                    }
                    let plan = self.plan(&old, &heard, &suspects);
                    let size = plan.live.len() + plan.joiners.len();
                    if size >= min {
                        return self.decide(&old, plan);
                    }
                    if since.elapsed() >= timeout + join_limit {
                        let reason = format!(
                            "the run would have {size} members, below --min-nodes {min}, and \
                             not enough nodes joined within {join_limit:?}"
                        );
                        for p in old.members.iter().filter(|p| **p != me) {
                            let msg = ViewMsg::Stop {
                                view: old.number,
                                reason: reason.clone(),
                            };
                            self.spawn_send(*p, msg, false);
                        }
                        // Let the stop reach them before the node goes.
                        std::thread::sleep(Duration::from_millis(500));
                        return Err(CommError::RunStopped(reason));
                    }
                    if !paused {
                        paused = true;
                        tracing::warn!(
                            "view {} + 1 would have {size} members, below --min-nodes {min}: \
                             waiting up to {join_limit:?} for nodes to join",
                            old.number
                        );
                    }
                }
            } else if !heard.contains(&coord) && since.elapsed() >= timeout {
                // A live coordinator reports as soon as it hears of the
                // change; one that stays silent is gone.
                tracing::warn!(%coord, "coordinator {coord} sent no report within {timeout:?}; suspecting it");
                self.board.suspect(&self.shared, &coord);
            } else if since.elapsed()
                >= 2 * timeout
                    + SEND_TIMEOUT
                    + if old.members.len() - suspects.len() < min {
                        join_limit
                    } else {
                        Duration::ZERO
                    }
            {
                tracing::warn!(%coord, "coordinator {coord} decided nothing in time; suspecting it");
                self.board.suspect(&self.shared, &coord);
            }
            self.sleep_tick()?;
        }
    }

    /// Probes the data-lane port of every member of `old` that has neither
    /// reported nor is suspected (at most every [`PROBE_EVERY`]): refused
    /// connections mean its process is gone, and it is suspected at once.
    /// Without this a second member killed with the first was waited for
    /// the whole peer timeout over QUIC, which sees nothing of a killed
    /// process until then; a probe that is accepted, or not answered (the
    /// path or the machine), leaves the verdict to the peer timeout.
    fn probe_silent(
        &self,
        old: &View,
        suspects: &HashSet<PeerId>,
        heard: &HashSet<PeerId>,
        probed: &mut HashMap<PeerId, Instant>,
    ) {
        let Some(rt) = self.rt.as_ref() else { return };
        let me = self.shared.local;
        for peer in old
            .members
            .iter()
            .filter(|p| **p != me && !suspects.contains(p))
        {
            if heard.contains(peer) || probed.get(peer).is_some_and(|t| t.elapsed() < PROBE_EVERY) {
                continue;
            }
            probed.insert(*peer, Instant::now());
            // Only where we reach the peer: a private address of a peer
            // behind a NAT may be another machine here, whose refusal
            // says nothing of the peer.
            let addrs = self
                .shared
                .reach
                .peer(peer)
                .lane_addrs(&self.membership.lane_addrs_of(peer))
                .unwrap_or_default();
            if addrs.is_empty() {
                continue;
            }
            let (shared, board, peer) = (self.shared.clone(), self.board.clone(), *peer);
            rt.spawn(async move {
                if alive::process_gone(&addrs).await {
                    board.lose(
                        &shared,
                        &peer,
                        "it sent no report and its data lane port refuses connections",
                    );
                }
            });
        }
    }
}
