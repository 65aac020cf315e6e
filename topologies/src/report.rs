//! Comparing graphs: one [`Analysis`] per (graph, size), written as CSV, and
//! consensus-error curves plotted as SVG or PNG (log-scale error against
//! rounds).
//!
//! Plots use plotters with its pure-Rust `ab_glyph` text renderer and a
//! DejaVu Sans subset shipped in `assets/` (licence next to it), so no system
//! font library is needed at build or run time.

use std::io::Write;
use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;

use crate::analysis::{
    Analysis, AnalysisOptions, analyze_topology, build_for_analysis, consensus_curve,
};
use crate::{GraphSpec, TopologyError, build};

/// DejaVu Sans, printable ASCII subset (see `assets/DejaVuSans-LICENSE.txt`).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans-subset.ttf");

/// Errors writing a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot write `{path}`: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot draw plot `{path}`: {reason}")]
    Plot { path: String, reason: String },
    #[error("plot `{path}`: unsupported file type, expected a name ending in .svg or .png")]
    UnsupportedFormat { path: String },
    #[error("plot `{path}`: nothing to plot")]
    Empty { path: String },
}

/// One (graph, size) of a comparison: its analysis, or why the graph does not
/// exist for that size.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CompareRow {
    pub graph: String,
    pub nodes: usize,
    pub analysis: Option<Analysis>,
    pub error: Option<String>,
}

/// Every (graph, size) pair that cannot be built, with the reason; callers
/// check this first to fail fast before the slow part.
pub fn unsupported(specs: &[GraphSpec], sizes: &[usize]) -> Vec<(GraphSpec, usize, TopologyError)> {
    let mut bad = Vec::new();
    for spec in specs {
        for &n in sizes {
            if let Err(e) = build_for_analysis(spec, n) {
                bad.push((spec.clone(), n, e));
            }
        }
    }
    bad
}

/// Analyses every graph at every size (graph-major order). Pairs that cannot
/// be built become rows with `error` set.
pub fn compare(specs: &[GraphSpec], sizes: &[usize], options: &AnalysisOptions) -> Vec<CompareRow> {
    let mut rows = Vec::with_capacity(specs.len() * sizes.len());
    for spec in specs {
        let label = spec.to_string();
        for &n in sizes {
            let (analysis, error) = match build_for_analysis(spec, n) {
                Ok(g) => (Some(analyze_topology(g.as_ref(), &label, options)), None),
                Err(e) => (None, Some(e.to_string())),
            };
            rows.push(CompareRow {
                graph: label.clone(),
                nodes: n,
                analysis,
                error,
            });
        }
    }
    rows
}

/// CSV column names, in order.
pub const CSV_HEADER: &[&str] = &[
    "graph",
    "nodes",
    "period",
    "doubly_stochastic",
    "sigma2_round",
    "spectral_gap_round",
    "sigma2_period",
    "spectral_gap_period",
    "period_deviation",
    "epsilon",
    "rounds_to_epsilon",
    "final_error",
    "out_degree_min",
    "out_degree_max",
    "out_degree_mean",
    "in_degree_min",
    "in_degree_max",
    "in_degree_mean",
    "message_bytes",
    "bytes_per_round_min",
    "bytes_per_round_max",
    "bytes_per_round_mean",
    "error",
];

/// The rows as CSV (header first). `rounds_to_epsilon` is empty when not
/// reached; analysis columns are empty for a row with an error.
pub fn to_csv(rows: &[CompareRow]) -> String {
    let mut out = CSV_HEADER.join(",");
    out.push('\n');
    for row in rows {
        let mut fields = vec![csv_field(&row.graph), row.nodes.to_string()];
        match &row.analysis {
            Some(a) => fields.extend([
                a.period.to_string(),
                a.doubly_stochastic.to_string(),
                a.sigma2_round.to_string(),
                a.spectral_gap_round.to_string(),
                a.sigma2_period.to_string(),
                a.spectral_gap_period.to_string(),
                a.period_deviation.to_string(),
                a.epsilon.to_string(),
                a.rounds_to_epsilon
                    .map(|r| r.to_string())
                    .unwrap_or_default(),
                a.final_error.to_string(),
                a.out_degree.min.to_string(),
                a.out_degree.max.to_string(),
                a.out_degree.mean.to_string(),
                a.in_degree.min.to_string(),
                a.in_degree.max.to_string(),
                a.in_degree.mean.to_string(),
                a.message_bytes.to_string(),
                a.bytes_per_round.min.to_string(),
                a.bytes_per_round.max.to_string(),
                a.bytes_per_round.mean.to_string(),
            ]),
            None => fields.extend(std::iter::repeat_n(String::new(), CSV_HEADER.len() - 3)),
        }
        fields.push(csv_field(row.error.as_deref().unwrap_or("")));
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

/// Writes [`to_csv`] to `path`.
pub fn write_csv(path: &Path, rows: &[CompareRow]) -> Result<(), ReportError> {
    let io = |source| ReportError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut file = std::fs::File::create(path).map_err(io)?;
    file.write_all(to_csv(rows).as_bytes()).map_err(io)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One line of a consensus plot.
#[derive(Debug, Clone, PartialEq)]
pub struct CurveSeries {
    pub label: String,
    /// Relative error after rounds 0, 1, 2, ...
    pub errors: Vec<f64>,
}

/// Consensus curves of each graph at `nodes` ranks over `rounds` rounds,
/// from the same seeded start.
pub fn curves(
    specs: &[GraphSpec],
    nodes: usize,
    rounds: u64,
    seed: u64,
) -> Result<Vec<CurveSeries>, TopologyError> {
    specs
        .iter()
        .map(|spec| {
            let g = build(spec, nodes)?;
            Ok(CurveSeries {
                label: format!("{spec} (n={nodes})"),
                errors: consensus_curve(g.as_ref(), rounds, seed),
            })
        })
        .collect()
}

/// Distinct qualitative line colours, cycled.
pub const LINE_COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Errors below this are drawn at this value (the log axis cannot show 0).
pub const PLOT_FLOOR: f64 = 1e-16;

/// Makes the shipped font plotters' `sans-serif` (once per process).
pub fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TrueType font (checked by a test); a failure
        // here would only lose text, so it is not propagated.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// Draws the curves (log-y error against rounds) to `path`: SVG when it ends
/// in `.svg`, PNG when it ends in `.png`.
pub fn plot_curves(path: &Path, title: &str, series: &[CurveSeries]) -> Result<(), ReportError> {
    let name = path.display().to_string();
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if series.iter().all(|s| s.errors.is_empty()) {
        return Err(ReportError::Empty { path: name });
    }
    register_font();
    let size = (960, 640);
    let result = match ext.as_deref() {
        Some("svg") => draw(
            SVGBackend::new(path, size).into_drawing_area(),
            title,
            series,
        ),
        Some("png") => draw(
            BitMapBackend::new(path, size).into_drawing_area(),
            title,
            series,
        ),
        _ => return Err(ReportError::UnsupportedFormat { path: name }),
    };
    result.map_err(|reason| ReportError::Plot { path: name, reason })
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    series: &[CurveSeries],
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let rounds = series
        .iter()
        .map(|s| s.errors.len())
        .max()
        .unwrap_or(1)
        .max(2) as u64
        - 1;
    let clamp = |v: f64| {
        if v.is_finite() {
            v.max(PLOT_FLOOR)
        } else {
            1.0
        }
    };
    let all = series
        .iter()
        .flat_map(|s| s.errors.iter().copied().map(clamp));
    let (lo, hi) = all.fold((1.0f64, 1.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(0..rounds, (lo * 0.5..hi * 1.5).log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .x_desc("round")
        .y_desc("consensus error (relative)")
        .y_label_formatter(&|v| format!("{v:.0e}"))
        .draw()
        .map_err(|e| err(&e))?;
    for (index, s) in series.iter().enumerate() {
        let color = LINE_COLORS[index % LINE_COLORS.len()];
        let points = s
            .errors
            .iter()
            .enumerate()
            .map(|(k, &v)| (k as u64, clamp(v)));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GraphKind;

    /// Splits one CSV line, honouring double quotes.
    fn split_csv(line: &str) -> Vec<String> {
        let (mut fields, mut field, mut quoted) = (Vec::new(), String::new(), false);
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '"' if quoted && chars.peek() == Some(&'"') => {
                    field.push('"');
                    chars.next();
                }
                '"' => quoted = !quoted,
                ',' if !quoted => fields.push(std::mem::take(&mut field)),
                _ => field.push(c),
            }
        }
        fields.push(field);
        fields
    }

    #[test]
    fn shipped_font_parses() {
        assert!(plotters::style::register_font("slowmo-test", FontStyle::Normal, FONT).is_ok());
    }

    #[test]
    fn compare_rows_and_csv() {
        let specs = GraphSpec::parse_list("hypercube,exponential,peers=2").unwrap();
        let options = AnalysisOptions {
            max_rounds: 200,
            ..AnalysisOptions::default()
        };
        let rows = compare(&specs, &[8, 12], &options);
        assert_eq!(rows.len(), 4);
        assert!(rows[1].error.as_deref().unwrap().contains("power-of-two"));
        // static hypercube with uniform weights: eigenvalues (1 + 3 - 2m) / 4
        let cube = rows[0].analysis.as_ref().unwrap();
        assert!((cube.sigma2_round - 0.5).abs() < 1e-12);
        assert!(matches!(cube.rounds_to_epsilon, Some(10..=15)), "{cube:?}");
        let csv = to_csv(&rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(lines[0].starts_with("graph,nodes,period,"));
        assert!(
            lines[3].starts_with("\"exponential,peers=2\",8,"),
            "{}",
            lines[3]
        );
        for line in &lines[1..] {
            assert_eq!(split_csv(line).len(), CSV_HEADER.len(), "{line}");
        }
        let error_row = split_csv(lines[2]);
        assert_eq!(&error_row[..3], &["hypercube", "12", ""]);
        assert!(
            error_row[CSV_HEADER.len() - 1].starts_with("graph `hypercube` cannot have 12 nodes")
        );
        let ok_row = split_csv(lines[3]);
        assert_eq!(&ok_row[..2], &["exponential,peers=2", "8"]);
        assert_eq!(ok_row[CSV_HEADER.len() - 1], "");
        let bad = unsupported(&specs, &[8, 12]);
        assert_eq!(bad.len(), 1);
        assert_eq!(
            (bad[0].0.kind.clone(), bad[0].1),
            (GraphKind::Hypercube, 12)
        );
    }

    #[test]
    fn plots_svg_and_png() {
        let dir = tempfile::tempdir().unwrap();
        let specs = GraphSpec::parse_list("exponential,ring,complete").unwrap();
        let series = curves(&specs, 16, 40, 1).unwrap();
        assert_eq!(series[2].errors.len(), 41);
        let svg = dir.path().join("c.svg");
        plot_curves(&svg, "consensus, 16 nodes", &series).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            text.contains("<svg") && text.contains("ring (n=16)"),
            "{text:.300}"
        );
        let png = dir.path().join("c.png");
        plot_curves(&png, "consensus", &series).unwrap();
        assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");
        let err = plot_curves(&dir.path().join("c.jpg"), "x", &series).unwrap_err();
        assert!(
            err.to_string()
                .contains("expected a name ending in .svg or .png")
        );
    }
}
