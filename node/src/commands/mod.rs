//! The subcommands of the `slowmo` binary, each with its arguments.

pub mod bench;
pub mod bench_allreduce;
pub mod bench_sim;
pub mod bench_step;
pub mod doctor;
pub mod join;
pub mod node;
pub mod relay;
pub mod run;
pub mod simulate;
pub mod study;
pub mod sweep;
pub mod topology;
