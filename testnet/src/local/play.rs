//! A local run from its first lives to its end: the fault player (each
//! scripted fault when it is due), the reports of nodes that fail, the
//! progress line, and the wait until every node has exited.

use std::collections::BTreeMap;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use slowmo_runspec::last_record;

use super::args::LocalArgs;
use super::fates::{Outcome, write_results};
use super::gates::Gates;
use super::launch::Prepared;
use super::nodes::{Nodes, not_stopped};
use crate::faults::{FaultAction, ScriptedFault, Trigger};
use crate::node_line::node_name;

/// Carries out the script on the started nodes until every node has
/// exited (or Ctrl-C), then writes the results.
pub(super) fn play(
    nodes: &mut Nodes,
    args: &LocalArgs,
    run: &Prepared,
    script: Vec<ScriptedFault>,
    interrupted: &Arc<AtomicBool>,
) -> anyhow::Result<Outcome> {
    let mut player = Player {
        gates: Gates::new(run.hold_at.iter().copied()),
        pending: script,
        run_step: 0,
        quiet: args.quiet,
        join_limit: Duration::from_secs(args.join_timeout),
    };
    let mut last_print = Instant::now();
    loop {
        if interrupted.load(Ordering::SeqCst) {
            let killed = nodes.stop();
            nodes.event("stop", "all", "interrupted");
            let outcome = nodes.finish();
            write_results(&run.out, &outcome)?;
            bail!(
                "interrupted: stopped every node{}; partial results in {}",
                not_stopped(&killed),
                run.out.display()
            );
        }
        report_failures(nodes)?;
        player.fire_due(nodes, run)?;
        if !player.can_go_on(nodes, run)? {
            break;
        }
        if !args.quiet && last_print.elapsed() >= Duration::from_secs(2) {
            last_print = Instant::now();
            println!("progress: {}", progress(nodes, run.config.steps));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let outcome = nodes.finish();
    write_results(&run.out, &outcome)?;
    Ok(outcome)
}

/// Reaps the nodes that exited; tells of each that failed on its own,
/// with the tail of its log.
fn report_failures(nodes: &mut Nodes) -> anyhow::Result<()> {
    for i in nodes.reap()? {
        let f = &nodes.slots[i].fate;
        let by = f.ended_by.as_deref().unwrap_or("self");
        if f.exit_code != Some(0) && by == "self" {
            let log = nodes.slots[i].dir.join("node.log");
            let tail = std::fs::read_to_string(&log)
                .map(|t| {
                    let lines: Vec<&str> = t.lines().collect();
                    lines[lines.len().saturating_sub(5)..].join("\n")
                })
                .unwrap_or_default();
            eprintln!(
                "{} failed ({}) at {:.1} s; the others go on; its log {}:\n{tail}",
                nodes.slots[i].name,
                f.exit.as_deref().unwrap_or("?"),
                f.ended_at_s.unwrap_or(0.0),
                log.display()
            );
        }
    }
    Ok(())
}

/// The faults of the script not yet carried out.
struct Player {
    /// In script order; a fault waits for the earlier ones on its node.
    pending: Vec<ScriptedFault>,
    /// The gates of the step faults: a step fault is due when every member
    /// holds at its step.
    gates: Gates,
    /// The run's step (the most any running node has done), for step
    /// faults whose gate is open already (the run went past them).
    run_step: u64,
    quiet: bool,
    /// How long the members may take to hear a started node ask to join.
    join_limit: Duration,
}

impl Player {
    /// Carries out every fault that is due and first on its node; opens
    /// the gates whose faults were carried out.
    fn fire_due(&mut self, nodes: &mut Nodes, run: &Prepared) -> anyhow::Result<()> {
        // The run's step, from the metrics files' tails.
        let steps: Vec<Option<u64>> = if self
            .pending
            .iter()
            .any(|f| matches!(f.at, Trigger::Step(_)))
        {
            nodes
                .slots
                .iter()
                .map(|slot| {
                    slot.running()
                        .then(|| last_step(&slot.dir.join("metrics.jsonl")).map(|(s, _)| s))
                        .flatten()
                })
                .collect()
        } else {
            Vec::new()
        };
        self.run_step = self
            .run_step
            .max(steps.iter().flatten().copied().max().unwrap_or(0));
        let now = nodes.start.elapsed().as_secs_f64();
        // Per gate fired at: the members' joiners before, joiners started.
        let mut fired: BTreeMap<u64, (Vec<(usize, usize)>, usize)> = BTreeMap::new();
        let mut k = 0;
        while k < self.pending.len() {
            let f = &self.pending[k];
            let first_on_node = !self.pending[..k].iter().any(|e| e.node == f.node);
            let due = match f.at {
                Trigger::Seconds(s) => now >= s,
                Trigger::Step(s) if self.gates.is_closed(s) => {
                    fired.contains_key(&s)
                        || self
                            .gates
                            .reached(nodes, s, |i| steps.get(i).copied().flatten())
                }
                Trigger::Step(s) => self.run_step >= s,
            };
            if first_on_node && due {
                let f = self.pending.remove(k);
                if let Trigger::Step(s) = f.at
                    && self.gates.is_closed(s)
                {
                    let at = fired
                        .entry(s)
                        .or_insert_with(|| (Gates::known_joiners(nodes, s), 0));
                    let result = nodes.fault(&f, &run.bin, &run.bootstrap)?;
                    if matches!(f.action, FaultAction::Restart | FaultAction::Join)
                        && result.starts_with("done")
                    {
                        at.1 += 1;
                    }
                    self.tell(&f, &result);
                } else {
                    let result = nodes.fault(&f, &run.bin, &run.bootstrap)?;
                    self.tell(&f, &result);
                }
                // Faults after it on its node may be due now.
                k = 0;
            } else {
                k += 1;
            }
        }
        for (step, (before, started)) in fired {
            if started > 0
                && !Gates::wait_for_joiners(nodes, step, &before, started, self.join_limit)
            {
                eprintln!(
                    "step {step}: no member heard the started node ask to join within {:?}; \
                     the run goes on",
                    self.join_limit
                );
            }
            self.gates.open(nodes, step)?;
        }
        Ok(())
    }

    fn tell(&self, f: &ScriptedFault, result: &str) {
        if !self.quiet {
            println!("fault {f}: {result}");
        }
    }

    /// Whether the run goes on. It ends when no node runs and no timed
    /// restart or join is to come (the faults left are logged as not
    /// done). Every running node frozen with no resume to come would never
    /// end: those nodes are resumed.
    fn can_go_on(&mut self, nodes: &mut Nodes, run: &Prepared) -> anyhow::Result<bool> {
        let running = nodes.slots.iter().filter(|s| s.running()).count();
        if running == 0 {
            // Nothing moves steps any more; a timed restart may still come.
            // (One that waits for a fault still to come on its node never fires.)
            let timed_restart = self.pending.iter().enumerate().any(|(k, f)| {
                matches!(f.action, FaultAction::Restart | FaultAction::Join)
                    && matches!(f.at, Trigger::Seconds(_))
                    && !self.pending[..k].iter().any(|e| e.node == f.node)
            });
            if !timed_restart {
                self.gates.open_all(nodes)?;
                for f in self.pending.drain(..) {
                    nodes.event(
                        f.action.name(),
                        &node_name(f.node),
                        "not done: every node had exited",
                    );
                }
                return Ok(false);
            }
        } else if nodes.slots.iter().filter(|s| s.running()).all(|s| s.paused)
            && !self.pending.iter().any(|f| f.action == FaultAction::Resume)
        {
            let now = nodes.start.elapsed().as_secs_f64();
            for i in 0..nodes.slots.len() {
                if nodes.slots[i].paused {
                    let f = ScriptedFault {
                        action: FaultAction::Resume,
                        node: i,
                        at: Trigger::Seconds(now),
                    };
                    nodes.fault(&f, &run.bin, &run.bootstrap)?;
                }
            }
        }
        Ok(true)
    }
}

/// Every node's step and loss (or state), for the progress line.
fn progress(nodes: &Nodes, steps: u64) -> String {
    let steps: Vec<String> = nodes
        .slots
        .iter()
        .map(|s| {
            let state = match (s.running(), s.paused) {
                (true, true) => " paused",
                (true, false) => "",
                (false, _) if s.fate.ended_by.as_deref() == Some("self") => " exited",
                (false, _) => " down",
            };
            match last_step(&s.dir.join("metrics.jsonl")) {
                _ if s.joiner && s.fate.lives == 0 => "to join".into(),
                Some((n, l)) => format!("{n}/{steps} ({l:.3}){state}"),
                None if s.running() => format!("joining{state}"),
                None => "down".into(),
            }
        })
        .collect();
    steps.join("  ")
}

/// The last step record of a metrics file, reading only its tail: `(steps
/// done, loss)`.
fn last_step(metrics: &Path) -> Option<(u64, f32)> {
    let mut file = std::fs::File::open(metrics).ok()?;
    let len = file.metadata().ok()?.len();
    const TAIL: u64 = 16 * 1024;
    let from = len.saturating_sub(TAIL);
    file.seek(SeekFrom::Start(from)).ok()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    // Past the first (possibly cut) line when the tail starts mid-file.
    let text = if from > 0 {
        text.split_once('\n').map_or("", |(_, rest)| rest)
    } else {
        &text
    };
    let r = last_record(text)?;
    Some((r.step + 1, r.loss))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_step_comes_from_the_tail_of_a_long_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut text = String::new();
        for step in 0..2000 {
            text.push_str(&format!(
                "{{\"step\":{step},\"time\":0.1,\"loss\":0.5,\"lr\":0.1,\"bytes_sent\":0,\
                 \"bytes_received\":0,\"weight\":1.0,\"gossip_rounds\":0}}\n"
            ));
        }
        std::fs::write(&path, &text).unwrap();
        assert!(text.len() > 16 * 1024);
        assert_eq!(last_step(&path), Some((2000, 0.5)));
    }
}
