//! Reading a run folder: a `simulate` output (`metrics.jsonl` with a
//! `worker` field on every line, `summary.json`), a `slowmo-testnet local
//! --out` folder (`run.toml`, `node-I/metrics.jsonl`, `node-I/summary.json`)
//! or a compose results folder (`results.md`, `nodeI/...`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use slowmo_runspec::{NodeSummary, ResultRow, StepRecord, ViewEvent, results_table};

/// One node's (or simulated worker's) step records.
#[derive(Debug, Clone)]
pub struct NodeSeries {
    pub name: String,
    pub records: Vec<StepRecord>,
}

/// Everything a report shows.
#[derive(Debug, Clone)]
pub struct RunData {
    pub dir: PathBuf,
    /// "simulate", "local testnet" or "compose testnet".
    pub kind: &'static str,
    pub nodes: Vec<NodeSeries>,
    /// The results table (markdown).
    pub table: String,
    /// The resolved run configuration (pretty JSON), or the run's TOML.
    pub config: Option<String>,
    /// Outer period, when the configuration says (barrier markers).
    pub tau: Option<u64>,
    /// Membership changes: (node, event).
    pub view_changes: Vec<(String, ViewEvent)>,
    /// Scripted faults: (step, description).
    pub faults: Vec<(u64, String)>,
}

impl RunData {
    /// Steps recorded: one past the furthest step any node reached.
    pub fn steps(&self) -> u64 {
        self.nodes
            .iter()
            .filter_map(|n| n.records.last())
            .map(|r| r.step + 1)
            .max()
            .unwrap_or(0)
    }
}

/// Orders `node-2` before `node-10`.
fn natural_key(name: &str) -> (String, u64) {
    let digits: String = name
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let stem = name[..name.len() - digits.len()].to_string();
    (stem, digits.parse().unwrap_or(0))
}

/// Parses a metrics file; lines carrying a `worker` field are split by it.
fn read_metrics(path: &Path) -> anyhow::Result<Vec<(Option<u64>, StepRecord)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            // the last line of a node still writing may be cut short
            Err(_) if i + 1 == text.lines().count() => continue,
            Err(e) => bail!("{} line {}: not JSON: {e}", path.display(), i + 1),
        };
        let worker = value.get("worker").and_then(serde_json::Value::as_u64);
        let record: StepRecord = serde_json::from_value(value)
            .with_context(|| format!("{} line {}: not a step record", path.display(), i + 1))?;
        out.push((worker, record));
    }
    Ok(out)
}

/// Step numbers named in a fault script (`kill 3@200; partition 0-1|2-3@300..500`).
pub fn fault_steps(script: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for part in script.split([';', '\n']).map(str::trim) {
        let Some((what, when)) = part.split_once('@') else {
            continue;
        };
        let mut ends = when.split("..");
        if let Some(start) = ends.next().and_then(|s| s.trim().parse::<u64>().ok()) {
            out.push((start, what.trim().to_string()));
        }
        if let Some(end) = ends.next().and_then(|s| s.trim().parse::<u64>().ok()) {
            out.push((end, format!("end of {}", what.trim())));
        }
    }
    out
}

/// Outer period of a resolved configuration (JSON).
fn tau_of(config: &serde_json::Value) -> Option<u64> {
    config
        .pointer("/algorithm/slowmo/tau")
        .and_then(serde_json::Value::as_u64)
}

/// Reads a run folder.
pub fn load(dir: &Path) -> anyhow::Result<RunData> {
    if !dir.is_dir() {
        bail!("{}: no such folder (give a run folder)", dir.display());
    }
    let mut data = RunData {
        dir: dir.to_owned(),
        kind: "simulate",
        nodes: Vec::new(),
        table: String::new(),
        config: None,
        tau: None,
        view_changes: Vec::new(),
        faults: Vec::new(),
    };
    // A simulate output: one metrics file for all workers.
    let top = dir.join("metrics.jsonl");
    if top.is_file() {
        let mut by_worker: std::collections::BTreeMap<u64, Vec<StepRecord>> = Default::default();
        for (worker, r) in read_metrics(&top)? {
            by_worker.entry(worker.unwrap_or(0)).or_default().push(r);
        }
        data.nodes = by_worker
            .into_iter()
            .map(|(w, records)| NodeSeries {
                name: format!("worker {w}"),
                records,
            })
            .collect();
        let summary = dir.join("summary.json");
        if summary.is_file() {
            let text = std::fs::read_to_string(&summary)
                .with_context(|| format!("reading {}", summary.display()))?;
            let value: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: not JSON", summary.display()))?;
            simulate_summary(&mut data, &value);
        }
        return finish(data);
    }
    // A testnet folder: one sub-folder per node.
    let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("metrics.jsonl").is_file())
        .collect();
    subdirs.sort_by_key(|p| natural_key(&p.file_name().unwrap_or_default().to_string_lossy()));
    let mut rows = Vec::new();
    for sub in subdirs {
        let name = sub
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let records = read_metrics(&sub.join("metrics.jsonl"))?
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        let summary = std::fs::read_to_string(sub.join("summary.json"))
            .ok()
            .and_then(|t| NodeSummary::from_json(&t).ok());
        if let Some(s) = &summary {
            for v in &s.view_changes {
                data.view_changes.push((name.clone(), v.clone()));
            }
            if data.config.is_none() {
                let config = serde_json::to_value(&s.config)?;
                data.tau = tau_of(&config);
                data.config = Some(serde_json::to_string_pretty(&config)?);
            }
        }
        rows.push(ResultRow {
            node: name.clone(),
            state: if summary.is_some() { "exited" } else { "-" }.into(),
            exit_code: None,
            limits: None,
            summary,
        });
        data.nodes.push(NodeSeries { name, records });
    }
    if data.nodes.is_empty() {
        bail!(
            "{}: no metrics.jsonl in it or in its node folders (expected the folder of \
             `slowmo simulate --metrics-jsonl DIR/metrics.jsonl --summary-json DIR/summary.json`, \
             of `slowmo-testnet local --out DIR`, or a compose results folder)",
            dir.display()
        );
    }
    let results_md = dir.join("results.md");
    // A local run's folder holds testnet.json (and now a results.md too).
    data.kind = if results_md.is_file() && !dir.join("testnet.json").is_file() {
        "compose testnet"
    } else {
        "local testnet"
    };
    data.table = match std::fs::read_to_string(&results_md) {
        Ok(text) => text,
        Err(_) => results_table(&rows),
    };
    if data.config.is_none()
        && let Ok(text) = std::fs::read_to_string(dir.join("run.toml"))
    {
        data.config = Some(text);
    }
    finish(data)
}

fn finish(data: RunData) -> anyhow::Result<RunData> {
    if data.nodes.iter().all(|n| n.records.is_empty()) {
        bail!(
            "{}: the metrics files hold no step records",
            data.dir.display()
        );
    }
    Ok(data)
}

/// The table, configuration, view changes and faults of a simulate summary.
fn simulate_summary(data: &mut RunData, value: &serde_json::Value) {
    let mut table = String::from("| quantity | value |\n|---|---|\n");
    if let Some(map) = value.as_object() {
        for (key, v) in map {
            let shown = match v {
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Bool(b) => b.to_string(),
                _ => continue,
            };
            table.push_str(&format!("| {} | {} |\n", key.replace('_', " "), shown));
        }
    }
    data.table = table;
    if let Some(config) = value.get("config") {
        data.tau = tau_of(config);
        data.config = serde_json::to_string_pretty(config).ok();
    }
    if let Some(events) = value.get("view_changes").and_then(|v| v.as_array()) {
        for e in events {
            if let Ok(event) = serde_json::from_value::<ViewEvent>(e.clone()) {
                data.view_changes.push(("worker 0".into(), event));
            }
        }
    }
    if let Some(script) = value.get("faults").and_then(|v| v.as_str()) {
        data.faults = fault_steps(script);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_scripts_give_their_steps() {
        assert_eq!(
            fault_steps("kill 3@200; partition 0-1|2-3@300..500"),
            vec![
                (200, "kill 3".to_string()),
                (300, "partition 0-1|2-3".to_string()),
                (500, "end of partition 0-1|2-3".to_string()),
            ]
        );
        assert!(fault_steps("nothing here").is_empty());
    }

    #[test]
    fn node_folders_sort_naturally() {
        let mut names = vec!["node-10", "node-2", "node-1"];
        names.sort_by_key(|n| natural_key(n));
        assert_eq!(names, ["node-1", "node-2", "node-10"]);
    }

    #[test]
    fn a_folder_without_metrics_is_refused_with_what_was_expected() {
        let dir = tempfile::tempdir().unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no metrics.jsonl"), "{err}");
        let err = load(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(err.contains("no such folder"), "{err}");
        std::fs::write(dir.path().join("metrics.jsonl"), "{\"step\": 1}\n{}\n").unwrap();
        let err = format!("{:#}", load(dir.path()).unwrap_err());
        assert!(err.contains("line 1: not a step record"), "{err}");
    }
}
