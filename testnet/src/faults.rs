//! Scripted faults of `slowmo-testnet local --faults`:
//!
//! ```text
//! kill 2@5s; restart 2@12s; pause 1@40; resume 1@60; join 8@300
//! ```
//! The grammar is the run's, [`slowmo_runspec::faults`] (the one
//! `slowmo simulate --faults` reads); the local testnet plays its node
//! faults on processes:
//! - `kill I`: SIGKILL node I.
//! - `restart I`: start node I again, with its identity and command (a
//!   node that is running is left alone); its log is appended to, its
//!   earlier metrics and summary are kept as `metrics.K.jsonl` and
//!   `summary.K.json`.
//! - `pause I` / `resume I`: SIGSTOP / SIGCONT node I (slow, not dead).
//! - `join I`: start a new node of the run (a new identity, not a restart)
//!   that was not started at the beginning: it runs the others' command
//!   and run configuration, bootstraps through the live nodes, finds the
//!   run under way and asks to be admitted at the members' next barrier.
//!
//! Partitions need network namespaces: they are the compose testnet's
//! (`slowmo-testnet partition`, `slowmo-testnet chaos`), and a local script
//! that holds one is refused.

use slowmo_runspec::faults::FaultScript;
pub use slowmo_runspec::faults::{FaultAction, ScriptedFault, Trigger};

/// Reads `--faults ARG` (the script, or a file holding it) for a run of
/// `nodes` nodes (see [`FaultScript::parse`] for the checks) and takes its
/// node faults.
pub fn load_script(arg: &str, nodes: usize) -> Result<Vec<ScriptedFault>, String> {
    FaultScript::load(arg, nodes)
        .and_then(|s| s.for_processes())
        .map_err(|e| format!("--faults {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_testnet_refuses_partitions_and_names_the_statement() {
        let e = load_script("kill 1@5s; partition 0-1|2-3@5..9", 4).unwrap_err();
        assert!(
            e.starts_with("--faults `partition 0,1|2,3@5..9`") && e.contains("compose testnet"),
            "{e}"
        );
        let e = load_script("kill 4@5s", 4).unwrap_err();
        assert!(
            e.starts_with("--faults `kill 4@5s`: there is no node 4"),
            "{e}"
        );
        let f = load_script("kill 2@5s; restart node-2@12.5s", 4).unwrap();
        assert_eq!(f[1].to_string(), "restart 2@12.5s");
    }
}
