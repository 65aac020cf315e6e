//! Watching a testnet: each node's Prometheus endpoint (`slowmo node
//! --metrics-addr`), a scrape configuration for a Prometheus on this host,
//! and the HTML report (`slowmo report`) written when a run ends.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::yaml::Yaml;

/// Port of the metrics endpoint inside a compose node's container.
pub const CONTAINER_METRICS_PORT: u16 = 9100;
/// The compose network that carries only the published metrics ports (the
/// testnet network is internal, and Docker publishes no port of a container
/// that is only on an internal network).
pub const METRICS_NETWORK: &str = "metrics";

/// The host ports of `nodes` endpoints starting at `base`; names `flag`
/// when the last one would pass 65535.
pub fn metrics_ports(flag: &str, base: u16, nodes: usize) -> anyhow::Result<Vec<u16>> {
    let last = u32::from(base) + nodes.saturating_sub(1) as u32;
    if base == 0 || last > u32::from(u16::MAX) {
        bail!(
            "{flag} {base}: node i serves on port {base} + i, so {nodes} nodes need ports {base}..={last}, \
             which must lie within 1..=65535"
        );
    }
    Ok((0..nodes).map(|i| base + i as u16).collect())
}

/// A Prometheus configuration scraping `127.0.0.1:PORT` for each node,
/// labelled with the node's name.
pub fn prometheus_config(job: &str, nodes: &[(String, u16)]) -> String {
    let mut out = format!(
        "# Written by slowmo-testnet: `prometheus --config.file=THIS_FILE` on this host\n\
         global:\n  scrape_interval: 5s\nscrape_configs:\n  - job_name: \"{job}\"\n    static_configs:\n"
    );
    for (name, port) in nodes {
        out.push_str(&format!(
            "      - targets: [\"127.0.0.1:{port}\"]\n        labels:\n          node: \"{name}\"\n"
        ));
    }
    out
}

/// Publishes a compose service's metrics endpoint on 127.0.0.1:`port` of
/// the host, through the metrics network.
pub fn publish(service: &mut Yaml, networks: &mut Yaml, port: u16) {
    let published = format!("127.0.0.1:{port}:{CONTAINER_METRICS_PORT}");
    service.insert("ports", vec![published]);
    networks.insert(METRICS_NETWORK, Yaml::map());
}

/// Declares the (not internal) metrics network of a compose file.
pub fn add_metrics_network(networks: &mut Yaml) {
    networks.insert(METRICS_NETWORK, Yaml::map().with("driver", "bridge"));
}

/// Writes the scrape configuration of compose nodes `node-0..` at `ports`.
pub fn write_prometheus_config(path: &Path, ports: &[u16]) -> anyhow::Result<()> {
    let nodes: Vec<(String, u16)> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| (crate::node_line::node_name(i), *p))
        .collect();
    std::fs::write(path, prometheus_config("slowmo", &nodes))
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {} (scrapes {} nodes)", path.display(), nodes.len());
    Ok(())
}

/// Runs `slowmo report DIR` and returns the page's path.
pub fn write_report(slowmo: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let output = Command::new(slowmo)
        .arg("report")
        .arg(dir)
        .output()
        .with_context(|| format!("running {} report", slowmo.display()))?;
    if !output.status.success() {
        bail!(
            "`{} report {}` failed: {}",
            slowmo.display(),
            dir.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let printed = String::from_utf8_lossy(&output.stdout);
    let path = printed
        .lines()
        .last()
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("report.html"));
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_follow_the_base_and_stay_in_range() {
        assert_eq!(
            metrics_ports("--metrics-base-port", 9100, 3).unwrap(),
            [9100, 9101, 9102]
        );
        let err = metrics_ports("--metrics-base-port", 65535, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--metrics-base-port 65535"), "{err}");
        assert!(metrics_ports("--metrics-port", 0, 1).is_err());
    }

    #[test]
    fn scrape_config_lists_every_node() {
        let text = prometheus_config(
            "slowmo",
            &[("node-0".into(), 9100), ("node-1".into(), 9101)],
        );
        assert!(text.contains("job_name: \"slowmo\""));
        assert!(text.contains("targets: [\"127.0.0.1:9101\"]"));
        assert!(text.contains("node: \"node-1\""));
    }
}
