//! `slowmo-testnet up|down|status|logs|kill|pause|resume|partition|heal|collect`:
//! running and perturbing a compose testnet written by `slowmo-testnet compose`.
//!
//! Lifecycle commands go through the compose tool (the `docker compose`
//! plugin or the `docker-compose` binary, whichever answers); partitions are
//! nftables rules inside each node's network namespace (the image carries
//! `nft`, the services have NET_ADMIN), so a cut-off node keeps running and
//! only loses its peers on the other side.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use slowmo_runspec::{ResultRow, StepRecord, last_record, results_table, step_rate};

use crate::docker::{self, ContainerInfo, Project, run_inherit};
use crate::results;

/// Which testnet a command acts on.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// Compose file of the testnet (from `slowmo-testnet compose`).
    #[arg(short = 'f', long = "file", default_value = "docker-compose.yml")]
    pub file: PathBuf,
    /// Compose project name; several testnets can run side by side under
    /// different names (and subnets).
    #[arg(
        short = 'p',
        long = "project-name",
        env = "COMPOSE_PROJECT_NAME",
        default_value = "slowmo"
    )]
    pub project: String,
}

impl Target {
    /// The compose project (checks the file and the name).
    pub fn project(&self) -> anyhow::Result<Project> {
        Ok(Project::new(&self.file, &self.project)?)
    }
}

/// Arguments of `slowmo-testnet up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    #[command(flatten)]
    pub target: Target,
    /// Watch the nodes' progress until all have exited, then collect their
    /// results and print the table; fails if a node failed.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up (and fail) after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
    /// With --wait: seconds between progress lines.
    #[arg(long, default_value_t = 5.0)]
    pub interval: f64,
    /// With --wait: results folder [default: results/PROJECT].
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// With --wait: remove the testnet (containers, network, volumes) after
    /// collecting.
    #[arg(long)]
    pub down: bool,
}

/// Arguments of `slowmo-testnet logs`.
#[derive(Debug, Clone, clap::Args)]
pub struct LogsArgs {
    #[command(flatten)]
    pub target: Target,
    /// Keep following the logs.
    #[arg(long, short = 'F')]
    pub follow: bool,
    /// Only the last N lines of each node.
    #[arg(long)]
    pub tail: Option<usize>,
    /// Nodes (`node-2` or `2`); all when none.
    pub nodes: Vec<String>,
}

/// Arguments of commands on one node (`kill`, `pause`, `resume`).
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    #[command(flatten)]
    pub target: Target,
    /// The node: `node-2` or `2`.
    pub node: String,
}

/// Arguments of `slowmo-testnet partition`.
#[derive(Debug, Clone, clap::Args)]
pub struct PartitionArgs {
    #[command(flatten)]
    pub target: Target,
    /// Groups of nodes, comma-separated (`0,1` or `node-0,node-1`). Each group
    /// is cut off from every node outside it; the nodes named in no group
    /// form one more group.
    #[arg(required = true)]
    pub groups: Vec<String>,
}

/// Arguments of `slowmo-testnet collect`.
#[derive(Debug, Clone, clap::Args)]
pub struct CollectArgs {
    #[command(flatten)]
    pub target: Target,
    /// Results folder [default: results/PROJECT].
    #[arg(long)]
    pub results: Option<PathBuf>,
}

fn results_dir(target: &Target, results: &Option<PathBuf>) -> PathBuf {
    results
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(&target.project))
}

/// `slowmo-testnet up`.
pub fn up(args: UpArgs) -> anyhow::Result<()> {
    let project = args.target.project()?;
    run_inherit(&mut project.command(&["up", "-d", "--no-build"]))?;
    if !args.wait {
        eprintln!(
            "testnet `{}` is up; watch it with `slowmo-testnet status -f {} -p {}`",
            project.name,
            project.file.display(),
            project.name
        );
        return Ok(());
    }
    let finished = watch(&project, Duration::from_secs(args.timeout), args.interval)?;
    let dir = results_dir(&args.target, &args.results);
    let rows = results::collect(&project.containers()?, &dir)?;
    println!("{}", results_table(&rows));
    eprintln!("results in {}", dir.display());
    // The page needs the slowmo binary on this host (beside this program).
    match crate::local::slowmo_binary(None).and_then(|b| crate::observe::write_report(&b, &dir)) {
        Ok(path) => println!("report: {}", path.display()),
        Err(e) => eprintln!("no report written: {e:#}"),
    }
    if args.down {
        down(&args.target)?;
    }
    if !finished {
        bail!("the testnet did not finish within {} s", args.timeout);
    }
    check_rows(&rows)
}

/// Fails naming every node that did not exit 0. A node killed on purpose
/// (state `killed`: by `chaos`, which logged it, and not restarted) is not
/// a failure, but at least one node must have exited 0.
pub fn check_rows(rows: &[ResultRow]) -> anyhow::Result<()> {
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| r.state != "killed" && (r.state != "exited" || r.exit_code != Some(0)))
        .map(|r| format!("{} ({} {})", r.node, r.state, r.exit_code.unwrap_or(-1)))
        .collect();
    if !failed.is_empty() {
        bail!(
            "nodes did not complete: {} (see their log.txt)",
            failed.join(", ")
        )
    }
    if !rows.is_empty() && rows.iter().all(|r| r.state == "killed") {
        bail!("every node was killed");
    }
    Ok(())
}

/// Whether a container may still make progress.
fn active(c: &ContainerInfo) -> bool {
    matches!(
        c.status.as_str(),
        "created" | "running" | "paused" | "restarting"
    )
}

/// One node's progress for the watch line and `status`.
fn progress(c: &ContainerInfo) -> (Option<StepRecord>, Option<f64>) {
    match docker::read_file(
        &c.id,
        &format!("{}/metrics.jsonl", crate::compose::DATA_DIR),
    ) {
        Ok(Some(bytes)) => {
            let text = String::from_utf8_lossy(&bytes);
            (last_record(&text), step_rate(&text))
        }
        _ => (None, None),
    }
}

fn progress_text(c: &ContainerInfo) -> String {
    let state = match c.status.as_str() {
        "exited" => format!("exited {}", c.exit_code),
        s => s.to_string(),
    };
    let (last, _) = if c.status == "created" {
        (None, None)
    } else {
        progress(c)
    };
    match last {
        Some(m) => format!("{} {state} step {} loss {:.3}", c.service, m.step, m.loss,),
        None if c.status == "running" => format!("{} joining", c.service),
        None => format!("{} {state}", c.service),
    }
}

/// Prints a progress line every `interval` seconds until every node has
/// exited (true) or `timeout` passed (false).
pub fn watch(project: &Project, timeout: Duration, interval: f64) -> anyhow::Result<bool> {
    let start = Instant::now();
    let interval = Duration::from_secs_f64(interval.max(0.2));
    loop {
        let containers = project.containers()?;
        if containers.is_empty() {
            bail!("project `{}` has no containers", project.name);
        }
        let line: Vec<String> = containers.iter().map(progress_text).collect();
        eprintln!(
            "[{:>5.0}s] {}",
            start.elapsed().as_secs_f64(),
            line.join(" | ")
        );
        if !containers.iter().any(active) {
            return Ok(true);
        }
        if start.elapsed() >= timeout {
            return Ok(false);
        }
        std::thread::sleep(interval);
    }
}

/// `slowmo-testnet down`: removes containers, the network and the volumes.
pub fn down(target: &Target) -> anyhow::Result<()> {
    let project = target.project()?;
    run_inherit(&mut project.command(&[
        "down",
        "--volumes",
        "--remove-orphans",
        "--timeout",
        "10",
    ]))?;
    Ok(())
}

/// `slowmo-testnet status`: one line per node.
pub fn status(target: &Target) -> anyhow::Result<()> {
    let project = target.project()?;
    let containers = project.containers()?;
    if containers.is_empty() {
        println!("testnet `{}` has no containers (not up)", project.name);
        return Ok(());
    }
    println!(
        "{:<8} {:<10} {:>6} {:>9} {:>8} {:<15} limits",
        "node", "state", "step", "loss", "steps/s", "address"
    );
    for c in &containers {
        let (last, rate) = progress(c);
        let state = match c.status.as_str() {
            "exited" => format!("exited {}", c.exit_code),
            s => s.to_string(),
        };
        println!(
            "{:<8} {:<10} {:>6} {:>9} {:>8} {:<15} {}",
            c.service,
            state,
            last.as_ref().map_or("-".into(), |m| m.step.to_string()),
            last.as_ref()
                .map_or("-".into(), |m| format!("{:.4}", m.loss)),
            rate.map_or("-".into(), |r| format!("{r:.2}")),
            c.address.as_deref().unwrap_or("-"),
            c.shape.as_deref().unwrap_or("-"),
        );
    }
    Ok(())
}

/// `slowmo-testnet logs`.
pub fn logs(args: LogsArgs) -> anyhow::Result<()> {
    let project = args.target.project()?;
    let mut cli: Vec<String> = vec!["logs".into()];
    if args.follow {
        cli.push("--follow".into());
    }
    if let Some(n) = args.tail {
        cli.push(format!("--tail={n}"));
    }
    for node in &args.nodes {
        cli.push(project.node(node)?);
    }
    let refs: Vec<&str> = cli.iter().map(String::as_str).collect();
    run_inherit(&mut project.command(&refs))?;
    Ok(())
}

/// `slowmo-testnet kill|pause|resume NODE`.
pub fn node_command(verb: &str, args: NodeArgs) -> anyhow::Result<()> {
    let project = args.target.project()?;
    let node = project.node(&args.node)?;
    let compose_verb = match verb {
        "kill" => "kill",
        "pause" => "pause",
        "resume" => "unpause",
        other => bail!("unknown node command {other}"),
    };
    run_inherit(&mut project.command(&[compose_verb, &node]))?;
    eprintln!("{verb}: {node}");
    Ok(())
}

/// The nftables script cutting a node off from `blocked` addresses (or, with
/// none, removing any cut).
pub fn partition_rules(blocked: &BTreeSet<String>) -> String {
    let mut rules =
        String::from("table inet slowmo_partition\ndelete table inet slowmo_partition\n");
    if !blocked.is_empty() {
        let list: Vec<&str> = blocked.iter().map(String::as_str).collect();
        rules.push_str(&format!(
            "table inet slowmo_partition {{\n\
             \x20   set cut {{ type ipv4_addr; elements = {{ {} }} }}\n\
             \x20   chain input {{ type filter hook input priority -10; policy accept; ip saddr @cut drop; }}\n\
             \x20   chain output {{ type filter hook output priority -10; policy accept; ip daddr @cut drop; }}\n\
             }}\n",
            list.join(", ")
        ));
    }
    rules
}

/// Which side of a partition each node is on: the index of the group that
/// names it, or `groups.len()` for the rest.
pub fn sides(groups: &[Vec<String>], nodes: &[String]) -> anyhow::Result<Vec<usize>> {
    let mut side = vec![groups.len(); nodes.len()];
    for (g, group) in groups.iter().enumerate() {
        for name in group {
            let i = nodes
                .iter()
                .position(|n| n == name)
                .with_context(|| format!("no node `{name}` in this testnet"))?;
            if side[i] != groups.len() {
                bail!("node `{name}` is named in two partition groups");
            }
            side[i] = g;
        }
    }
    Ok(side)
}

/// Applies a rule set per running node; reports the nodes it had to skip.
fn apply_rules(
    containers: &[ContainerInfo],
    rules_for: impl Fn(usize) -> String,
) -> anyhow::Result<()> {
    let mut skipped = Vec::new();
    for (i, c) in containers.iter().enumerate() {
        if c.status != "running" {
            skipped.push(format!("{} ({})", c.service, c.status));
            continue;
        }
        docker::exec(&c.id, &["nft", "-f", "-"], &rules_for(i))
            .with_context(|| format!("changing the firewall of {}", c.service))?;
    }
    if !skipped.is_empty() {
        eprintln!(
            "not changed (not running): {}; the running nodes' rules cover them",
            skipped.join(", ")
        );
    }
    Ok(())
}

/// `slowmo-testnet partition A,B [C,D ...]`.
pub fn partition(args: PartitionArgs) -> anyhow::Result<()> {
    let project = args.target.project()?;
    let containers = project.containers()?;
    let mut groups = Vec::new();
    for spec in &args.groups {
        let mut group = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            group.push(project.node(part)?);
        }
        groups.push(group);
    }
    let described = apply_partition(&containers, &groups)?;
    eprintln!("partitioned: {described}");
    Ok(())
}

/// Cuts each group off from every node outside it (the nodes in no group
/// form one more group); returns the sides as `node-0,node-1 | node-2,...`.
pub fn apply_partition(
    containers: &[ContainerInfo],
    groups: &[Vec<String>],
) -> anyhow::Result<String> {
    let names: Vec<String> = containers.iter().map(|c| c.service.clone()).collect();
    let side = sides(groups, &names)?;
    let addresses: Vec<Option<String>> = containers.iter().map(|c| c.address.clone()).collect();
    if let Some(c) = containers.iter().find(|c| c.address.is_none()) {
        bail!(
            "{} has no testnet address label: was its compose file written by slowmo-testnet?",
            c.service
        );
    }
    apply_rules(containers, |i| {
        let blocked: BTreeSet<String> = (0..containers.len())
            .filter(|&j| side[j] != side[i])
            .filter_map(|j| addresses[j].clone())
            .collect();
        partition_rules(&blocked)
    })?;
    let mut described: Vec<String> = groups.iter().map(|g| g.join(",")).collect();
    let rest: Vec<&str> = names
        .iter()
        .zip(&side)
        .filter(|(_, s)| **s == groups.len())
        .map(|(n, _)| n.as_str())
        .collect();
    if !rest.is_empty() {
        described.push(rest.join(","));
    }
    Ok(described.join(" | "))
}

/// `slowmo-testnet heal`: removes every partition.
pub fn heal(target: &Target) -> anyhow::Result<()> {
    let project = target.project()?;
    apply_heal(&project.containers()?)?;
    eprintln!("healed: every node reaches every other");
    Ok(())
}

/// Removes every partition rule from the running nodes.
pub fn apply_heal(containers: &[ContainerInfo]) -> anyhow::Result<()> {
    apply_rules(containers, |_| partition_rules(&BTreeSet::new()))
}

/// `slowmo-testnet collect`.
pub fn collect(args: CollectArgs) -> anyhow::Result<()> {
    let project = args.target.project()?;
    let dir = results_dir(&args.target, &args.results);
    let rows = results::collect(&project.containers()?, &dir)?;
    println!("{}", results_table(&rows));
    eprintln!("results in {}", dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_rules_block_the_other_side_or_nothing() {
        let blocked: BTreeSet<String> = ["10.0.0.12".to_string(), "10.0.0.13".to_string()].into();
        let rules = partition_rules(&blocked);
        assert!(
            rules.starts_with("table inet slowmo_partition\ndelete table inet slowmo_partition\n")
        );
        assert!(rules.contains("elements = { 10.0.0.12, 10.0.0.13 }"));
        assert!(rules.contains("ip saddr @cut drop"));
        assert!(rules.contains("ip daddr @cut drop"));
        let heal = partition_rules(&BTreeSet::new());
        assert_eq!(heal.lines().count(), 2);
    }

    #[test]
    fn sides_put_unnamed_nodes_together() {
        let nodes: Vec<String> = (0..5).map(crate::node_line::node_name).collect();
        let groups = vec![
            vec!["node-0".to_string(), "node-3".to_string()],
            vec!["node-1".to_string()],
        ];
        assert_eq!(sides(&groups, &nodes).unwrap(), vec![0, 1, 2, 0, 2]);
        let twice = vec![vec!["node-0".to_string()], vec!["node-0".to_string()]];
        assert!(
            sides(&twice, &nodes)
                .unwrap_err()
                .to_string()
                .contains("two partition groups")
        );
        let unknown = vec![vec!["node-9".to_string()]];
        assert!(
            sides(&unknown, &nodes)
                .unwrap_err()
                .to_string()
                .contains("node-9")
        );
    }

    #[test]
    fn check_rows_names_failed_nodes() {
        let ok = ResultRow {
            node: "node-0".into(),
            state: "exited".into(),
            exit_code: Some(0),
            ..ResultRow::default()
        };
        assert!(check_rows(std::slice::from_ref(&ok)).is_ok());
        let bad = ResultRow {
            node: "node-1".into(),
            exit_code: Some(137),
            ..ok.clone()
        };
        let running = ResultRow {
            node: "node-2".into(),
            state: "running".into(),
            ..ok.clone()
        };
        let killed = ResultRow {
            node: "node-3".into(),
            state: "killed".into(),
            ..bad.clone()
        };
        let err = check_rows(&[ok.clone(), bad, running, killed.clone()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("node-1 (exited 137)") && err.contains("node-2 (running"),
            "{err}"
        );
        assert!(!err.contains("node-3"), "{err}");
        assert!(check_rows(&[ok, killed.clone()]).is_ok());
        let err = check_rows(&[killed]).unwrap_err().to_string();
        assert!(err.contains("every node was killed"), "{err}");
    }
}
