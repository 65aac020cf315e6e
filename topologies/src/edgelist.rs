//! User-supplied graphs: edge-list files (static) and schedule files (one
//! edge list per round).
//!
//! # Format
//! ```text
//! # a comment; everything after '#' on a line is ignored, blank lines too
//! undirected        # optional, before the first edge: every edge goes both ways
//! 0 1               # rank 0 sends to rank 1 ("src dst", whitespace separated)
//! 1 2
//! ---               # schedule files only: ends a round
//! 2 0
//! ```
//! - Edges are directed (`src` sends to `dst`) unless the file says
//!   `undirected` (or says `directed`, the default) on a line of its own
//!   before the first edge; the choice applies to the whole file.
//! - Ranks are `0..size` of the run; a rank `>= size` or a self-loop is an
//!   error naming the line. Duplicate edges count once. Ranks without edges
//!   are allowed (they simply never mix: `slowmo topology analyze` shows it).
//! - Schedule files: a line `---` ends a round; round `k` of training uses
//!   file round `k mod T`. Two separators in a row give a round without
//!   communication; a separator at the very end of the file is ignored. In an
//!   edge-list file `---` is an error.

use std::path::Path;

use crate::{ExplicitGraph, TopologyError};

/// One parsed edge and the line it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    pub src: usize,
    pub dst: usize,
    /// 1-based line number.
    pub line: usize,
}

/// A parsed edge-list or schedule file, before it is checked against a size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphFile {
    /// Every edge also runs `dst -> src`.
    pub undirected: bool,
    /// One edge list per round (exactly one for an edge-list file).
    pub rounds: Vec<Vec<Edge>>,
}

/// Parses a static edge list; `source_name` (usually the path) names errors.
pub fn parse_edge_list(text: &str, source_name: &str) -> Result<GraphFile, TopologyError> {
    parse(text, source_name, false)
}

/// Parses a schedule: edge lists separated by `---` lines.
pub fn parse_schedule(text: &str, source_name: &str) -> Result<GraphFile, TopologyError> {
    parse(text, source_name, true)
}

/// Reads and parses an edge-list file and checks it against `size` ranks.
pub fn load_edge_list(path: &Path, size: usize) -> Result<ExplicitGraph, TopologyError> {
    let source = path.display().to_string();
    let file = parse_edge_list(&read(path)?, &source)?;
    file.to_graph(format!("edges:{source}"), size, &source)
}

/// Reads and parses a schedule file and checks it against `size` ranks.
pub fn load_schedule(path: &Path, size: usize) -> Result<ExplicitGraph, TopologyError> {
    let source = path.display().to_string();
    let file = parse_schedule(&read(path)?, &source)?;
    file.to_graph(format!("schedule:{source}"), size, &source)
}

fn read(path: &Path) -> Result<String, TopologyError> {
    std::fs::read_to_string(path).map_err(|e| TopologyError::File {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

impl GraphFile {
    /// The graph over `size` ranks; an edge naming a rank `>= size` is an
    /// error naming its line.
    pub fn to_graph(
        &self,
        name: impl Into<String>,
        size: usize,
        source_name: &str,
    ) -> Result<ExplicitGraph, TopologyError> {
        let mut rounds = Vec::with_capacity(self.rounds.len());
        for edges in &self.rounds {
            let mut list = Vec::with_capacity(edges.len() * 2);
            for e in edges {
                if let Some(rank) = [e.src, e.dst].into_iter().find(|&r| r >= size) {
                    return Err(TopologyError::Parse {
                        source_name: source_name.into(),
                        line: e.line,
                        reason: format!(
                            "rank {rank} is out of range: the run has {size} nodes (ranks 0..{size})"
                        ),
                    });
                }
                list.push((e.src, e.dst));
                if self.undirected {
                    list.push((e.dst, e.src));
                }
            }
            rounds.push(list);
        }
        ExplicitGraph::from_rounds(name, size, &rounds)
    }
}

fn parse(text: &str, source_name: &str, schedule: bool) -> Result<GraphFile, TopologyError> {
    let error = |line: usize, reason: String| TopologyError::Parse {
        source_name: source_name.into(),
        line,
        reason,
    };
    let mut undirected = false;
    let mut seen_content = false;
    let mut rounds = vec![Vec::new()];
    let mut trailing_separator = false;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        match content {
            "undirected" | "directed" => {
                if seen_content {
                    return Err(error(
                        line,
                        format!(
                            "`{content}` must come before the first edge (it applies to the whole file)"
                        ),
                    ));
                }
                undirected = content == "undirected";
                continue;
            }
            "---" if schedule => {
                rounds.push(Vec::new());
                seen_content = true;
                trailing_separator = true;
                continue;
            }
            "---" => {
                return Err(error(
                    line,
                    "`---` separates rounds, which only a schedule file has (use `schedule:PATH`)"
                        .into(),
                ));
            }
            _ => {}
        }
        let fields: Vec<&str> = content.split_whitespace().collect();
        if fields.len() != 2 {
            return Err(error(
                line,
                format!(
                    "expected an edge `src dst` (two ranks), found {} field(s): `{content}`",
                    fields.len()
                ),
            ));
        }
        let rank = |s: &str| {
            s.parse::<usize>().map_err(|_| {
                error(
                    line,
                    format!("`{s}` is not a rank (a non-negative integer)"),
                )
            })
        };
        let (src, dst) = (rank(fields[0])?, rank(fields[1])?);
        if src == dst {
            return Err(error(
                line,
                format!(
                    "self-loop {src} -> {dst}: a rank always keeps its own share, list only edges to other ranks"
                ),
            ));
        }
        seen_content = true;
        trailing_separator = false;
        if let Some(last) = rounds.last_mut() {
            last.push(Edge { src, dst, line });
        }
    }
    if trailing_separator {
        rounds.pop();
    }
    Ok(GraphFile { undirected, rounds })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Topology;

    #[test]
    fn parses_comments_directives_and_rounds() {
        let text = "# ring of 3\nundirected\n0 1 # first\n\n1 2\n---\n2 0\n---\n---\n0 2\n---\n";
        let file = parse_schedule(text, "s.txt").unwrap();
        assert!(file.undirected);
        assert_eq!(file.rounds.len(), 4);
        assert_eq!(
            file.rounds[0][1],
            Edge {
                src: 1,
                dst: 2,
                line: 5
            }
        );
        assert!(file.rounds[2].is_empty());
        let g = file.to_graph("schedule:s.txt", 3, "s.txt").unwrap();
        assert_eq!(g.period(), 4);
        assert_eq!(g.out_peers(1, 0), vec![0, 2]);
        assert_eq!(g.out_peers(0, 1), vec![2]);
    }

    #[test]
    fn directed_edge_list() {
        let g = parse_edge_list("0 1\n1 2\n2 0\n", "e")
            .unwrap()
            .to_graph("edges:e", 3, "e")
            .unwrap();
        assert_eq!((g.out_peers(0, 0), g.in_peers(0, 0)), (vec![1], vec![2]));
        assert_eq!(g.period(), 1);
    }

    #[test]
    fn errors_name_the_source_and_line() {
        let cases = [
            ("0 1\n1 x\n", 2, "`x` is not a rank"),
            ("0 1\n\n1 2 3\n", 3, "found 3 field(s)"),
            ("0 1\n4 4\n", 2, "self-loop"),
            ("0 1\nundirected\n", 2, "before the first edge"),
            ("0 1\n---\n1 0\n", 2, "only a schedule file"),
            ("0 -1\n", 1, "`-1` is not a rank"),
        ];
        for (text, line, needle) in cases {
            let err = parse_edge_list(text, "graph.txt").unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!("graph.txt, line {line}: ")),
                "{text:?}: {msg}"
            );
            assert!(msg.contains(needle), "{text:?}: {msg}");
        }
        let err = parse_edge_list("0 1\n# c\n2 9\n", "g.txt")
            .unwrap()
            .to_graph("edges:g.txt", 4, "g.txt")
            .unwrap_err();
        assert_eq!(
            err,
            TopologyError::Parse {
                source_name: "g.txt".into(),
                line: 3,
                reason: "rank 9 is out of range: the run has 4 nodes (ranks 0..4)".into()
            }
        );
    }

    #[test]
    fn missing_file_is_named() {
        let err = load_edge_list(Path::new("/nonexistent/slowmo-graph.txt"), 4).unwrap_err();
        assert!(
            matches!(&err, TopologyError::File { path, .. } if path == "/nonexistent/slowmo-graph.txt"),
            "{err:?}"
        );
    }
}
