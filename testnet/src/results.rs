//! Gathering what the nodes of a compose testnet wrote into one results
//! folder, and the per-node table.
//!
//! Layout of the folder:
//! ```text
//! results/
//!   results.md      the table (markdown)
//!   results.json    one object per node: state, exit code, limits, summary
//!   chaos.jsonl     what `slowmo-testnet chaos` did, if it ran
//!   node-0/summary.json metrics.jsonl shaping.txt run.toml log.txt
//!   node-1/...      (metrics.K.jsonl, summary.K.json: earlier lives of a
//!                    node that chaos restarted, see crate::life)
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use slowmo_runspec::{NodeSummary, ResultRow, results_table};

use crate::chaos::log::{ChaosFate, LOG_FILE, fates};
use crate::docker::{self, ContainerInfo};

/// Files copied out of each node's /data.
pub const NODE_FILES: [&str; 4] = ["summary.json", "metrics.jsonl", "shaping.txt", "run.toml"];

/// Copies every node's files and log into `dir` and writes the table;
/// returns the rows (also for nodes whose summary is missing).
pub fn collect(containers: &[ContainerInfo], dir: &Path) -> anyhow::Result<Vec<ResultRow>> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    let mut rows = Vec::new();
    for c in containers {
        let node_dir = dir.join(&c.service);
        std::fs::create_dir_all(&node_dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", node_dir.display()))?;
        let mut row = ResultRow {
            node: c.service.clone(),
            state: c.status.clone(),
            exit_code: Some(c.exit_code),
            limits: c.shape.clone(),
            summary: None,
        };
        for name in NODE_FILES {
            let path = format!("{}/{name}", crate::compose::DATA_DIR);
            if let Some(bytes) = docker::read_file(&c.id, &path)? {
                let target = node_dir.join(name);
                std::fs::write(&target, &bytes)
                    .map_err(|e| anyhow::anyhow!("writing {}: {e}", target.display()))?;
                if name == "summary.json" {
                    match NodeSummary::from_json(&String::from_utf8_lossy(&bytes)) {
                        Ok(summary) => row.summary = Some(summary),
                        Err(e) => eprintln!("{}: summary.json is not a summary: {e}", c.service),
                    }
                }
            }
        }
        if let Err(e) = docker::save_logs(&c.id, &node_dir.join("log.txt")) {
            eprintln!("{}: could not save the log: {e}", c.service);
        }
        rows.push(row);
    }
    // Nodes that `chaos` killed last stay down on purpose.
    let chaos = fates(&crate::events::read_log(&dir.join(LOG_FILE)));
    let mut md = results_table(&rows);
    if !chaos.is_empty() {
        for row in &mut rows {
            if chaos.get(&row.node).is_some_and(|f| f.down_at_end) && row.state == "exited" {
                row.state = "killed".into();
            }
        }
        md = results_table(&rows);
        md.push_str(&chaos_table(&rows, &chaos));
    }
    let md_path = dir.join("results.md");
    std::fs::write(&md_path, md)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", md_path.display()))?;
    let json = dir.join("results.json");
    std::fs::write(&json, serde_json::to_string_pretty(&rows)?)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", json.display()))?;
    Ok(rows)
}

/// The per-node account of a chaos run, below the results table.
pub fn chaos_table(rows: &[ResultRow], chaos: &BTreeMap<String, ChaosFate>) -> String {
    let mut out = String::from(
        "\n| node | fate | kills | restarts | pauses | partitions |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let f = chaos.get(&r.node).cloned().unwrap_or_default();
        let fate = if f.down_at_end {
            "killed".to_string()
        } else if r.completed() {
            if f.restarts > 0 {
                format!("finished after {} restart(s)", f.restarts)
            } else {
                "finished".to_string()
            }
        } else if r.state == "running" || r.state == "paused" {
            r.state.clone()
        } else {
            format!("did not finish ({})", r.state)
        };
        out.push_str(&format!(
            "| {} | {fate} | {} | {} | {} | {} |\n",
            r.node, f.kills, f.restarts, f.pauses, f.partitions
        ));
    }
    out
}
