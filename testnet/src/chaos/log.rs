//! The chaos log (`chaos.jsonl` in the results folder) and what it says
//! became of each node.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::events::{EventLog, LogEntry};

/// The name of the chaos log in the results folder.
pub const LOG_FILE: &str = "chaos.jsonl";

/// What chaos did to each node: kills and restarts taken, and whether its
/// last life ended by a chaos kill (it was killed and not restarted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChaosFate {
    pub kills: usize,
    pub restarts: usize,
    pub pauses: usize,
    pub partitions: usize,
    pub down_at_end: bool,
}

/// Per node (by name), from a chaos log.
pub fn fates(log: &[LogEntry]) -> BTreeMap<String, ChaosFate> {
    let mut out: BTreeMap<String, ChaosFate> = BTreeMap::new();
    for e in log.iter().filter(|e| e.result == "done") {
        for node in e
            .target
            .split(',')
            .filter(|n| crate::node_line::node_index(n).is_some())
        {
            let f = out.entry(node.to_string()).or_default();
            match e.action.as_str() {
                "kill" => {
                    f.kills += 1;
                    f.down_at_end = true;
                }
                "restart" => {
                    f.restarts += 1;
                    f.down_at_end = false;
                }
                "pause" => f.pauses += 1,
                "partition" => f.partitions += 1,
                _ => {}
            }
        }
    }
    out
}

/// The open chaos log: every line also goes to stderr.
pub(super) struct Log {
    pub(super) events: EventLog,
    pub(super) start: Instant,
}

impl Log {
    pub(super) fn write(&mut self, action: &str, target: &str, result: &str) -> anyhow::Result<()> {
        self.write_at(self.start.elapsed(), action, target, result)
    }

    /// Logs an action that began `t` after the start.
    pub(super) fn write_at(
        &mut self,
        t: Duration,
        action: &str,
        target: &str,
        result: &str,
    ) -> anyhow::Result<()> {
        let entry = LogEntry::new(t, action, target, result);
        eprintln!(
            "[{:>6.1}s] chaos: {} {}: {}",
            entry.t, entry.action, entry.target, entry.result
        );
        self.events.write(&entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fates_follow_the_log() {
        let e = |action: &str, target: &str, result: &str| LogEntry {
            t: 0.0,
            unix: 0.0,
            action: action.into(),
            target: target.into(),
            result: result.into(),
        };
        let log = vec![
            e("kill", "node-1", "done"),
            e("restart", "node-1", "done"),
            e("kill", "node-2", "done"),
            e("kill", "node-3", "skipped: node-3 is exited"),
            e("partition", "node-0,node-3", "done"),
        ];
        let f = fates(&log);
        assert_eq!(
            f["node-1"],
            ChaosFate {
                kills: 1,
                restarts: 1,
                ..ChaosFate::default()
            }
        );
        assert!(f["node-2"].down_at_end);
        assert_eq!(f["node-3"].kills, 0);
        assert_eq!(f["node-3"].partitions, 1);
    }
}
