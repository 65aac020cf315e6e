//! `slowmo topology`: analyse and compare communication graphs before
//! training over them.
//!
//! ```text
//! slowmo topology analyze --graph exponential --nodes 16 --json exp16.json
//! slowmo topology compare --graphs exponential,ring,torus --nodes 8,16,32 --csv graphs.csv --plot consensus.svg
//! ```
//! The numbers come from `slowmo_topologies::analysis` (measured push-sum
//! consensus, nalgebra singular values); this module only parses flags,
//! prints tables and writes files. New subcommands are new variants of
//! [`TopologyCommand`] plus one arm in [`run`].

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use slowmo_topologies::GraphSpec;
use slowmo_topologies::analysis::{self, Analysis, AnalysisOptions};
use slowmo_topologies::report::{self, CompareRow};

/// `slowmo topology ...`
#[derive(Debug, Clone, Args)]
pub struct TopologyArgs {
    #[command(subcommand)]
    pub command: TopologyCommand,
}

/// The `topology` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum TopologyCommand {
    /// Analyse one graph at one size: stochasticity, second singular value,
    /// measured rounds to consensus, degrees and bytes sent per round.
    Analyze(AnalyzeArgs),
    /// Compare graphs across sizes: one table row per (graph, size), with
    /// optional CSV and a plot of consensus error against rounds.
    Compare(CompareArgs),
    /// Train with the simulator over a grid of graphs, sizes and slow
    /// momentum; writes CSV and an SVG chart of accuracy and consensus.
    Sweep(Box<crate::commands::sweep::SweepArgs>),
}

/// Options shared by `analyze` and `compare`.
#[derive(Debug, Clone, Args)]
pub struct MixingArgs {
    /// Out-peers per round for the time-varying graphs (exponential,
    /// bidirectional-exponential, bipartite-exponential, linear); overrides
    /// a `,peers=` in the graph name.
    #[arg(long, value_name = "P")]
    pub peers: Option<usize>,
    /// Seed of the random graphs and of the random start vector; overrides
    /// a `,seed=` in the graph name.
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Model size in f32 values, for the bytes sent per round.
    #[arg(long, value_name = "F", default_value_t = 1_000_000)]
    pub model_floats: u64,
    /// Target relative consensus error for "rounds to consensus".
    #[arg(long, value_name = "E", default_value_t = 1e-4)]
    pub epsilon: f64,
    /// Stop measuring after this many rounds ("not reached").
    #[arg(long, value_name = "R", default_value_t = 10_000)]
    pub max_rounds: u64,
}

/// `slowmo topology analyze`
#[derive(Debug, Clone, Args)]
pub struct AnalyzeArgs {
    /// Graph name, e.g. exponential, ring, torus, random-regular:4,
    /// erdos-renyi:0.3, edges:FILE, schedule:FILE (optionally with
    /// ,peers=P / ,seed=S).
    #[arg(long, value_name = "NAME", default_value = "exponential")]
    pub graph: String,
    /// Number of nodes.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub nodes: usize,
    #[command(flatten)]
    pub mixing: MixingArgs,
    /// Also write the analysis as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// `slowmo topology compare`
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Comma-separated graph names; a `peers=` or `seed=` item applies to the
    /// graph before it (`exponential,peers=2,ring`).
    #[arg(
        long,
        value_name = "A,B,...",
        default_value = "exponential,bidirectional-exponential,ring,undirected-ring,torus,hypercube,complete"
    )]
    pub graphs: String,
    /// Comma-separated node counts.
    #[arg(
        long,
        value_name = "N,M,...",
        value_delimiter = ',',
        default_value = "8,16,32,64"
    )]
    pub nodes: Vec<usize>,
    #[command(flatten)]
    pub mixing: MixingArgs,
    /// Write one CSV row per (graph, size) to this file.
    #[arg(long, value_name = "PATH")]
    pub csv: Option<PathBuf>,
    /// Plot consensus error against rounds (log scale) to this .svg or .png
    /// file, one line per graph.
    #[arg(long, value_name = "PATH")]
    pub plot: Option<PathBuf>,
    /// Size the plot is drawn at (default: the largest of --nodes).
    #[arg(long, value_name = "N")]
    pub plot_nodes: Option<usize>,
    /// Rounds on the plot's x axis (default: until the slowest graph reaches
    /// --epsilon, at most --max-rounds).
    #[arg(long, value_name = "R")]
    pub plot_rounds: Option<u64>,
    /// Report (graph, size) pairs that do not exist (hypercube of 12, torus
    /// of a prime) as table rows instead of failing.
    #[arg(long)]
    pub skip_unsupported: bool,
}

/// Runs a `slowmo topology` subcommand.
pub fn run(args: TopologyArgs) -> Result<()> {
    match args.command {
        TopologyCommand::Analyze(a) => analyze(a),
        TopologyCommand::Compare(c) => compare(c),
        TopologyCommand::Sweep(s) => crate::commands::sweep::run(*s),
    }
}

impl MixingArgs {
    fn options(&self) -> Result<AnalysisOptions> {
        if !(self.epsilon > 0.0 && self.epsilon < 1.0) {
            bail!("--epsilon {} must be in (0, 1)", self.epsilon);
        }
        Ok(AnalysisOptions {
            epsilon: self.epsilon,
            max_rounds: self.max_rounds,
            model_floats: self.model_floats,
            start_seed: self.seed.unwrap_or(0),
        })
    }

    /// Applies --peers (to graphs that take it, unless `strict`) and --seed.
    fn apply(&self, mut spec: GraphSpec, strict: bool) -> GraphSpec {
        if let Some(p) = self.peers
            && (strict || spec.kind.takes_peers())
        {
            spec.peers = p;
        }
        if let Some(s) = self.seed {
            spec.seed = s;
        }
        spec
    }
}

fn analyze(args: AnalyzeArgs) -> Result<()> {
    let options = args.mixing.options()?;
    let spec: GraphSpec = args.graph.parse().context("--graph")?;
    let spec = args.mixing.apply(spec, true);
    let result = analysis::analyze(&spec, args.nodes, &options)
        .with_context(|| format!("--graph {spec} --nodes {}", args.nodes))?;
    print!("{}", analysis_table(&result));
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&result)?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("cannot write --json file `{}`", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn compare(args: CompareArgs) -> Result<()> {
    let options = args.mixing.options()?;
    let specs: Vec<GraphSpec> = GraphSpec::parse_list(&args.graphs)
        .context("--graphs")?
        .into_iter()
        .map(|s| args.mixing.apply(s, false))
        .collect();
    if args.nodes.is_empty() {
        bail!("--nodes needs at least one size");
    }
    let missing = report::unsupported(&specs, &args.nodes);
    if !missing.is_empty() && !args.skip_unsupported {
        let mut msg = String::from(
            "these graphs do not exist for the requested sizes (pass --skip-unsupported to list them as rows instead):",
        );
        for (spec, n, e) in &missing {
            let _ = write!(msg, "\n  {spec} with {n} nodes: {e}");
        }
        bail!(msg);
    }
    let rows = report::compare(&specs, &args.nodes, &options);
    print!("{}", compare_table(&rows));
    if let Some(path) = &args.csv {
        report::write_csv(path, &rows)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        plot(&args, &specs, &rows, &options, path)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn plot(
    args: &CompareArgs,
    specs: &[GraphSpec],
    rows: &[CompareRow],
    options: &AnalysisOptions,
    path: &std::path::Path,
) -> Result<()> {
    let nodes = args
        .plot_nodes
        .unwrap_or_else(|| args.nodes.iter().copied().max().unwrap_or(1));
    let specs: Vec<GraphSpec> = specs
        .iter()
        .filter(|s| slowmo_topologies::build(s, nodes).is_ok())
        .cloned()
        .collect();
    if specs.is_empty() {
        bail!("--plot: none of the graphs exists with {nodes} nodes; choose --plot-nodes");
    }
    let rounds = args.plot_rounds.unwrap_or_else(|| {
        rows.iter()
            .filter(|r| r.nodes == nodes)
            .filter_map(|r| r.analysis.as_ref())
            .map(|a| a.rounds_to_epsilon.unwrap_or(a.max_rounds))
            .max()
            .unwrap_or(options.max_rounds)
            .clamp(1, options.max_rounds.max(1))
    });
    let series = report::curves(&specs, nodes, rounds, options.start_seed)?;
    let title = format!("push-sum consensus error, {nodes} nodes");
    report::plot_curves(path, &title, &series)?;
    Ok(())
}

/// The human-readable report of one analysis.
pub fn analysis_table(a: &Analysis) -> String {
    let mut t = String::new();
    let mut line = |key: &str, value: String| {
        let _ = writeln!(t, "{key:<30} {value}");
    };
    line("graph", a.graph.clone());
    line("nodes", a.nodes.to_string());
    line("period (rounds)", a.period.to_string());
    line("doubly stochastic", yes_no(a.doubly_stochastic).into());
    line(
        "sigma2, one round",
        format!(
            "{:.6}  (spectral gap {:.6})",
            a.sigma2_round, a.spectral_gap_round
        ),
    );
    line(
        "sigma2, product over period",
        format!(
            "{:.6}  (spectral gap {:.6})",
            a.sigma2_period, a.spectral_gap_period
        ),
    );
    line(
        "max deviation after a period",
        format!("{:.6}", a.period_deviation),
    );
    line(
        &format!("rounds to error < {:e}", a.epsilon),
        rounds_text(a),
    );
    line("out-degree min / mean / max", degree_text(&a.out_degree));
    line("in-degree min / mean / max", degree_text(&a.in_degree));
    line(
        "message size",
        format!(
            "{} ({} floats x 4 + 8)",
            bytes(a.message_bytes as f64),
            a.model_floats
        ),
    );
    line(
        "sent per node per round",
        format!(
            "min {}, mean {}, max {}",
            bytes(a.bytes_per_round.min),
            bytes(a.bytes_per_round.mean),
            bytes(a.bytes_per_round.max)
        ),
    );
    t
}

/// The comparison table, one row per (graph, size).
pub fn compare_table(rows: &[CompareRow]) -> String {
    let width = rows.iter().map(|r| r.graph.len()).max().unwrap_or(5).max(5);
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{:<width$} {:>6} {:>6} {:>7} {:>9} {:>9} {:>10} {:>9} {:>12}",
        "graph",
        "nodes",
        "period",
        "doubly",
        "sigma2",
        "sigma2/P",
        "rounds",
        "out-deg",
        "sent/round"
    );
    for r in rows {
        match (&r.analysis, &r.error) {
            (Some(a), _) => {
                let rounds = a
                    .rounds_to_epsilon
                    .map_or_else(|| format!(">{}", a.max_rounds), |k| k.to_string());
                let _ = writeln!(
                    t,
                    "{:<width$} {:>6} {:>6} {:>7} {:>9.6} {:>9.6} {:>10} {:>9.2} {:>12}",
                    r.graph,
                    r.nodes,
                    a.period,
                    yes_no(a.doubly_stochastic),
                    a.sigma2_round,
                    a.sigma2_period,
                    rounds,
                    a.out_degree.mean,
                    bytes(a.bytes_per_round.mean)
                );
            }
            (None, error) => {
                let _ = writeln!(
                    t,
                    "{:<width$} {:>6}  unsupported: {}",
                    r.graph,
                    r.nodes,
                    error.as_deref().unwrap_or("?")
                );
            }
        }
    }
    if let Some(a) = rows.iter().find_map(|r| r.analysis.as_ref()) {
        let _ = writeln!(
            t,
            "sigma2 = one round, sigma2/P = product over one period; rounds = measured rounds to relative error < {:e} ({} floats per model)",
            a.epsilon, a.model_floats
        );
    }
    t
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn rounds_text(a: &Analysis) -> String {
    match a.rounds_to_epsilon {
        Some(k) => k.to_string(),
        None => format!(
            "not reached in {} rounds (error {:.3e})",
            a.max_rounds, a.final_error
        ),
    }
}

fn degree_text(s: &analysis::Stats) -> String {
    format!("{} / {:.2} / {}", s.min, s.mean, s.max)
}

fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = b;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        topology: TopologyArgs,
    }

    fn parse(args: &[&str]) -> TopologyArgs {
        Cli::try_parse_from(std::iter::once("topology").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .topology
    }

    #[test]
    fn analyze_writes_json() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("a.json");
        let args = parse(&[
            "analyze",
            "--graph",
            "exponential",
            "--nodes",
            "8",
            "--model-floats",
            "10",
            "--json",
            json.to_str().unwrap(),
        ]);
        run(args).unwrap();
        let a: Analysis = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(
            (a.nodes, a.period, a.rounds_to_epsilon, a.message_bytes),
            (8, 3, Some(3), 48)
        );
        let table = analysis_table(&a);
        assert!(
            table.contains("doubly stochastic              yes"),
            "{table}"
        );
    }

    #[test]
    fn unknown_graphs_and_sizes_are_errors() {
        let err = run(parse(&["analyze", "--graph", "hypercub", "--nodes", "8"])).unwrap_err();
        assert!(
            format!("{err:#}").contains("accepted: exponential"),
            "{err:#}"
        );
        let err = run(parse(&["analyze", "--graph", "hypercube", "--nodes", "12"])).unwrap_err();
        assert!(format!("{err:#}").contains("power-of-two"), "{err:#}");
        let err = run(parse(&["analyze", "--graph", "ring", "--peers", "2"])).unwrap_err();
        assert!(
            format!("{err:#}").contains("peers=2 only applies"),
            "{err:#}"
        );
        let err = run(parse(&[
            "compare",
            "--graphs",
            "ring,hypercube",
            "--nodes",
            "8,12",
        ]))
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("hypercube with 12 nodes"),
            "{err:#}"
        );
        assert!(Cli::try_parse_from(["topology", "analyze", "--nodes", "x"]).is_err());
    }

    #[test]
    fn compare_writes_csv_and_plot() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("c.csv");
        let svg = dir.path().join("c.svg");
        let args = parse(&[
            "compare",
            "--graphs",
            "exponential,ring,hypercube",
            "--nodes",
            "4,6",
            "--peers",
            "2",
            "--skip-unsupported",
            "--csv",
            csv.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
            "--max-rounds",
            "500",
        ]);
        run(args).unwrap();
        let text = std::fs::read_to_string(&csv).unwrap();
        assert_eq!(text.lines().count(), 7, "{text}");
        assert!(text.contains("\"exponential,peers=2\",4,"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("hypercube,6,") && l.contains("power-of-two")),
            "{text}"
        );
        assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    }

    #[test]
    fn byte_units() {
        assert_eq!(bytes(408.0), "408 B");
        assert_eq!(bytes(4_000_008.0), "3.81 MiB");
    }
}
