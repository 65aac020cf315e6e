//! The node processes of a local run over their lives: starting, reaping,
//! the scripted faults, stopping; every start, exit and fault goes to
//! `events.jsonl`.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use slowmo_runspec::{NodeSummary, ResultRow};

use super::fates::{NodeFate, Outcome};
use crate::events::{EventLog, LogEntry};
use crate::faults::{FaultAction, ScriptedFault, Trigger};

/// One node over its lives.
pub(super) struct Slot {
    pub(super) name: String,
    pub(super) dir: PathBuf,
    /// The node's arguments (after the binary), the same for every life.
    args: Vec<OsString>,
    /// A node that joins mid-run: its bootstrap peers are added to `args`
    /// when it first starts (the live nodes then).
    pub(super) joiner: bool,
    child: Option<Child>,
    pub(super) paused: bool,
    /// The current life was ended by a scripted kill / by the harness.
    ended_by: Option<&'static str>,
    pub(super) fate: NodeFate,
}

impl Slot {
    /// A node not started yet, to run `slowmo` with `args`.
    pub(super) fn new(name: String, dir: PathBuf, args: Vec<OsString>, joiner: bool) -> Self {
        Slot {
            fate: NodeFate {
                node: name.clone(),
                ..NodeFate::default()
            },
            name,
            dir,
            args,
            joiner,
            child: None,
            paused: false,
            ended_by: None,
        }
    }

    pub(super) fn running(&self) -> bool {
        self.child.is_some()
    }
}

/// Started node processes; dropping stops every one still running.
pub(super) struct Nodes {
    pub(super) slots: Vec<Slot>,
    /// How long the nodes have after SIGTERM.
    grace: Duration,
    pub(super) start: Instant,
    events: EventLog,
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain kill(2) on a pid we started and have not reaped.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

impl Nodes {
    /// No nodes yet; events go to `events`, the clock starts now.
    pub(super) fn new(events: EventLog, grace: Duration) -> Self {
        Nodes {
            slots: Vec::new(),
            grace,
            start: Instant::now(),
            events,
        }
    }

    fn elapsed(&self) -> f64 {
        (self.start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
    }

    /// Appends one line to events.jsonl (errors are reported, not fatal:
    /// the run matters more than its log).
    pub(super) fn event(&mut self, action: &str, target: &str, result: &str) {
        let entry = LogEntry::new(self.start.elapsed(), action, target, result);
        if let Err(e) = self.events.write(&entry) {
            eprintln!("{e:#}");
        }
    }

    /// Records the end of node `i`'s current life.
    fn ended(&mut self, i: usize, status: ExitStatus) {
        let t = self.elapsed();
        let slot = &mut self.slots[i];
        slot.child = None;
        slot.paused = false;
        let by = slot.ended_by.take().unwrap_or("self");
        let f = &mut slot.fate;
        f.exit = Some(status.to_string());
        f.exit_code = status.code();
        f.signal = status.signal();
        f.ended_at_s = Some(t);
        f.ended_by = Some(by.to_string());
        let name = slot.name.clone();
        self.event("exit", &name, &format!("{status} (by {by})"));
    }

    /// Reaps every node that has exited; returns their indices.
    pub(super) fn reap(&mut self) -> anyhow::Result<Vec<usize>> {
        let mut done = Vec::new();
        for i in 0..self.slots.len() {
            let Some(child) = self.slots[i].child.as_mut() else {
                continue;
            };
            if let Some(status) = child.try_wait()? {
                self.ended(i, status);
                done.push(i);
            }
        }
        Ok(done)
    }

    /// Starts (or restarts) node `i`: appends to its log with a marker line
    /// after the first life.
    pub(super) fn spawn(&mut self, i: usize, bin: &Path, note: &str) -> anyhow::Result<()> {
        let t = self.elapsed();
        let slot = &mut self.slots[i];
        let log_path = slot.dir.join("node.log");
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        if !note.is_empty() {
            writeln!(log, "--- slowmo-testnet: {note} at {t:.1} s ---")?;
        }
        // What an earlier life said of its gates is no longer so.
        slowmo_runspec::gate::clear_node_files(&crate::node_line::gate_dir(&slot.dir))?;
        let child = Command::new(bin)
            .args(&slot.args)
            .stdin(Stdio::null())
            // Their own process group: a Ctrl-C at the terminal reaches this
            // harness alone, which then stops each node once.
            .process_group(0)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} ({})", slot.name, bin.display()))?;
        slot.child = Some(child);
        slot.paused = false;
        slot.fate.lives += 1;
        slot.fate.ended_at_s = None;
        slot.fate.ended_by = None;
        slot.fate.exit = None;
        slot.fate.exit_code = None;
        slot.fate.signal = None;
        let name = slot.name.clone();
        self.event(
            "start",
            &name,
            if note.is_empty() { "started" } else { note },
        );
        Ok(())
    }

    /// Where the running nodes listen, as their logs name it
    /// (`listening on ADDR/p2p/PEER`), node 0's known address first.
    fn live_addresses(&self, first: &str) -> Vec<String> {
        let mut out = vec![first.to_string()];
        for slot in self.slots.iter().filter(|s| s.running() && !s.paused) {
            let Ok(log) = std::fs::read_to_string(slot.dir.join("node.log")) else {
                continue;
            };
            for line in log.lines() {
                if let Some((_, rest)) = line.split_once("listening on ") {
                    let addr: String = rest
                        .chars()
                        .take_while(|c| !c.is_whitespace() && *c != '\u{1b}')
                        .collect();
                    if addr.starts_with('/') && !out.contains(&addr) {
                        out.push(addr);
                    }
                }
            }
        }
        out
    }

    /// Carries out one scripted fault; returns what goes to the log.
    pub(super) fn fault(
        &mut self,
        f: &ScriptedFault,
        bin: &Path,
        bootstrap: &str,
    ) -> anyhow::Result<String> {
        let i = f.node;
        let name = self.slots[i].name.clone();
        let result = match f.action {
            FaultAction::Join => {
                if self.slots[i].fate.lives > 0 {
                    "skipped: already started".to_string()
                } else {
                    let peers = self.live_addresses(bootstrap);
                    let slot = &mut self.slots[i];
                    for addr in &peers {
                        slot.args.push("--bootstrap".into());
                        slot.args.push(addr.into());
                    }
                    let step = match f.at {
                        Trigger::Step(s) => format!(" (the run at step {s})"),
                        Trigger::Seconds(_) => String::new(),
                    };
                    self.spawn(i, bin, &format!("{name} joins the run{step}"))?;
                    format!("done ({} bootstrap peers)", peers.len())
                }
            }
            FaultAction::Kill => match self.slots[i].child.as_mut() {
                None => "skipped: not running".to_string(),
                Some(child) => {
                    let _ = child.kill();
                    let status = child.wait()?;
                    self.slots[i].ended_by = Some("fault");
                    self.slots[i].fate.kills += 1;
                    self.ended(i, status);
                    "done".to_string()
                }
            },
            FaultAction::Restart => {
                if self.slots[i].running() {
                    "skipped: running".to_string()
                } else {
                    crate::life::keep_in_place(&self.slots[i].dir)?;
                    self.slots[i].fate.restarts += 1;
                    let life = self.slots[i].fate.lives + 1;
                    self.spawn(i, bin, &format!("{name} restarted (life {life})"))?;
                    "done".to_string()
                }
            }
            FaultAction::Pause | FaultAction::Resume => {
                let pause = f.action == FaultAction::Pause;
                let slot = &mut self.slots[i];
                match &slot.child {
                    None => "skipped: not running".to_string(),
                    Some(_) if slot.paused == pause => format!(
                        "skipped: already {}",
                        if pause { "paused" } else { "running" }
                    ),
                    Some(child) => {
                        signal(
                            child.id(),
                            if pause { libc::SIGSTOP } else { libc::SIGCONT },
                        );
                        slot.paused = pause;
                        if pause {
                            slot.fate.pauses += 1;
                        }
                        "done".to_string()
                    }
                }
            }
        };
        self.event(f.action.name(), &name, &result);
        Ok(result)
    }

    /// Asks every running node to stop (SIGTERM; a paused one is resumed
    /// first), waits up to the grace period for all of them together, and
    /// kills the ones still running then. Returns the names of those it had
    /// to kill (each also reported).
    pub(super) fn stop(&mut self) -> Vec<String> {
        let mut running = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(child) = &slot.child {
                signal(child.id(), libc::SIGTERM);
                if slot.paused {
                    signal(child.id(), libc::SIGCONT);
                }
                slot.ended_by = Some("harness");
                running.push(i);
            }
        }
        let deadline = Instant::now() + self.grace;
        while !running.is_empty() && Instant::now() < deadline {
            let _ = self.reap();
            running.retain(|&i| self.slots[i].running());
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut killed = Vec::new();
        for i in running {
            if let Some(child) = self.slots[i].child.as_mut() {
                let _ = child.kill();
                if let Ok(status) = child.wait() {
                    self.ended(i, status);
                }
                let name = self.slots[i].name.clone();
                eprintln!(
                    "{name} did not stop within {} s of SIGTERM (--stop-grace); killed it",
                    self.grace.as_secs()
                );
                killed.push(name);
            }
        }
        killed
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `; NAMES did not stop in time` for a message, or nothing.
pub(super) fn not_stopped(killed: &[String]) -> String {
    if killed.is_empty() {
        String::new()
    } else {
        format!(
            "; {} did not stop in time and {} killed",
            killed.join(", "),
            if killed.len() == 1 { "was" } else { "were" }
        )
    }
}

impl Nodes {
    /// The rows, fates and verdict once every node has exited.
    pub(super) fn finish(&mut self) -> Outcome {
        let mut rows = Vec::new();
        let mut fates = Vec::new();
        for slot in &mut self.slots {
            let summary = std::fs::read_to_string(slot.dir.join("summary.json"))
                .ok()
                .and_then(|t| NodeSummary::from_json(&t).ok());
            let f = &mut slot.fate;
            f.completed = f.exit_code == Some(0) && summary.as_ref().is_some_and(|s| s.completed);
            f.fate = match f.ended_by.as_deref() {
                _ if f.completed => "finished",
                _ if f.lives == 0 => "not started",
                Some("fault") => "killed",
                Some("harness") => "stopped",
                _ => "failed",
            }
            .to_string();
            rows.push(ResultRow {
                node: slot.name.clone(),
                state: match (f.fate.as_str(), f.exit_code, f.signal) {
                    ("killed", _, _) => "killed".to_string(),
                    ("not started", _, _) => "not started".to_string(),
                    (_, Some(_), _) => "exited".to_string(),
                    (_, None, Some(sig)) => format!("signal {sig}"),
                    _ => "unknown".to_string(),
                },
                exit_code: f.exit_code.map(i64::from),
                limits: None,
                summary,
            });
            fates.push(f.clone());
        }
        let bad: Vec<String> = fates
            .iter()
            .filter(|f| f.fate != "finished" && f.fate != "killed" && f.fate != "not started")
            .map(|f| format!("{} {}", f.node, f.describe()))
            .collect();
        let failure = if !bad.is_empty() {
            Some(format!(
                "not every node completed the run: {}",
                bad.join("; ")
            ))
        } else if !fates.iter().any(|f| f.fate == "finished") {
            Some("no node completed the run".to_string())
        } else {
            None
        };
        Outcome {
            rows,
            fates,
            failure,
        }
    }
}
