//! Carrying out the schedule on a running compose testnet.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::log::{LOG_FILE, Log};
use super::plan::{Action, ChaosKind, PlanConfig, Planner, parse_duration};
use crate::control::{self, Target};
use crate::docker::{self, ContainerInfo, Project, run_output};
use crate::events::EventLog;
use crate::node_line::{node_index, node_name};

/// Arguments of `slowmo-testnet chaos`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    #[command(flatten)]
    pub target: Target,
    /// Seed of the schedule: the same seed and settings give the same
    /// actions on the same nodes at the same offsets.
    #[arg(long)]
    pub seed: u64,
    /// Time between two actions (`30s`, `2m`, `500ms`; a bare number is
    /// seconds).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub every: Duration,
    /// Kinds of fault to draw from, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "kill,restart,pause,partition"
    )]
    pub actions: Vec<ChaosKind>,
    /// Stop after this long [default: when every node has exited].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Most nodes down at once (killed, paused or cut off) [default: fewer
    /// than half of the nodes].
    #[arg(long)]
    pub max_down: Option<usize>,
    /// How long a pause or a partition lasts before it is undone [default:
    /// --every].
    #[arg(long, value_parser = parse_duration)]
    pub heal_after: Option<Duration>,
    /// Results folder for chaos.jsonl and earlier lives' metrics [default:
    /// results/PROJECT, where `up --wait` collects].
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// Print the schedule of this many actions and exit, touching nothing
    /// (needs --nodes instead of a running testnet).
    #[arg(long, value_name = "ACTIONS")]
    pub dry_run: Option<usize>,
    /// With --dry-run: the number of nodes.
    #[arg(long)]
    pub nodes: Option<usize>,
}

fn container(containers: &[ContainerInfo], node: usize) -> Option<&ContainerInfo> {
    containers
        .iter()
        .find(|c| node_index(&c.service) == Some(node))
}

/// Nodes out now for any reason: not running (exited, paused, ...).
fn out_now(containers: &[ContainerInfo]) -> usize {
    containers.iter().filter(|c| c.status != "running").count()
}

/// Copies a stopped node's metrics and summary of the life that just ended
/// out of its container into the results folder (the rule of
/// [`crate::life`]).
fn keep_earlier_life(c: &ContainerInfo, results: &Path) -> anyhow::Result<()> {
    let dir = results.join(&c.service);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    crate::life::keep_earlier_life(&dir, |name, target| {
        let path = format!("{}/{name}", crate::compose::DATA_DIR);
        let Some(bytes) = docker::read_file(&c.id, &path)? else {
            return Ok(false);
        };
        std::fs::write(target, &bytes).with_context(|| format!("writing {}", target.display()))?;
        Ok(true)
    })?;
    Ok(())
}

/// Carries out one action; `Ok(result)` is what goes to the log.
fn carry_out(
    project: &Project,
    action: &Action,
    max_down: usize,
    results: &Path,
) -> anyhow::Result<String> {
    let containers = project.containers()?;
    let one = |node: usize| {
        container(&containers, node)
            .with_context(|| format!("no container for {}", node_name(node)))
    };
    let compose = |verb: &str, service: &str| -> anyhow::Result<()> {
        run_output(&mut project.command(&[verb, service]))?;
        Ok(())
    };
    match action {
        Action::Kill { node } | Action::Pause { node } => {
            let c = one(*node)?;
            if c.status != "running" {
                return Ok(format!("skipped: {} is {}", c.service, c.status));
            }
            if out_now(&containers) + 1 > max_down {
                return Ok(format!(
                    "skipped: {} node(s) are already out (exited, paused or killed); --max-down {max_down}",
                    out_now(&containers)
                ));
            }
            compose(
                if matches!(action, Action::Kill { .. }) {
                    "kill"
                } else {
                    "pause"
                },
                &c.service,
            )?;
        }
        Action::Restart { node } => {
            let c = one(*node)?;
            if let Some(why) = no_restart(c) {
                return Ok(format!("skipped: {why}"));
            }
            keep_earlier_life(c, results)?;
            compose("start", &c.service)?;
        }
        Action::Resume { node } => {
            let c = one(*node)?;
            if c.status != "paused" {
                return Ok(format!("skipped: {} is {}", c.service, c.status));
            }
            compose("unpause", &c.service)?;
        }
        Action::Partition { group } => {
            if out_now(&containers) + group.len() > max_down {
                return Ok(format!(
                    "skipped: {} node(s) are already out; cutting off {} more passes --max-down {max_down}",
                    out_now(&containers),
                    group.len()
                ));
            }
            let names: Vec<String> = group.iter().map(|n| node_name(*n)).collect();
            control::apply_partition(&containers, &[names])?;
        }
        Action::Heal => control::apply_heal(&containers)?,
    }
    Ok("done".into())
}

/// Why a container is not started again by a `restart`: it is up, or it
/// finished the run on its own (exit status 0; a killed container exits with
/// 137). Starting a node after the run ended would only leave it waiting to
/// be admitted to a run that is over.
fn no_restart(c: &ContainerInfo) -> Option<String> {
    if c.status == "running" || c.status == "paused" {
        Some(format!("{} is {}", c.service, c.status))
    } else if c.status == "exited" && c.exit_code == 0 {
        Some(format!("{} finished the run (exit status 0)", c.service))
    } else {
        None
    }
}

/// Whether any container may still make progress.
fn any_active(containers: &[ContainerInfo]) -> bool {
    containers.iter().any(|c| {
        matches!(
            c.status.as_str(),
            "created" | "running" | "paused" | "restarting"
        )
    })
}

/// `slowmo-testnet chaos`.
pub fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let heal_after = args.heal_after.unwrap_or(args.every);
    if let Some(count) = args.dry_run {
        let nodes = args
            .nodes
            .context("--dry-run needs --nodes N (it does not look at a testnet)")?;
        let mut planner = Planner::new(PlanConfig {
            nodes,
            seed: args.seed,
            every: args.every,
            actions: args.actions.clone(),
            max_down: args
                .max_down
                .unwrap_or_else(|| PlanConfig::default_max_down(nodes)),
            heal_after,
        })?;
        for _ in 0..count {
            let p = planner.next_action();
            println!(
                "{:>9.1}s {} {}",
                p.at_ms as f64 / 1000.0,
                p.action.name(),
                p.action.target()
            );
        }
        return Ok(());
    }
    let project = args.target.project()?;
    // Started beside `up --wait`, the containers may not exist yet.
    let waiting = Instant::now();
    let services = project.services()?;
    let containers = loop {
        let containers = project.containers()?;
        if !containers.is_empty() && containers.len() >= services.len() {
            break containers;
        }
        if waiting.elapsed() >= Duration::from_secs(120) {
            bail!(
                "testnet `{}` has no containers after 2 minutes: start it with `slowmo-testnet up`",
                project.name
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    let nodes = containers.len();
    let max_down = args
        .max_down
        .unwrap_or_else(|| PlanConfig::default_max_down(nodes));
    let mut planner = Planner::new(PlanConfig {
        nodes,
        seed: args.seed,
        every: args.every,
        actions: args.actions.clone(),
        max_down,
        heal_after,
    })?;
    let results = args
        .results
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(&args.target.project));
    std::fs::create_dir_all(&results).with_context(|| format!("creating {}", results.display()))?;
    let path = results.join(LOG_FILE);
    let mut log = Log {
        events: EventLog::open(&path)?,
        start: Instant::now(),
    };
    log.write(
        "start",
        "all",
        &format!(
            "seed {} every {:?} actions {:?} max-down {max_down} heal-after {heal_after:?} nodes {nodes}",
            args.seed, args.every, args.actions
        ),
    )?;
    let end_reason = loop {
        let next = planner.next_action();
        let at = Duration::from_millis(next.at_ms);
        if args.duration.is_some_and(|d| at > d) {
            if let Some(d) = args.duration {
                sleep_until(&log.start, d, &project)?;
            }
            break "duration over";
        }
        if !sleep_until(&log.start, at, &project)? {
            break "every node has exited";
        }
        let began = log.start.elapsed();
        let result = match carry_out(&project, &next.action, max_down, &results) {
            Ok(r) => r,
            Err(e) => format!("failed: {e:#}"),
        };
        log.write_at(began, next.action.name(), &next.action.target(), &result)?;
    };
    // Leave no node cut off or frozen.
    let containers = project.containers()?;
    let heal = control::apply_heal(&containers)
        .map_or_else(|e| format!("failed: {e:#}"), |()| "done".into());
    log.write("heal", "all", &heal)?;
    for c in containers.iter().filter(|c| c.status == "paused") {
        let r = run_output(&mut project.command(&["unpause", &c.service]))
            .map_or_else(|e| format!("failed: {e}"), |_| "done".into());
        log.write("resume", &c.service, &r)?;
    }
    log.write("end", "all", end_reason)?;
    eprintln!("chaos log: {}", log.events.path().display());
    Ok(())
}

/// Sleeps until `at` after `start`, checking every few seconds that the
/// testnet still runs; false when every node has exited.
fn sleep_until(start: &Instant, at: Duration, project: &Project) -> anyhow::Result<bool> {
    let mut last_check = Instant::now();
    loop {
        let now = start.elapsed();
        if now >= at {
            return Ok(true);
        }
        if last_check.elapsed() >= Duration::from_secs(2) {
            last_check = Instant::now();
            if !any_active(&project.containers()?) {
                return Ok(false);
            }
        }
        std::thread::sleep((at - now).min(Duration::from_millis(200)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_killed_or_failed_node_is_restarted() {
        let c = |status: &str, exit_code: i64| ContainerInfo {
            id: "x".into(),
            service: "node-5".into(),
            status: status.into(),
            exit_code,
            address: None,
            shape: None,
        };
        assert_eq!(no_restart(&c("exited", 137)), None);
        assert_eq!(no_restart(&c("exited", 1)), None);
        assert_eq!(
            no_restart(&c("exited", 0)).unwrap(),
            "node-5 finished the run (exit status 0)"
        );
        assert_eq!(no_restart(&c("paused", 0)).unwrap(), "node-5 is paused");
        assert_eq!(no_restart(&c("running", 0)).unwrap(), "node-5 is running");
    }
}
