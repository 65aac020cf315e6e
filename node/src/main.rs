use clap::{Parser, Subcommand};

/// slowmo: decentralized training with push-sum gossip and slow momentum.
#[derive(Debug, Parser)]
#[command(name = "slowmo", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run m workers inside one process (deterministic given the seed).
    Simulate(Box<slowmo_node::commands::simulate::SimulateArgs>),
    /// Run one real peer of a run over libp2p.
    Node(Box<slowmo_node::commands::node::NodeArgs>),
    /// Serve nodes behind NATs as a relay, training nothing.
    Relay(slowmo_node::commands::relay::RelayArgs),
    /// Check what this machine's network lets a node do before a long run.
    Doctor(slowmo_node::commands::doctor::DoctorArgs),
    /// Admission to a run: run keys, invitations, peer ids.
    Run(slowmo_node::commands::run::RunArgs),
    /// Analyse and compare communication graphs, and sweep training over them.
    Topology(slowmo_node::commands::topology::TopologyArgs),
    /// Measure the simulator's overhead, transport throughput and all-reduce.
    Bench(slowmo_node::commands::bench::BenchArgs),
    /// Write an HTML report with plots of a run folder.
    Report(slowmo_node::io::report::ReportArgs),
    /// Studies over many simulated runs: the paper's table with error bars.
    Study(slowmo_node::commands::study::StudyArgs),
}

/// Sets candle's compute threads unless the user chose already. Many
/// simulated workers (or several nodes) share few cores; oversubscription
/// costs more than it gains.
fn set_compute_threads(threads: usize) {
    for var in ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"] {
        if std::env::var_os(var).is_none() {
            // SAFETY: called in main before any thread exists.
            unsafe { std::env::set_var(var, threads.to_string()) };
        }
    }
}

/// The command line, with the training flags that mean nothing to a node
/// hidden from `slowmo node --help` (it is given `--nodes`; `--workers`
/// still works there, as in a shared config file).
fn parse_cli() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let command =
        Cli::command().mut_subcommand("node", |node| node.mut_arg("workers", |a| a.hide(true)));
    let matches = command.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> std::process::ExitCode {
    // before any thread exists: it changes a process-wide allocator setting
    slowmo_node::model::tune_malloc_for_training();
    let cli = parse_cli();
    match &cli.command {
        Command::Simulate(_) => set_compute_threads(1),
        Command::Topology(_)
        | Command::Bench(_)
        | Command::Report(_)
        | Command::Run(_)
        | Command::Relay(_)
        | Command::Doctor(_)
        | Command::Study(_) => set_compute_threads(1),
        Command::Node(args) => {
            if let Some(n) = args.threads {
                set_compute_threads(n.max(1));
            }
        }
    }
    // Benchmarks print tables on stdout; their logs stay on stderr, and
    // only warnings unless RUST_LOG asks for more.
    let default_level = match cli.command {
        Command::Bench(_) => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        // Colour only for a terminal: a log file (a testnet's node.log, a
        // redirect) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Simulate(args) => slowmo_node::commands::simulate::run(*args),
        Command::Node(args) => slowmo_node::commands::node::run(*args),
        Command::Run(args) => slowmo_node::commands::run::run(args),
        Command::Relay(args) => slowmo_node::commands::relay::run(args),
        Command::Doctor(args) => slowmo_node::commands::doctor::run(args),
        Command::Topology(args) => slowmo_node::commands::topology::run(args),
        Command::Bench(args) => slowmo_node::commands::bench::run(args),
        Command::Report(args) => slowmo_node::io::report::run(args),
        Command::Study(args) => slowmo_node::commands::study::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
