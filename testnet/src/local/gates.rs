//! The harness's side of the step gates (`slowmo_runspec::gate`): every
//! node holds before the steps of the script's step faults, and a fault at
//! step S is carried out once every member holds there, so that it lands
//! at exactly that step, as in the simulator.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use slowmo_runspec::gate;

use super::nodes::Nodes;
use crate::node_line::gate_dir;

/// The gates still closed.
pub(super) struct Gates {
    closed: BTreeSet<u64>,
}

impl Gates {
    /// Gates at `steps`, all closed.
    pub(super) fn new(steps: impl IntoIterator<Item = u64>) -> Self {
        Self {
            closed: steps.into_iter().collect(),
        }
    }

    pub(super) fn is_closed(&self, step: u64) -> bool {
        self.closed.contains(&step)
    }

    /// The members: nodes running (not paused) that train in a view.
    fn members(nodes: &Nodes) -> Vec<usize> {
        (0..nodes.slots.len())
            .filter(|i| {
                let s = &nodes.slots[*i];
                s.running() && !s.paused && gate::is_member(&gate_dir(&s.dir))
            })
            .collect()
    }

    /// Whether the run stands at `step`: every member holds there, or one
    /// went past it without holding (it joined later, or the gate was
    /// opened in an earlier life) and the others will not be waited for.
    /// `steps_of(i)` is node i's steps done, from its metrics.
    pub(super) fn reached(
        &self,
        nodes: &Nodes,
        step: u64,
        steps_of: impl Fn(usize) -> Option<u64>,
    ) -> bool {
        let members = Self::members(nodes);
        let held = |i: &usize| gate::read_held(&gate_dir(&nodes.slots[*i].dir), step).is_some();
        !members.is_empty()
            && (members.iter().all(held)
                || members
                    .iter()
                    .any(|i| !held(i) && steps_of(*i).is_some_and(|s| s > step)))
    }

    /// The joiners every member holding at `step` knows of.
    pub(super) fn known_joiners(nodes: &Nodes, step: u64) -> Vec<(usize, usize)> {
        Self::members(nodes)
            .into_iter()
            .filter_map(|i| gate::read_held(&gate_dir(&nodes.slots[i].dir), step).map(|n| (i, n)))
            .collect()
    }

    /// Waits (up to `limit`) until a member in `before` that still holds
    /// at `step` knows of `more` joiners more than it did then: one member
    /// that knows is enough, it starts the change at its next barrier and
    /// the others follow. Returns whether one heard of them in time.
    pub(super) fn wait_for_joiners(
        nodes: &Nodes,
        step: u64,
        before: &[(usize, usize)],
        more: usize,
        limit: Duration,
    ) -> bool {
        let started = Instant::now();
        loop {
            let heard = before.iter().any(|(i, n)| {
                let slot = &nodes.slots[*i];
                slot.running()
                    && gate::read_held(&gate_dir(&slot.dir), step).is_some_and(|k| k >= n + more)
            });
            if heard || started.elapsed() >= limit {
                return heard;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Opens the gate at `step` in every node's folder.
    pub(super) fn open(&mut self, nodes: &Nodes, step: u64) -> anyhow::Result<()> {
        for slot in &nodes.slots {
            let dir = gate_dir(&slot.dir);
            std::fs::create_dir_all(&dir)?;
            gate::open(&dir, step)?;
        }
        self.closed.remove(&step);
        Ok(())
    }

    /// Opens every gate still closed: no fault is left to play there.
    pub(super) fn open_all(&mut self, nodes: &Nodes) -> anyhow::Result<()> {
        for step in std::mem::take(&mut self.closed) {
            self.closed.insert(step);
            self.open(nodes, step)?;
        }
        Ok(())
    }
}
