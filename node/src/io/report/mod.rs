//! `slowmo report RUN_DIR`: one self-contained HTML page with inline SVG
//! plots of a run (a `simulate` output, a `slowmo-testnet local` folder or a
//! compose results folder): loss per node against step and wall time, test
//! accuracy, consensus distance and weight spread, push-sum weights, bytes
//! per second, the step-time distribution, with markers for barriers, view
//! changes and faults; then the results table and the resolved config.

mod html;
mod load;
mod plots;

use std::path::PathBuf;

use anyhow::Context;
use slowmo_runspec::StepRecord;

pub use html::{escape, markdown_table};
pub use load::{NodeSeries, RunData, fault_steps, load};
use plots::{Chart, Line, Marker, MarkerKind};

/// Arguments of `slowmo report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The run folder.
    pub run_dir: PathBuf,
    /// Where to write the page [default: RUN_DIR/report.html].
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// Size of every plot, pixels.
const SIZE: (u32, u32) = (640, 360);
/// Steps in the loss curves' moving mean, at least.
const LOSS_WINDOW: usize = 10;
/// The step-time plot stops at this quantile (the slowest steps would
/// squeeze the rest into one corner).
const STEP_TIME_QUANTILE: f64 = 0.99;

/// Mean of the last `window` values at each point.
fn moving_mean(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len());
    let mut sum = 0.0;
    for (i, &(x, y)) in points.iter().enumerate() {
        sum += y;
        if i >= window {
            sum -= points[i - window].1;
        }
        out.push((x, sum / (i + 1).min(window) as f64));
    }
    out
}

/// Bytes per second (sent and received) over windows of about a fiftieth of
/// the run, at each window's end.
pub fn byte_rates(records: &[StepRecord]) -> Vec<(f64, f64)> {
    let (Some(first), Some(last)) = (records.first(), records.last()) else {
        return Vec::new();
    };
    let window = ((last.time - first.time) / 50.0).max(1e-3);
    let mut out = Vec::new();
    let (mut t0, mut b0) = (first.time, first.bytes_sent + first.bytes_received);
    for r in records {
        let b = r.bytes_sent + r.bytes_received;
        if r.time - t0 >= window && b >= b0 {
            out.push((r.time, (b - b0) as f64 / (r.time - t0)));
            (t0, b0) = (r.time, b);
        }
    }
    out
}

/// Seconds between consecutive records, as an empirical CDF in milliseconds.
pub fn step_time_cdf(records: &[StepRecord]) -> Vec<(f64, f64)> {
    let mut dts: Vec<f64> = records
        .windows(2)
        .filter(|w| w[1].step == w[0].step + 1)
        .map(|w| (w[1].time - w[0].time) * 1e3)
        .filter(|d| d.is_finite() && *d >= 0.0)
        .collect();
    dts.sort_by(f64::total_cmp);
    let n = dts.len() as f64;
    dts.iter()
        .enumerate()
        .map(|(i, &d)| (d, (i + 1) as f64 / n))
        .collect()
}

fn lines(
    data: &RunData,
    point: impl Fn(&StepRecord) -> Option<(f64, f64)>,
    suffix: &str,
) -> Vec<Line> {
    data.nodes
        .iter()
        .map(|n| Line {
            label: format!("{}{suffix}", n.name),
            points: n.records.iter().filter_map(&point).collect(),
        })
        .collect()
}

/// Markers on a step axis: barriers every tau steps, view changes, faults.
fn step_markers(data: &RunData) -> Vec<Marker> {
    let steps = data.steps();
    let mut out = Vec::new();
    if let Some(tau) = data.tau.filter(|t| *t > 0 && *t < steps) {
        out.extend((1..=steps / tau).map(|k| Marker {
            x: (k * tau) as f64,
            kind: MarkerKind::Barrier,
        }));
    }
    out.extend(data.view_changes.iter().map(|(_, v)| Marker {
        x: v.at_step as f64,
        kind: MarkerKind::ViewChange,
    }));
    out.extend(data.faults.iter().map(|(s, _)| Marker {
        x: *s as f64,
        kind: MarkerKind::Fault,
    }));
    out
}

/// Every plot of the report, with its caption; plots without data are left
/// out and named in the notes.
pub fn figures(data: &RunData) -> anyhow::Result<(Vec<html::Figure>, Vec<String>)> {
    let step = |r: &StepRecord| (r.step + 1) as f64;
    let markers = step_markers(data);
    let longest = data
        .nodes
        .iter()
        .map(|n| n.records.len())
        .max()
        .unwrap_or(0);
    let window = LOSS_WINDOW.max(longest / 300);
    let smooth = |ls: Vec<Line>| -> Vec<Line> {
        ls.into_iter()
            .map(|l| Line {
                points: moving_mean(&l.points, window),
                ..l
            })
            .collect()
    };
    let mut consensus = lines(data, |r| Some((step(r), r.consensus_distance?)), "");
    consensus.extend(lines(
        data,
        |r| Some((step(r), r.weight_spread?)),
        " weight spread",
    ));
    consensus.extend(lines(
        data,
        |r| Some((step(r), r.average_residual_norm?)),
        " average residual",
    ));
    let specs: Vec<(&'static str, Chart, String)> = vec![
        (
            "loss-step",
            Chart {
                title: "Train loss per node".into(),
                x_desc: "step".into(),
                y_desc: format!("loss (mean of {window} steps)"),
                lines: smooth(lines(data, |r| Some((step(r), f64::from(r.loss))), "")),
                markers: markers.clone(),
                ..Chart::default()
            },
            "Mini-batch loss of each node against its step; grey lines are outer barriers, red ones view changes, purple ones faults.".into(),
        ),
        (
            "loss-time",
            Chart {
                title: "Train loss against wall time".into(),
                x_desc: "seconds since the node started".into(),
                y_desc: format!("loss (mean of {window} steps)"),
                lines: smooth(lines(data, |r| Some((r.time, f64::from(r.loss))), "")),
                ..Chart::default()
            },
            "The same losses against each node's wall clock.".into(),
        ),
        (
            "accuracy",
            Chart {
                title: "Test accuracy at evaluations".into(),
                x_desc: "step".into(),
                y_desc: "test accuracy".into(),
                lines: lines(data, |r| Some((step(r), f64::from(r.test_accuracy?))), ""),
                markers: markers.clone(),
                ..Chart::default()
            },
            "Mean over nodes of their test accuracy at each intermediate evaluation (each node's own with background gossip).".into(),
        ),
        (
            "consensus",
            Chart {
                title: "Consensus distance and weight spread".into(),
                x_desc: "step".into(),
                y_desc: "log scale".into(),
                log_y: true,
                lines: consensus,
                markers: markers.clone(),
            },
            "Mean ||z_i - z_bar|| over nodes at barriers and evaluations, the standard deviation of the push-sum weights at evaluations, and (with --compress-average) each node's ||e||, what its compressed averages kept back.".into(),
        ),
        (
            "weight",
            Chart {
                title: "Push-sum weight per node".into(),
                x_desc: "step".into(),
                y_desc: "weight".into(),
                lines: lines(data, |r| Some((step(r), r.weight)), ""),
                markers: markers.clone(),
                ..Chart::default()
            },
            "Each node's push-sum weight after its step (1 without push-sum).".into(),
        ),
        (
            "bandwidth",
            Chart {
                title: "Traffic per node".into(),
                x_desc: "seconds since the node started".into(),
                y_desc: "MB/s sent + received".into(),
                lines: data
                    .nodes
                    .iter()
                    .map(|n| Line {
                        label: n.name.clone(),
                        points: byte_rates(&n.records)
                            .into_iter()
                            .map(|(t, b)| (t, b / 1e6))
                            .collect(),
                    })
                    .collect(),
                ..Chart::default()
            },
            "Tensor bytes sent and received per second, over windows of a fiftieth of the run.".into(),
        ),
        (
            "step-time",
            Chart {
                title: "Step time distribution".into(),
                x_desc: "milliseconds per step (waits included)".into(),
                y_desc: "fraction of steps at most this long".into(),
                lines: data
                    .nodes
                    .iter()
                    .map(|n| Line {
                        label: n.name.clone(),
                        points: step_time_cdf(&n.records)
                            .into_iter()
                            .take_while(|p| p.1 <= STEP_TIME_QUANTILE)
                            .collect(),
                    })
                    .collect(),
                ..Chart::default()
            },
            "Empirical distribution of the wall time between consecutive steps of each node, up to its 99th percentile.".into(),
        ),
    ];
    let mut figures = Vec::new();
    let mut notes = Vec::new();
    for (id, chart, caption) in specs {
        match plots::render(&chart, SIZE).map_err(|e| anyhow::anyhow!("plot {id}: {e}"))? {
            Some(svg) => figures.push(html::Figure { id, caption, svg }),
            None => notes.push(format!("{}: nothing recorded.", chart.title)),
        }
    }
    Ok((figures, notes))
}

/// Writes the report of `data` to `path`.
pub fn write(data: &RunData, path: &std::path::Path) -> anyhow::Result<()> {
    let (figures, notes) = figures(data)?;
    let page = html::page(data, &figures, &notes);
    std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))
}

/// `slowmo report`: writes the page and prints its path.
pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let data = load(&args.run_dir)?;
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| args.run_dir.join("report.html"));
    write(&data, &path)?;
    println!("{}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(step: u64, time: f64, bytes: u64) -> StepRecord {
        StepRecord {
            step,
            time,
            loss: 1.0,
            lr: 0.1,
            bytes_sent: bytes,
            bytes_received: bytes,
            weight: 1.0,
            gossip_rounds: 0,
            consensus_distance: None,
            weight_spread: None,
            average_residual_norm: None,
            test_accuracy: None,
            train_loss: None,
        }
    }

    #[test]
    fn rates_cdf_and_moving_mean() {
        // 1000 bytes each way per step, 10 ms per step
        let rs: Vec<StepRecord> = (0..200)
            .map(|s| record(s, s as f64 * 0.01, 1000 * s))
            .collect();
        let rates = byte_rates(&rs);
        assert!(rates.len() >= 40, "{}", rates.len());
        for (_, r) in &rates {
            assert!((r - 200_000.0).abs() < 1.0, "{r}");
        }
        let cdf = step_time_cdf(&rs);
        assert_eq!(cdf.len(), 199);
        assert!((cdf[0].0 - 10.0).abs() < 1e-6 && cdf[198].1 == 1.0);
        let m = moving_mean(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)], 2);
        assert_eq!(m, vec![(0.0, 1.0), (1.0, 2.0), (2.0, 4.0)]);
    }
}
