//! Scripted faults of `slowmo-testnet local --faults`:
//!
//! ```text
//! kill 2@5s; restart 2@12s; pause 1@40; resume 1@60
//! ```
//! Statements are separated by `;` or new lines (`#` starts a comment
//! line). `@Ns` is N seconds (decimals allowed) after the nodes were
//! started; a bare `@N` is when the run reaches base step N (the highest
//! step any running node's metrics show), as in `slowmo simulate --faults`.
//! - `kill I`: SIGKILL node I.
//! - `restart I`: start node I again, with its identity and command (a
//!   node that is running is left alone); its log is appended to, its
//!   earlier metrics and summary are kept as `metrics.K.jsonl` and
//!   `summary.K.json`.
//! - `pause I` / `resume I`: SIGSTOP / SIGCONT node I (slow, not dead).
//! - `join I`: start a new node of the run (a new identity, not a restart)
//!   that was not started at the beginning: I counts on from `--nodes`
//!   (`join 8@300` in a run of 8 nodes starts node-8 when the run reaches
//!   step 300; a second one is `join 9`). It runs the others' command and
//!   run configuration, bootstraps through the live nodes, finds the run
//!   under way and asks to be admitted at the members' next barrier. After
//!   its join it can be killed, restarted or paused like the others.
//!
//! Partitions need network namespaces: they are the compose testnet's
//! (`slowmo-testnet partition`, `slowmo-testnet chaos`).

use std::fmt;

/// What a scripted fault does.
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
            Trigger::Step(s) => write!(f, "step {s}"),
        }
    }
}

/// One scripted fault.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedFault {
    pub action: FaultAction,
    pub node: usize,
    pub at: Trigger,
}

impl fmt::Display for ScriptedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = match self.at {
            Trigger::Seconds(s) => format!("{s}s"),
            Trigger::Step(s) => s.to_string(),
        };
        write!(f, "{} {}@{at}", self.action.name(), self.node)
    }
}

/// Largest number of nodes a script may add with `join`.
pub const MAX_JOINS: usize = 64;

/// Parses a fault script for a run of `nodes` nodes and checks it: every
/// node exists (one of the `nodes` started at the beginning, or one added
/// by an earlier `join`), joined nodes count on from `nodes` without gaps,
/// a restart follows a kill of the same node and a resume a pause (in the
/// order written).
pub fn parse_script(text: &str, nodes: usize) -> Result<Vec<ScriptedFault>, String> {
    let mut faults = Vec::new();
    for stmt in text.split([';', '\n']).map(str::trim) {
        if stmt.is_empty() || stmt.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("--faults `{stmt}`: {why}");
        let (verb, rest) = stmt
            .split_once(char::is_whitespace)
            .ok_or_else(|| bad("expected `kill|restart|pause|resume|join NODE@WHEN`"))?;
        let action = match verb {
            "kill" => FaultAction::Kill,
            "restart" => FaultAction::Restart,
            "pause" => FaultAction::Pause,
            "resume" => FaultAction::Resume,
            "join" => FaultAction::Join,
            "partition" | "heal" => {
                return Err(bad(
                    "partitions need the compose testnet (slowmo-testnet partition / chaos)",
                ));
            }
            other => {
                return Err(bad(&format!(
                    "unknown fault `{other}` (kill, restart, pause, resume, join)"
                )));
            }
        };
        let (node, when) = rest
            .split_once('@')
            .ok_or_else(|| bad("no `@WHEN` (`@5s` for seconds, `@40` for a step)"))?;
        let node = node.trim();
        let node: usize = node
            .strip_prefix("node-")
            .unwrap_or(node)
            .parse()
            .map_err(|_| bad(&format!("node `{node}` is not a number")))?;
        if action == FaultAction::Join {
            if node < nodes {
                return Err(bad(&format!(
                    "node {node} is one of the {nodes} started at the beginning; a joining \
                     node counts on from --nodes (`join {nodes}@...`)"
                )));
            }
            if node >= nodes + MAX_JOINS {
                return Err(bad(&format!(
                    "node {node}: a script adds at most {MAX_JOINS} nodes"
                )));
            }
        } else if node >= nodes
            && !faults
                .iter()
                .any(|f: &ScriptedFault| f.action == FaultAction::Join && f.node == node)
        {
            return Err(bad(&format!(
                "there is no node {node} in {nodes} nodes (a node added mid-run needs an \
                 earlier `join {node}@...`)"
            )));
        }
        let when = when.trim();
        let at = match when.strip_suffix('s') {
            Some(secs) => {
                let s: f64 = secs
                    .trim()
                    .parse()
                    .map_err(|_| bad(&format!("`{when}` is not a number of seconds")))?;
                if !s.is_finite() || s < 0.0 {
                    return Err(bad(&format!("`{when}` is not a time")));
                }
                Trigger::Seconds(s)
            }
            None => {
                let step: u64 = when
                    .parse()
                    .map_err(|_| bad(&format!("`{when}` is not a step (or seconds: `{when}s`)")))?;
                if step == 0 {
                    return Err(bad(
                        "step 0: the run has not begun (use `@0s` for the start)",
                    ));
                }
                Trigger::Step(step)
            }
        };
        faults.push(ScriptedFault { action, node, at });
    }
    // Per node: None (running), or the action that took it down; a node
    // still to join is down "by" its join.
    let mut down = vec![None::<FaultAction>; nodes];
    for f in &faults {
        if f.action == FaultAction::Join {
            if f.node != down.len() {
                return Err(format!(
                    "--faults `{f}`: {}",
                    if f.node < down.len() {
                        "that node has already joined".to_string()
                    } else {
                        format!(
                            "joining nodes count on without gaps: join {} first",
                            down.len()
                        )
                    }
                ));
            }
            down.push(None);
            continue;
        }
        let state = &mut down[f.node];
        let ok = match f.action {
            FaultAction::Kill => state.is_none() || *state == Some(FaultAction::Pause),
            FaultAction::Pause => state.is_none(),
            FaultAction::Restart => *state == Some(FaultAction::Kill),
            FaultAction::Resume => *state == Some(FaultAction::Pause),
            // Joins were dealt with above.
            FaultAction::Join => true,
        };
        if !ok {
            let why = match f.action {
                FaultAction::Restart => "needs an earlier `kill` of the same node",
                FaultAction::Resume => "needs an earlier `pause` of the same node",
                _ => "the node is already down at that point of the script",
            };
            return Err(format!("--faults `{f}`: {why}"));
        }
        *state = match f.action {
            FaultAction::Kill => Some(FaultAction::Kill),
            FaultAction::Pause => Some(FaultAction::Pause),
            FaultAction::Restart | FaultAction::Resume | FaultAction::Join => None,
        };
    }
    Ok(faults)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_parse_with_seconds_and_steps() {
        let f = parse_script(
            "kill 2@5s; restart node-2@12.5s\n# note\npause 1@40\nresume 1@60",
            4,
        )
        .unwrap();
        assert_eq!(
            f,
            vec![
                ScriptedFault {
                    action: FaultAction::Kill,
                    node: 2,
                    at: Trigger::Seconds(5.0)
                },
                ScriptedFault {
                    action: FaultAction::Restart,
                    node: 2,
                    at: Trigger::Seconds(12.5)
                },
                ScriptedFault {
                    action: FaultAction::Pause,
                    node: 1,
                    at: Trigger::Step(40)
                },
                ScriptedFault {
                    action: FaultAction::Resume,
                    node: 1,
                    at: Trigger::Step(60)
                },
            ]
        );
        assert_eq!(f[1].to_string(), "restart 2@12.5s");
    }

    #[test]
    fn bad_scripts_are_refused_with_the_reason() {
        for (script, needle) in [
            ("kill 4@5s", "no node 4 in 4 nodes"),
            ("kill x@5s", "node `x` is not a number"),
            ("kill 1", "no `@WHEN`"),
            ("kill 1@soon", "`soon` is not a step"),
            ("kill 1@-3s", "not a time"),
            ("kill 1@0", "step 0"),
            ("restart 1@5s", "needs an earlier `kill`"),
            ("kill 1@5s; kill 1@6s", "already down"),
            ("resume 2@9", "needs an earlier `pause`"),
            ("partition 0-1|2-3@5..9", "compose testnet"),
            ("explode 1@5s", "unknown fault `explode`"),
            ("join 2@5", "started at the beginning"),
            ("join 5@5", "join 4 first"),
            ("join 4@5; join 4@9", "already joined"),
            ("kill 4@5", "earlier `join 4@...`"),
            ("kill 4@5; join 4@9", "earlier `join 4@...`"),
            ("join 4@5; restart 4@9", "needs an earlier `kill`"),
            ("join 99@5", "at most 64"),
        ] {
            let e = parse_script(script, 4).unwrap_err();
            assert!(
                e.contains("--faults") && e.contains(needle),
                "{script}: {e}"
            );
        }
        assert_eq!(parse_script(" ; \n", 4).unwrap(), vec![]);
    }

    #[test]
    fn joined_nodes_count_on_from_the_first_ones() {
        let f = parse_script("join 4@300; join 5@20s; kill 4@500; restart 4@600", 4).unwrap();
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
}
