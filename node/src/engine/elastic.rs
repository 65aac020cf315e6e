//! Elastic recovery (docs/algorithm.md, "Membership"): when a member is
//! lost or another member begins a view change, the live members agree on a
//! new view, return to the newest barrier all of them completed, re-derive
//! ranks, graph and data shards, and hand the state to joiners; a worker
//! outside the view waits to be admitted and continues from the state a
//! member sent.

use std::sync::Arc;

use slowmo_gossip::{CommError, Communicator, NewView, ViewChange};
use slowmo_runspec::ViewEvent;

use crate::data::Batcher;
use crate::engine::exchange::CommExchange;
use crate::engine::train::TrainError;
use crate::engine::worker::{LossWindow, Place, RecoveryPoint, Worker};
use crate::io::checkpoint::{Checkpoint, Identity};

/// Barriers kept: members of a view are at most one barrier apart when a
/// change begins (a barrier completes nowhere before every member entered
/// it); synchronous noaverage gossip may drift a little further. With
/// background gossip and no exact average each member returns to its own
/// newest barrier, however far apart they are.
const RECOVERY_POINTS: usize = 4;

impl Worker<'_> {
    pub(super) fn record_point(&mut self) {
        let round = self.outer.slowmo().outer_steps();
        self.points.retain(|p| p.outer_round < round);
        if self.points.len() == RECOVERY_POINTS {
            self.points.pop_front();
        }
        self.points.push_back(RecoveryPoint {
            outer_round: round,
            state: self.outer.state(),
            losses: self.losses.0.iter().copied().collect(),
        });
    }

    pub(super) fn newest_round(&self) -> u64 {
        self.points.back().map_or(0, |p| p.outer_round)
    }

    pub(super) fn restore_point(&mut self, p: RecoveryPoint) -> Result<(), TrainError> {
        self.outer
            .restore(p.state)
            .map_err(|e| TrainError::Resume(format!("returning to a barrier: {e}")))?;
        self.losses = LossWindow::default();
        p.losses.into_iter().for_each(|l| self.losses.push(l));
        Ok(())
    }

    /// The identity a state transfer carries: the run's configuration and
    /// the view it is for.
    pub(super) fn transfer_identity(&self, world: usize) -> Identity {
        Identity {
            config_hash: self.config.hash(),
            settings: self.config.settings(),
            run_id: "state-transfer".into(),
            rank: 0,
            world_size: world,
            view: 0,
        }
    }

    /// Ranks, graph and data shard of a new view. The data stream starts
    /// afresh, seeded by the rank and the view number, so that every
    /// transport derives the same one.
    pub(super) fn adopt(&mut self, view: &NewView) -> Result<(), TrainError> {
        let other = |e: String| TrainError::Comm(CommError::Config(e));
        let topology = slowmo_topologies::build(&self.config.graph, view.world)
            .map_err(|e| other(format!("graph of the new view: {e}")))?;
        let mut shards = crate::data::shard_indices(
            &self.dataset.train().labels(),
            self.dataset.classes(),
            view.world,
            self.config.partition,
            self.config.seed,
        )
        .map_err(|e| other(format!("data shards of the new view: {e}")))?;
        let shard = std::mem::take(&mut shards[view.rank]);
        let seed = self.config.seed ^ ((view.rank as u64 + 1) << 32) ^ (view.number << 48);
        self.batcher = Batcher::new(shard, seed);
        self.topology = Arc::from(topology);
        self.place = Place {
            rank: view.rank,
            world: view.world,
        };
        // Checkpoints from here on are of this view (a resume refuses them:
        // it starts from the first view).
        if let Some(plan) = &mut self.checkpoints {
            plan.identity.rank = view.rank;
            plan.identity.world_size = view.world;
            plan.identity.view = view.number;
        }
        Ok(())
    }

    /// After a lost member or a change another member began: agree on the
    /// new view, return to the agreed barrier, hand the state to joiners.
    pub(super) fn change_view(&mut self, comm: &mut dyn Communicator) -> Result<(), TrainError> {
        let at_step = self.outer.steps();
        match comm.change_view(self.newest_round())? {
            ViewChange::Member(view) => {
                // Background gossip without exact averages: nothing holds
                // the members near one barrier (a slow node falls many
                // behind), and nothing needs them there: each returns to
                // its own newest barrier, and the average after the change
                // equalises the parameters.
                let target = if self.own_barrier() {
                    self.newest_round()
                } else {
                    view.rollback_to
                };
                let point = self
                    .points
                    .iter()
                    .find(|p| p.outer_round == target)
                    .cloned()
                    .ok_or_else(|| {
                        TrainError::Resume(format!(
                            "the view returns to outer iteration {}, which this worker no longer \
                             holds (it keeps {:?})",
                            target,
                            self.points
                                .iter()
                                .map(|p| p.outer_round)
                                .collect::<Vec<_>>()
                        ))
                    })?;
                self.restore_point(point)?;
                self.adopt(&view)?;
                if view.sends_state {
                    let bytes = Checkpoint {
                        identity: self.transfer_identity(view.world),
                        state: self.outer.state(),
                        epoch: 0,
                        position: 0,
                        losses: self.losses.0.iter().copied().collect(),
                    }
                    .to_bytes(self.model.layout())
                    .map_err(|e| TrainError::Resume(format!("encoding the state: {e}")))?;
                    comm.send_state(&bytes)?;
                }
                self.after_change(comm)?;
                tracing::info!(
                    "view {}: rank {} of {}, back at step {} (lost {:?}, joined {:?})",
                    view.number,
                    view.rank,
                    view.world,
                    self.outer.steps(),
                    view.lost,
                    view.joined
                );
                self.note_view(view, at_step, false);
                Ok(())
            }
            ViewChange::Excluded(why) => {
                tracing::warn!("outside the new view ({why}); waiting to be admitted again");
                self.rejoin(comm, at_step)
            }
        }
    }

    /// Records a change in the summary's list.
    pub(super) fn note_view(&mut self, view: NewView, at_step: u64, rejoined: bool) {
        self.events.push(ViewEvent {
            view: view.number,
            at_step,
            resumed_from: self.outer.steps(),
            rank: view.rank,
            world: view.world,
            lost: view.lost,
            joined: view.joined,
            rejoined,
            members: view.members,
            state_sender: view.state_sender,
        });
    }

    /// Waits until the run admits this worker, then continues from the
    /// state a member sent.
    pub(super) fn rejoin(
        &mut self,
        comm: &mut dyn Communicator,
        at_step: u64,
    ) -> Result<(), TrainError> {
        if let Some(gate) = &self.gate {
            gate.member(false);
        }
        let admission = comm.rejoin()?;
        let view = admission.view;
        let expect = self.transfer_identity(view.world);
        let ck = Checkpoint::from_bytes(
            &admission.state,
            self.model.layout(),
            &expect,
            std::path::Path::new("<state transfer>"),
        )?;
        self.outer
            .restore(ck.state)
            .map_err(|e| TrainError::Resume(format!("the state a member sent: {e}")))?;
        // The sender's compression error stays with the sender.
        self.outer.clear_average_residual();
        self.losses = LossWindow::default();
        ck.losses.into_iter().for_each(|l| self.losses.push(l));
        self.adopt(&view)?;
        self.after_change(comm)?;
        tracing::info!(
            "admitted to view {}: rank {} of {}, at step {}",
            view.number,
            view.rank,
            view.world,
            self.outer.steps()
        );
        self.note_view(view, at_step, true);
        Ok(())
    }

    /// Whether a view change returns this worker to its own newest barrier
    /// rather than the view's common one: background gossip without exact
    /// averages, where members drift apart by any number of barriers.
    fn own_barrier(&self) -> bool {
        let alg = self.outer.algorithm();
        alg.background_gossip && !alg.slowmo.average
    }

    /// Every member, old and new, after a change: the noaverage variant
    /// re-normalizes the weights over the live members (mass that died with
    /// a peer, or was in flight, is gone); the barrier states of the other
    /// variants are already equal. Background gossip starts the new view's
    /// rounds at one count. Then the new view's first recovery point.
    pub(super) fn after_change(&mut self, comm: &mut dyn Communicator) -> Result<(), TrainError> {
        let topology = self.topology.clone();
        let mut net = CommExchange::new(comm, &*topology, false);
        if !self.outer.algorithm().slowmo.average && self.push_sum {
            self.outer.average_now(&mut net)?;
        }
        self.outer.align_rounds(&mut net)?;
        self.points.clear();
        self.record_point();
        Ok(())
    }
}
