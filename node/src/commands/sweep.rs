//! `slowmo topology sweep`: the simulator over a grid of graphs, sizes and
//! slow-momentum settings, with the graph analysis beside each result.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use slowmo_topologies::GraphSpec;
use slowmo_topologies::analysis::{AnalysisOptions, analyze};

use crate::config::ConfigArgs;
use crate::engine::simulate::Simulation;

/// Arguments of `slowmo topology sweep`.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// Graphs to train over, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "exponential,bidirectional-exponential,ring,torus,complete"
    )]
    pub graphs: Vec<GraphSpec>,
    /// Worker counts, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "16")]
    pub nodes: Vec<usize>,
    /// Slow momentum values, comma separated (0 is the plain base).
    #[arg(long, value_delimiter = ',', default_value = "0,0.5")]
    pub betas: Vec<f32>,
    // Training settings; the base defaults to sgp here.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Write the results as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write an SVG bar chart of final accuracy and consensus distance per run.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// One run of the sweep.
#[derive(Debug, Clone)]
pub struct SweepRow {
    pub graph: String,
    pub nodes: usize,
    pub beta: f32,
    pub spectral_gap: f64,
    pub rounds_to_consensus: Option<u64>,
    pub consensus_distance: f64,
    pub test_accuracy: f32,
    /// Held-out loss of the averaged model (the transformer's measure).
    pub test_loss: f32,
    pub train_loss: f32,
    pub wall_seconds: f64,
}

const CSV_HEADER: &str = "graph,nodes,beta,spectral_gap,rounds_to_consensus,consensus_distance,test_accuracy,test_loss,train_loss,wall_seconds";

fn csv(rows: &[SweepRow]) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{:.6},{},{:.6e},{:.4},{:.4},{:.4},{:.2}",
            r.graph,
            r.nodes,
            r.beta,
            r.spectral_gap,
            r.rounds_to_consensus
                .map(|v| v.to_string())
                .unwrap_or_default(),
            r.consensus_distance,
            r.test_accuracy,
            r.test_loss,
            r.train_loss,
            r.wall_seconds
        );
    }
    out
}

/// A plain SVG bar chart: test accuracy (bars) and consensus distance (labels) per run.
fn svg(rows: &[SweepRow]) -> String {
    let bar = 28.0;
    let gap = 10.0;
    let width = 640.0;
    let height = 60.0 + rows.len() as f64 * (bar + gap);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"10\" y=\"20\" font-size=\"14\">final test accuracy (bar) and consensus distance per graph</text>\n"
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 40.0 + i as f64 * (bar + gap);
        let w = 300.0 * f64::from(r.test_accuracy.clamp(0.0, 1.0));
        let _ = writeln!(
            out,
            "<text x=\"10\" y=\"{:.1}\">{} n={} beta={}</text>\
             <rect x=\"250\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{bar}\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{:.3} | {:.2e}</text>",
            y + bar * 0.65,
            r.graph,
            r.nodes,
            r.beta,
            if r.beta > 0.0 { "#d95f02" } else { "#1b9e77" },
            255.0 + w,
            y + bar * 0.65,
            r.test_accuracy,
            r.consensus_distance
        );
    }
    out.push_str("</svg>\n");
    out
}

/// Runs the sweep and prints a table.
pub fn run(args: SweepArgs) -> Result<()> {
    if args.graphs.is_empty() || args.nodes.is_empty() || args.betas.is_empty() {
        bail!("--graphs, --nodes and --betas each need at least one value");
    }
    let mut base = args.config.options()?;
    if base.base.is_none() && base.preset.is_none() {
        base.base = Some(slowmo_optim::Base::Sgp);
    }
    let mut rows = Vec::new();
    println!(
        "{:<28} {:>5} {:>5} {:>8} {:>8} {:>11} {:>9} {:>9} {:>8}",
        "graph", "nodes", "beta", "gap", "rounds", "consensus", "test acc", "test loss", "train"
    );
    for graph in &args.graphs {
        for &nodes in &args.nodes {
            let a = analyze(graph, nodes, &AnalysisOptions::default())
                .with_context(|| format!("analysing {graph} with {nodes} nodes"))?;
            for &beta in &args.betas {
                let mut o = base.clone();
                o.graph = Some(graph.clone());
                o.workers = Some(nodes);
                o.beta = Some(beta);
                let config = o.resolve()?;
                let s = Simulation::new(&config).run().with_context(|| {
                    format!("training over {graph} with {nodes} nodes, beta {beta}")
                })?;
                let row = SweepRow {
                    graph: graph.to_string(),
                    nodes,
                    beta,
                    spectral_gap: a.spectral_gap_period,
                    rounds_to_consensus: a.rounds_to_epsilon,
                    consensus_distance: s.consensus_distance,
                    test_accuracy: s.test_accuracy,
                    test_loss: s.test_loss,
                    train_loss: s.final_train_loss,
                    wall_seconds: s.wall_seconds,
                };
                println!(
                    "{:<28} {:>5} {:>5} {:>8.4} {:>8} {:>11.3e} {:>9.4} {:>9.4} {:>8.4}",
                    row.graph,
                    nodes,
                    beta,
                    row.spectral_gap,
                    row.rounds_to_consensus
                        .map(|v| v.to_string())
                        .unwrap_or("-".into()),
                    row.consensus_distance,
                    row.test_accuracy,
                    row.test_loss,
                    row.train_loss
                );
                rows.push(row);
            }
        }
    }
    if let Some(p) = &args.csv {
        std::fs::write(p, csv(&rows)).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.plot {
        std::fs::write(p, svg(&rows)).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_and_svg_hold_every_row() {
        let row = SweepRow {
            graph: "ring".into(),
            nodes: 4,
            beta: 0.5,
            spectral_gap: 0.25,
            rounds_to_consensus: None,
            consensus_distance: 0.01,
            test_accuracy: 0.8,
            test_loss: 0.6,
            train_loss: 0.5,
            wall_seconds: 1.0,
        };
        let text = csv(&[row.clone(), row.clone()]);
        assert_eq!(text.lines().count(), 3);
        assert!(
            text.lines()
                .nth(1)
                .unwrap()
                .starts_with("ring,4,0.5,0.250000,,")
        );
        let picture = svg(&[row]);
        assert!(picture.contains("<rect") && picture.contains("0.800"));
    }
}
