//! Event logs, one JSON object a line: a local run's `events.jsonl` (every
//! start, exit and scripted fault) and chaos's `chaos.jsonl` (every action).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// One line of an event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Seconds since the start (of the run, or of chaos) when the action
    /// began, to the millisecond.
    pub t: f64,
    /// Wall clock, seconds since the Unix epoch.
    pub unix: f64,
    pub action: String,
    /// `node-2`, `node-0,node-3` (a partition's cut-off group) or `all`.
    pub target: String,
    /// `done`, `skipped: WHY` or `failed: WHY` (and what a start or an exit
    /// was).
    pub result: String,
}

impl LogEntry {
    /// An entry for an action that began `t` after the start, stamped with
    /// the wall clock now.
    pub fn new(t: Duration, action: &str, target: &str, result: &str) -> Self {
        LogEntry {
            t: (t.as_secs_f64() * 1000.0).round() / 1000.0,
            unix: unix_now(),
            action: action.to_string(),
            target: target.to_string(),
            result: result.to_string(),
        }
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Reads an event log; unreadable lines are skipped.
pub fn read_log(path: &Path) -> Vec<LogEntry> {
    std::fs::read_to_string(path)
        .map(|text| {
            text.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// An event log open for appending.
pub struct EventLog {
    file: std::fs::File,
    path: PathBuf,
}

impl EventLog {
    /// Opens (creates, or appends to) the log at `path`.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(EventLog {
            file,
            path: path.to_owned(),
        })
    }

    /// Where the log is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one entry, at once (the line is on disk when this returns).
    pub fn write(&mut self, entry: &LogEntry) -> anyhow::Result<()> {
        let line = serde_json::to_string(entry)?;
        writeln!(self.file, "{line}")
            .and_then(|()| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}
