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
//! `node-I/metrics.K.jsonl` (K = 1 for its first life, ...; see
//! [`crate::life`]), because the restarted node writes its files afresh. At the end (`--duration`, or when
//! every node has exited) partitions are healed and paused nodes unfrozen;
//! killed nodes stay down.
//!
//! [`plan`] draws the schedule, [`log`] writes and reads the log, and the
//! runner (`slowmo-testnet chaos`) carries the actions out.

pub mod log;
pub mod plan;
mod run;

pub use log::{ChaosFate, LOG_FILE, fates};
pub use plan::{Action, ChaosKind, PlanConfig, Planned, Planner, parse_duration};
pub use run::{ChaosArgs, run};
