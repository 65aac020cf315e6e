//! The types of a run, shared by the `slowmo` binary and the testnet tools
//! without pulling in models or transports: the training options and how a
//! file and flags layer into one [`RunConfig`], the kind enums those options
//! name, the per-step [`StepRecord`] and per-node [`NodeSummary`] a node
//! writes, and the one results table drawn from them.

mod args;
mod kinds;
mod limits;
mod options;
mod records;
mod resolve;
mod table;

pub use args::ConfigArgs;
pub use kinds::{DatasetKind, ModelKind, Partition, PartitionError};
pub use limits::{
    BUFFERS_PER_WORKER, MAX_LOCAL_NODES, NODE_OVERHEAD_BYTES, Resources, WORKER_OVERHEAD_BYTES,
};
pub use options::{ConfigError, TrainOptions};
pub use records::{NodeSummary, StepRecord, ViewEvent, last_record, step_rate, step_records};
pub use resolve::{MAX_BATCH_SIZE, MAX_STALENESS, RunConfig};
pub use table::{ResultRow, human_bytes, results_table};
