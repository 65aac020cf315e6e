//! The results table of a testnet: one row per node, from its summary and
//! how its process ended. Local and docker-compose testnets both draw it.

use serde::Serialize;

use crate::records::NodeSummary;

/// One node of a testnet.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ResultRow {
    pub node: String,
    /// Process or container state: exited, running, ...
    pub state: String,
    pub exit_code: Option<i64>,
    /// The node's resource and link limits, where a profile set them.
    pub limits: Option<String>,
    /// The node's summary, if it wrote one that parses.
    pub summary: Option<NodeSummary>,
}

impl ResultRow {
    /// Whether the node exited 0 with a summary that says it completed.
    pub fn completed(&self) -> bool {
        self.state == "exited"
            && self.exit_code == Some(0)
            && self.summary.as_ref().is_some_and(|s| s.completed)
    }
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".to_string())
}

/// The markdown table of the rows; a node without a summary shows `-`.
pub fn results_table(rows: &[ResultRow]) -> String {
    let mut out = String::from(
        "| node | exit | rank | completed | steps | train loss | test acc | steps/s | sent | received | wall s | limits |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let s = r.summary.as_ref();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.node,
            match r.exit_code {
                Some(code) if r.state == "exited" => code.to_string(),
                _ => r.state.clone(),
            },
            opt(s.and_then(|s| s.rank), |v| v.to_string()),
            opt(s, |s| if s.completed { "yes" } else { "no" }.into()),
            opt(s, |s| s.steps.to_string()),
            opt(s.and_then(|s| s.final_train_loss), |v| format!("{v:.4}")),
            opt(s.and_then(|s| s.test_accuracy), |v| format!("{v:.4}")),
            opt(s, |s| format!("{:.2}", s.steps_per_second)),
            opt(s, |s| human_bytes(s.bytes_sent)),
            opt(s, |s| human_bytes(s.bytes_received)),
            opt(s, |s| format!("{:.1}", s.wall_seconds)),
            r.limits.as_deref().unwrap_or("-"),
        ));
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
    use crate::TrainOptions;

    #[test]
    fn table_shows_each_node_and_missing_summaries() {
        let config = TrainOptions::default().resolve().unwrap();
        let mut s = NodeSummary::failed(&config, String::new());
        s.error = None;
        s.rank = Some(2);
        s.completed = true;
        s.steps = 300;
        s.final_train_loss = Some(0.52);
        s.test_accuracy = Some(0.81);
        s.bytes_sent = 2048;
        s.bytes_received = 456;
        s.wall_seconds = 12.3;
        s.steps_per_second = 24.4;
        let done = ResultRow {
            node: "node1".into(),
            state: "exited".into(),
            exit_code: Some(0),
            limits: Some("2 cpus".into()),
            summary: Some(s),
        };
        let missing = ResultRow {
            node: "node2".into(),
            state: "exited".into(),
            exit_code: Some(1),
            ..ResultRow::default()
        };
        let running = ResultRow {
            node: "node3".into(),
            state: "running".into(),
            ..ResultRow::default()
        };
        assert!(done.completed() && !missing.completed() && !running.completed());
        let text = results_table(&[done, missing, running]);
        assert!(
            text.contains(
                "| node1 | 0 | 2 | yes | 300 | 0.5200 | 0.8100 | 24.40 | 2.0 KiB | 456 B | 12.3 | 2 cpus |"
            ),
            "{text}"
        );
        assert!(text.contains("| node2 | 1 | - | - | - |"), "{text}");
        assert!(text.contains("| node3 | running | - |"), "{text}");
        assert_eq!(text.lines().count(), 5, "{text}");
    }

    #[test]
    fn bytes_get_binary_units() {
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
