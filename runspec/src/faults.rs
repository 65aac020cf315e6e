//! The fault-script grammar: one parser for every player of a script
//! (`slowmo simulate --faults`, `slowmo-testnet local --faults`).
//!
//! ```text
//! kill 2@5s; restart 2@12s; pause 1@40; resume 1@60
//! join 8@300
//! partition 0-3|4-7@300..500
//! ```
//! Statements are separated by `;` or new lines; a line starting with `#`
//! is a comment. `@N` is when the run reaches base step N, `@Ns` is N
//! seconds (decimals allowed) after the nodes were started. A node is named
//! by its index (`2` or `node-2`).
//! - `kill I`: node I dies (a simulated crash, or SIGKILL).
//! - `restart I`: node I, killed earlier in the script, starts again and
//!   asks to be admitted at the members' next barrier.
//! - `pause I` / `resume I`: node I stops and goes on (slow, not dead).
//! - `join I`: a new node that was not there at the start asks to join; I
//!   counts on from the run's nodes without gaps (`join 8@300` in a run of
//!   8, then `join 9@...`). After its join it can be killed, restarted or
//!   paused like the others.
//! - `partition A|B@FROM..UNTIL`: from FROM the sides (`0-3`, `0,2,5`)
//!   cannot reach each other; at UNTIL the cut heals.
//!
//! [`FaultScript::parse`] checks what holds for every player: nodes exist,
//! joins count on, a restart follows a kill of the same node and a resume a
//! pause, nothing fires at step 0, partition sides are disjoint and windows
//! not empty. Each player then takes the part it can play and refuses the
//! rest by name: [`FaultScript::for_simulator`] (base steps only, no
//! pause) and [`FaultScript::for_processes`] (no partitions: those need
//! network namespaces, the compose testnet's).

use std::collections::HashMap;
use std::fmt;

/// Most nodes a script may add with `join`.
pub const MAX_JOINS: usize = 64;

/// What a scripted fault does to one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    Kill,
    Restart,
    Pause,
    Resume,
    Join,
}

impl FaultAction {
    pub fn name(self) -> &'static str {
        match self {
            FaultAction::Kill => "kill",
            FaultAction::Restart => "restart",
            FaultAction::Pause => "pause",
            FaultAction::Resume => "resume",
            FaultAction::Join => "join",
        }
    }
}

/// When a fault fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// Seconds after the nodes were started.
    Seconds(f64),
    /// When the run reaches this base step.
    Step(u64),
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::Seconds(s) => write!(f, "{s}s"),
            Trigger::Step(s) => write!(f, "{s}"),
        }
    }
}

/// A fault that acts on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedFault {
    pub action: FaultAction,
    pub node: usize,
    pub at: Trigger,
}

impl fmt::Display for ScriptedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}@{}", self.action.name(), self.node, self.at)
    }
}

/// Two sides of the run that cannot reach each other for a while.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkPartition {
    pub sides: Vec<Vec<usize>>,
    pub from: Trigger,
    pub until: Trigger,
}

impl fmt::Display for NetworkPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sides: Vec<String> = self
            .sides
            .iter()
            .map(|s| {
                s.iter()
                    .map(|w| w.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        write!(
            f,
            "partition {}@{}..{}",
            sides.join("|"),
            self.from,
            self.until
        )
    }
}

/// One statement of a script.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    Node(ScriptedFault),
    Partition(NetworkPartition),
}

impl fmt::Display for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Statement::Node(x) => x.fmt(f),
            Statement::Partition(x) => x.fmt(f),
        }
    }
}

/// A parsed and checked script for a run of `nodes` nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultScript {
    pub nodes: usize,
    pub statements: Vec<Statement>,
}

impl fmt::Display for FaultScript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.statements.iter().map(|s| s.to_string()).collect();
        write!(f, "{}", parts.join("; "))
    }
}

fn parse_node(text: &str) -> Result<usize, String> {
    let text = text.trim();
    text.strip_prefix("node-")
        .unwrap_or(text)
        .parse()
        .map_err(|_| format!("node `{text}` is not a number"))
}

fn parse_trigger(text: &str) -> Result<Trigger, String> {
    let when = text.trim();
    match when.strip_suffix('s') {
        Some(secs) => {
            let s: f64 = secs
                .trim()
                .parse()
                .map_err(|_| format!("`{when}` is not a number of seconds"))?;
            if !s.is_finite() || s < 0.0 {
                return Err(format!("`{when}` is not a time"));
            }
            Ok(Trigger::Seconds(s))
        }
        None => {
            let step: u64 = when
                .parse()
                .map_err(|_| format!("`{when}` is not a step (or seconds: `{when}s`)"))?;
            if step == 0 {
                return Err("step 0: the run has not begun (use `@0s` for the start)".into());
            }
            Ok(Trigger::Step(step))
        }
    }
}

/// `0-3` or `0,2,5` or `4`.
fn parse_side(text: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (parse_node(a)?, parse_node(b)?);
                if a > b {
                    return Err(format!("range {a}-{b} runs backwards"));
                }
                out.extend(a..=b);
            }
            None => out.push(parse_node(part)?),
        }
    }
    Ok(out)
}

fn parse_statement(stmt: &str) -> Result<Statement, String> {
    let (verb, rest) = stmt.split_once(char::is_whitespace).ok_or(
        "expected `kill|restart|pause|resume|join NODE@WHEN` or `partition A|B@FROM..UNTIL`",
    )?;
    let (what, when) = rest
        .rsplit_once('@')
        .ok_or("no `@WHEN` (`@40` for a base step, `@5s` for seconds)")?;
    let action = match verb {
        "kill" => FaultAction::Kill,
        "restart" => FaultAction::Restart,
        "pause" => FaultAction::Pause,
        "resume" => FaultAction::Resume,
        "join" => FaultAction::Join,
        "partition" => {
            let sides = what
                .split('|')
                .map(parse_side)
                .collect::<Result<Vec<_>, _>>()?;
            let (from, until) = when
                .split_once("..")
                .ok_or("a partition needs `@FROM..UNTIL`")?;
            return Ok(Statement::Partition(NetworkPartition {
                sides,
                from: parse_trigger(from)?,
                until: parse_trigger(until)?,
            }));
        }
        other => {
            return Err(format!(
                "unknown fault `{other}` (kill, restart, pause, resume, join, partition)"
            ));
        }
    };
    Ok(Statement::Node(ScriptedFault {
        action,
        node: parse_node(what)?,
        at: parse_trigger(when)?,
    }))
}

impl FaultScript {
    /// Parses a script for a run of `nodes` nodes and checks what every
    /// player needs (see the module's documentation). An error names the
    /// statement and what is wrong with it.
    pub fn parse(text: &str, nodes: usize) -> Result<Self, String> {
        let mut script = FaultScript {
            nodes,
            statements: Vec::new(),
        };
        for stmt in text.split([';', '\n']).map(str::trim) {
            if stmt.is_empty() || stmt.starts_with('#') {
                continue;
            }
            let parsed = parse_statement(stmt).map_err(|e| format!("`{stmt}`: {e}"))?;
            script.statements.push(parsed);
        }
        script.check()?;
        Ok(script)
    }

    /// Reads `--faults ARG`: the script itself, or the name of a file
    /// holding one (an argument with an `@` is always a script).
    pub fn load(arg: &str, nodes: usize) -> Result<Self, String> {
        let path = std::path::Path::new(arg);
        if !arg.contains('@') && path.is_file() {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            Self::parse(&text, nodes).map_err(|e| format!("{}: {e}", path.display()))
        } else {
            Self::parse(arg, nodes)
        }
    }

    fn check(&self) -> Result<(), String> {
        let nodes = self.nodes;
        // Per node: None (running), or the action that took it down.
        let mut down = vec![None::<FaultAction>; nodes];
        for s in &self.statements {
            let f = match s {
                Statement::Partition(p) => {
                    check_partition(p, down.len()).map_err(|e| format!("`{p}`: {e}"))?;
                    continue;
                }
                Statement::Node(f) => f,
            };
            let bad = |why: String| format!("`{f}`: {why}");
            if f.action == FaultAction::Join {
                if f.node < nodes {
                    return Err(bad(format!(
                        "node {} is one of the {nodes} started at the beginning; a joining \
                         node counts on from them (`join {nodes}@...`)",
                        f.node
                    )));
                }
                if f.node >= nodes + MAX_JOINS {
                    return Err(bad(format!(
                        "node {}: a script adds at most {MAX_JOINS} nodes",
                        f.node
                    )));
                }
                if f.node != down.len() {
                    return Err(bad(if f.node < down.len() {
                        "that node has already joined".into()
                    } else {
                        format!(
                            "joining nodes count on without gaps: join {} first",
                            down.len()
                        )
                    }));
                }
                down.push(None);
                continue;
            }
            let Some(state) = down.get_mut(f.node) else {
                return Err(bad(format!(
                    "there is no node {} in {nodes} nodes (a node added mid-run needs an \
                     earlier `join {}@...`)",
                    f.node, f.node
                )));
            };
            let ok = match f.action {
                FaultAction::Kill => state.is_none() || *state == Some(FaultAction::Pause),
                FaultAction::Pause => state.is_none(),
                FaultAction::Restart => *state == Some(FaultAction::Kill),
                FaultAction::Resume => *state == Some(FaultAction::Pause),
                FaultAction::Join => unreachable!("joins are checked above"),
            };
            if !ok {
                return Err(bad(match f.action {
                    FaultAction::Restart => {
                        format!("needs an earlier `kill {}@...`", f.node)
                    }
                    FaultAction::Resume => {
                        format!("needs an earlier `pause {}@...`", f.node)
                    }
                    _ => "the node is already down at that point of the script".into(),
                }));
            }
            *state = match f.action {
                FaultAction::Kill => Some(FaultAction::Kill),
                FaultAction::Pause => Some(FaultAction::Pause),
                _ => None,
            };
        }
        Ok(())
    }

    /// The node faults, for a player of real processes; a partition is
    /// refused (it needs network namespaces: the compose testnet's
    /// `slowmo-testnet partition` and `chaos`).
    pub fn for_processes(&self) -> Result<Vec<ScriptedFault>, String> {
        self.statements
            .iter()
            .map(|s| match s {
                Statement::Node(f) => Ok(f.clone()),
                Statement::Partition(p) => Err(format!(
                    "`{p}`: partitions need the compose testnet (slowmo-testnet partition / \
                     chaos)"
                )),
            })
            .collect()
    }

    /// The script as the simulator plays it: base steps only, no pauses
    /// (a simulated worker is either there or dead), kills only of workers
    /// there from the start, a restart at a later step than its kill, and a
    /// partition of all the workers, alone in its script.
    pub fn for_simulator(&self) -> Result<SimScript, String> {
        let step = |t: Trigger, s: &Statement| match t {
            Trigger::Step(n) => Ok(n),
            Trigger::Seconds(_) => Err(format!(
                "`{s}`: the simulator plays faults at base steps (`@40`), not seconds"
            )),
        };
        let mut faults = Vec::new();
        let mut killed_at: HashMap<usize, u64> = HashMap::new();
        for s in &self.statements {
            faults.push(match s {
                Statement::Partition(p) => {
                    let mut all: Vec<usize> = p.sides.concat();
                    all.sort_unstable();
                    if all != (0..self.nodes).collect::<Vec<_>>() {
                        return Err(format!(
                            "`{s}`: the simulator's partition sides cover all {} workers",
                            self.nodes
                        ));
                    }
                    if self.statements.len() > 1 {
                        return Err(format!(
                            "`{s}`: the simulator plays a partition alone, not with other \
                             faults in one script"
                        ));
                    }
                    SimFault::Partition {
                        sides: p.sides.clone(),
                        from: step(p.from, s)?,
                        until: step(p.until, s)?,
                    }
                }
                Statement::Node(f) => {
                    let at = step(f.at, s)?;
                    match f.action {
                        FaultAction::Kill if f.node >= self.nodes => {
                            return Err(format!(
                                "`{s}`: worker {} joins during the run; the simulator kills \
                                 only workers that were there from the start",
                                f.node
                            ));
                        }
                        FaultAction::Kill => {
                            killed_at.insert(f.node, at);
                            SimFault::Kill {
                                worker: f.node,
                                step: at,
                            }
                        }
                        FaultAction::Restart => {
                            let k = killed_at.remove(&f.node).unwrap_or(0);
                            if at <= k {
                                return Err(format!(
                                    "`{s}`: a restart comes at a later step than the kill \
                                     (step {k})"
                                ));
                            }
                            SimFault::Restart {
                                worker: f.node,
                                step: at,
                            }
                        }
                        FaultAction::Join => SimFault::Join {
                            worker: f.node,
                            step: at,
                        },
                        FaultAction::Pause | FaultAction::Resume => {
                            return Err(format!(
                                "`{s}`: the simulator cannot pause a worker (a simulated \
                                 worker is there or dead); `slowmo-testnet local` plays pauses"
                            ));
                        }
                    }
                }
            });
        }
        Ok(SimScript { faults })
    }
}

fn check_partition(p: &NetworkPartition, known: usize) -> Result<(), String> {
    if p.sides.len() != 2 {
        return Err(format!("a partition has two sides, not {}", p.sides.len()));
    }
    if let Some(&w) = p.sides.iter().flatten().find(|&&w| w >= known) {
        return Err(format!("there is no node {w} in {known} nodes"));
    }
    let mut all: Vec<usize> = p.sides.concat();
    all.sort_unstable();
    let n = all.len();
    all.dedup();
    if all.len() != n {
        return Err("partition sides must be disjoint".into());
    }
    let empty = match (p.from, p.until) {
        (Trigger::Step(a), Trigger::Step(b)) => a >= b,
        (Trigger::Seconds(a), Trigger::Seconds(b)) => a >= b,
        _ => return Err("a partition's window is in steps or in seconds, not both".into()),
    };
    if empty {
        return Err(format!("partition window {}..{} is empty", p.from, p.until));
    }
    Ok(())
}

/// One fault as the simulator plays it (steps are base steps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimFault {
    Kill {
        worker: usize,
        step: u64,
    },
    Restart {
        worker: usize,
        step: u64,
    },
    /// A worker that was not there at the start (its id counts on from
    /// the run's workers) asks to join; it is admitted like a restart.
    Join {
        worker: usize,
        step: u64,
    },
    Partition {
        sides: Vec<Vec<usize>>,
        from: u64,
        until: u64,
    },
}

/// The faults of a simulated run, in the order written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimScript {
    pub faults: Vec<SimFault>,
}

impl SimScript {
    /// Parses `text` for a run of `workers` and takes the simulator's part
    /// ([`FaultScript::for_simulator`]).
    pub fn parse(text: &str, workers: usize) -> Result<Self, String> {
        FaultScript::parse(text, workers)?.for_simulator()
    }

    /// Workers that take part only from a restart or a join.
    pub fn joiners(&self) -> Vec<usize> {
        self.faults
            .iter()
            .filter_map(|f| match f {
                SimFault::Restart { worker, .. } | SimFault::Join { worker, .. } => Some(*worker),
                _ => None,
            })
            .collect()
    }
}

impl fmt::Display for SimScript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |s: &[usize]| {
            s.iter()
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let parts: Vec<String> = self
            .faults
            .iter()
            .map(|x| match x {
                SimFault::Kill { worker, step } => format!("kill {worker}@{step}"),
                SimFault::Restart { worker, step } => format!("restart {worker}@{step}"),
                SimFault::Join { worker, step } => format!("join {worker}@{step}"),
                SimFault::Partition { sides, from, until } => format!(
                    "partition {}|{}@{from}..{until}",
                    side(&sides[0]),
                    side(&sides[1])
                ),
            })
            .collect();
        write!(f, "{}", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(action: FaultAction, node: usize, at: Trigger) -> Statement {
        Statement::Node(ScriptedFault { action, node, at })
    }

    #[test]
    fn scripts_parse_with_seconds_steps_and_partitions() {
        let s = FaultScript::parse(
            "kill 2@5s; restart node-2@12.5s\n# note\npause 1@40\nresume 1@60; \
             partition 0-1|2,3@5..9",
            4,
        )
        .unwrap();
        assert_eq!(
            s.statements,
            vec![
                node(FaultAction::Kill, 2, Trigger::Seconds(5.0)),
                node(FaultAction::Restart, 2, Trigger::Seconds(12.5)),
                node(FaultAction::Pause, 1, Trigger::Step(40)),
                node(FaultAction::Resume, 1, Trigger::Step(60)),
                Statement::Partition(NetworkPartition {
                    sides: vec![vec![0, 1], vec![2, 3]],
                    from: Trigger::Step(5),
                    until: Trigger::Step(9),
                }),
            ]
        );
        assert_eq!(
            s.to_string(),
            "kill 2@5s; restart 2@12.5s; pause 1@40; resume 1@60; partition 0,1|2,3@5..9"
        );
        assert_eq!(FaultScript::parse(" ; \n", 4).unwrap().statements, vec![]);
    }

    #[test]
    fn bad_scripts_are_refused_with_the_statement_and_the_reason() {
        for (script, needle) in [
            ("kill 4@5s", "no node 4 in 4 nodes"),
            ("kill x@5s", "node `x` is not a number"),
            ("kill 1", "no `@WHEN`"),
            ("kill 1@soon", "`soon` is not a step"),
            ("kill 1@-3s", "not a time"),
            ("kill 1@0", "step 0"),
            ("restart 1@5s", "needs an earlier `kill 1@...`"),
            ("kill 1@5s; kill 1@6s", "already down"),
            ("resume 2@9", "needs an earlier `pause 2@...`"),
            ("explode 1@5s", "unknown fault `explode`"),
            ("join 2@5", "started at the beginning"),
            ("join 5@5", "join 4 first"),
            ("join 4@5; join 4@9", "already joined"),
            ("kill 4@5", "earlier `join 4@...`"),
            ("kill 4@5; join 4@9", "earlier `join 4@...`"),
            ("join 4@5; restart 4@9", "needs an earlier `kill 4@...`"),
            ("join 99@5", "at most 64"),
            ("partition 0-1|1-3@5..9", "disjoint"),
            ("partition 0-1|2-3@9..5", "empty"),
            ("partition 0-1|2-4@5..9", "no node 4"),
            ("partition 0|1|2@5..9", "two sides"),
            ("partition 0-1|2-3@5", "`@FROM..UNTIL`"),
            ("partition 0-1|2-3@5..9s", "not both"),
            ("partition 3-1|0@5..9", "runs backwards"),
        ] {
            let e = FaultScript::parse(script, 4).unwrap_err();
            let stmt = script.rsplit(';').next().unwrap().trim();
            assert!(e.contains(needle), "{script}: {e}");
            assert!(e.contains(&format!("`{}", &stmt[..4])), "{script}: {e}");
        }
    }

    #[test]
    fn joined_nodes_count_on_from_the_first_ones() {
        let s = FaultScript::parse("join 4@300; join 5@20s; kill 4@500; restart 4@600", 4).unwrap();
        let f = s.for_processes().unwrap();
        assert_eq!(f.len(), 4);
        assert_eq!(
            f[0],
            ScriptedFault {
                action: FaultAction::Join,
                node: 4,
                at: Trigger::Step(300)
            }
        );
        assert_eq!(f[1].to_string(), "join 5@20s");
        assert_eq!(f[2].action, FaultAction::Kill);
    }

    #[test]
    fn each_player_refuses_what_it_cannot_play_by_name() {
        let procs = |t: &str| FaultScript::parse(t, 8).unwrap().for_processes();
        let sim = |t: &str| SimScript::parse(t, 8);
        let e = procs("kill 1@5; partition 0-3|4-7@10..20").unwrap_err();
        assert!(
            e.contains("`partition 0,1,2,3|4,5,6,7@10..20`") && e.contains("compose"),
            "{e}"
        );
        for (script, needle) in [
            ("kill 1@5s", "base steps"),
            ("pause 1@5; resume 1@9", "cannot pause"),
            (
                "join 8@10; kill 8@20",
                "only workers that were there from the start",
            ),
            ("kill 1@20; restart 1@20", "later step than the kill"),
            ("partition 0-2|3-6@10..20", "cover all 8"),
            ("kill 1@5; partition 0-3|4-7@10..20", "alone"),
        ] {
            let e = sim(script).unwrap_err();
            assert!(e.contains(needle), "{script}: {e}");
        }
        let ok = sim("kill 3@200; restart 3@400; join 8@500").unwrap();
        assert_eq!(ok.to_string(), "kill 3@200; restart 3@400; join 8@500");
        assert_eq!(ok.joiners(), vec![3, 8]);
        assert_eq!(
            sim("partition 0-3|4-7@300..500").unwrap().faults,
            vec![SimFault::Partition {
                sides: vec![(0..4).collect(), (4..8).collect()],
                from: 300,
                until: 500
            }]
        );
    }
}
