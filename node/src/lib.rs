//! The slowmo node: configuration, models, data, the training loop, metrics.
//!
//! - [`model`]: the [`model::Learner`] trait the loop trains (the built-in
//!   MLP, CNN and transformer are one; a caller's candle model can be too).
//! - [`data`]: the [`data::TrainData`] and [`data::Samples`] traits the loop
//!   reads (the built-in datasets implement them), with the loaders.
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
