//! Graph names: the [`GraphSpec`] string form used on the command line and in
//! the TOML config, and [`build`], which turns a spec and a size into a graph.
//!
//! # String form
//! `KIND[,peers=P][,seed=S]`, where `KIND` is one of
//!
//! | name | graph |
//! |---|---|
//! | `exponential` | time-varying directed exponential graph (the default) |
//! | `bidirectional-exponential` | hops +1, -1, +2, -2, +4, -4, ... one (or P) per round |
//! | `bipartite-exponential` | odd hops ±1, ±3, ±5, ±9, ...: even ranks talk to odd ranks; even sizes only |
//! | `linear` | hops +1, +2, ..., +(n-1), one (or P) per round |
//! | `ring` / `undirected-ring` | static rings |
//! | `torus` | static undirected 2-D torus, most square rows x cols; prime sizes > 3 are rejected |
//! | `hypercube` | static; power-of-two sizes only |
//! | `complete`, `star` | static |
//! | `random-regular:D` | seeded connected random D-regular graph |
//! | `erdos-renyi:P` | seeded G(n, P); an error unless connected |
//! | `edges:PATH` | static edge-list file (see [`crate::edgelist`]) |
//! | `schedule:PATH` | one edge list per round (see [`crate::edgelist`]) |
//!
//! `peers` (default 1) is the number of out-peers per round and only applies
//! to the four time-varying hop graphs; `seed` (default 0) only matters for
//! the random graphs. Defaults are left out when a spec is printed, so
//! printing and parsing round-trip. A path containing `,peers=` or `,seed=`
//! cannot be expressed.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::cycling::CyclingHops;
use crate::{DirectedExponential, Structured, Topology, TopologyError, edgelist, random};

/// Every accepted graph name, for error messages and `--help`.
pub const ACCEPTED_NAMES: &str = "exponential, bidirectional-exponential, bipartite-exponential, \
linear, ring, undirected-ring, torus, hypercube, complete, star, random-regular:D, \
erdos-renyi:P, edges:PATH, schedule:PATH, each optionally followed by ,peers=P and/or ,seed=S";

/// Which graph family, with its argument.
#[derive(Debug, Clone, PartialEq)]
pub enum GraphKind {
    /// Directed exponential graph (hops `j * (p+1)^i`), cycled `peers` at a time.
    Exponential,
    /// Hops `+1, -1, +2, -2, +4, -4, ...`, cycled `peers` at a time.
    BidirectionalExponential,
    /// Odd hops `±1, ±(1+2), ±(1+4), ...`, cycled `peers` at a time; even sizes.
    BipartiteExponential,
    /// Hops `+1, +2, ..., +(n-1)`, cycled `peers` at a time.
    Linear,
    /// Static directed ring.
    Ring,
    /// Static undirected ring.
    UndirectedRing,
    /// Static undirected 2-D torus.
    Torus,
    /// Static undirected hypercube (power-of-two sizes).
    Hypercube,
    /// Static complete graph.
    Complete,
    /// Static undirected star around rank 0.
    Star,
    /// Seeded connected random regular graph.
    RandomRegular { degree: usize },
    /// Seeded Erdos-Renyi G(n, p), required to be connected.
    ErdosRenyi { p: f64 },
    /// Static graph from an edge-list file.
    EdgeList { path: PathBuf },
    /// Time-varying graph from a schedule file.
    Schedule { path: PathBuf },
}

impl GraphKind {
    /// Whether the graph takes a number of peers per round (the time-varying
    /// hop graphs); all others reject `peers != 1`.
    pub fn takes_peers(&self) -> bool {
        matches!(
            self,
            Self::Exponential
                | Self::BidirectionalExponential
                | Self::BipartiteExponential
                | Self::Linear
        )
    }

    /// Whether the seed changes the graph.
    pub fn is_random(&self) -> bool {
        matches!(self, Self::RandomRegular { .. } | Self::ErdosRenyi { .. })
    }
}

impl fmt::Display for GraphKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::Exponential => "exponential".into(),
            Self::BidirectionalExponential => "bidirectional-exponential".into(),
            Self::BipartiteExponential => "bipartite-exponential".into(),
            Self::Linear => "linear".into(),
            Self::Ring => "ring".into(),
            Self::UndirectedRing => "undirected-ring".into(),
            Self::Torus => "torus".into(),
            Self::Hypercube => "hypercube".into(),
            Self::Complete => "complete".into(),
            Self::Star => "star".into(),
            Self::RandomRegular { degree } => format!("random-regular:{degree}"),
            Self::ErdosRenyi { p } => format!("erdos-renyi:{p}"),
            Self::EdgeList { path } => format!("edges:{}", path.display()),
            Self::Schedule { path } => format!("schedule:{}", path.display()),
        };
        f.pad(&text)
    }
}

impl FromStr for GraphKind {
    type Err = TopologyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let bad = |reason: String| TopologyError::UnknownGraph {
            name: text.into(),
            reason,
        };
        let (name, arg) = match text.split_once(':') {
            Some((name, arg)) => (name, Some(arg)),
            None => (text, None),
        };
        let plain = match name {
            "exponential" => Some(Self::Exponential),
            "bidirectional-exponential" => Some(Self::BidirectionalExponential),
            "bipartite-exponential" => Some(Self::BipartiteExponential),
            "linear" => Some(Self::Linear),
            "ring" => Some(Self::Ring),
            "undirected-ring" => Some(Self::UndirectedRing),
            "torus" => Some(Self::Torus),
            "hypercube" => Some(Self::Hypercube),
            "complete" => Some(Self::Complete),
            "star" => Some(Self::Star),
            _ => None,
        };
        if let Some(kind) = plain {
            return match arg {
                None => Ok(kind),
                Some(_) => Err(bad(format!("`{name}` takes no `:` argument"))),
            };
        }
        let needs =
            |what: &str, example: &str| bad(format!("`{name}` needs {what}, e.g. `{example}`"));
        match (name, arg.map(str::trim)) {
            ("random-regular", None | Some("")) => Err(needs("a degree", "random-regular:4")),
            ("random-regular", Some(d)) => d
                .parse()
                .map(|degree| Self::RandomRegular { degree })
                .map_err(|_| bad(format!("degree `{d}` is not a non-negative integer"))),
            ("erdos-renyi", None | Some("")) => {
                Err(needs("an edge probability", "erdos-renyi:0.3"))
            }
            ("erdos-renyi", Some(p)) => match p.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => Ok(Self::ErdosRenyi { p }),
                _ => Err(bad(format!(
                    "edge probability `{p}` is not a number in [0, 1]"
                ))),
            },
            ("edges", None | Some("")) => Err(needs("a file", "edges:graph.txt")),
            ("edges", Some(path)) => Ok(Self::EdgeList { path: path.into() }),
            ("schedule", None | Some("")) => Err(needs("a file", "schedule:rounds.txt")),
            ("schedule", Some(path)) => Ok(Self::Schedule { path: path.into() }),
            _ => Err(bad("no such graph".into())),
        }
    }
}

/// A graph family plus its options; the string form `KIND[,peers=P][,seed=S]`
/// is what the CLI and the TOML config use (serde reads and writes it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct GraphSpec {
    pub kind: GraphKind,
    /// Out-peers per round for the time-varying hop graphs (default 1).
    pub peers: usize,
    /// Seed of the random graphs (default 0).
    pub seed: u64,
}

impl Default for GraphSpec {
    fn default() -> Self {
        Self::new(GraphKind::Exponential)
    }
}

impl GraphSpec {
    /// A spec with `peers = 1`, `seed = 0`.
    pub fn new(kind: GraphKind) -> Self {
        Self {
            kind,
            peers: 1,
            seed: 0,
        }
    }

    /// The same spec with `peers` out-peers per round.
    pub fn with_peers(mut self, peers: usize) -> Self {
        self.peers = peers;
        self
    }

    /// The same spec with another seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Checks the options against the kind (peers >= 1; peers only for the
    /// time-varying hop graphs).
    pub fn validate(&self) -> Result<(), TopologyError> {
        let invalid = |reason: String| TopologyError::InvalidParameter {
            graph: self.kind.to_string(),
            reason,
        };
        if self.peers == 0 {
            return Err(invalid("peers per round must be at least 1".into()));
        }
        if self.peers != 1 && !self.kind.takes_peers() {
            return Err(invalid(format!(
                "peers={} only applies to exponential, bidirectional-exponential, \
                 bipartite-exponential and linear; this graph always sends to all its neighbours",
                self.peers
            )));
        }
        Ok(())
    }

    /// Parses a comma-separated list of specs, e.g.
    /// `exponential,peers=2,ring,random-regular:4,seed=3`: a `peers=` or
    /// `seed=` item belongs to the graph before it. File paths in a list
    /// cannot contain commas.
    pub fn parse_list(list: &str) -> Result<Vec<Self>, TopologyError> {
        let mut groups: Vec<String> = Vec::new();
        for item in list.split(',').map(str::trim) {
            match groups.last_mut() {
                Some(last) if is_option(item) => {
                    last.push(',');
                    last.push_str(item);
                }
                _ => groups.push(item.to_string()),
            }
        }
        groups.iter().map(|g| g.parse()).collect()
    }
}

fn is_option(item: &str) -> bool {
    item.starts_with("peers=") || item.starts_with("seed=")
}

impl fmt::Display for GraphSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.kind.to_string();
        if self.peers != 1 {
            text.push_str(&format!(",peers={}", self.peers));
        }
        if self.seed != 0 {
            text.push_str(&format!(",seed={}", self.seed));
        }
        f.pad(&text)
    }
}

impl FromStr for GraphSpec {
    type Err = TopologyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let bad = |reason: String| TopologyError::UnknownGraph {
            name: text.into(),
            reason,
        };
        let mut parts: Vec<&str> = text.split(',').collect();
        let mut spec = GraphSpec::new(GraphKind::Exponential);
        let (mut peers, mut seed) = (None, None);
        while parts.len() > 1 && is_option(parts[parts.len() - 1].trim()) {
            let option = parts.pop().unwrap_or_default().trim();
            let (key, value) = option.split_once('=').unwrap_or((option, ""));
            let slot = if key == "peers" {
                &mut peers
            } else {
                &mut seed
            };
            if slot.is_some() {
                return Err(bad(format!("`{key}` is given twice")));
            }
            *slot = Some(value.to_string());
        }
        spec.kind = parts.join(",").parse().map_err(|e| match e {
            TopologyError::UnknownGraph { reason, .. } => bad(reason),
            other => other,
        })?;
        if let Some(p) = peers {
            spec.peers = match p.parse() {
                Ok(p) if p >= 1 => p,
                _ => return Err(bad(format!("peers `{p}` is not a positive integer"))),
            };
        }
        if let Some(s) = seed {
            spec.seed = s
                .parse()
                .map_err(|_| bad(format!("seed `{s}` is not a non-negative integer")))?;
        }
        spec.validate()?;
        Ok(spec)
    }
}

impl From<GraphSpec> for String {
    fn from(spec: GraphSpec) -> Self {
        spec.to_string()
    }
}

impl TryFrom<String> for GraphSpec {
    type Error = TopologyError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// When `spec` asks for more out-peers per round than its graph of `size`
/// nodes has, what each round really sends to, as a note naming the
/// setting (a run logs it: the graph is still the one asked for, only
/// smaller). `None` when it does not, or the graph cannot be built.
pub fn peers_clamped(spec: &GraphSpec, size: usize) -> Option<String> {
    if spec.peers <= 1 || size <= 1 {
        return None;
    }
    let topology = build(spec, size).ok()?;
    let used = (0..topology.period().clamp(1, 64))
        .map(|k| topology.out_peers(0, k).len())
        .max()
        .unwrap_or(0);
    (used < spec.peers).then(|| {
        format!(
            "--peers {}: the {} graph of {size} nodes has {used} out-peers per round at most, \
             so each round sends to {used}",
            spec.peers, spec.kind
        )
    })
}

/// Builds the graph `spec` describes over `size` ranks (ranks `0..size`).
///
/// Errors: `size == 0`, a size the graph does not exist for (hypercube of 12,
/// torus of a prime > 3, bipartite of an odd size), bad parameters, a random
/// graph that could not be drawn connected, an unreadable or malformed file
/// (the message names the file and line).
pub fn build(spec: &GraphSpec, size: usize) -> Result<Box<dyn Topology>, TopologyError> {
    spec.validate()?;
    let peers = spec.peers;
    Ok(match &spec.kind {
        GraphKind::Exponential => Box::new(DirectedExponential::with_peers(size, peers)?),
        GraphKind::BidirectionalExponential => {
            Box::new(CyclingHops::bidirectional_exponential(size, peers)?)
        }
        GraphKind::BipartiteExponential => {
            Box::new(CyclingHops::bipartite_exponential(size, peers)?)
        }
        GraphKind::Linear => Box::new(CyclingHops::linear(size, peers)?),
        GraphKind::Ring => Box::new(Structured::ring(size)?),
        GraphKind::UndirectedRing => Box::new(Structured::undirected_ring(size)?),
        GraphKind::Torus => Box::new(Structured::torus(size)?),
        GraphKind::Hypercube => Box::new(Structured::hypercube(size)?),
        GraphKind::Complete => Box::new(Structured::complete(size)?),
        GraphKind::Star => Box::new(Structured::star(size)?),
        GraphKind::RandomRegular { degree } => {
            Box::new(random::random_regular(size, *degree, spec.seed)?)
        }
        GraphKind::ErdosRenyi { p } => Box::new(random::erdos_renyi(size, *p, spec.seed)?),
        GraphKind::EdgeList { path } => Box::new(edgelist::load_edge_list(path, size)?),
        GraphKind::Schedule { path } => Box::new(edgelist::load_schedule(path, size)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_peers_than_the_graph_has_are_named() {
        let spec: GraphSpec = "exponential,peers=100".parse().unwrap();
        let note = peers_clamped(&spec, 4).unwrap();
        assert!(
            note.starts_with("--peers 100: the exponential graph of 4 nodes"),
            "{note}"
        );
        let fits: GraphSpec = "exponential,peers=2".parse().unwrap();
        assert_eq!(peers_clamped(&fits, 16), None);
        assert_eq!(peers_clamped(&"ring".parse().unwrap(), 4), None);
    }

    #[test]
    fn names_round_trip() {
        for name in [
            "exponential",
            "exponential,peers=2",
            "bidirectional-exponential,peers=3",
            "bipartite-exponential",
            "linear",
            "ring",
            "undirected-ring",
            "torus",
            "hypercube",
            "complete",
            "star,seed=9",
            "random-regular:4,seed=7",
            "erdos-renyi:0.25",
            "erdos-renyi:1,seed=18446744073709551615",
            "edges:graphs/a b.txt",
            "schedule:/tmp/x:y.txt,seed=2",
        ] {
            let spec: GraphSpec = name.parse().unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(spec.to_string(), name);
            assert_eq!(spec.to_string().parse::<GraphSpec>().unwrap(), spec);
        }
        let spec: GraphSpec = " exponential , seed=0 , peers=1 ".parse().unwrap();
        assert_eq!(spec, GraphSpec::default());
        assert_eq!(spec.to_string(), "exponential");
        assert_eq!(format!("{:<14}|", spec), "exponential   |");
    }

    #[test]
    fn bad_names_list_the_accepted_ones() {
        for (name, needle) in [
            ("expo", "no such graph"),
            ("ring:3", "takes no `:` argument"),
            ("random-regular", "needs a degree"),
            ("random-regular:x", "not a non-negative integer"),
            ("erdos-renyi:1.5", "not a number in [0, 1]"),
            ("edges:", "needs a file"),
            ("exponential,peers=0", "not a positive integer"),
            ("exponential,seed=-1", "seed `-1`"),
            ("exponential,peers=2,peers=3", "given twice"),
        ] {
            let err = name.parse::<GraphSpec>().unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(needle), "{name}: {msg}");
            assert!(
                msg.contains("accepted: exponential, bidirectional-exponential"),
                "{msg}"
            );
        }
        let err = "ring,peers=2".parse::<GraphSpec>().unwrap_err();
        assert!(
            matches!(err, TopologyError::InvalidParameter { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn lists_attach_options_to_the_previous_graph() {
        let list =
            GraphSpec::parse_list("exponential,peers=2, ring ,random-regular:4,seed=3").unwrap();
        assert_eq!(
            list,
            vec![
                GraphSpec::new(GraphKind::Exponential).with_peers(2),
                GraphSpec::new(GraphKind::Ring),
                GraphSpec::new(GraphKind::RandomRegular { degree: 4 }).with_seed(3),
            ]
        );
        assert!(GraphSpec::parse_list("ring,,star").is_err());
    }

    #[test]
    fn serde_uses_the_string_form() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Config {
            graph: GraphSpec,
        }
        let config = Config {
            graph: "random-regular:3,seed=5".parse().unwrap(),
        };
        let json = serde_json::to_string(&config).unwrap();
        assert_eq!(json, r#"{"graph":"random-regular:3,seed=5"}"#);
        assert_eq!(serde_json::from_str::<Config>(&json).unwrap(), config);
        let err = serde_json::from_str::<Config>(r#"{"graph":"hypercub"}"#).unwrap_err();
        assert!(
            err.to_string().contains("unknown graph `hypercub`"),
            "{err}"
        );
    }

    #[test]
    fn build_reports_unsupported_sizes() {
        let hyper = GraphSpec::new(GraphKind::Hypercube);
        assert!(build(&hyper, 16).is_ok());
        let err = build(&hyper, 12).unwrap_err();
        assert!(err.to_string().contains("cannot have 12 nodes"), "{err}");
        assert!(build(&GraphSpec::default(), 0).is_err());
        assert!(build(&"bipartite-exponential".parse().unwrap(), 5).is_err());
        let missing: GraphSpec = "edges:/nonexistent/slowmo.txt".parse().unwrap();
        assert!(
            build(&missing, 4)
                .unwrap_err()
                .to_string()
                .contains("/nonexistent/slowmo.txt")
        );
    }
}
