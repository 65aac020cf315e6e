//! Heterogeneity profiles: how much CPU each node of a compose testnet gets
//! and how its network link is emulated.
//!
//! A profile is a small TOML file. `[all]` holds settings for every node;
//! each `[[group]]` selects some nodes and overrides the settings it names,
//! later groups winning over earlier ones:
//!
//! ```toml
//! description = "a quarter of the nodes 3x slower"
//!
//! [all]                  # every node (all keys optional)
//! cpus = 0.5             # hard CPU limit, in cores [host cores / nodes]
//! cpu_slowdown = 1.0     # divides `cpus`: 3.0 makes a node 3x slower
//! cpuset = "0"           # pin to these host CPUs ("0-1", "0,2")
//! cpu_shares = 1024      # relative CPU weight under contention
//! threads = 1            # compute threads (RAYON_NUM_THREADS, --threads) [1]
//! delay_ms = [30, 80]    # one-way egress delay (netem)
//! jitter_ms = 5          # delay jitter (netem)
//! loss_percent = 0.1     # egress packet loss
//! rate_mbit = 100        # egress bandwidth cap (tbf)
//!
//! [[group]]
//! name = "slow-cpu"      # shown in the compose file and `profile` table
//! fraction = 0.25        # round(0.25 * nodes) nodes, at least one ...
//! offset = 0.75          # ... starting at node floor(0.75 * nodes) [0]
//! # nodes = [3]          # or: these node indices
//! cpu_slowdown = 3.0
//! ```
//!
//! A numeric network setting is either one number or a `[low, high]` pair,
//! spread evenly over the nodes it applies to (the first gets `low`, the last
//! `high`), so a wide-area profile gives every node a different distance.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The profiles shipped with slowmo-testnet: name, TOML text.
pub const BUILTIN: [(&str, &str); 3] = [
    ("lan", include_str!("profiles/lan.toml")),
    ("wan", include_str!("profiles/wan.toml")),
    ("mixed", include_str!("profiles/mixed.toml")),
];

/// Errors of loading or applying a profile.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(
        "unknown profile `{name}`: expected one of lan, wan, mixed or the path of a profile TOML file"
    )]
    Unknown { name: String },
    #[error("cannot read profile file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("profile {profile} is not valid TOML for a profile: {message}")]
    Parse { profile: String, message: String },
    #[error("profile {profile}: `{field}` {message}")]
    Invalid {
        profile: String,
        field: String,
        message: String,
    },
}

/// One number, or a `[low, high]` range spread over the selected nodes.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Spread {
    One(f64),
    Range([f64; 2]),
}

impl Spread {
    /// The value for the `position`-th of `count` nodes.
    pub fn at(self, position: usize, count: usize) -> f64 {
        match self {
            Spread::One(v) => v,
            Spread::Range([low, high]) if count > 1 => {
                low + (high - low) * position as f64 / (count - 1) as f64
            }
            Spread::Range([low, _]) => low,
        }
    }

    fn values(self) -> Vec<f64> {
        match self {
            Spread::One(v) => vec![v],
            Spread::Range([a, b]) => vec![a, b],
        }
    }
}

/// Node settings as a profile gives them; every field optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSettings {
    pub cpus: Option<f64>,
    pub cpu_slowdown: Option<f64>,
    pub cpuset: Option<String>,
    pub cpu_shares: Option<u32>,
    pub threads: Option<u32>,
    pub delay_ms: Option<Spread>,
    pub jitter_ms: Option<Spread>,
    pub loss_percent: Option<Spread>,
    pub rate_mbit: Option<Spread>,
}

/// Which nodes a group applies to.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// These node indices.
    Nodes(Vec<usize>),
    /// `max(1, round(fraction * n))` nodes from `floor(offset * n)` on.
    Fraction { fraction: f64, offset: f64 },
}

impl Selection {
    /// The selected node indices of an `n`-node testnet, in order.
    pub fn indices(&self, n: usize) -> Vec<usize> {
        match self {
            Selection::Nodes(nodes) => nodes.clone(),
            Selection::Fraction { fraction, offset } => {
                let count = ((fraction * n as f64).round() as usize).max(1);
                let start = ((offset * n as f64).floor() as usize).min(n.saturating_sub(1));
                (start..(start + count).min(n)).collect()
            }
        }
    }
}

/// A named selection of nodes and the settings it overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub name: String,
    pub select: Selection,
    pub settings: NodeSettings,
}

/// A heterogeneity profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// The built-in name or the file it came from.
    pub name: String,
    pub description: String,
    pub all: NodeSettings,
    pub groups: Vec<Group>,
}

/// What one node runs with, after the profile is applied.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeShape {
    pub index: usize,
    /// Hard CPU limit in cores (compose `cpus`).
    pub cpus: f64,
    pub cpuset: Option<String>,
    pub cpu_shares: Option<u32>,
    pub threads: u32,
    pub delay_ms: f64,
    pub jitter_ms: f64,
    pub loss_percent: f64,
    /// Egress cap; `None` is unlimited.
    pub rate_mbit: Option<f64>,
    /// Names of the groups that selected this node.
    pub groups: Vec<String>,
}

impl NodeShape {
    /// Whether any link emulation applies.
    pub fn shapes_link(&self) -> bool {
        self.delay_ms > 0.0
            || self.jitter_ms > 0.0
            || self.loss_percent > 0.0
            || self.rate_mbit.is_some()
    }
}

/// Raw TOML form of a profile.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    #[serde(default)]
    description: String,
    #[serde(default)]
    all: NodeSettings,
    #[serde(default)]
    group: Vec<toml::Table>,
}

impl Profile {
    /// A built-in profile by name, or a profile file by path.
    pub fn load(name_or_path: &str) -> Result<Self, ProfileError> {
        if let Some((name, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return Self::from_toml(name, text);
        }
        let path = Path::new(name_or_path);
        if path.extension().is_some_and(|e| e == "toml") || path.exists() {
            let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
                path: path.to_owned(),
                source,
            })?;
            return Self::from_toml(name_or_path, &text);
        }
        Err(ProfileError::Unknown {
            name: name_or_path.to_string(),
        })
    }

    /// Parses and checks a profile; `name` appears in error messages.
    pub fn from_toml(name: &str, text: &str) -> Result<Self, ProfileError> {
        let parse_error = |message: String| ProfileError::Parse {
            profile: name.to_string(),
            message,
        };
        let raw: RawProfile = toml::from_str(text).map_err(|e| parse_error(e.to_string()))?;
        let mut groups = Vec::new();
        for (i, mut table) in raw.group.into_iter().enumerate() {
            let group_name = match table.remove("name") {
                Some(toml::Value::String(s)) => s,
                Some(_) => {
                    return Err(invalid(
                        name,
                        &format!("group[{i}].name"),
                        "must be a string",
                    ));
                }
                None => format!("group{i}"),
            };
            let field = |key: &str| format!("group `{group_name}`.{key}");
            let number = |key: &str, v: toml::Value| -> Result<f64, ProfileError> {
                match v {
                    toml::Value::Float(f) => Ok(f),
                    toml::Value::Integer(n) => Ok(n as f64),
                    _ => Err(invalid(name, &field(key), "must be a number")),
                }
            };
            let nodes = table.remove("nodes");
            let fraction = table
                .remove("fraction")
                .map(|v| number("fraction", v))
                .transpose()?;
            let offset = table
                .remove("offset")
                .map(|v| number("offset", v))
                .transpose()?;
            let select = match (nodes, fraction) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        name,
                        &field("nodes"),
                        "and `fraction` exclude each other",
                    ));
                }
                (Some(v), None) => {
                    if offset.is_some() {
                        return Err(invalid(name, &field("offset"), "only goes with `fraction`"));
                    }
                    let nodes: Vec<usize> = v.try_into().map_err(|_| {
                        invalid(name, &field("nodes"), "must be a list of node indices")
                    })?;
                    Selection::Nodes(nodes)
                }
                (None, Some(fraction)) => {
                    if !(fraction > 0.0 && fraction <= 1.0) {
                        return Err(invalid(name, &field("fraction"), "must be in (0, 1]"));
                    }
                    let offset = offset.unwrap_or(0.0);
                    if !(0.0..1.0).contains(&offset) {
                        return Err(invalid(name, &field("offset"), "must be in [0, 1)"));
                    }
                    Selection::Fraction { fraction, offset }
                }
                (None, None) => {
                    return Err(invalid(
                        name,
                        &format!("group `{group_name}`"),
                        "selects no nodes: give `nodes = [..]` or `fraction = ..`",
                    ));
                }
            };
            let settings: NodeSettings =
                toml::Value::Table(table)
                    .try_into()
                    .map_err(|e: toml::de::Error| {
                        parse_error(format!("group `{group_name}`: {}", e.message()))
                    })?;
            check_settings(name, &format!("group `{group_name}`."), &settings)?;
            groups.push(Group {
                name: group_name,
                select,
                settings,
            });
        }
        check_settings(name, "all.", &raw.all)?;
        Ok(Profile {
            name: name.to_string(),
            description: raw.description,
            all: raw.all,
            groups,
        })
    }

    /// Every node's shape in an `n`-node testnet; `default_cpus` is the CPU
    /// limit of a node whose profile sets none.
    pub fn resolve(&self, n: usize, default_cpus: f64) -> Result<Vec<NodeShape>, ProfileError> {
        let mut merged = vec![(self.all.clone(), Vec::<String>::new()); n];
        // Spread positions: per setting, the group that last set it.
        let mut positions = vec![[(0usize, n); 4]; n];
        for (i, p) in positions.iter_mut().enumerate() {
            *p = [(i, n); 4];
        }
        for group in &self.groups {
            let selected = group.select.indices(n);
            if let Some(bad) = selected.iter().find(|&&i| i >= n) {
                return Err(invalid(
                    &self.name,
                    &format!("group `{}`.nodes", group.name),
                    &format!(
                        "names node {bad}, but the testnet has nodes 0..{}",
                        n.saturating_sub(1)
                    ),
                ));
            }
            let count = selected.len();
            for (position, &i) in selected.iter().enumerate() {
                let (settings, names) = &mut merged[i];
                let g = &group.settings;
                macro_rules! over {
                    ($($f:ident),*) => { $( if g.$f.is_some() { settings.$f = g.$f.clone(); } )* };
                }
                over!(cpus, cpu_slowdown, cpuset, cpu_shares, threads);
                let spreads = [&g.delay_ms, &g.jitter_ms, &g.loss_percent, &g.rate_mbit];
                for (k, s) in spreads.iter().enumerate() {
                    if s.is_some() {
                        positions[i][k] = (position, count);
                    }
                }
                over!(delay_ms, jitter_ms, loss_percent, rate_mbit);
                names.push(group.name.clone());
            }
        }
        Ok(merged
            .into_iter()
            .enumerate()
            .map(|(index, (s, groups))| {
                let at = |spread: Option<Spread>, k: usize| {
                    spread.map(|v| v.at(positions[index][k].0, positions[index][k].1))
                };
                let cpus = s.cpus.unwrap_or(default_cpus) / s.cpu_slowdown.unwrap_or(1.0);
                NodeShape {
                    index,
                    cpus: (cpus * 100.0).round().max(1.0) / 100.0,
                    cpuset: s.cpuset,
                    cpu_shares: s.cpu_shares,
                    threads: s.threads.unwrap_or(1),
                    delay_ms: at(s.delay_ms, 0).unwrap_or(0.0),
                    jitter_ms: at(s.jitter_ms, 1).unwrap_or(0.0),
                    loss_percent: at(s.loss_percent, 2).unwrap_or(0.0),
                    rate_mbit: at(s.rate_mbit, 3).filter(|&r| r > 0.0),
                    groups,
                }
            })
            .collect())
    }
}

fn invalid(profile: &str, field: &str, message: &str) -> ProfileError {
    ProfileError::Invalid {
        profile: profile.to_string(),
        field: field.to_string(),
        message: message.to_string(),
    }
}

fn check_settings(profile: &str, prefix: &str, s: &NodeSettings) -> Result<(), ProfileError> {
    let field = |name: &str| format!("{prefix}{name}");
    if let Some(c) = s.cpus
        && !(c.is_finite() && c >= 0.01)
    {
        return Err(invalid(
            profile,
            &field("cpus"),
            "must be at least 0.01 cores",
        ));
    }
    if let Some(f) = s.cpu_slowdown
        && !(f.is_finite() && f > 0.0)
    {
        return Err(invalid(
            profile,
            &field("cpu_slowdown"),
            "must be a positive factor",
        ));
    }
    if let Some(set) = &s.cpuset
        && (set.is_empty()
            || !set
                .chars()
                .all(|c| c.is_ascii_digit() || c == ',' || c == '-'))
    {
        return Err(invalid(
            profile,
            &field("cpuset"),
            "must look like \"0\", \"0-1\" or \"0,2\"",
        ));
    }
    if s.cpu_shares == Some(0) {
        return Err(invalid(profile, &field("cpu_shares"), "must be positive"));
    }
    if s.threads == Some(0) {
        return Err(invalid(profile, &field("threads"), "must be at least 1"));
    }
    let limits = [
        ("delay_ms", s.delay_ms, 60_000.0),
        ("jitter_ms", s.jitter_ms, 60_000.0),
        ("loss_percent", s.loss_percent, 100.0),
        ("rate_mbit", s.rate_mbit, 1_000_000.0),
    ];
    for (name, spread, max) in limits {
        if let Some(spread) = spread
            && spread
                .values()
                .iter()
                .any(|v| !(v.is_finite() && (0.0..=max).contains(v)))
        {
            return Err(invalid(
                profile,
                &field(name),
                &format!("must be between 0 and {max}"),
            ));
        }
    }
    Ok(())
}

/// This machine's CPU count.
pub fn host_cpus() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

/// A plain-text table of resolved node shapes.
pub fn shapes_table(shapes: &[NodeShape]) -> String {
    let mut out = format!(
        "{:<7} {:>5} {:>7} {:>8} {:>9} {:>9} {:>7} {:>9}  {}\n",
        "node",
        "cpus",
        "cpuset",
        "threads",
        "delay_ms",
        "jitter_ms",
        "loss_%",
        "rate_mbit",
        "groups"
    );
    for s in shapes {
        out.push_str(&format!(
            "{:<7} {:>5} {:>7} {:>8} {:>9} {:>9} {:>7} {:>9}  {}\n",
            crate::node_line::node_name(s.index),
            format!("{:.2}", s.cpus),
            s.cpuset.as_deref().unwrap_or("-"),
            s.threads,
            format!("{:.1}", s.delay_ms),
            format!("{:.1}", s.jitter_ms),
            format!("{:.2}", s.loss_percent),
            s.rate_mbit
                .map(|r| format!("{r:.1}"))
                .unwrap_or_else(|| "-".into()),
            if s.groups.is_empty() {
                "-".to_string()
            } else {
                s.groups.join(",")
            },
        ));
    }
    out
}

/// Arguments of `slowmo-testnet profile`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfileArgs {
    /// A built-in profile (lan, wan, mixed) or a profile TOML file; without
    /// one, lists the built-ins.
    pub name: Option<String>,
    /// Show the per-node settings for this many nodes.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// CPU cores shared out to nodes whose profile sets no `cpus`
    /// [default: this machine's cores].
    #[arg(long)]
    pub host_cpus: Option<f64>,
}

/// `slowmo-testnet profile`: prints a profile's TOML (a template for your
/// own) and what it gives each node.
pub fn show(args: ProfileArgs) -> anyhow::Result<()> {
    let Some(name) = args.name else {
        for (name, text) in BUILTIN {
            let profile = Profile::from_toml(name, text)?;
            println!("{name:<6} {}", profile.description);
        }
        println!(
            "\n`slowmo-testnet profile NAME` shows one; a TOML file of the same form is a profile too."
        );
        return Ok(());
    };
    let profile = Profile::load(&name)?;
    let text = match BUILTIN.iter().find(|(n, _)| *n == name) {
        Some((_, text)) => text.to_string(),
        None => std::fs::read_to_string(&name)?,
    };
    if args.nodes == 0 {
        anyhow::bail!("--nodes must be at least 1");
    }
    let host = args.host_cpus.unwrap_or_else(host_cpus);
    let shapes = profile.resolve(args.nodes, host / args.nodes as f64)?;
    println!("{}", text.trim_end());
    println!("\n# With {} nodes on {host} CPU cores:", args.nodes);
    for line in shapes_table(&shapes).lines() {
        println!("# {line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse_and_lan_shapes_nothing() {
        for (name, _) in BUILTIN {
            Profile::load(name).unwrap();
        }
        let shapes = Profile::load("lan").unwrap().resolve(4, 0.5).unwrap();
        assert_eq!(shapes.len(), 4);
        for s in &shapes {
            assert_eq!(s.cpus, 0.5);
            assert_eq!(s.threads, 1);
            assert!(!s.shapes_link());
        }
    }

    #[test]
    fn wan_spreads_delay_over_the_nodes() {
        let shapes = Profile::load("wan").unwrap().resolve(6, 1.0).unwrap();
        let delays: Vec<f64> = shapes.iter().map(|s| s.delay_ms).collect();
        assert_eq!(delays, vec![30.0, 40.0, 50.0, 60.0, 70.0, 80.0]);
        assert!(shapes.iter().all(|s| s.rate_mbit == Some(100.0)));
        assert_eq!(shapes[0].jitter_ms, 3.0);
        assert_eq!(shapes[5].jitter_ms, 8.0);
    }

    #[test]
    fn mixed_slows_one_quarter_and_caps_another() {
        let shapes = Profile::load("mixed").unwrap().resolve(4, 0.5).unwrap();
        assert_eq!(shapes[0].cpus, 0.5);
        assert_eq!(shapes[1].cpus, 0.5);
        assert_eq!(shapes[2].rate_mbit, Some(20.0));
        assert_eq!(shapes[2].cpus, 0.5);
        assert_eq!(shapes[3].cpus, 0.17);
        assert_eq!(shapes[3].rate_mbit, None);
        assert_eq!(shapes[3].groups, vec!["slow-cpu".to_string()]);
        let eight = Profile::load("mixed").unwrap().resolve(8, 0.25).unwrap();
        let slow: Vec<usize> = eight
            .iter()
            .filter(|s| s.cpus < 0.25)
            .map(|s| s.index)
            .collect();
        let capped: Vec<usize> = eight
            .iter()
            .filter(|s| s.rate_mbit.is_some())
            .map(|s| s.index)
            .collect();
        assert_eq!(slow, vec![6, 7]);
        assert_eq!(capped, vec![4, 5]);
    }

    #[test]
    fn later_groups_override_and_spread_within_their_selection() {
        let text = r#"
            [all]
            rate_mbit = 50
            threads = 2
            [[group]]
            nodes = [1, 3]
            delay_ms = [10, 20]
            rate_mbit = 5
            [[group]]
            name = "pinned"
            nodes = [3]
            cpuset = "0"
            cpus = 1
        "#;
        let shapes = Profile::from_toml("t", text)
            .unwrap()
            .resolve(4, 0.5)
            .unwrap();
        assert_eq!(shapes[0].rate_mbit, Some(50.0));
        assert_eq!(shapes[1].delay_ms, 10.0);
        assert_eq!(shapes[3].delay_ms, 20.0);
        assert_eq!(shapes[3].rate_mbit, Some(5.0));
        assert_eq!(shapes[3].cpuset.as_deref(), Some("0"));
        assert_eq!(shapes[3].cpus, 1.0);
        assert_eq!(shapes[3].threads, 2);
        assert_eq!(
            shapes[3].groups,
            vec!["group0".to_string(), "pinned".to_string()]
        );
    }

    #[test]
    fn errors_name_the_profile_and_field() {
        let cases = [
            ("[all]\ncpus = 0", "all.cpus"),
            ("[all]\nloss_percent = 120", "all.loss_percent"),
            ("[all]\nrate_mbit = [1, -2]", "all.rate_mbit"),
            ("[all]\ncpuset = \"a\"", "all.cpuset"),
            ("[[group]]\nfraction = 2.0", "group `group0`.fraction"),
            ("[[group]]\nname = \"g\"\ndelay_ms = 3", "group `g`"),
            (
                "[[group]]\nnodes = [1]\nfraction = 0.5",
                "group `group0`.nodes",
            ),
        ];
        for (text, field) in cases {
            let err = Profile::from_toml("custom.toml", text)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("custom.toml") && err.contains(field),
                "{text}: {err}"
            );
        }
        let err = Profile::from_toml("p.toml", "[all]\nspeed = 3")
            .unwrap_err()
            .to_string();
        assert!(err.contains("speed"), "{err}");
        let err = Profile::from_toml("p.toml", "[[group]]\nnodes = [0]\nfoo = 1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("foo"), "{err}");
        let out_of_range =
            Profile::from_toml("p.toml", "[[group]]\nnodes = [7]\nthreads = 2").unwrap();
        let err = out_of_range.resolve(4, 0.5).unwrap_err().to_string();
        assert!(err.contains("node 7"), "{err}");
        let err = Profile::load("nosuch").unwrap_err().to_string();
        assert!(
            err.contains("nosuch") && err.contains("lan, wan, mixed"),
            "{err}"
        );
    }

    #[test]
    fn fraction_selection_counts_at_least_one_node() {
        let s = Selection::Fraction {
            fraction: 0.25,
            offset: 0.75,
        };
        assert_eq!(s.indices(2), vec![1]);
        assert_eq!(s.indices(4), vec![3]);
        assert_eq!(s.indices(10), vec![7, 8, 9]);
    }
}
