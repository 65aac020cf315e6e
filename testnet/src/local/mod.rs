//! `slowmo-testnet local`: N `slowmo node` processes on 127.0.0.1.
//!
//! The first node is the bootstrap peer of the others. Every node gets its
//! own folder (identity, metrics, summary, parameters, log, checkpoints); the
//! merged run configuration is written once as `run.toml` and handed to every
//! node, so they all resolve the same settings.
//!
//! A node that exits, fails or is killed does not stop the others: its end
//! (exit status or signal, time) is recorded and the run goes on until every
//! node still running has exited. `--faults` scripts kills, restarts, pauses
//! and resumes, and new nodes joining mid-run (see [`crate::faults`]); a
//! restarted node runs the same command with the same identity, its log is
//! appended to and its earlier metrics and summary are kept as
//! `metrics.K.jsonl` and `summary.K.json` (K = 1 for its first life; see
//! [`crate::life`]). A
//! joining node (`join 4@300` in a run of 4) gets a new identity in its own
//! folder `node-4`, the others' command, and the live nodes as its bootstrap
//! peers. Every process started here is stopped again on Ctrl-C.
//!
//! Besides the nodes' folders the run folder holds `testnet.json` (run id,
//! nodes, transport: what `--resume` needs), `events.jsonl` (every start,
//! exit and scripted fault, with its time), `fates.json` and `results.md`
//! (per node: finished, failed, killed, restarted) and `results.json`.
//!
//! [`args`] holds the command line, `launch` prepares the run folder and
//! starts the nodes, `play` carries out the fault script and waits for the
//! end, `nodes` owns the processes and [`fates`] tells how each fared.

pub mod args;
pub mod fates;
mod gates;
mod launch;
mod nodes;
mod play;
mod run;

pub use args::{LocalArgs, TestnetRecord, Transport, slowmo_binary};
pub use fates::{NodeFate, Outcome, fates_table};
pub use run::{launch, run, run_nodes};
