//! The report page: one self-contained HTML file (inline SVG, inline CSS,
//! no scripts, nothing fetched).

use std::fmt::Write as _;

use super::load::RunData;

/// Escapes text for HTML.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The markdown tables in `md` (blocks of `| a | b |` lines, the second
/// line of each a separator) as HTML tables, one per block; other lines
/// (a table's caption, blank lines) end a block.
pub fn markdown_table(md: &str) -> String {
    let mut blocks: Vec<Vec<Vec<String>>> = Vec::new();
    let mut open = false;
    for line in md.lines().map(str::trim) {
        if !line.starts_with('|') {
            open = false;
            continue;
        }
        let cells = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect();
        if !open {
            blocks.push(Vec::new());
            open = true;
        }
        blocks.last_mut().expect("pushed").push(cells);
    }
    let mut out = String::new();
    for rows in blocks {
        out.push_str("<table>\n");
        for (i, row) in rows.iter().enumerate() {
            if i == 1 && row.iter().all(|c| c.chars().all(|ch| "-: ".contains(ch))) {
                continue;
            }
            let tag = if i == 0 { "th" } else { "td" };
            out.push_str("<tr>");
            for cell in row {
                let _ = write!(out, "<{tag}>{}</{tag}>", escape(cell));
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table>\n");
    }
    out
}

/// One plot of the page.
pub struct Figure {
    /// Element id (`plot-<id>`).
    pub id: &'static str,
    pub caption: String,
    pub svg: String,
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1400px}\
table{border-collapse:collapse;font-size:13px;margin:8px 0}\
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f2f2f2}\
figure{display:inline-block;margin:8px;vertical-align:top}\
figcaption{font-size:13px;color:#555;max-width:640px}\
pre{background:#f7f7f7;padding:12px;font-size:12px;overflow:auto}";

/// The whole page.
pub fn page(data: &RunData, figures: &[Figure], notes: &[String]) -> String {
    let mut out = String::new();
    let title = format!("slowmo run report: {}", data.dir.display());
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        escape(&title),
        escape(&title)
    );
    let steps = data.steps();
    let _ = writeln!(
        out,
        "<p>{}: {} {}, {} steps recorded.</p>",
        escape(data.kind),
        data.nodes.len(),
        if data.kind == "simulate" {
            "workers"
        } else {
            "nodes"
        },
        steps
    );
    out.push_str("<h2>Results</h2>\n");
    if data.table.trim().is_empty() {
        out.push_str("<p>No summary was found.</p>\n");
    } else {
        out.push_str(&markdown_table(&data.table));
    }
    out.push_str("<h2>Plots</h2>\n");
    for note in notes {
        let _ = writeln!(out, "<p>{}</p>", escape(note));
    }
    for f in figures {
        let _ = write!(
            out,
            "<figure id=\"plot-{}\">\n{}\n<figcaption>{}</figcaption>\n</figure>\n",
            f.id,
            f.svg,
            escape(&f.caption)
        );
    }
    if !data.view_changes.is_empty() || !data.faults.is_empty() {
        out.push_str("<h2>View changes and faults</h2>\n<table>\n<tr><th>node</th><th>view</th><th>at step</th><th>back to step</th><th>size</th><th>lost</th><th>joined</th></tr>\n");
        for (node, v) in &data.view_changes {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(node),
                v.view,
                v.at_step,
                v.resumed_from,
                v.world,
                escape(&v.lost.join(", ")),
                escape(&v.joined.join(", "))
            );
        }
        out.push_str("</table>\n");
        for (step, what) in &data.faults {
            let _ = writeln!(out, "<p>fault at step {step}: {}</p>", escape(what));
        }
    }
    out.push_str("<h2>Configuration</h2>\n");
    match &data.config {
        Some(c) => {
            let _ = writeln!(out, "<pre id=\"config\">{}</pre>", escape(c));
        }
        None => out.push_str("<p>No configuration was found.</p>\n"),
    }
    out.push_str("</body>\n</html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_tables_become_html_and_text_is_escaped() {
        let html = markdown_table("| a | b<c |\n|---|---|\n| 1 | & |\n");
        assert_eq!(
            html,
            "<table>\n<tr><th>a</th><th>b&lt;c</th></tr>\n<tr><td>1</td><td>&amp;</td></tr>\n</table>\n"
        );
    }

    #[test]
    fn two_tables_one_after_the_other_stay_two_tables() {
        // A testnet's results.md: the results, a blank line, the fates.
        let md = "| node | steps |\n|---|---|\n| node-0 | 10 |\n\n| node | fate |\n|---|---|\n| node-0 | finished |\n";
        let html = markdown_table(md);
        assert_eq!(html.matches("<table>").count(), 2, "{html}");
        assert!(
            !html.contains("---"),
            "a separator row shown as data: {html}"
        );
        assert!(
            html.contains("<tr><th>node</th><th>fate</th></tr>"),
            "{html}"
        );
    }
}
