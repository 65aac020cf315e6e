use clap::{Parser, Subcommand};

/// Launch and observe slowmo testnets.
#[derive(Debug, Parser)]
#[command(name = "slowmo-testnet", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// N `slowmo node` processes on 127.0.0.1.
    Local(slowmo_testnet::local::LocalArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Local(args) => slowmo_testnet::local::run(args),
    }
}
