//! One worker's training state, shared by the loop ([`super::train`]) and
//! its elastic recovery ([`super::elastic`]).

use std::sync::Arc;
use std::time::Instant;

use slowmo_optim::OuterLoop;
use slowmo_runspec::{StepRecord, ViewEvent};
use slowmo_topologies::Topology;

use crate::config::RunConfig;
use crate::data::{Batcher, TrainData};
use crate::io::checkpoint::Identity;
use crate::model::Learner;

/// Steps whose mini-batch losses make up the reported train loss.
pub const LOSS_WINDOW: usize = 50;

/// Where and how often a worker writes checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointPlan {
    pub dir: std::path::PathBuf,
    /// Outer iterations between checkpoints.
    pub every: u64,
    /// Checkpoints kept.
    pub keep: u64,
    pub identity: Identity,
}

/// The mean of the last [`LOSS_WINDOW`] mini-batch losses.
#[derive(Default)]
pub(super) struct LossWindow(pub(super) std::collections::VecDeque<f32>);

impl LossWindow {
    pub(super) fn push(&mut self, loss: f32) {
        if self.0.len() == LOSS_WINDOW {
            self.0.pop_front();
        }
        self.0.push_back(loss);
    }

    pub(super) fn mean(&self) -> f32 {
        if self.0.is_empty() {
            return f32::NAN;
        }
        self.0.iter().sum::<f32>() / self.0.len() as f32
    }
}

/// The state of a recent outer barrier, kept to return to after a view
/// change (docs/algorithm.md, "Membership").
#[derive(Clone)]
pub(super) struct RecoveryPoint {
    pub(super) outer_round: u64,
    pub(super) state: slowmo_optim::LoopState,
    pub(super) losses: Vec<f32>,
}

/// Where this worker stands in the run's membership.
pub(super) struct Place {
    pub(super) rank: usize,
    pub(super) world: usize,
}

/// One worker's training state, across view changes.
pub(super) struct Worker<'s> {
    pub(super) config: RunConfig,
    pub(super) dataset: Arc<dyn TrainData>,
    pub(super) model: Box<dyn Learner>,
    pub(super) topology: Arc<dyn Topology>,
    pub(super) stop: Option<Arc<std::sync::atomic::AtomicBool>>,
    pub(super) checkpoints: Option<CheckpointPlan>,
    pub(super) outer: OuterLoop,
    pub(super) batcher: Batcher,
    pub(super) losses: LossWindow,
    pub(super) grad: Vec<f32>,
    pub(super) sample_len: usize,
    pub(super) push_sum: bool,
    pub(super) started: Instant,
    pub(super) points: std::collections::VecDeque<RecoveryPoint>,
    pub(super) place: Place,
    pub(super) events: Vec<ViewEvent>,
    pub(super) on_step: &'s mut dyn FnMut(&StepRecord),
    pub(super) gate: Option<crate::engine::gate::StepGate>,
}
