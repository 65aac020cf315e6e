//! What a node runs, from its flags or from a join ticket, and the ticket
//! and ports it prints for the next machine.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use slowmo_gossip::p2p::settings::fetch_settings;
use slowmo_gossip::p2p::{DataLane, PendingJoin};
use slowmo_runspec::JoinTicket;

use crate::commands::node::NodeArgs;
use crate::commands::run::AdmissionArgs;
use crate::config::RunConfig;

/// The run a node takes part in.
pub struct RunPlan {
    pub config: RunConfig,
    pub run_id: String,
    pub bootstrap: Vec<String>,
    pub data_lane: DataLane,
    pub admission: AdmissionArgs,
}

/// The run id of a node without `--run-id`.
pub const DEFAULT_RUN_ID: &str = "slowmo";

impl RunPlan {
    /// From the flags, or, with `--join`, from the ticket and the settings
    /// its peer serves.
    pub fn from_args(args: &NodeArgs) -> anyhow::Result<Self> {
        match &args.join {
            Some(text) => Self::from_ticket(args, text),
            None => {
                let mut options = args.config.options()?;
                if let Some(n) = args.nodes {
                    options.workers = Some(n);
                }
                Ok(RunPlan {
                    config: options.resolve()?,
                    run_id: args.run_id.clone().unwrap_or_else(|| DEFAULT_RUN_ID.into()),
                    bootstrap: args.bootstrap.clone(),
                    data_lane: args.data_lane.unwrap_or_default(),
                    admission: args.admission.clone(),
                })
            }
        }
    }

    fn from_ticket(args: &NodeArgs, text: &str) -> anyhow::Result<Self> {
        let ticket = JoinTicket::decode(text).context("--join")?;
        // The run's settings come from the ticket; only the data folder is
        // this machine's own.
        let train = &args.config.train;
        train.check_paths()?;
        let given: Vec<String> = train
            .to_table()?
            .keys()
            .filter(|k| k.as_str() != "data_dir")
            .map(|k| format!("--{}", k.replace('_', "-")))
            .collect();
        if !given.is_empty() {
            bail!(
                "--join takes the run's settings from the ticket, so {} cannot be given with it \
                 (only --data-dir, where this machine keeps the data)",
                given.join(", ")
            );
        }
        let data_lane: DataLane = ticket
            .data_lane
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--join: the ticket's data lane: {e}"))?;
        let wait = Duration::from_secs(args.join_timeout.max(1));
        tracing::info!(peers = ?ticket.addrs, "asking the ticket's peer for the run's settings");
        let settings = fetch_settings(&ticket.addrs, &ticket.run_id, &ticket.config_hash, wait)
            .context("--join: fetching the run's settings")?;
        let mut config: RunConfig = serde_json::from_str(&settings)
            .context("--join: the run's settings (from a node of another version?)")?;
        config.data_dir = train.data_dir.clone();
        if config.hash() != ticket.config_hash {
            bail!(
                "--join: the run's settings read back with hash {}, not the ticket's {} (a node \
                 of another version?)",
                config.hash(),
                ticket.config_hash
            );
        }
        let mut admission = args.admission.clone();
        if let Some(key) = &ticket.run_key_public {
            match &admission.run_key_public {
                Some(mine) if mine != key => {
                    bail!("--run-key-public {mine} is not the run key the ticket names ({key})")
                }
                _ => admission.run_key_public = Some(key.clone()),
            }
        }
        tracing::info!(
            nodes = config.workers,
            run_id = %ticket.run_id,
            "the run's settings match the ticket"
        );
        Ok(RunPlan {
            config,
            run_id: ticket.run_id,
            bootstrap: ticket.addrs,
            data_lane,
            admission,
        })
    }
}

/// The addresses a ticket hands out: the listen addresses other machines
/// can dial (loopback ones only when there is nothing else).
fn dialable(addrs: Vec<String>) -> Vec<String> {
    let is_loopback = |a: &String| a.starts_with("/ip4/127.") || a.starts_with("/ip6/::1/");
    let outside: Vec<String> = addrs.iter().filter(|a| !is_loopback(a)).cloned().collect();
    if outside.is_empty() { addrs } else { outside }
}

/// The ticket of a bound node.
pub fn ticket_of(
    pending: &PendingJoin,
    plan: &RunPlan,
    run_key_public: Option<String>,
    external: &[String],
) -> JoinTicket {
    let me = pending.local_peer_id();
    let mut addrs = dialable(pending.listen_addrs());
    for a in external {
        let a = if a.contains("/p2p/") {
            a.clone()
        } else {
            format!("{}/p2p/{me}", a.trim_end_matches('/'))
        };
        if !addrs.contains(&a) {
            addrs.insert(0, a);
        }
    }
    JoinTicket {
        addrs,
        run_id: plan.run_id.clone(),
        config_hash: plan.config.hash(),
        data_lane: plan.data_lane.name().into(),
        run_key_public,
    }
}

/// The ports other machines must reach, in words: each TCP and UDP listen
/// port and the lane's.
pub fn ports_line(pending: &PendingJoin) -> String {
    let mut tcp = Vec::new();
    let mut udp = Vec::new();
    for a in pending.listen_addrs() {
        let parts: Vec<&str> = a.split('/').collect();
        for w in parts.windows(2) {
            match w[0] {
                "tcp" => tcp.push(w[1].to_string()),
                "udp" => udp.push(w[1].to_string()),
                _ => {}
            }
        }
    }
    for v in [&mut tcp, &mut udp] {
        v.sort();
        v.dedup();
    }
    let mut parts = Vec::new();
    if !tcp.is_empty() {
        parts.push(format!("libp2p on TCP {}", tcp.join(", ")));
    }
    if !udp.is_empty() {
        parts.push(format!("libp2p on UDP {} (QUIC)", udp.join(", ")));
    }
    if let Some(p) = pending.lane_port() {
        parts.push(format!("data lane on TCP {p}"));
    }
    format!(
        "ports: {}; open them to the run's other machines",
        parts.join(", ")
    )
}

/// Prints the ports and the ticket on standard output (and to
/// `--ticket-file`), before the node waits for its peers.
pub fn announce(pending: &PendingJoin, ticket: &JoinTicket, args: &NodeArgs) -> anyhow::Result<()> {
    let text = ticket.encode();
    if let Some(path) = &args.ticket_file {
        crate::io::outputs::write_atomically(path, format!("{text}\n").as_bytes())
            .with_context(|| format!("--ticket-file {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", ports_line(pending));
    let _ = writeln!(out, "join this run from another machine with:");
    let _ = writeln!(out, "  slowmo node --join {text}");
    let _ = out.flush();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_hands_out_loopback_addresses_only_when_there_is_nothing_else() {
        let lo = "/ip4/127.0.0.1/tcp/1/p2p/x".to_string();
        let lan = "/ip4/10.1.2.3/tcp/1/p2p/x".to_string();
        assert_eq!(dialable(vec![lo.clone(), lan.clone()]), vec![lan.clone()]);
        assert_eq!(dialable(vec![lo.clone()]), vec![lo]);
    }
}
