//! Gathering what the nodes of a compose testnet wrote into one results
//! folder, and the per-node table.
//!
//! Layout of the folder:
//! ```text
//! results/
//!   results.md      the table (markdown)
//!   results.json    one object per node: the table's columns
//!   node0/summary.json metrics.jsonl shaping.txt run.toml log.txt
//!   node1/...
//! ```
//! The table code here is the compose testnet's own; the local testnet's
//! table (summary.rs) is expected to take it over.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::docker::{self, ContainerInfo};

/// Files copied out of each node's /data.
pub const NODE_FILES: [&str; 4] = ["summary.json", "metrics.jsonl", "shaping.txt", "run.toml"];

/// One row of the results table.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NodeRow {
    pub node: String,
    /// Container state: exited, running, ...
    pub state: String,
    pub exit_code: Option<i64>,
    pub shape: Option<String>,
    pub rank: Option<u64>,
    pub peer_id: Option<String>,
    pub completed: Option<bool>,
    pub steps: Option<u64>,
    pub final_train_loss: Option<f64>,
    pub test_accuracy: Option<f64>,
    pub steps_per_second: Option<f64>,
    pub bytes_sent: Option<u64>,
    pub bytes_received: Option<u64>,
    pub wall_seconds: Option<f64>,
}

impl NodeRow {
    /// Fills the summary's columns from a node's summary JSON.
    pub fn with_summary(mut self, summary: &Value) -> Self {
        let f = |k: &str| summary.get(k).and_then(Value::as_f64);
        let u = |k: &str| summary.get(k).and_then(Value::as_u64);
        self.rank = u("rank");
        self.peer_id = summary
            .get("peer_id")
            .and_then(Value::as_str)
            .map(str::to_string);
        self.completed = summary.get("completed").and_then(Value::as_bool);
        self.steps = u("steps");
        self.final_train_loss = f("final_train_loss");
        self.test_accuracy = f("test_accuracy");
        self.steps_per_second = f("steps_per_second");
        self.bytes_sent = u("bytes_sent");
        self.bytes_received = u("bytes_received");
        self.wall_seconds = f("wall_seconds");
        self
    }
}

/// The last parsed line of a metrics JSON-lines text.
pub fn last_metrics(text: &str) -> Option<Value> {
    text.lines()
        .rev()
        .filter(|l| !l.trim().is_empty())
        .find_map(|l| serde_json::from_str(l).ok())
}

/// Steps per second over a metrics text: steps between the first and last
/// records over the time between them.
pub fn metrics_step_rate(text: &str) -> Option<f64> {
    let records: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let point = |v: &Value| Some((v.get("step")?.as_f64()?, v.get("time")?.as_f64()?));
    let (s0, t0) = point(records.first()?)?;
    let (s1, t1) = point(records.last()?)?;
    (t1 > t0).then(|| (s1 - s0) / (t1 - t0))
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".to_string())
}

/// The markdown table of the rows.
pub fn table(rows: &[NodeRow]) -> String {
    let mut out = String::from(
        "| node | exit | rank | completed | steps | final loss | test acc | steps/s | sent MB | recv MB | wall s | limits |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let mb = |b: u64| format!("{:.1}", b as f64 / 1e6);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.node,
            match r.exit_code {
                Some(code) if r.state == "exited" => code.to_string(),
                _ => r.state.clone(),
            },
            opt(r.rank, |v| v.to_string()),
            opt(r.completed, |v| if v { "yes".into() } else { "no".into() }),
            opt(r.steps, |v| v.to_string()),
            opt(r.final_train_loss, |v| format!("{v:.4}")),
            opt(r.test_accuracy, |v| format!("{v:.4}")),
            opt(r.steps_per_second, |v| format!("{v:.2}")),
            opt(r.bytes_sent, mb),
            opt(r.bytes_received, mb),
            opt(r.wall_seconds, |v| format!("{v:.1}")),
            r.shape.as_deref().unwrap_or("-"),
        ));
    }
    out
}

/// Copies every node's files and log into `dir` and writes the table;
/// returns the rows (also for nodes whose summary is missing).
pub fn collect(containers: &[ContainerInfo], dir: &Path) -> anyhow::Result<Vec<NodeRow>> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    let mut rows = Vec::new();
    for c in containers {
        let node_dir = dir.join(&c.service);
        std::fs::create_dir_all(&node_dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", node_dir.display()))?;
        let mut row = NodeRow {
            node: c.service.clone(),
            state: c.status.clone(),
            exit_code: Some(c.exit_code),
            shape: c.shape.clone(),
            ..NodeRow::default()
        };
        for name in NODE_FILES {
            let path = format!("{}/{name}", crate::compose::DATA_DIR);
            if let Some(bytes) = docker::read_file(&c.id, &path)? {
                let target = node_dir.join(name);
                std::fs::write(&target, &bytes)
                    .map_err(|e| anyhow::anyhow!("writing {}: {e}", target.display()))?;
                if name == "summary.json" {
                    match serde_json::from_slice::<Value>(&bytes) {
                        Ok(summary) => row = row.with_summary(&summary),
                        Err(e) => eprintln!("{}: summary.json is not JSON: {e}", c.service),
                    }
                }
            }
        }
        if let Err(e) = docker::save_logs(&c.id, &node_dir.join("log.txt")) {
            eprintln!("{}: could not save the log: {e}", c.service);
        }
        rows.push(row);
    }
    let md = dir.join("results.md");
    std::fs::write(&md, table(&rows))
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", md.display()))?;
    let json = dir.join("results.json");
    std::fs::write(&json, serde_json::to_string_pretty(&rows)?)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", json.display()))?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_take_the_summary_fields() {
        let summary: Value = serde_json::from_str(
            r#"{"rank":2,"peer_id":"12D3x","completed":true,"steps":300,"final_train_loss":0.52,
                "test_accuracy":0.81,"bytes_sent":2500000,"bytes_received":456,"wall_seconds":12.3,
                "steps_per_second":24.4,"config":{}}"#,
        )
        .unwrap();
        let row = NodeRow {
            node: "node1".into(),
            state: "exited".into(),
            exit_code: Some(0),
            ..NodeRow::default()
        }
        .with_summary(&summary);
        assert_eq!(row.rank, Some(2));
        assert_eq!(row.completed, Some(true));
        assert_eq!(row.steps_per_second, Some(24.4));
        let missing = NodeRow {
            node: "node2".into(),
            state: "exited".into(),
            exit_code: Some(1),
            ..NodeRow::default()
        };
        let text = table(&[row, missing]);
        assert!(
            text.contains(
                "| node1 | 0 | 2 | yes | 300 | 0.5200 | 0.8100 | 24.40 | 2.5 | 0.0 | 12.3 | - |"
            ),
            "{text}"
        );
        assert!(text.contains("| node2 | 1 | - | - | - |"), "{text}");
    }

    #[test]
    fn metrics_give_the_last_record_and_the_step_rate() {
        let text =
            "{\"step\":0,\"time\":0.5,\"loss\":2.0}\n{\"step\":10,\"time\":2.5,\"loss\":1.0}\n\n";
        assert_eq!(last_metrics(text).unwrap()["loss"], 1.0);
        assert_eq!(metrics_step_rate(text), Some(5.0));
        assert_eq!(metrics_step_rate("{\"step\":0,\"time\":0.5}\n"), None);
        assert!(last_metrics("").is_none());
    }
}
