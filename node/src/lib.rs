//! The slowmo node: configuration, models, data, the training loop, metrics.
//!
//! - [`engine`]: the training loop, its elastic recovery, the simulator and
//!   the shared setup of a run (model and dataset from the configuration).
//! - [`io`]: what a run reads and writes (checkpoints, metrics, outputs,
//!   the observation endpoint, reports).
//! - [`commands`]: the subcommands of the `slowmo` binary.

pub mod commands;
pub mod config;
pub mod data;
pub mod engine;
pub mod io;
pub mod model;
