//! The slowmo node: configuration, models, data, the training loop, metrics.

pub mod data;
pub mod model;
pub mod topology_cmd;
