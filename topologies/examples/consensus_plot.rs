//! Plots push-sum consensus error against rounds for a few graphs.
//!
//! ```text
//! cargo run -p slowmo-topologies --example consensus_plot -- consensus.svg 32
//! ```

use slowmo_topologies::GraphSpec;
use slowmo_topologies::analysis::{AnalysisOptions, analyze};
use slowmo_topologies::report::{curves, plot_curves};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "consensus.svg".into());
    let nodes: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(32);
    let specs = GraphSpec::parse_list(
        "exponential,exponential,peers=2,bidirectional-exponential,undirected-ring,torus,complete",
    )?;
    let options = AnalysisOptions::default();
    for spec in &specs {
        let a = analyze(spec, nodes, &options)?;
        let rounds = a
            .rounds_to_epsilon
            .map_or("not reached".into(), |r| r.to_string());
        println!(
            "{spec:<28} sigma2 {:.4}  rounds to 1e-4: {rounds}",
            a.sigma2_round
        );
    }
    let series = curves(&specs, nodes, 60, 0)?;
    plot_curves(
        path.as_ref(),
        &format!("push-sum consensus, {nodes} nodes"),
        &series,
    )?;
    println!("wrote {path}");
    Ok(())
}
