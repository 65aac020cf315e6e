//! What a run reads and writes: checkpoints, metrics, output files, the
//! observation endpoint and reports.

pub mod checkpoint;
pub mod metrics;
pub mod metrics_http;
pub mod node_outputs;
pub mod observe;
pub mod outputs;
pub mod reference_dump;
pub mod report;
