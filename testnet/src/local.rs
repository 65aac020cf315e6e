//! `slowmo-testnet local`: N `slowmo node` processes on 127.0.0.1 (filled in by the lead).

/// Arguments of `slowmo-testnet local`.
#[derive(Debug, clap::Args)]
pub struct LocalArgs {}

/// Runs a local testnet.
pub fn run(_args: LocalArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet built")
}
