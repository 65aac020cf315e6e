//! How each node of a local run fared over its lives, and the run's tables.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use slowmo_runspec::{ResultRow, results_table};

/// How one node fared over the run, all its lives together.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeFate {
    pub node: String,
    /// `finished` (its last life exited 0 with a completed summary),
    /// `killed` (by a scripted fault, not restarted), `failed` (it exited
    /// otherwise on its own), `stopped` (by the harness: Ctrl-C), `not
    /// started` (a scripted `join` that never came: the run ended first).
    pub fate: String,
    /// Processes started for it (1 + restarts).
    pub lives: u32,
    pub kills: u32,
    pub restarts: u32,
    pub pauses: u32,
    /// How its last life ended: `exit status: 1`, `signal: 9 (SIGKILL)`.
    pub exit: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Seconds after the start at which its last life ended.
    pub ended_at_s: Option<f64>,
    /// Who ended its last life: `self` (it exited or died on its own),
    /// `fault` (a scripted kill) or `harness` (stopped on Ctrl-C).
    pub ended_by: Option<String>,
    pub completed: bool,
}

impl NodeFate {
    /// One cell: `finished`, `killed at 5.0 s`, `finished after 1 restart`...
    pub fn describe(&self) -> String {
        let at = self
            .ended_at_s
            .map(|t| format!(" at {t:.1} s"))
            .unwrap_or_default();
        let mut text = match self.fate.as_str() {
            "finished" => "finished".to_string(),
            "killed" => format!("killed{at}"),
            "failed" => format!(
                "failed{at} ({}{})",
                self.exit.as_deref().unwrap_or("no exit status"),
                if self.exit_code == Some(0) {
                    ", no completed summary"
                } else {
                    ""
                }
            ),
            other => format!("{other}{at}"),
        };
        if self.restarts > 0 {
            text.push_str(&format!(
                ", after {} restart{}",
                self.restarts,
                if self.restarts == 1 { "" } else { "s" }
            ));
        }
        text
    }
}

/// The per-node fates as a markdown table.
pub fn fates_table(fates: &[NodeFate]) -> String {
    let mut out = String::from(
        "| node | fate | exit | ended at s | ended by | lives | kills | restarts | pauses |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for f in fates {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            f.node,
            f.describe(),
            f.exit.as_deref().unwrap_or("-"),
            f.ended_at_s.map_or("-".into(), |t| format!("{t:.1}")),
            f.ended_by.as_deref().unwrap_or("-"),
            f.lives,
            f.kills,
            f.restarts,
            f.pauses
        ));
    }
    out
}

/// What a local run gives back.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub rows: Vec<ResultRow>,
    pub fates: Vec<NodeFate>,
    /// Why the run failed, naming the nodes; `None` when every node
    /// finished or was killed by the script (and one at least finished).
    pub failure: Option<String>,
}

/// results.md (both tables), results.json (the rows) and fates.json.
pub(super) fn write_results(out: &Path, outcome: &Outcome) -> anyhow::Result<()> {
    let md = format!(
        "{}\n{}",
        results_table(&outcome.rows),
        fates_table(&outcome.fates)
    );
    for (name, text) in [
        ("results.md", md),
        ("results.json", serde_json::to_string_pretty(&outcome.rows)?),
        ("fates.json", serde_json::to_string_pretty(&outcome.fates)?),
    ] {
        let path = out.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fates_describe_how_a_node_ended() {
        let f = NodeFate {
            node: "node-2".into(),
            fate: "killed".into(),
            ended_at_s: Some(5.04),
            ..NodeFate::default()
        };
        assert_eq!(f.describe(), "killed at 5.0 s");
        let f = NodeFate {
            fate: "finished".into(),
            restarts: 1,
            ..f
        };
        assert_eq!(f.describe(), "finished, after 1 restart");
        let table = fates_table(&[f]);
        assert!(
            table.contains("| node-2 | finished, after 1 restart |"),
            "{table}"
        );
    }
}
