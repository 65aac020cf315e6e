//! A local run from start to end: [`super::launch`] starts the nodes,
//! [`super::play`] carries out the script and waits for the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::bail;
use slowmo_runspec::{ResultRow, results_table};

use super::args::{LocalArgs, default_out, fault_script, slowmo_binary};
use super::fates::{Outcome, fates_table};
use super::launch::Prepared;

/// Runs a local testnet to the end and writes its report; errors name the
/// nodes that failed.
pub fn run(mut args: LocalArgs) -> anyhow::Result<()> {
    let out = args.out.get_or_insert_with(default_out).clone();
    let outcome = run_nodes(&args)?;
    println!("{}", results_table(&outcome.rows));
    println!("{}", fates_table(&outcome.fates));
    if !args.no_report {
        let report = slowmo_binary(args.slowmo_bin.as_deref())
            .and_then(|bin| crate::observe::write_report(&bin, &out));
        match (report, &outcome.failure) {
            (Ok(path), _) => println!("report: {}", path.display()),
            (Err(e), None) => return Err(e),
            (Err(e), Some(_)) => eprintln!("no report written: {e:#}"),
        }
    }
    match outcome.failure {
        Some(why) => bail!("{why}; files in {}", out.display()),
        None => Ok(()),
    }
}

/// Launches the nodes, waits for them, and returns their results; fails
/// when a node did not finish (see [`Outcome::failure`]).
pub fn launch(args: &LocalArgs) -> anyhow::Result<Vec<ResultRow>> {
    let outcome = run_nodes(args)?;
    match outcome.failure {
        Some(why) => bail!("{why}:\n{}", results_table(&outcome.rows)),
        None => Ok(outcome.rows),
    }
}

/// Launches the nodes, carries out the fault script, waits until every
/// node has exited, and returns what became of each.
pub fn run_nodes(args: &LocalArgs) -> anyhow::Result<Outcome> {
    let script = fault_script(args)?;
    let run = Prepared::new(args, &script)?;
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        // A second handler cannot be installed in tests that call launch twice; that is fine.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }
    let mut nodes = run.start(args)?;
    if !args.quiet {
        println!(
            "started {} nodes ({}), files in {}",
            args.nodes,
            run.config.algorithm.base,
            run.out.display()
        );
    }
    super::play::play(&mut nodes, args, &run, script, &interrupted)
}
