//! The chaos schedule: which fault at which offset, deterministic from the
//! seed and the settings alone (see [`super`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::bail;
use serde::Serialize;
use slowmo_optim::rng::SplitMix64;

use crate::node_line::node_name;

/// One kind of random fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ChaosKind {
    Kill,
    Restart,
    Pause,
    Partition,
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

    /// The nodes it acts on, by name (`node-2`, `node-0,node-3`).
    pub fn target(&self) -> String {
        match self {
            Action::Kill { node }
            | Action::Restart { node }
            | Action::Pause { node }
            | Action::Resume { node } => node_name(*node),
            Action::Partition { group } => group
                .iter()
                .map(|n| node_name(*n))
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

/// The schedule: an endless, deterministic sequence of actions. It tracks
/// which nodes its own actions took down, and never has more than
/// `max_down` down at once.
#[derive(Debug, Clone)]
pub struct Planner {
    config: PlanConfig,
    rng: SplitMix64,
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
            rng: SplitMix64::new(config.seed ^ 0x736c_6f77_6d6f_6368),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
