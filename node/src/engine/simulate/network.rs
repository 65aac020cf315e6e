//! `slowmo simulate --network FILE.toml`: the simulated network a run goes
//! over (see `slowmo_gossip::simnet`), and the pace it gives each worker.

use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use slowmo_gossip::VirtualTime;
use slowmo_gossip::simnet::{NetworkProfile, SimNetwork};

use crate::config::RunConfig;

/// Reads a network profile and resolves it for the run (its node and link
/// indices checked against the number of workers, its randomness seeded by
/// the run's seed).
pub fn load(path: &Path, config: &RunConfig) -> anyhow::Result<SimNetwork> {
    // The error's message already holds its cause: no chain to repeat it.
    let profile = NetworkProfile::from_file(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    SimNetwork::new(&profile, config.workers, config.seed).with_context(|| {
        format!(
            "--network {} with {} workers",
            path.display(),
            config.workers
        )
    })
}

/// One worker's pace in virtual time.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerPace {
    pub rank: usize,
    /// Mean virtual time of a step, waits included (every step but the
    /// last, which runs into the end-of-run collectives).
    pub step_seconds: f64,
    /// Compute time of one step on this worker, without waits.
    pub compute_seconds: f64,
    /// The worker's virtual clock at the end of the run.
    pub clock_seconds: f64,
    /// Push-sum shares this worker sent that never arrived.
    pub messages_dropped: u64,
}

/// The simulated network's side of a run's summary.
#[derive(Debug, Clone, Serialize)]
pub struct NetworkSummary {
    pub workers: Vec<WorkerPace>,
}

impl NetworkSummary {
    /// From each worker's virtual time and dropped-message count; `None`
    /// without a simulated network.
    pub fn new(times: &[Option<VirtualTime>], dropped: &[u64]) -> Option<Self> {
        let workers = times
            .iter()
            .zip(dropped)
            .enumerate()
            .map(|(rank, (time, &messages_dropped))| {
                let t = (*time)?;
                Some(WorkerPace {
                    rank,
                    step_seconds: if t.steps == 0 {
                        t.compute
                    } else {
                        t.step_clock / t.steps as f64
                    },
                    compute_seconds: t.compute,
                    clock_seconds: t.clock,
                    messages_dropped,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self { workers })
    }

    pub fn print(&self) {
        println!("  virtual time     per step (compute), end clock, shares lost");
        for w in &self.workers {
            println!(
                "    worker {:<4}   {:.2} ms ({:.2} ms), {:.3} s, {}",
                w.rank,
                w.step_seconds * 1e3,
                w.compute_seconds * 1e3,
                w.clock_seconds,
                w.messages_dropped
            );
        }
    }
}
