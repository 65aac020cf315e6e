//! Network profiles: the TOML description of a simulated network.
//!
//! The vocabulary follows the docker testnet's profiles (`cpu_slowdown`,
//! delay, jitter, rate, loss), written with units as `tc` writes them:
//!
//! ```toml
//! description = "node 3 slow, one long link, node 3 crashes"
//! compute_ms = 2.0          # one base step on an unslowed node (required)
//!
//! [default]                 # every node and link unless overridden
//! delay = "5ms"             # one-way propagation delay (ns, us, ms, s)
//! jitter = "1ms"            # delay varies uniformly in [delay - jitter, delay + jitter]
//! rate = "1gbit"            # link bandwidth (bit, kbit, mbit, gbit, tbit per second)
//! loss = 0.0                # probability that a whole message is lost, in [0, 1)
//! cpu_slowdown = 1.0        # compute time multiplier (`slowdown` also accepted)
//!
//! [node.3]                  # node 3: its compute and each of its out-links
//! cpu_slowdown = 3.0
//!
//! [link."0->2"]             # the link from node 0 to node 2
//! delay = "50ms"
//! rate = "20mbit"
//!
//! [[fault]]
//! kind = "crash"            # node 3 computes no step from step 200 on
//! node = 3
//! at_step = 200
//!
//! [[fault]]
//! kind = "pause"            # node 1 freezes before step 100 for 50 of its steps
//! node = 1
//! at_step = 100
//! steps = 50
//!
//! [[fault]]
//! kind = "partition"        # steps 300..500: {0,1} and the rest cannot talk
//! groups = [[0, 1]]         # nodes in no group form one more group
//! from_step = 300
//! to_step = 500
//! ```
//!
//! A link's setting comes from `[link."A->B"]`, else from the sender's
//! `[node.A]` (like the testnet's egress shaping), else from `[default]`,
//! else no delay, no jitter, unlimited rate and no loss. Each link has its
//! own rate: a node's out-links do not share one uplink.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Rank;

/// Errors of reading, parsing or checking a network profile.
#[derive(Debug, thiserror::Error)]
pub enum NetworkProfileError {
    #[error("cannot read network profile {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("network profile {profile} is not valid TOML for a network profile: {message}")]
    Parse { profile: String, message: String },
    #[error("network profile {profile}: `{key}` {message}")]
    Invalid {
        profile: String,
        key: String,
        message: String,
    },
}

/// Link settings; `None` is "not set here". Times are seconds, rates bits
/// per second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinkSettings {
    pub delay_s: Option<f64>,
    pub jitter_s: Option<f64>,
    pub rate_bit_s: Option<f64>,
    pub loss: Option<f64>,
}

impl LinkSettings {
    /// These settings with the ones `over` sets replacing ours.
    pub fn overridden_by(self, over: LinkSettings) -> LinkSettings {
        LinkSettings {
            delay_s: over.delay_s.or(self.delay_s),
            jitter_s: over.jitter_s.or(self.jitter_s),
            rate_bit_s: over.rate_bit_s.or(self.rate_bit_s),
            loss: over.loss.or(self.loss),
        }
    }
}

/// A node's settings: its compute slowdown and its out-links' settings.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NodeSettings {
    pub cpu_slowdown: Option<f64>,
    pub link: LinkSettings,
}

/// A scripted fault. Steps are the node's own base-step indices.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// `node` computes no step from `at_step` on and sends nothing more.
    Crash { node: Rank, at_step: u64 },
    /// `node` freezes before computing `at_step`, for as long as `steps` of
    /// its own steps take; then it goes on where it stopped.
    Pause {
        node: Rank,
        at_step: u64,
        steps: u64,
    },
    /// During steps `from_step..to_step` (of the sender) nodes in different
    /// groups cannot reach each other. Nodes in no group form one more group.
    Partition {
        groups: Vec<Vec<Rank>>,
        from_step: u64,
        to_step: u64,
    },
}

/// A parsed network profile. Node and link indices are checked against a
/// world size by [`NetworkProfile::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkProfile {
    /// The file it came from, or `inline`; error messages name it.
    pub name: String,
    pub description: String,
    /// Compute time of one base step on a node with slowdown 1, in seconds.
    pub compute_s: f64,
    pub default: NodeSettings,
    pub nodes: BTreeMap<Rank, NodeSettings>,
    pub links: BTreeMap<(Rank, Rank), LinkSettings>,
    pub faults: Vec<Fault>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    #[serde(default)]
    description: String,
    compute_ms: f64,
    #[serde(default)]
    default: RawNode,
    #[serde(default)]
    node: BTreeMap<String, RawNode>,
    #[serde(default)]
    link: BTreeMap<String, RawLink>,
    #[serde(default)]
    fault: Vec<RawFault>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    #[serde(alias = "slowdown")]
    cpu_slowdown: Option<f64>,
    delay: Option<WithUnit>,
    jitter: Option<WithUnit>,
    rate: Option<WithUnit>,
    loss: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    delay: Option<WithUnit>,
    jitter: Option<WithUnit>,
    rate: Option<WithUnit>,
    loss: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    kind: String,
    node: Option<Rank>,
    at_step: Option<u64>,
    steps: Option<u64>,
    groups: Option<Vec<Vec<Rank>>>,
    from_step: Option<u64>,
    to_step: Option<u64>,
}

/// A quoted quantity with a unit (`"5ms"`, `"20mbit"`); a bare number is
/// refused with that hint rather than serde's "expected a string".
#[derive(Debug, Clone)]
struct WithUnit(String);

impl<'de> Deserialize<'de> for WithUnit {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = WithUnit;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a quoted number with a unit, such as \"5ms\" or \"20mbit\"")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<WithUnit, E> {
                Ok(WithUnit(text.to_string()))
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

/// Parses a duration such as `"5ms"` into seconds.
pub fn parse_duration(text: &str) -> Result<f64, String> {
    let expected =
        || format!("must be a duration such as \"5ms\" (units ns, us, ms, s), not {text:?}");
    let (number, unit) = split_unit(text).ok_or_else(expected)?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(expected()),
    };
    let seconds = number * scale;
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(format!(
            "must be a finite, non-negative duration, not {text:?}"
        ));
    }
    Ok(seconds)
}

/// Parses a rate as `tc` writes it (`"20mbit"`) into bits per second.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let expected = || {
        format!(
            "must be a rate such as \"20mbit\" (units bit, kbit, mbit, gbit, tbit per second), not {text:?}"
        )
    };
    let (number, unit) = split_unit(text).ok_or_else(expected)?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "tbit" => 1e12,
        _ => return Err(expected()),
    };
    let bits = number * scale;
    if !(bits.is_finite() && bits > 0.0) {
        return Err(format!("must be a finite, positive rate, not {text:?}"));
    }
    Ok(bits)
}

/// `"12.5ms"` -> `(12.5, "ms")`.
fn split_unit(text: &str) -> Option<(f64, &str)> {
    let text = text.trim();
    let at = text.find(|c: char| c.is_ascii_alphabetic())?;
    let number: f64 = text[..at].trim().parse().ok()?;
    Some((number, text[at..].trim()))
}

impl NetworkProfile {
    /// Reads and parses a profile file (indices unchecked until
    /// [`NetworkProfile::validate`]).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, NetworkProfileError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| NetworkProfileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// Parses a profile given as text; errors call it `inline`.
    pub fn from_toml(text: &str) -> Result<Self, NetworkProfileError> {
        Self::parse("inline", text)
    }

    fn parse(name: &str, text: &str) -> Result<Self, NetworkProfileError> {
        let raw: RawProfile = toml::from_str(text).map_err(|e| NetworkProfileError::Parse {
            profile: name.to_string(),
            message: e.to_string(),
        })?;
        Self::from_raw(name, raw)
    }

    fn from_raw(name: &str, raw: RawProfile) -> Result<Self, NetworkProfileError> {
        let invalid = |key: &str, message: &str| invalid(name, key, message);
        if !(raw.compute_ms.is_finite() && raw.compute_ms >= 0.0) {
            return Err(invalid(
                "compute_ms",
                "must be a finite, non-negative number of milliseconds",
            ));
        }
        let default = node_settings(name, "default", &raw.default)?;
        let mut nodes = BTreeMap::new();
        for (key, settings) in &raw.node {
            let path = format!("node.{key}");
            let rank: Rank = key
                .trim()
                .parse()
                .map_err(|_| invalid(&path, "must name a node by its index, as in [node.3]"))?;
            nodes.insert(rank, node_settings(name, &path, settings)?);
        }
        let mut links = BTreeMap::new();
        for (key, settings) in &raw.link {
            let path = format!("link.{key:?}");
            let ends = key
                .split_once("->")
                .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
            let Some((from, to)) = ends else {
                return Err(invalid(
                    &path,
                    "must name a link as \"FROM->TO\", as in [link.\"0->2\"]",
                ));
            };
            if from == to {
                return Err(invalid(&path, "is a node's link to itself"));
            }
            let raw_link = RawNode {
                cpu_slowdown: None,
                delay: settings.delay.clone(),
                jitter: settings.jitter.clone(),
                rate: settings.rate.clone(),
                loss: settings.loss,
            };
            links.insert((from, to), node_settings(name, &path, &raw_link)?.link);
        }
        let faults = raw
            .fault
            .iter()
            .enumerate()
            .map(|(i, f)| fault(name, i, f))
            .collect::<Result<_, _>>()?;
        Ok(NetworkProfile {
            name: name.to_string(),
            description: raw.description,
            compute_s: raw.compute_ms * 1e-3,
            default,
            nodes,
            links,
            faults,
        })
    }

    /// Checks every node index against a run of `world_size` nodes.
    pub fn validate(&self, world_size: usize) -> Result<(), NetworkProfileError> {
        let last = world_size.saturating_sub(1);
        let check = |key: String, rank: Rank| {
            if rank < world_size {
                Ok(())
            } else {
                Err(invalid(
                    &self.name,
                    &key,
                    &format!("names node {rank}, but the run has nodes 0..={last}"),
                ))
            }
        };
        for &rank in self.nodes.keys() {
            check(format!("node.{rank}"), rank)?;
        }
        for &(from, to) in self.links.keys() {
            let key = format!("link.\"{from}->{to}\"");
            check(key.clone(), from)?;
            check(key, to)?;
        }
        for (i, fault) in self.faults.iter().enumerate() {
            match fault {
                Fault::Crash { node, .. } | Fault::Pause { node, .. } => {
                    check(format!("fault[{i}].node"), *node)?
                }
                Fault::Partition { groups, .. } => {
                    for &rank in groups.iter().flatten() {
                        check(format!("fault[{i}].groups"), rank)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The settings of node `rank`: its own over the defaults.
    pub fn node(&self, rank: Rank) -> NodeSettings {
        let own = self.nodes.get(&rank).copied().unwrap_or_default();
        NodeSettings {
            cpu_slowdown: own.cpu_slowdown.or(self.default.cpu_slowdown),
            link: self.default.link.overridden_by(own.link),
        }
    }

    /// The settings of the link `from -> to`: the link's own, else the
    /// sender's, else the defaults.
    pub fn link(&self, from: Rank, to: Rank) -> LinkSettings {
        let own = self.links.get(&(from, to)).copied().unwrap_or_default();
        self.node(from).link.overridden_by(own)
    }
}

/// A profile embedded in a larger TOML document (errors call it `inline`).
impl<'de> Deserialize<'de> for NetworkProfile {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawProfile::deserialize(deserializer)?;
        NetworkProfile::from_raw("inline", raw).map_err(serde::de::Error::custom)
    }
}

fn invalid(profile: &str, key: &str, message: &str) -> NetworkProfileError {
    NetworkProfileError::Invalid {
        profile: profile.to_string(),
        key: key.to_string(),
        message: message.to_string(),
    }
}

fn node_settings(
    profile: &str,
    path: &str,
    raw: &RawNode,
) -> Result<NodeSettings, NetworkProfileError> {
    let key = |field: &str| format!("{path}.{field}");
    let parsed = |field: &str, text: &Option<WithUnit>, parse: fn(&str) -> Result<f64, String>| {
        text.as_ref()
            .map(|t| parse(&t.0))
            .transpose()
            .map_err(|message| invalid(profile, &key(field), &message))
    };
    if let Some(s) = raw.cpu_slowdown
        && !(s.is_finite() && s > 0.0)
    {
        return Err(invalid(
            profile,
            &key("cpu_slowdown"),
            "must be a finite, positive factor",
        ));
    }
    if let Some(loss) = raw.loss
        && !(0.0..1.0).contains(&loss)
    {
        return Err(invalid(
            profile,
            &key("loss"),
            "must be a probability in [0, 1)",
        ));
    }
    Ok(NodeSettings {
        cpu_slowdown: raw.cpu_slowdown,
        link: LinkSettings {
            delay_s: parsed("delay", &raw.delay, parse_duration)?,
            jitter_s: parsed("jitter", &raw.jitter, parse_duration)?,
            rate_bit_s: parsed("rate", &raw.rate, parse_rate)?,
            loss: raw.loss,
        },
    })
}

fn fault(profile: &str, i: usize, raw: &RawFault) -> Result<Fault, NetworkProfileError> {
    let key = |field: &str| format!("fault[{i}].{field}");
    let kind = raw.kind.as_str();
    let required = |field: &str, value: Option<u64>| {
        value.ok_or_else(|| invalid(profile, &key(field), &format!("is required for a {kind}")))
    };
    let fields = [
        ("node", raw.node.is_some()),
        ("at_step", raw.at_step.is_some()),
        ("steps", raw.steps.is_some()),
        ("groups", raw.groups.is_some()),
        ("from_step", raw.from_step.is_some()),
        ("to_step", raw.to_step.is_some()),
    ];
    let allowed: &[&str] = match kind {
        "crash" => &["node", "at_step"],
        "pause" => &["node", "at_step", "steps"],
        "partition" => &["groups", "from_step", "to_step"],
        _ => {
            return Err(invalid(
                profile,
                &key("kind"),
                &format!("is {kind:?}; expected \"crash\", \"pause\" or \"partition\""),
            ));
        }
    };
    if let Some((field, _)) = fields.iter().find(|(f, set)| *set && !allowed.contains(f)) {
        return Err(invalid(
            profile,
            &key(field),
            &format!("does not apply to a {kind}"),
        ));
    }
    let node = || {
        raw.node
            .ok_or_else(|| invalid(profile, &key("node"), &format!("is required for a {kind}")))
    };
    match kind {
        "crash" => Ok(Fault::Crash {
            node: node()?,
            at_step: required("at_step", raw.at_step)?,
        }),
        "pause" => {
            let steps = required("steps", raw.steps)?;
            if steps == 0 {
                return Err(invalid(profile, &key("steps"), "must be at least 1"));
            }
            Ok(Fault::Pause {
                node: node()?,
                at_step: required("at_step", raw.at_step)?,
                steps,
            })
        }
        _ => {
            let groups = raw
                .groups
                .clone()
                .ok_or_else(|| invalid(profile, &key("groups"), "is required for a partition"))?;
            let from_step = required("from_step", raw.from_step)?;
            let to_step = required("to_step", raw.to_step)?;
            if to_step <= from_step {
                return Err(invalid(
                    profile,
                    &key("to_step"),
                    "must be greater than from_step",
                ));
            }
            let mut seen = std::collections::BTreeSet::new();
            for group in &groups {
                if group.is_empty() {
                    return Err(invalid(profile, &key("groups"), "holds an empty group"));
                }
                if let Some(twice) = group.iter().find(|&&r| !seen.insert(r)) {
                    return Err(invalid(
                        profile,
                        &key("groups"),
                        &format!("lists node {twice} more than once"),
                    ));
                }
            }
            Ok(Fault::Partition {
                groups,
                from_step,
                to_step,
            })
        }
    }
}

#[cfg(test)]
mod tests;
