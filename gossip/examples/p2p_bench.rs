//! Runs the network benchmarks of `slowmo bench` without the rest of the
//! node (same code: node/src/bench_cmd.rs).
//!
//! ```text
//! cargo run --release -p slowmo-gossip --example p2p_bench -- transport --sizes-mib 4,64,256
//! cargo run --release -p slowmo-gossip --example p2p_bench -- allreduce --nodes 4 --floats 10000000
//! ```

#[path = "../../node/src/bench_cmd.rs"]
mod bench_cmd;

use clap::Parser;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    bench: bench_cmd::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    bench_cmd::run(Cli::parse().bench)
}
