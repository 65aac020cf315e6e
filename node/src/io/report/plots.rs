//! Line charts as SVG text (plotters' SVG backend and the DejaVu subset the
//! topologies crate ships), with vertical markers for barriers, view
//! changes and faults.

use plotters::prelude::*;
use slowmo_topologies::report::{LINE_COLORS, register_font};

/// Points drawn per line at most; longer lines are thinned evenly.
const MAX_POINTS: usize = 1500;
/// Legend entries at most; further lines are drawn without one.
const MAX_LEGEND: usize = 12;
/// Barrier markers are left out when there are more (they would hide the lines).
const MAX_BARRIERS: usize = 150;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// What a vertical marker stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    Barrier,
    ViewChange,
    Fault,
}

/// A vertical line at `x`.
#[derive(Debug, Clone)]
pub struct Marker {
    pub x: f64,
    pub kind: MarkerKind,
}

/// A chart to draw.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    /// Logarithmic y axis (values <= 0 are left out).
    pub log_y: bool,
    pub lines: Vec<Line>,
    pub markers: Vec<Marker>,
}

fn thin(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    if points.len() <= MAX_POINTS {
        return points.to_vec();
    }
    let stride = points.len().div_ceil(MAX_POINTS);
    let mut out: Vec<(f64, f64)> = points.iter().step_by(stride).copied().collect();
    if let Some(last) = points.last()
        && out.last() != Some(last)
    {
        out.push(*last);
    }
    out
}

/// Tick labels with as many decimals as a tenth of `range` needs.
fn tick_format(range: f64) -> impl Fn(&f64) -> String {
    let step = range / 10.0;
    let decimals = if step > 0.0 && step.is_finite() {
        (-step.log10().floor()).clamp(0.0, 6.0) as usize
    } else {
        0
    };
    move |v: &f64| {
        if v.abs() >= 1e6 {
            format!("{v:.2e}")
        } else {
            format!("{v:.decimals$}")
        }
    }
}

fn span(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// A range with some room, never empty.
fn padded((lo, hi): (f64, f64), frac: f64) -> (f64, f64) {
    if hi - lo < 1e-12 {
        let pad = if lo.abs() > 1e-12 {
            lo.abs() * 0.1
        } else {
            1.0
        };
        return (lo - pad, hi + pad);
    }
    let pad = (hi - lo) * frac;
    (lo - pad, hi + pad)
}

/// The chart as one `<svg>` element; `None` when no line has a point.
pub fn render(chart: &Chart, size: (u32, u32)) -> Result<Option<String>, String> {
    // a log axis cannot show zeros: all-zero values get a linear one
    let any_positive = chart
        .lines
        .iter()
        .flat_map(|l| &l.points)
        .any(|p| p.1 > 0.0);
    let chart = &Chart {
        log_y: chart.log_y && any_positive,
        ..chart.clone()
    };
    let ty = |y: f64| {
        if chart.log_y {
            (y > 0.0).then(|| y.log10())
        } else {
            Some(y)
        }
    };
    let lines: Vec<(String, Vec<(f64, f64)>)> = chart
        .lines
        .iter()
        .map(|l| {
            let pts: Vec<(f64, f64)> = l
                .points
                .iter()
                .filter_map(|&(x, y)| Some((x, ty(y)?)))
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            (l.label.clone(), thin(&pts))
        })
        .filter(|(_, p)| !p.is_empty())
        .collect();
    let Some(xs) = span(lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.0))) else {
        return Ok(None);
    };
    let ys = span(lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.1))).unwrap_or((0.0, 1.0));
    let (x0, x1) = padded(xs, 0.01);
    let (y0, y1) = padded(ys, 0.05);
    register_font();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(&root, chart, &lines, (x0, x1), (y0, y1)).map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(Some(svg))
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    chart: &Chart,
    lines: &[(String, Vec<(f64, f64)>)],
    (x0, x1): (f64, f64),
    (y0, y1): (f64, f64),
) -> Result<(), Box<dyn std::error::Error + 'static>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(root)
        .caption(&chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    let log = chart.log_y;
    let y_plain = tick_format(y1 - y0);
    // mantissa digits enough to tell ticks apart within the decades shown
    let digits = match y1 - y0 {
        r if r >= 2.0 => 0,
        r if r >= 0.3 => 1,
        r if r >= 0.03 => 2,
        _ => 3,
    };
    let y_fmt = move |v: &f64| {
        if log {
            format!("{:.digits$e}", 10f64.powf(*v))
        } else {
            y_plain(v)
        }
    };
    let x_fmt = tick_format(x1 - x0);
    c.configure_mesh()
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .x_desc(chart.x_desc.as_str())
        .y_desc(chart.y_desc.as_str())
        .y_label_formatter(&y_fmt)
        .x_label_formatter(&x_fmt)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let barriers = chart
        .markers
        .iter()
        .filter(|m| m.kind == MarkerKind::Barrier)
        .count();
    let mut labelled = [false; 3];
    for m in &chart.markers {
        if !(x0..=x1).contains(&m.x) || (m.kind == MarkerKind::Barrier && barriers > MAX_BARRIERS) {
            continue;
        }
        let (style, name, slot) = match m.kind {
            MarkerKind::Barrier => (RGBColor(190, 190, 190).stroke_width(1), "barrier", 0),
            MarkerKind::ViewChange => (RGBColor(220, 30, 30).stroke_width(2), "view change", 1),
            MarkerKind::Fault => (RGBColor(120, 40, 170).stroke_width(2), "fault", 2),
        };
        let series = c.draw_series(std::iter::once(PathElement::new(
            vec![(m.x, y0), (m.x, y1)],
            style,
        )))?;
        if !labelled[slot] {
            labelled[slot] = true;
            series
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y - 6), (x, y + 6)], style));
        }
    }
    for (i, (label, points)) in lines.iter().enumerate() {
        let color = LINE_COLORS[i % LINE_COLORS.len()];
        let style = color.stroke_width(if points.len() > 1 { 1 } else { 3 });
        let series = if points.len() > 1 {
            c.draw_series(LineSeries::new(points.iter().copied(), style))?
        } else {
            c.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?
        };
        if i < MAX_LEGEND {
            series.label(label.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        }
    }
    c.configure_series_labels()
        .label_font(("sans-serif", 12))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_have_the_decimals_their_range_needs() {
        assert_eq!(tick_format(0.6)(&0.25), "0.25");
        assert_eq!(tick_format(300.0)(&250.0), "250");
        assert_eq!(tick_format(0.004)(&0.0015), "0.0015");
        assert_eq!(tick_format(5e7)(&2.5e7), "2.50e7");
    }

    #[test]
    fn draws_lines_and_markers_as_svg() {
        let chart = Chart {
            title: "loss".into(),
            x_desc: "step".into(),
            y_desc: "loss".into(),
            log_y: true,
            lines: vec![
                Line {
                    label: "node-0".into(),
                    points: (0..5000)
                        .map(|i| (i as f64, 1.0 / (i + 1) as f64))
                        .collect(),
                },
                Line {
                    label: "empty after log".into(),
                    points: vec![(1.0, 0.0), (2.0, -1.0)],
                },
            ],
            markers: vec![
                Marker {
                    x: 100.0,
                    kind: MarkerKind::Barrier,
                },
                Marker {
                    x: 2500.0,
                    kind: MarkerKind::ViewChange,
                },
            ],
        };
        let svg = render(&chart, (640, 360)).unwrap().unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        // the data line, thinned to at most MAX_POINTS (+ the last) points
        let data: Vec<&str> = svg
            .split("<polyline")
            .filter(|p| p.contains("stroke=\"#1F77B4\" stroke-width=\"1\""))
            .collect();
        assert_eq!(data.len(), 1);
        let points = data[0]
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let n = points.split_whitespace().count();
        assert!((1000..=MAX_POINTS + 1).contains(&n), "{n}");
        // each marker and its legend entry
        assert_eq!(svg.matches("stroke=\"#DC1E1E\"").count(), 2);
        assert_eq!(svg.matches("stroke=\"#BEBEBE\"").count(), 2);
        assert!(svg.contains("view change") && svg.contains("node-0"));
        assert!(!svg.contains("empty after log"));
        // only zeros: drawn on a linear axis
        let zeros = Chart {
            lines: vec![Line {
                label: "zeros".into(),
                points: vec![(1.0, 0.0), (2.0, 0.0)],
            }],
            ..chart.clone()
        };
        let svg = render(&zeros, (640, 360)).unwrap().unwrap();
        assert!(svg.contains("zeros"));
        let empty = Chart {
            lines: vec![],
            ..chart
        };
        assert!(render(&empty, (640, 360)).unwrap().is_none());
    }
}
