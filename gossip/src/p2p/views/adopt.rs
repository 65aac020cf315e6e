//! Installing a decided view: the links, the inbox, the board and the
//! lanes switch to it.

use std::sync::Arc;

use libp2p::PeerId;

use super::msg::ViewDecision;
use crate::ledger::{Ledger, Mixing};
use crate::p2p::comm::{P2pComm, spawn_links};
use crate::p2p::state::View;
use crate::sync::lock;
use crate::view_rule;
use crate::{CommError, NewView, Rank, ViewChange};

impl P2pComm {
    /// Installs a decided view; `Excluded` when it leaves us out.
    pub(super) fn adopt_decision(&mut self, d: &ViewDecision) -> Result<ViewChange, CommError> {
        let me = self.shared.local.to_string();
        let Some(rank) = d.members.iter().position(|m| m.peer == me) else {
            return Ok(ViewChange::Excluded(format!(
                "view {} goes on without us",
                d.number
            )));
        };
        let was_member = self.is_member();
        let members: Vec<PeerId> = d
            .members
            .iter()
            .map(|m| m.peer.parse::<PeerId>())
            .collect::<Result<_, _>>()
            .map_err(|e| CommError::Protocol(format!("decided view holds a bad peer id: {e}")))?;
        for (m, p) in d.members.iter().zip(&members) {
            if m.peer != me {
                self.dial(p, &m.addrs);
            }
        }
        let names: Vec<String> = d.members.iter().map(|m| m.peer.clone()).collect();
        let sender: Option<Rank> = view_rule::state_sender(&names, &d.joined);
        self.install(View {
            number: d.number,
            members,
        });
        {
            let mut b = lock(&self.board.0);
            b.fresh = d
                .joined
                .iter()
                .filter_map(|p| p.parse::<PeerId>().ok())
                .collect();
            b.last = Some(d.clone());
        }
        if was_member {
            self.tell_left_out(d);
        }
        self.pending_joiners = d
            .joined
            .iter()
            .filter_map(|p| p.parse::<PeerId>().ok())
            .collect();
        let view = NewView {
            number: d.number,
            rank,
            world: d.members.len(),
            rollback_to: d.rollback_to,
            lost: d.lost.clone(),
            joined: d.joined.clone(),
            sends_state: was_member && sender == Some(rank),
            members: names,
            state_sender: sender,
        };
        tracing::info!(
            view = d.number,
            rank,
            world = view.world,
            "view {}: rank {rank} of {} (lost {:?}, joined {:?})",
            d.number,
            view.world,
            d.lost,
            d.joined
        );
        Ok(ViewChange::Member(view))
    }

    /// Switches every link, the inbox and the collective counter to `view`.
    pub(crate) fn install(&mut self, view: View) {
        let view = Arc::new(view);
        let rank = view.rank_of(&self.shared.local);
        for link in self
            .push_links
            .drain(..)
            .flatten()
            .chain(self.reduce_links.drain(..).flatten())
        {
            link.task.abort();
        }
        for payload in self.shared.push_inbox.reset(view.number) {
            payload.recycle(&self.shared.pool);
        }
        while let Ok(msg) = self.reduce_rx.try_recv() {
            self.shared.pool.give(msg.payload);
        }
        for msg in self.early.drain(..) {
            self.shared.pool.give(msg.payload);
        }
        self.push = Ledger::new(Mixing::Arrived);
        self.seq = 0;
        {
            let mut b = lock(&self.board.0);
            b.suspects.clear();
            b.reports.retain(|v, _| *v >= view.number);
            // A joiner's decision stays until its state has come.
            b.decided.retain(|(_, d)| d.number >= view.number);
            b.excluded = None;
            b.joiners.retain(|p, _| view.rank_of(p).is_none());
        }
        // Starts the alarm afresh for the new view, before the node's tasks
        // see it: an alarm they raise about the old one is dropped, one
        // about the new one stays.
        self.membership.install(view.clone());
        // Reports on the new view that came before we installed it.
        let early: Vec<_> = lock(&self.board.0)
            .reports
            .get(&view.number)
            .map(|r| r.iter().map(|(p, r)| (*p, r.clone())).collect())
            .unwrap_or_default();
        for (peer, report) in early.iter().filter(|(p, _)| *p != self.shared.local) {
            super::accept::heed(&self.shared, peer, report);
        }
        if let Some(lanes) = &self.lanes {
            // Lanes serve one view: the new one's are offered below.
            lanes.retire_before(view.number);
        }
        if let (Some(_), Some(rt)) = (rank, self.rt.as_ref()) {
            let _guard = rt.enter();
            let (push, reduce) =
                spawn_links(&self.shared, self.lanes.as_ref(), &self.control, &view);
            self.push_links = push;
            self.reduce_links = reduce;
        }
        self.rank = rank.unwrap_or(0);
        self.view = view;
    }

    /// Whether this node is a member of its current view.
    pub fn is_member(&self) -> bool {
        self.view.rank_of(&self.shared.local).is_some()
    }

    /// `true` when nodes wait to join (they are admitted at this barrier).
    pub(crate) fn at_barrier_p2p(&mut self) -> Result<bool, CommError> {
        self.shared.check()?;
        Ok(self.joiners_waiting_p2p() > 0)
    }

    /// Nodes outside the view that asked to join.
    pub(crate) fn joiners_waiting_p2p(&self) -> usize {
        let b = lock(&self.board.0);
        b.joiners
            .keys()
            .filter(|p| self.view.rank_of(p).is_none())
            .count()
    }
}
