use clap::{Parser, Subcommand};
use slowmo_testnet::{compose, control, profile};

/// Launch and observe slowmo testnets.
#[derive(Debug, Parser)]
#[command(name = "slowmo-testnet", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// N `slowmo node` processes on 127.0.0.1.
    Local(slowmo_testnet::local::LocalArgs),
    /// Per-step wall time of a local testnet: SGP, OSGP and SlowMo-SGP
    /// against the same nodes with communication disabled.
    Bench(slowmo_testnet::bench::BenchArgs),
    /// Write the docker-compose file of an N-node testnet (to stdout or -o).
    Compose(compose::ComposeArgs),
    /// Show a heterogeneity profile (lan, wan, mixed or a TOML file) and what
    /// it gives each node; lists the built-in profiles without a name.
    Profile(profile::ProfileArgs),
    /// Start a compose testnet; with --wait, watch it to the end, collect the
    /// results and print the table.
    Up(control::UpArgs),
    /// Stop and remove a compose testnet: containers, network and volumes.
    Down(control::Target),
    /// Each node's state, step, loss and step rate.
    Status(control::Target),
    /// The nodes' logs.
    Logs(control::LogsArgs),
    /// Kill a node (SIGKILL).
    Kill(control::NodeArgs),
    /// Freeze a node (its processes stop; its peers see silence).
    Pause(control::NodeArgs),
    /// Unfreeze a paused node.
    Resume(control::NodeArgs),
    /// Cut groups of nodes off from each other, e.g. `partition 0,1`
    /// (nodes 0 and 1 against the rest).
    Partition(control::PartitionArgs),
    /// Remove every partition.
    Heal(control::Target),
    /// Random faults (kill, restart, pause, partition) on a running testnet,
    /// deterministic from --seed, logged to chaos.jsonl in the results folder.
    Chaos(slowmo_testnet::chaos::ChaosArgs),
    /// Copy every node's summary, metrics and log into a results folder and
    /// print the table.
    Collect(control::CollectArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Local(args) => slowmo_testnet::local::run(args),
        Command::Bench(args) => slowmo_testnet::bench::run(args),
        Command::Compose(args) => compose::run(args),
        Command::Profile(args) => profile::show(args),
        Command::Up(args) => control::up(args),
        Command::Down(target) => control::down(&target),
        Command::Status(target) => {
            // A table for the terminal or a pipe: a reader that goes away
            // (`status | head`) ends the program quietly, as for other
            // command-line tools, instead of a panic in println!.
            // SAFETY: called before any other thread exists; SIG_DFL is a
            // valid disposition for SIGPIPE.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            }
            control::status(&target)
        }
        Command::Logs(args) => control::logs(args),
        Command::Kill(args) => control::node_command("kill", args),
        Command::Pause(args) => control::node_command("pause", args),
        Command::Resume(args) => control::node_command("resume", args),
        Command::Partition(args) => control::partition(args),
        Command::Heal(target) => control::heal(&target),
        Command::Chaos(args) => slowmo_testnet::chaos::run(args),
        Command::Collect(args) => control::collect(args),
    }
}
