//! `slowmo run`: the run key, invitations and peer ids that the admission
//! policies of `slowmo node` use (`--allow FILE`, `--invitation FILE
//! --run-key-public KEY`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use slowmo_gossip::p2p::{Admission, Invitation, RunKey, parse_public_key, read_allowlist};

use crate::config::RunConfig;

/// Arguments of `slowmo run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(subcommand)]
    pub command: RunCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum RunCommand {
    /// Create a run key (it signs invitations; keep it secret) and print its
    /// public key, which every node is given as --run-key-public.
    Init {
        /// Where to write the run key (refused if it exists); the public key
        /// also goes to FILE.pub.
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// The run id the invitations name (the nodes' --run-id; at most 256 bytes).
        #[arg(long, default_value = "slowmo", value_parser = parse_run_id)]
        run_id: String,
    },
    /// Write an invitation for PEER_ID: the run key's signature over the
    /// run id and the peer id.
    Invite {
        /// The run key written by `slowmo run init`.
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// The invited node's peer id (`slowmo run peer-id --identity FILE`).
        peer_id: String,
        /// Where to write the invitation [default: standard output].
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print the peer id of a node's identity file (created if missing), for
    /// allowlists and invitations.
    PeerId {
        /// The node's --identity file.
        #[arg(long, value_name = "FILE")]
        identity: PathBuf,
    },
}

/// Admission flags of `slowmo node`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AdmissionArgs {
    /// Admit only the peer ids listed in FILE (one per line, `#` starts a
    /// comment); places and ranks follow the list's order [default: open,
    /// anyone with the run id].
    #[arg(long, value_name = "FILE", conflicts_with_all = ["invitation", "run_key_public"])]
    pub allow: Option<PathBuf>,
    /// This node's invitation (`slowmo run invite`); only peers invited by
    /// the same run key are admitted.
    #[arg(long, value_name = "FILE")]
    pub invitation: Option<PathBuf>,
    /// The run's public key for --invitation: `ed25519:<hex>` as `slowmo run
    /// init` prints it, or a file holding it.
    #[arg(long, value_name = "KEY_OR_FILE", requires = "invitation")]
    pub run_key_public: Option<String>,
}

impl AdmissionArgs {
    /// The admission policy these flags ask for.
    pub fn policy(&self) -> anyhow::Result<Admission> {
        if let Some(path) = &self.allow {
            return read_allowlist(path)
                .map(Admission::Allow)
                .map_err(|e| anyhow::anyhow!("--allow: {e}"));
        }
        match (&self.invitation, &self.run_key_public) {
            (Some(inv), Some(key)) => {
                let run_key =
                    parse_public_key(key).map_err(|e| anyhow::anyhow!("--run-key-public: {e}"))?;
                let invitation =
                    Invitation::read(inv).map_err(|e| anyhow::anyhow!("--invitation: {e}"))?;
                Ok(Admission::Invited {
                    run_key,
                    invitation,
                })
            }
            (None, None) => Ok(Admission::Open),
            _ => bail!(
                "--invitation and --run-key-public go together (a --join ticket of a run with \
                 invitations carries the public key)"
            ),
        }
    }
}

/// The settings behind the config hash, flattened (`algorithm.slowmo.beta`),
/// so that peers can name the ones that differ.
pub fn config_settings(config: &RunConfig) -> BTreeMap<String, String> {
    let Ok(mut v) = serde_json::to_value(config) else {
        return BTreeMap::new();
    };
    if let Some(map) = v.as_object_mut() {
        map.remove("data_dir");
    }
    slowmo_runspec::flat_settings(&v).into_iter().collect()
}

/// Writes `text` to a new file readable by its owner only; refuses to
/// replace an existing one.
fn write_new_secret(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options.open(path).with_context(|| {
        if path.exists() {
            format!(
                "{} exists already; a run key is never overwritten",
                path.display()
            )
        } else {
            format!("creating {}", path.display())
        }
    })?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// `--run-id`: checked up front (not empty, at most
/// [`slowmo_gossip::p2p::MAX_RUN_ID_BYTES`] bytes).
pub fn parse_run_id(text: &str) -> Result<String, String> {
    slowmo_gossip::p2p::check_run_id(text)?;
    Ok(text.to_string())
}

/// `slowmo run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    match args.command {
        RunCommand::Init { key, run_id } => {
            let run_key = RunKey::generate(&run_id);
            write_new_secret(&key, &run_key.to_file_text())?;
            let mut pub_path = key.clone().into_os_string();
            pub_path.push(".pub");
            let pub_path = PathBuf::from(pub_path);
            std::fs::write(&pub_path, format!("{}\n", run_key.public_text()))
                .with_context(|| format!("writing {}", pub_path.display()))?;
            eprintln!(
                "run key of run `{run_id}` written to {} (keep it secret); public key in {}",
                key.display(),
                pub_path.display()
            );
            println!("{}", run_key.public_text());
        }
        RunCommand::Invite { key, peer_id, out } => {
            let run_key = RunKey::read(&key).map_err(anyhow::Error::msg)?;
            let invitation = run_key
                .invite_text(&peer_id)
                .map_err(|e| anyhow::anyhow!("PEER_ID: {e}"))?;
            let text = invitation.to_file_text(&run_key.keypair.public());
            match out {
                Some(path) => {
                    std::fs::write(&path, text)
                        .with_context(|| format!("writing {}", path.display()))?;
                    eprintln!(
                        "invitation of {} to run `{}` written to {}",
                        invitation.peer,
                        run_key.run_id,
                        path.display()
                    );
                }
                None => print!("{text}"),
            }
        }
        RunCommand::PeerId { identity } => {
            println!("{}", slowmo_gossip::p2p::peer_id_of_identity(&identity)?);
        }
    }
    Ok(())
}
