//! Node summaries (written by `slowmo node --summary-json`) and the results
//! table shared by the local and docker-compose testnets.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

/// The fields of a node summary the reports use.
#[derive(Debug, Clone, Deserialize)]
pub struct NodeSummary {
    pub rank: Option<usize>,
    pub peer_id: Option<String>,
    pub completed: bool,
    #[serde(default)]
    pub error: Option<String>,
    pub steps: u64,
    pub final_train_loss: Option<f32>,
    pub test_accuracy: Option<f32>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    #[serde(default)]
    pub messages_dropped: u64,
    pub wall_seconds: f64,
    pub steps_per_second: f64,
}

/// Reads one summary file.
pub fn read_summary(path: &Path) -> anyhow::Result<NodeSummary> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// A node's name and where its summary is.
#[derive(Debug, Clone)]
pub struct NodeResult {
    pub name: String,
    pub summary: Option<NodeSummary>,
    pub summary_path: PathBuf,
}

fn opt<T: std::fmt::Display>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

/// Renders the results table: one row per node.
pub fn table(results: &[NodeResult]) -> String {
    let mut out = format!(
        "{:<10} {:>4} {:>9} {:>7} {:>10} {:>9} {:>8} {:>12} {:>12} {:>8}\n",
        "node",
        "rank",
        "completed",
        "steps",
        "train loss",
        "test acc",
        "steps/s",
        "sent",
        "received",
        "wall s"
    );
    for r in results {
        match &r.summary {
            Some(s) => out.push_str(&format!(
                "{:<10} {:>4} {:>9} {:>7} {:>10} {:>9} {:>8.1} {:>12} {:>12} {:>8.1}\n",
                r.name,
                opt(s.rank, |v| v.to_string()),
                if s.completed { "yes" } else { "NO" },
                s.steps,
                opt(s.final_train_loss, |v| format!("{v:.4}")),
                opt(s.test_accuracy, |v| format!("{v:.4}")),
                s.steps_per_second,
                human_bytes(s.bytes_sent),
                human_bytes(s.bytes_received),
                s.wall_seconds
            )),
            None => out.push_str(&format!(
                "{:<10} no summary at {}\n",
                r.name,
                r.summary_path.display()
            )),
        }
    }
    out
}

/// Bytes with a binary unit.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shows_each_node_and_missing_summaries() {
        let s: NodeSummary = serde_json::from_str(
            r#"{"rank":1,"peer_id":"p","completed":true,"steps":10,"final_train_loss":0.5,
                "test_accuracy":0.75,"bytes_sent":2048,"bytes_received":10,"wall_seconds":2.0,
                "steps_per_second":5.0,"config":{}}"#,
        )
        .unwrap();
        let t = table(&[
            NodeResult {
                name: "node-0".into(),
                summary: Some(s),
                summary_path: "a".into(),
            },
            NodeResult {
                name: "node-1".into(),
                summary: None,
                summary_path: "b/summary.json".into(),
            },
        ]);
        assert!(t.contains("0.7500"), "{t}");
        assert!(t.contains("2.0 KiB"), "{t}");
        assert!(t.contains("no summary at b/summary.json"), "{t}");
    }
}
