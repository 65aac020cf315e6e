//! `slowmo-testnet chaos`: random faults on a running compose testnet,
//! deterministic from a seed, with a log of what was done when.
//!
//! Every `--every` one action is drawn from `--actions` among those that can
//! be taken then: `kill` (SIGKILL a node that is up), `restart` (start a
//! killed node again, same container: same identity, volume and command),
//! `pause` (freeze a node; it is unfrozen `--heal-after` later) and
//! `partition` (cut a group of nodes off from the rest; healed `--heal-after`
//! later). A node counts as down while it is killed, paused or on the cut-off
//! side of a partition, and no action takes more than `--max-down` nodes
//! down at once (default: fewer than half, so a majority stays up).
//!
//! The schedule ([`Planner`]) depends on the seed and the settings alone, so
//! a seed replays the same faults at the same offsets. What happens to the
//! testnet meanwhile (a node that finished or failed on its own) does not
//! change the schedule: an action that does not apply any more is logged as
//! skipped, with the reason, and an action that would take more nodes down
//! than `--max-down` counting the nodes that are already out for other
//! reasons is skipped too. Every action goes to `chaos.jsonl` in the results
//! folder, one JSON object a line (seconds since the start, wall clock, action,
//! target, result), as it is taken. Before a killed node is restarted its
//! metrics and summary so far are copied into the results folder as
//! `nodeI/metrics.K.jsonl` (K = 1 for its first life, ...), because the
//! restarted node writes its files afresh. At the end (`--duration`, or when
//! every node has exited) partitions are healed and paused nodes unfrozen;
//! killed nodes stay down.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::control::{self, Target};
use crate::docker::{self, ContainerInfo, Project, run_output};

/// The name of the chaos log in the results folder.
pub const LOG_FILE: &str = "chaos.jsonl";

/// One kind of random fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ChaosKind {
    Kill,
    Restart,
    Pause,
    Partition,
}

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

/// Parses `30s`, `2m`, `1h`, `500ms` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{text}`: expected a duration such as 30s, 2m, 500ms"))?;
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("`{text}`: unknown unit `{unit}` (ms, s, m, h)")),
    };
    let secs = value * scale;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("`{text}`: not a duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// One planned action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "lowercase")]
pub enum Action {
    Kill {
        node: usize,
    },
    Restart {
        node: usize,
    },
    Pause {
        node: usize,
    },
    Resume {
        node: usize,
    },
    /// `group` is cut off from every other node.
    Partition {
        group: Vec<usize>,
    },
    Heal,
}

impl Action {
    /// The action's name in the log.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Kill { .. } => "kill",
            Action::Restart { .. } => "restart",
            Action::Pause { .. } => "pause",
            Action::Resume { .. } => "resume",
            Action::Partition { .. } => "partition",
            Action::Heal => "heal",
        }
    }

    /// The nodes it acts on, as `nodeI` names.
    pub fn target(&self) -> String {
        match self {
            Action::Kill { node }
            | Action::Restart { node }
            | Action::Pause { node }
            | Action::Resume { node } => format!("node{node}"),
            Action::Partition { group } => group
                .iter()
                .map(|n| format!("node{n}"))
                .collect::<Vec<_>>()
                .join(","),
            Action::Heal => "all".into(),
        }
    }
}

/// An action at an offset from the start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Milliseconds since the start.
    pub at_ms: u64,
    pub action: Action,
}

/// Settings of a schedule.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    pub nodes: usize,
    pub seed: u64,
    pub every: Duration,
    pub actions: Vec<ChaosKind>,
    pub max_down: usize,
    pub heal_after: Duration,
}

impl PlanConfig {
    /// The default `--max-down`: fewer than half of the nodes.
    pub fn default_max_down(nodes: usize) -> usize {
        nodes.saturating_sub(1) / 2
    }

    /// Checks the settings; errors name the flag.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.nodes < 2 {
            bail!(
                "chaos needs a testnet of at least 2 nodes, this one has {}",
                self.nodes
            );
        }
        if self.every.is_zero() {
            bail!("--every must be longer than 0");
        }
        if self.heal_after.is_zero() {
            bail!("--heal-after must be longer than 0");
        }
        if self.actions.is_empty() {
            bail!("--actions names no action");
        }
        if self.max_down == 0 || self.max_down >= self.nodes {
            bail!(
                "--max-down {}: must be between 1 and {} (one node of the {} stays up)",
                self.max_down,
                self.nodes - 1,
                self.nodes
            );
        }
        Ok(())
    }
}

/// SplitMix64: small, fast and the same everywhere.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// The schedule: an endless, deterministic sequence of actions. It tracks
/// which nodes its own actions took down, and never has more than
/// `max_down` down at once.
#[derive(Debug, Clone)]
pub struct Planner {
    config: PlanConfig,
    rng: Rng,
    /// The next draw.
    tick: u64,
    killed: BTreeSet<usize>,
    /// Paused nodes and when each is resumed.
    paused: BTreeMap<usize, u64>,
    /// The cut-off group and when it is healed.
    partition: Option<(Vec<usize>, u64)>,
}

impl Planner {
    pub fn new(config: PlanConfig) -> anyhow::Result<Self> {
        config.check()?;
        let mut actions = config.actions.clone();
        actions.sort();
        actions.dedup();
        Ok(Planner {
            rng: Rng(config.seed ^ 0x736c_6f77_6d6f_6368),
            config: PlanConfig { actions, ..config },
            tick: 1,
            killed: BTreeSet::new(),
            paused: BTreeMap::new(),
            partition: None,
        })
    }

    /// Nodes down now: killed, paused or cut off.
    pub fn down(&self) -> BTreeSet<usize> {
        let mut down: BTreeSet<usize> = self.killed.clone();
        down.extend(self.paused.keys().copied());
        if let Some((group, _)) = &self.partition {
            down.extend(group.iter().copied());
        }
        down
    }

    fn up(&self) -> Vec<usize> {
        let down = self.down();
        (0..self.config.nodes)
            .filter(|n| !down.contains(n))
            .collect()
    }

    /// The next undo (resume or heal) due at or before `until`.
    fn due_undo(&self, until: u64) -> Option<Planned> {
        let resume = self
            .paused
            .iter()
            .map(|(&n, &at)| (at, n))
            .min()
            .filter(|(at, _)| *at <= until);
        let heal = self
            .partition
            .as_ref()
            .map(|(_, at)| *at)
            .filter(|at| *at <= until);
        match (resume, heal) {
            (Some((at, node)), Some(h)) if at <= h => Some(Planned {
                at_ms: at,
                action: Action::Resume { node },
            }),
            (_, Some(h)) => Some(Planned {
                at_ms: h,
                action: Action::Heal,
            }),
            (Some((at, node)), None) => Some(Planned {
                at_ms: at,
                action: Action::Resume { node },
            }),
            (None, None) => None,
        }
    }

    /// The next action; `None` actions are draws where nothing could be
    /// done (everything down that may be, nothing to restart).
    pub fn next_event(&mut self) -> (u64, Option<Action>) {
        let every = self.config.every.as_millis() as u64;
        let tick_at = self.tick * every;
        if let Some(undo) = self.due_undo(tick_at) {
            match &undo.action {
                Action::Resume { node } => {
                    self.paused.remove(node);
                }
                _ => self.partition = None,
            }
            return (undo.at_ms, Some(undo.action));
        }
        self.tick += 1;
        (tick_at, self.draw(tick_at))
    }

    /// The next action that does something.
    pub fn next_action(&mut self) -> Planned {
        loop {
            if let (at_ms, Some(action)) = self.next_event() {
                return Planned { at_ms, action };
            }
        }
    }

    fn draw(&mut self, now: u64) -> Option<Action> {
        let down = self.down().len();
        let up = self.up();
        let room = self.config.max_down.saturating_sub(down);
        let feasible: Vec<ChaosKind> = self
            .config
            .actions
            .iter()
            .copied()
            .filter(|k| match k {
                ChaosKind::Kill | ChaosKind::Pause => room > 0 && !up.is_empty(),
                ChaosKind::Restart => !self.killed.is_empty(),
                ChaosKind::Partition => self.partition.is_none() && room > 0 && up.len() >= 2,
            })
            .collect();
        if feasible.is_empty() {
            return None;
        }
        let span = self.config.heal_after.as_millis() as u64;
        Some(match self.rng.pick(&feasible) {
            ChaosKind::Kill => {
                let node = self.rng.pick(&up);
                self.killed.insert(node);
                Action::Kill { node }
            }
            ChaosKind::Restart => {
                let killed: Vec<usize> = self.killed.iter().copied().collect();
                let node = self.rng.pick(&killed);
                self.killed.remove(&node);
                Action::Restart { node }
            }
            ChaosKind::Pause => {
                let node = self.rng.pick(&up);
                self.paused.insert(node, now + span);
                Action::Pause { node }
            }
            ChaosKind::Partition => {
                let size = 1 + self.rng.below(room.min(up.len() - 1));
                let mut pool = up;
                let mut group = Vec::new();
                for _ in 0..size {
                    group.push(pool.remove(self.rng.below(pool.len())));
                }
                group.sort_unstable();
                self.partition = Some((group.clone(), now + span));
                Action::Partition { group }
            }
        })
    }
}

/// One line of chaos.jsonl (and of a local run's events.jsonl).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Seconds since chaos started (when the action began).
    pub t: f64,
    /// Wall clock, seconds since the Unix epoch.
    pub unix: f64,
    pub action: String,
    /// `node2`, `node0,node3` (a partition's cut-off group) or `all`.
    pub target: String,
    /// `done`, `skipped: WHY` or `failed: WHY`.
    pub result: String,
}

/// Reads a chaos log; unreadable lines are skipped.
pub fn read_log(path: &Path) -> Vec<LogEntry> {
    std::fs::read_to_string(path)
        .map(|text| {
            text.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

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

/// Per node (`nodeI`), from a chaos log.
pub fn fates(log: &[LogEntry]) -> BTreeMap<String, ChaosFate> {
    let mut out: BTreeMap<String, ChaosFate> = BTreeMap::new();
    for e in log.iter().filter(|e| e.result == "done") {
        for node in e.target.split(',').filter(|n| n.starts_with("node")) {
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

struct Log {
    file: std::fs::File,
    path: PathBuf,
    start: Instant,
}

impl Log {
    fn write(&mut self, action: &str, target: &str, result: &str) -> anyhow::Result<()> {
        self.write_at(self.start.elapsed(), action, target, result)
    }

    /// Logs an action that began `t` after the start.
    fn write_at(
        &mut self,
        t: Duration,
        action: &str,
        target: &str,
        result: &str,
    ) -> anyhow::Result<()> {
        let entry = LogEntry {
            t: (t.as_secs_f64() * 1000.0).round() / 1000.0,
            unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            action: action.to_string(),
            target: target.to_string(),
            result: result.to_string(),
        };
        eprintln!(
            "[{:>6.1}s] chaos: {} {}: {}",
            entry.t, entry.action, entry.target, entry.result
        );
        let line = serde_json::to_string(&entry)?;
        writeln!(self.file, "{line}")
            .and_then(|()| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

fn container(containers: &[ContainerInfo], node: usize) -> Option<&ContainerInfo> {
    containers
        .iter()
        .find(|c| docker::node_index(&c.service) == Some(node))
}

/// Nodes out now for any reason: not running (exited, paused, ...).
fn out_now(containers: &[ContainerInfo]) -> usize {
    containers.iter().filter(|c| c.status != "running").count()
}

/// Copies a stopped node's metrics and summary of the life that just ended
/// into the results folder as `metrics.K.jsonl` / `summary.K.json`.
fn keep_earlier_life(c: &ContainerInfo, results: &Path) -> anyhow::Result<()> {
    let dir = results.join(&c.service);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut life = 1;
    while dir.join(format!("metrics.{life}.jsonl")).exists() {
        life += 1;
    }
    for (name, kept) in [
        ("metrics.jsonl", format!("metrics.{life}.jsonl")),
        ("summary.json", format!("summary.{life}.json")),
    ] {
        let path = format!("{}/{name}", crate::compose::DATA_DIR);
        let bytes = docker::read_file(&c.id, &path)?.unwrap_or_default();
        if name == "metrics.jsonl" || !bytes.is_empty() {
            let target = dir.join(kept);
            std::fs::write(&target, &bytes)
                .with_context(|| format!("writing {}", target.display()))?;
        }
    }
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
        container(&containers, node).with_context(|| format!("no container for node{node}"))
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
            let names: Vec<String> = group.iter().map(|n| format!("node{n}")).collect();
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
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut log = Log {
        file,
        path,
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
    eprintln!("chaos log: {}", log.path.display());
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
            service: "node5".into(),
            status: status.into(),
            exit_code,
            address: None,
            shape: None,
        };
        assert_eq!(no_restart(&c("exited", 137)), None);
        assert_eq!(no_restart(&c("exited", 1)), None);
        assert_eq!(
            no_restart(&c("exited", 0)).unwrap(),
            "node5 finished the run (exit status 0)"
        );
        assert_eq!(no_restart(&c("paused", 0)).unwrap(), "node5 is paused");
        assert_eq!(no_restart(&c("running", 0)).unwrap(), "node5 is running");
    }

    fn config(seed: u64, nodes: usize, max_down: usize) -> PlanConfig {
        PlanConfig {
            nodes,
            seed,
            every: Duration::from_secs(30),
            actions: vec![
                ChaosKind::Kill,
                ChaosKind::Restart,
                ChaosKind::Pause,
                ChaosKind::Partition,
            ],
            max_down,
            heal_after: Duration::from_secs(45),
        }
    }

    fn schedule(config: PlanConfig, n: usize) -> Vec<Planned> {
        let mut p = Planner::new(config).unwrap();
        (0..n).map(|_| p.next_action()).collect()
    }

    #[test]
    fn the_schedule_is_deterministic_from_the_seed() {
        let a = schedule(config(7, 8, 3), 200);
        assert_eq!(a, schedule(config(7, 8, 3), 200));
        assert_ne!(a, schedule(config(8, 8, 3), 200));
        // Every kind shows up, times never go backwards, draws are on the grid.
        for kind in ["kill", "restart", "pause", "resume", "partition", "heal"] {
            assert!(a.iter().any(|p| p.action.name() == kind), "no {kind}");
        }
        assert!(a.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert!(
            a.iter()
                .filter(|p| !matches!(p.action, Action::Resume { .. } | Action::Heal))
                .all(|p| p.at_ms % 30_000 == 0)
        );
    }

    #[test]
    fn the_schedule_never_takes_more_than_max_down_nodes_down() {
        for seed in 0..50 {
            for (nodes, max_down) in [(2, 1), (4, 1), (5, 2), (8, 3), (8, 7)] {
                let mut down: BTreeSet<usize> = BTreeSet::new();
                let mut killed = BTreeSet::new();
                let mut cut: Vec<usize> = Vec::new();
                for p in schedule(config(seed, nodes, max_down), 300) {
                    match &p.action {
                        Action::Kill { node } => {
                            assert!(down.insert(*node), "{node} killed while down");
                            killed.insert(*node);
                        }
                        Action::Pause { node } => {
                            assert!(down.insert(*node), "{node} paused while down")
                        }
                        Action::Restart { node } => {
                            assert!(killed.remove(node), "restart of a node not killed");
                            down.remove(node);
                        }
                        Action::Resume { node } => assert!(down.remove(node)),
                        Action::Partition { group } => {
                            assert!(cut.is_empty(), "two partitions at once");
                            assert!(!group.is_empty() && group.len() < nodes);
                            for n in group {
                                assert!(down.insert(*n), "{n} cut off while down");
                            }
                            cut = group.clone();
                        }
                        Action::Heal => {
                            assert!(!cut.is_empty());
                            for n in cut.drain(..) {
                                down.remove(&n);
                            }
                        }
                    }
                    assert!(
                        down.len() <= max_down,
                        "seed {seed}: {} down with --max-down {max_down}",
                        down.len()
                    );
                }
            }
        }
    }

    #[test]
    fn only_the_chosen_actions_are_drawn() {
        let mut c = config(3, 6, 2);
        c.actions = vec![ChaosKind::Kill, ChaosKind::Restart];
        for p in schedule(c, 100) {
            assert!(matches!(
                p.action,
                Action::Kill { .. } | Action::Restart { .. }
            ));
        }
        // Kills alone stop at the floor: the planner then has nothing to do.
        let mut c = config(3, 6, 2);
        c.actions = vec![ChaosKind::Kill];
        let mut p = Planner::new(c).unwrap();
        let events: Vec<_> = (0..10).map(|_| p.next_event()).collect();
        assert_eq!(events.iter().filter(|e| e.1.is_some()).count(), 2);
    }

    #[test]
    fn bad_settings_are_refused_naming_the_flag() {
        let e = Planner::new(config(1, 4, 4)).unwrap_err().to_string();
        assert!(
            e.contains("--max-down 4") && e.contains("between 1 and 3"),
            "{e}"
        );
        let e = Planner::new(config(1, 4, 0)).unwrap_err().to_string();
        assert!(e.contains("--max-down 0"), "{e}");
        let mut c = config(1, 4, 1);
        c.every = Duration::ZERO;
        assert!(Planner::new(c).unwrap_err().to_string().contains("--every"));
        assert!(Planner::new(config(1, 1, 1)).is_err());
        assert_eq!(PlanConfig::default_max_down(8), 3);
        assert_eq!(PlanConfig::default_max_down(4), 1);
        assert_eq!(PlanConfig::default_max_down(3), 1);
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(
            parse_duration("3 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("").is_err());
    }

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
            e("kill", "node1", "done"),
            e("restart", "node1", "done"),
            e("kill", "node2", "done"),
            e("kill", "node3", "skipped: node3 is exited"),
            e("partition", "node0,node3", "done"),
        ];
        let f = fates(&log);
        assert_eq!(
            f["node1"],
            ChaosFate {
                kills: 1,
                restarts: 1,
                ..ChaosFate::default()
            }
        );
        assert!(f["node2"].down_at_end);
        assert_eq!(f["node3"].kills, 0);
        assert_eq!(f["node3"].partitions, 1);
    }
}
