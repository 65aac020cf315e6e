//! The slowmo node: configuration, models, data, the training loop, metrics.

pub mod bench_cmd;
pub mod bench_sim;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod exchange;
pub mod metrics;
pub mod model;
pub mod node_cmd;
pub mod node_outputs;
pub mod observe;
pub mod outputs;
pub mod report;
pub mod run_cmd;
pub mod simulate;
pub mod stopping;
pub mod study;
pub mod sweep;
pub mod topology_cmd;
pub mod train;
