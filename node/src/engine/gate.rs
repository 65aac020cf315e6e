//! Holding at given steps until a harness opens the gate
//! (`slowmo_runspec::gate` describes the files): the local testnet plays
//! step-triggered faults at exactly their step this way.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use slowmo_gossip::Communicator;
use slowmo_runspec::gate;

/// The longest a node holds before it goes on by itself (a harness that
/// died must not leave it waiting for ever).
pub const HOLD_LIMIT: Duration = Duration::from_secs(300);
/// How often a held node looks at its gate.
const POLL: Duration = Duration::from_millis(5);

/// Steps to hold at, and the folder of the gate files.
#[derive(Debug, Clone)]
pub struct StepGate {
    dir: PathBuf,
    at: BTreeSet<u64>,
}

impl StepGate {
    /// A gate at `steps` in `dir` (created).
    pub fn new(dir: PathBuf, steps: impl IntoIterator<Item = u64>) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        gate::clear_node_files(&dir)?;
        Ok(Self {
            dir,
            at: steps.into_iter().collect(),
        })
    }

    /// This worker trains as a member (or waits outside the view).
    pub(super) fn member(&self, yes: bool) {
        if let Err(e) = gate::set_member(&self.dir, yes) {
            tracing::warn!("step gate {}: {e}", self.dir.display());
        }
    }

    /// Before base step `step`: holds while the gate there is closed,
    /// telling the harness how many nodes this one knows to wait to join.
    pub(super) fn hold(&self, step: u64, comm: &dyn Communicator, stop: Option<&Arc<AtomicBool>>) {
        if !self.at.contains(&step) || gate::is_open(&self.dir, step) {
            return;
        }
        tracing::info!(step, "holding before step {step} until the gate opens");
        let started = Instant::now();
        let mut told = None;
        while !gate::is_open(&self.dir, step) {
            let joiners = comm.joiners_waiting();
            if told != Some(joiners) {
                if let Err(e) = gate::write_held(&self.dir, step, joiners) {
                    tracing::warn!("step gate {}: {e}", self.dir.display());
                    break;
                }
                told = Some(joiners);
            }
            if stop.is_some_and(|f| f.load(Ordering::Relaxed)) {
                break;
            }
            if started.elapsed() >= HOLD_LIMIT {
                tracing::warn!(
                    step,
                    "the gate at step {step} stayed closed for {HOLD_LIMIT:?}; going on"
                );
                break;
            }
            std::thread::sleep(POLL);
        }
        let _ = gate::remove_held(&self.dir, step);
    }
}
