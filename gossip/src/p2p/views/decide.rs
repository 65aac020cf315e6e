//! The coordinator's decision: who goes on, who joins, and the barrier
//! everybody returns to, by the rule both transports share
//! ([`view_rule::decide`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use libp2p::PeerId;

use super::msg::{Report, ViewDecision, ViewMsg};
use crate::p2p::comm::P2pComm;
use crate::p2p::membership::msg::MemberInfo;
use crate::p2p::state::View;
use crate::sync::lock;
use crate::view_rule::{self, Decision};
use crate::{CommError, ViewChange};

/// The coordinator's view of a change: the members that go on (in their
/// old order), the joiners their reports name, and the reports.
pub(super) struct Plan {
    pub live: Vec<PeerId>,
    pub joiners: BTreeMap<PeerId, Vec<String>>,
    pub reports: HashMap<PeerId, Report>,
}

impl P2pComm {
    /// The members of view `old` that go on: those we heard from and do
    /// not suspect, in their old order.
    fn live(&self, old: &View, heard: &HashSet<PeerId>, suspects: &HashSet<PeerId>) -> Vec<PeerId> {
        let me = self.shared.local;
        old.members
            .iter()
            .filter(|p| heard.contains(p) && (**p == me || !suspects.contains(p)))
            .copied()
            .collect()
    }

    /// The joiners the reports of the `live` members name.
    fn joiners_in(
        reports: &HashMap<PeerId, Report>,
        live: &[PeerId],
    ) -> BTreeMap<PeerId, Vec<String>> {
        let mut joiners: BTreeMap<PeerId, Vec<String>> = BTreeMap::new();
        for r in live.iter().filter_map(|p| reports.get(p)) {
            for j in &r.joiners {
                if let Ok(p) = j.peer.parse::<PeerId>() {
                    joiners.entry(p).or_insert_with(|| j.addrs.clone());
                }
            }
        }
        joiners.retain(|p, _| !live.contains(p));
        joiners
    }

    /// What the coordinator would decide now: the members of `old` that go
    /// on, the joiners their reports name, and the reports.
    pub(super) fn plan(
        &self,
        old: &View,
        heard: &HashSet<PeerId>,
        suspects: &HashSet<PeerId>,
    ) -> Plan {
        let live = self.live(old, heard, suspects);
        let reports = lock(&self.board.0)
            .reports
            .get(&old.number)
            .cloned()
            .unwrap_or_default();
        let joiners = Self::joiners_in(&reports, &live);
        Plan {
            live,
            joiners,
            reports,
        }
    }

    /// The coordinator's decision from the reports of view `old`, by the
    /// rule both transports share ([`view_rule::decide`]).
    pub(super) fn decide(&mut self, old: &Arc<View>, plan: Plan) -> Result<ViewChange, CommError> {
        let me = self.shared.local;
        let Plan {
            live,
            joiners,
            reports,
        } = plan;
        let barriers: Vec<(PeerId, u64)> = live
            .iter()
            .filter_map(|p| reports.get(p).map(|r| (*p, r.last_barrier)))
            .collect();
        let candidates: Vec<PeerId> = joiners.keys().copied().collect();
        let next = match view_rule::decide(&old.members, &barriers, &candidates, |p| {
            self.membership.place(p)
        }) {
            Decision::Go(next) => next,
            Decision::NoQuorum { reachable, of } => {
                let reason = format!(
                    "{reachable} of the {of} members of view {} are reachable, no quorum: \
                     waiting to rejoin the side that holds one",
                    old.number
                );
                tracing::warn!("{reason}");
                for p in live.iter().filter(|p| **p != me) {
                    let msg = ViewMsg::Excluded {
                        view: old.number,
                        reason: reason.clone(),
                    };
                    self.spawn_send(*p, msg, false);
                }
                return Ok(ViewChange::Excluded(reason));
            }
        };
        let addrs_of = |p: &PeerId| -> Vec<String> {
            let known = self.membership.addrs_of(p);
            if known.is_empty() {
                joiners.get(p).cloned().unwrap_or_default()
            } else {
                known
            }
        };
        let names = |ps: &[PeerId]| ps.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let decision = ViewDecision {
            from_view: old.number,
            number: old.number + 1,
            members: next
                .members
                .iter()
                .map(|p| MemberInfo {
                    peer: p.to_string(),
                    addrs: addrs_of(p),
                })
                .collect(),
            rollback_to: next.rollback_to,
            lost: names(&next.lost),
            joined: names(&next.joined),
        };
        for m in decision.members.iter().filter(|m| m.peer != me.to_string()) {
            if let Ok(p) = m.peer.parse::<PeerId>() {
                self.dial(&p, &m.addrs);
                self.spawn_send(p, ViewMsg::Decided(decision.clone()), false);
            }
        }
        self.adopt_decision(&decision)
    }
}
