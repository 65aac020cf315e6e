//! The types of a run, shared by the `slowmo` binary and the testnet tools
//! without pulling in models or transports: the training options and how a
//! file and flags layer into one [`RunConfig`], the kind enums those options
//! name, the per-step [`StepRecord`] and per-node [`NodeSummary`] a node
//! writes, the one results table drawn from them, and the fault-script
//! grammar every player of a script parses with ([`faults`]), and the step
//! gates a harness plays step faults with exactly ([`gate`]).

mod args;
mod compression;
pub mod faults;
pub mod gate;
mod kinds;
mod limits;
mod options;
mod records;
mod resolve;
mod table;
pub mod ticket;

pub use args::ConfigArgs;
pub use compression::{Compression, CompressionError};
pub use kinds::{DatasetArg, DatasetKind, ModelKind, Partition, PartitionError, TransformerShape};
pub use limits::{
    BUFFERS_PER_WORKER, MAX_LOCAL_NODES, NODE_OVERHEAD_BYTES, Resources, WORKER_OVERHEAD_BYTES,
};
pub use options::{ConfigError, TrainOptions};
pub use records::{
    ConnectionsSummary, NodeSummary, StepRecord, ViewEvent, last_record, step_rate, step_records,
};
pub use resolve::{
    MAX_BATCH_SIZE, MAX_STALENESS, RunConfig, SettingChange, flat_settings, resume_differences,
};
pub use table::{ResultRow, human_bytes, results_table};
pub use ticket::{JoinTicket, TicketError};
