//! The study's outputs: the table as markdown, CSV and JSON, and one
//! self-contained HTML page (the table, a chart with error bars, every
//! configuration of the grid, a link to each run's own report).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use super::table::{Aggregate, StudyTable};
use crate::io::outputs::write_atomically;
use crate::io::report::{escape, markdown_table};

/// `mean +- std` of accuracies, in percent.
fn pct(mean: f64, std: f64) -> String {
    format!("{:.2} ± {:.2}", 100.0 * mean, 100.0 * std)
}

fn loss(mean: f64, std: f64) -> String {
    format!("{mean:.4} ± {std:.4}")
}

/// What every run shared, in one sentence (Local Adam's learning rate and
/// the MLP's widths only where the study has them).
pub fn caption(t: &StudyTable) -> String {
    let s = &t.settings;
    let has = |f: &dyn Fn(&super::table::Comparison) -> bool| t.comparisons.iter().any(f);
    let mut optimizers = if s.optimizer == "sgd" {
        format!("SGD lr {} (momentum {})", s.sgd_lr, s.sgd_momentum)
    } else {
        format!("inner optimizer {} lr {}", s.optimizer, s.sgd_lr)
    };
    if has(&|c| c.base == super::args::StudyBase::LocalAdam) {
        optimizers += &format!(", Local Adam lr {}", s.adam_lr);
    }
    if has(&|c| c.model == slowmo_runspec::ModelKind::Mlp) {
        optimizers += &format!(", MLP hidden {:?}", s.hidden);
    }
    format!(
        "{} simulated workers, {}, {} base steps, batch {} per worker, tau {}, {optimizers}; \
         {} seeds per row (mean ± sample std); beta chosen per row from {{{}}} by mean validation accuracy (the transformer: validation loss) on {} training samples held out \
         (training on the other {}); test figures of the exactly averaged model on the {} test samples.",
        s.workers,
        s.dataset,
        s.steps,
        s.batch_size,
        s.tau,
        s.seeds,
        s.betas
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        s.validation_samples,
        s.train_samples,
        s.test_samples
    )
}

/// The main table: per model and base, the plain base and SlowMo with the
/// chosen beta, side by side.
pub fn markdown(t: &StudyTable) -> String {
    let mut out = String::from(
        "| model | base | test acc. % (base) | test acc. % (SlowMo) | SlowMo - base (points) | train loss (base) | train loss (SlowMo) | beta (val. acc. %) |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for c in &t.comparisons {
        let cell = |a: &Option<Aggregate>, f: &dyn Fn(&Aggregate) -> String| {
            a.as_ref().map(f).unwrap_or_else(|| "-".into())
        };
        let diff = match (&c.plain, &c.slowmo) {
            (Some(p), Some(s)) => {
                format!(
                    "{:+.2}",
                    100.0 * (s.test_accuracy_mean - p.test_accuracy_mean)
                )
            }
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            c.model,
            c.base.label(),
            cell(&c.plain, &|a| pct(
                a.test_accuracy_mean,
                a.test_accuracy_std
            )),
            cell(&c.slowmo, &|a| pct(
                a.test_accuracy_mean,
                a.test_accuracy_std
            )),
            diff,
            cell(&c.plain, &|a| loss(a.train_loss_mean, a.train_loss_std)),
            cell(&c.slowmo, &|a| loss(a.train_loss_mean, a.train_loss_std)),
            cell(&c.slowmo, &|a| format!(
                "{} ({:.2})",
                a.beta.unwrap_or(0.0),
                100.0 * a.validation_accuracy_mean
            )),
        );
    }
    out
}

/// Every configuration: one row per model, base and beta, with the
/// held-out losses and the test perplexity (`exp` of the mean test loss,
/// the language model's measure).
pub fn grid_markdown(t: &StudyTable) -> String {
    let mut out = String::from(
        "| model | base | beta | seeds | validation acc. % | test acc. % | train loss | validation loss | test loss | test perplexity | chosen |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for a in &t.grid {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} |",
            a.model,
            a.base.label(),
            a.beta.map(|b| b.to_string()).unwrap_or("- (plain)".into()),
            a.seeds,
            pct(a.validation_accuracy_mean, a.validation_accuracy_std),
            pct(a.test_accuracy_mean, a.test_accuracy_std),
            loss(a.train_loss_mean, a.train_loss_std),
            loss(a.validation_loss_mean, a.validation_loss_std),
            loss(a.test_loss_mean, a.test_loss_std),
            a.test_loss_mean.exp(),
            if a.chosen { "yes" } else { "" }
        );
    }
    out
}

/// Every configuration as CSV.
pub fn csv(t: &StudyTable) -> String {
    let mut out = String::from(
        "model,base,beta,seeds,validation_accuracy_mean,validation_accuracy_std,test_accuracy_mean,test_accuracy_std,train_loss_mean,train_loss_std,validation_loss_mean,validation_loss_std,test_loss_mean,test_loss_std,chosen\n",
    );
    for a in &t.grid {
        let _ = writeln!(
            out,
            "{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{}",
            a.model,
            a.base,
            a.beta.map(|b| b.to_string()).unwrap_or_default(),
            a.seeds,
            a.validation_accuracy_mean,
            a.validation_accuracy_std,
            a.test_accuracy_mean,
            a.test_accuracy_std,
            a.train_loss_mean,
            a.train_loss_std,
            a.validation_loss_mean,
            a.validation_loss_std,
            a.test_loss_mean,
            a.test_loss_std,
            a.chosen
        );
    }
    out
}

/// Test accuracy per base, plain and SlowMo, as bars with +- std whiskers.
pub fn chart(t: &StudyTable) -> String {
    let bars: Vec<(String, &Aggregate, bool)> = t
        .comparisons
        .iter()
        .flat_map(|c| {
            let mut v = Vec::new();
            if let Some(p) = &c.plain {
                v.push((format!("{} {}", c.model, c.base.label()), p, false));
            }
            if let Some(s) = &c.slowmo {
                v.push((
                    format!(
                        "{} SlowMo-{} (beta {})",
                        c.model,
                        c.base.label(),
                        s.beta.unwrap_or(0.0)
                    ),
                    s,
                    true,
                ));
            }
            v
        })
        .collect();
    let lo = bars
        .iter()
        .map(|(_, a, _)| a.test_accuracy_mean - a.test_accuracy_std)
        .fold(f64::INFINITY, f64::min);
    let hi = bars
        .iter()
        .map(|(_, a, _)| a.test_accuracy_mean + a.test_accuracy_std)
        .fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if lo.is_finite() && hi.is_finite() {
        let pad = ((hi - lo) * 0.1).max(0.002);
        ((lo - pad).max(0.0), (hi + pad).min(1.0))
    } else {
        (0.0, 1.0)
    };
    let (left, span, bar, gap) = (260.0, 420.0, 16.0, 6.0);
    let x = |v: f64| left + span * ((v - lo) / (hi - lo).max(1e-9)).clamp(0.0, 1.0);
    let height = 70.0 + bars.len() as f64 * (bar + gap);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"10\" y=\"18\" font-size=\"14\">test accuracy, mean ± std over seeds (axis from {:.1}% to {:.1}%)</text>\n",
        100.0 * lo,
        100.0 * hi
    );
    for (i, (label, a, slow)) in bars.iter().enumerate() {
        let y = 34.0 + i as f64 * (bar + gap);
        let m = x(a.test_accuracy_mean);
        let (e0, e1) = (
            x(a.test_accuracy_mean - a.test_accuracy_std),
            x(a.test_accuracy_mean + a.test_accuracy_std),
        );
        let mid = y + bar / 2.0;
        let _ = writeln!(
            out,
            "<text x=\"10\" y=\"{:.1}\">{}</text>\
             <rect class=\"bar\" x=\"{left}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{bar}\" fill=\"{}\"/>\
             <line class=\"whisker\" x1=\"{e0:.1}\" x2=\"{e1:.1}\" y1=\"{mid:.1}\" y2=\"{mid:.1}\" stroke=\"#222\"/>\
             <line x1=\"{e0:.1}\" x2=\"{e0:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#222\"/>\
             <line x1=\"{e1:.1}\" x2=\"{e1:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#222\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            y + bar * 0.75,
            escape(label),
            m - left,
            if *slow { "#d95f02" } else { "#1b9e77" },
            y + 3.0,
            y + bar - 3.0,
            y + 3.0,
            y + bar - 3.0,
            e1 + 6.0,
            y + bar * 0.75,
            pct(a.test_accuracy_mean, a.test_accuracy_std)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The study's page.
pub fn html(t: &StudyTable) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>slowmo study: the paper's table</title>\n\
         <style>body{{font-family:sans-serif;margin:24px;color:#222;max-width:1400px}}\
         table{{border-collapse:collapse;font-size:13px;margin:8px 0}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}th{{background:#f2f2f2}}</style>\n\
         </head>\n<body>\n<h1>slowmo study: each base with and without slow momentum</h1>\n<p>{}</p>\n<h2>Table</h2>\n<div id=\"table\">{}</div>\n\
         <h2>Test accuracy</h2>\n<figure id=\"plot-accuracy\">\n{}</figure>\n<h2>Every configuration</h2>\n<div id=\"grid\">{}</div>\n<h2>Runs</h2>\n<ul>\n",
        escape(&caption(t)),
        markdown_table(&markdown(t)),
        chart(t),
        markdown_table(&grid_markdown(t))
    );
    for r in &t.runs {
        let key = super::table::Variant {
            model: r.model,
            base: r.base,
            beta: r.beta,
        }
        .key(r.seed);
        let _ = writeln!(
            out,
            "<li><a href=\"runs/{k}/report.html\">{k}</a>: validation {:.4}, test {:.4}, train loss {:.4}</li>",
            r.validation_accuracy,
            r.test_accuracy,
            r.final_train_loss,
            k = escape(&key)
        );
    }
    out.push_str("</ul>\n</body>\n</html>\n");
    out
}

/// Writes `table.md`, `table.csv`, `study.json` and `report.html` into `out`.
pub fn write_all(t: &StudyTable, out: &Path) -> anyhow::Result<()> {
    let md = format!(
        "{}\n\n{}\nEvery configuration:\n\n{}",
        caption(t),
        markdown(t),
        grid_markdown(t)
    );
    let files: [(&str, Vec<u8>); 4] = [
        ("table.md", md.into_bytes()),
        ("table.csv", csv(t).into_bytes()),
        ("study.json", serde_json::to_vec_pretty(t)?),
        ("report.html", html(t).into_bytes()),
    ];
    for (name, bytes) in files {
        let path = out.join(name);
        write_atomically(&path, &bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
