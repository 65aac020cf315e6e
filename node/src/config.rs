//! The run configuration: one TOML file, overridable by flags. The types
//! live in `slowmo-runspec`, shared with the testnet tools.

pub use slowmo_runspec::{ConfigArgs, ConfigError, RunConfig, TrainOptions};
