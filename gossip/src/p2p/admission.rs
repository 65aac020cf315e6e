//! Who may join a run, decided before anything about the run is said.
//!
//! Every membership exchange starts with a [`Knock`]: the wire version and
//! a proof that the sender may join. The answerer checks it against its
//! [`Admission`] policy and answers [`Door::Closed`] (nothing else: no run
//! id, no hash, no reason; the reason goes to its own log) or
//! [`Door::Open`] with its own proof, which the greeter checks in turn.
//! Only then do hellos (run identity, settings, member lists) travel, so an
//! outsider learns nothing about the run and is never a member.
//!
//! Policies:
//! - [`Admission::Open`]: a peer proves it knows the run id (SHA-256 of the
//!   run id and its own peer id; the connection authenticates the peer id,
//!   so the proof cannot be replayed by another peer). For a private
//!   testnet: anyone who knows the run id gets in. Places in rank order:
//!   sorted peer ids.
//! - [`Admission::Allow`]: the same proof, and the peer id must be on the
//!   allowlist. Places: the order of the list.
//! - [`Admission::Invited`]: the peer presents an ed25519 signature of the
//!   run key over the run id and its peer id ([`Invitation`]), verified
//!   against the run's public key. Places: SHA-256 of the run id and the
//!   peer id, so no key can be ground to come first among the invited.

use std::path::Path;

use libp2p::PeerId;
use libp2p::identity::ed25519;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a peer presents to be admitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Proof {
    /// SHA-256 over a domain tag, the run id and the sender's peer id.
    RunId(Vec<u8>),
    /// The run key's ed25519 signature over the run id and the sender's
    /// peer id.
    Invitation(Vec<u8>),
}

/// The first message of a membership exchange.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Knock {
    pub version: u16,
    pub proof: Proof,
}

/// The answer to a [`Knock`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Door {
    /// Admitted; the answerer's own proof follows.
    Open(Proof),
    /// Not admitted. Carries nothing about the run, on purpose.
    Closed,
}

/// The admission policy of a run. Every node of a run uses the same one
/// (peers compare a digest of it once admitted).
#[derive(Debug, Clone, Default)]
#[allow(clippy::large_enum_variant)] // one per node, read at start-up
pub enum Admission {
    /// Anyone who knows the run id (today's behaviour; a private testnet).
    #[default]
    Open,
    /// Only these peer ids, placed in this order.
    Allow(Vec<PeerId>),
    /// Peers with an invitation signed by the run key.
    Invited {
        /// The run's public key, which every invitation must verify against.
        run_key: ed25519::PublicKey,
        /// This node's own invitation.
        invitation: Invitation,
    },
}

/// A peer's invitation to a run: the run key's signature over the run id
/// and the peer id. Kept in a small TOML file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invitation {
    pub run_id: String,
    pub peer: PeerId,
    pub signature: Vec<u8>,
}

/// A run key: an ed25519 keypair held by whoever starts the run, and the
/// run id its invitations name. Kept in a TOML file readable by its owner
/// only.
#[derive(Debug, Clone)]
pub struct RunKey {
    pub run_id: String,
    pub keypair: ed25519::Keypair,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunKeyFile {
    run_id: String,
    public: String,
    secret: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct InvitationFile {
    run_id: String,
    peer: String,
    run_key: String,
    signature: String,
}

const KEY_PREFIX: &str = "ed25519:";

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

fn tagged(tag: &[u8], run_id: &str, peer: &PeerId) -> Vec<u8> {
    let mut m = Vec::with_capacity(tag.len() + run_id.len() + 40);
    m.extend_from_slice(tag);
    m.extend_from_slice(run_id.as_bytes());
    m.push(0);
    m.extend_from_slice(&peer.to_bytes());
    m
}

/// The bytes an invitation signs.
fn invitation_message(run_id: &str, peer: &PeerId) -> Vec<u8> {
    tagged(b"slowmo-invitation/1\0", run_id, peer)
}

fn run_id_proof(run_id: &str, peer: &PeerId) -> Vec<u8> {
    Sha256::digest(tagged(b"slowmo-admission/1\0", run_id, peer)).to_vec()
}

/// The public key as written in files and on the command line.
pub fn public_key_text(key: &ed25519::PublicKey) -> String {
    format!("{KEY_PREFIX}{}", hex(&key.to_bytes()))
}

/// Reads a run's public key: `ed25519:<64 hex digits>` as printed by
/// `slowmo run init`, or the path of a file holding it.
pub fn parse_public_key(text_or_file: &str) -> Result<ed25519::PublicKey, String> {
    let text = if text_or_file.starts_with(KEY_PREFIX) {
        text_or_file.to_string()
    } else {
        std::fs::read_to_string(text_or_file).map_err(|e| {
            format!(
                "run key `{text_or_file}`: neither `{KEY_PREFIX}<hex>` nor a readable file ({e})"
            )
        })?
    };
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or("");
    let hexpart = line.strip_prefix(KEY_PREFIX).ok_or_else(|| {
        format!("run key `{text_or_file}`: expected `{KEY_PREFIX}` and 64 hex digits")
    })?;
    unhex(hexpart)
        .and_then(|b| ed25519::PublicKey::try_from_bytes(&b).ok())
        .ok_or_else(|| {
            format!("run key `{text_or_file}`: `{line}` is not an ed25519 public key (`{KEY_PREFIX}` and 64 hex digits)")
        })
}

/// Reads a text file for a flag, naming it in the error.
fn read_text(what: &str, path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

impl RunKey {
    /// A new run key for `run_id`.
    pub fn generate(run_id: &str) -> Self {
        Self {
            run_id: run_id.to_string(),
            keypair: ed25519::Keypair::generate(),
        }
    }

    /// The public key, as `ed25519:<hex>`.
    pub fn public_text(&self) -> String {
        public_key_text(&self.keypair.public())
    }

    /// The file's text (TOML).
    pub fn to_file_text(&self) -> String {
        let file = RunKeyFile {
            run_id: self.run_id.clone(),
            public: self.public_text(),
            secret: hex(&self.keypair.to_bytes()),
        };
        format!(
            "# slowmo run key: signs invitations to run `{}`. Keep it secret.\n{}",
            self.run_id,
            toml::to_string(&file).expect("a run key serialises")
        )
    }

    /// Reads a run key file.
    pub fn read(path: &Path) -> Result<Self, String> {
        let bad = |why: String| format!("run key file {}: {why}", path.display());
        let text = read_text("run key file", path)?;
        let file: RunKeyFile = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let mut bytes = unhex(&file.secret).ok_or_else(|| bad("`secret` is not hex".into()))?;
        let keypair = ed25519::Keypair::try_from_bytes(&mut bytes)
            .map_err(|e| bad(format!("`secret` is not an ed25519 keypair: {e}")))?;
        if public_key_text(&keypair.public()) != file.public.trim() {
            return Err(bad("`public` does not belong to `secret`".into()));
        }
        super::run_id::check_run_id(&file.run_id).map_err(|e| bad(format!("`run_id`: {e}")))?;
        Ok(Self {
            run_id: file.run_id,
            keypair,
        })
    }

    /// An invitation for the peer id written as `peer`.
    pub fn invite_text(&self, peer: &str) -> Result<Invitation, String> {
        let id: PeerId = peer
            .trim()
            .parse()
            .map_err(|e| format!("`{peer}` is not a peer id: {e}"))?;
        Ok(self.invite(id))
    }

    /// An invitation for `peer` to this key's run.
    pub fn invite(&self, peer: PeerId) -> Invitation {
        Invitation {
            run_id: self.run_id.clone(),
            peer,
            signature: self.keypair.sign(&invitation_message(&self.run_id, &peer)),
        }
    }
}

impl Invitation {
    /// The file's text (TOML); `run_key` is the signer's public key, for
    /// the operator's eyes (nodes verify against `--run-key-public`).
    pub fn to_file_text(&self, run_key: &ed25519::PublicKey) -> String {
        let file = InvitationFile {
            run_id: self.run_id.clone(),
            peer: self.peer.to_string(),
            run_key: public_key_text(run_key),
            signature: hex(&self.signature),
        };
        format!(
            "# slowmo invitation: peer {} may join run `{}`\n{}",
            self.peer,
            self.run_id,
            toml::to_string(&file).expect("an invitation serialises")
        )
    }

    /// Reads an invitation file.
    pub fn read(path: &Path) -> Result<Self, String> {
        let bad = |why: String| format!("invitation {}: {why}", path.display());
        let text = read_text("invitation", path)?;
        let file: InvitationFile = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let peer = file
            .peer
            .parse()
            .map_err(|e| bad(format!("`peer` is not a peer id: {e}")))?;
        let signature = unhex(&file.signature)
            .filter(|s| s.len() == 64)
            .ok_or_else(|| bad("`signature` is not 64 bytes of hex".into()))?;
        Ok(Self {
            run_id: file.run_id,
            peer,
            signature,
        })
    }

    /// Whether `run_key` signed this invitation.
    pub fn verifies(&self, run_key: &ed25519::PublicKey) -> bool {
        run_key.verify(
            &invitation_message(&self.run_id, &self.peer),
            &self.signature,
        )
    }
}

/// The peer id of the identity kept in `path` (created there if missing),
/// for allowlists and invitations.
pub fn peer_id_of_identity(path: &Path) -> Result<String, crate::CommError> {
    Ok(super::identity::load_or_create(Some(path))?
        .public()
        .to_peer_id()
        .to_string())
}

/// Reads an allowlist: one peer id per line; `#` starts a comment; blank
/// lines are skipped. The order of the list is the order of the places.
pub fn read_allowlist(path: &Path) -> Result<Vec<PeerId>, String> {
    let text = read_text("allowlist", path)?;
    let mut peers: Vec<PeerId> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let entry = line.split('#').next().unwrap_or("").trim();
        if entry.is_empty() {
            continue;
        }
        let peer: PeerId = entry.parse().map_err(|e| {
            format!(
                "allowlist {} line {}: `{entry}` is not a peer id ({e})",
                path.display(),
                n + 1
            )
        })?;
        if peers.contains(&peer) {
            return Err(format!(
                "allowlist {} line {}: {peer} is listed twice",
                path.display(),
                n + 1
            ));
        }
        peers.push(peer);
    }
    if peers.is_empty() {
        return Err(format!("allowlist {}: lists no peer id", path.display()));
    }
    Ok(peers)
}

impl Admission {
    /// The policy's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Admission::Open => "open",
            Admission::Allow(_) => "allowlist",
            Admission::Invited { .. } => "invitation",
        }
    }

    /// The run's public key as text (`ed25519:<hex>`) under invitations,
    /// what a join ticket hands a new node.
    pub fn run_key_text(&self) -> Option<String> {
        match self {
            Admission::Invited { run_key, .. } => Some(public_key_text(run_key)),
            _ => None,
        }
    }

    /// What admitted peers compare: the policy and what it admits (a hash
    /// of the allowlist in order, or the run's public key).
    pub(crate) fn digest(&self) -> String {
        match self {
            Admission::Open => "open".into(),
            Admission::Allow(list) => {
                let mut h = Sha256::new();
                for p in list {
                    h.update(p.to_bytes());
                }
                format!("allowlist {}", &hex(&h.finalize())[..16])
            }
            Admission::Invited { run_key, .. } => {
                format!("invitations of run key {}", public_key_text(run_key))
            }
        }
    }

    /// Checks that this node itself is admitted (at start-up, so that a
    /// misconfigured node says so instead of waiting).
    pub fn check_self(&self, run_id: &str, local: &PeerId) -> Result<(), String> {
        match self {
            Admission::Open => Ok(()),
            Admission::Allow(list) if list.contains(local) => Ok(()),
            Admission::Allow(_) => Err(format!(
                "this node's peer id {local} is not on the allowlist"
            )),
            Admission::Invited {
                run_key,
                invitation,
            } => {
                if invitation.peer != *local {
                    Err(format!(
                        "the invitation is for peer {}, but this node is {local} (another --identity?)",
                        invitation.peer
                    ))
                } else if invitation.run_id != run_id {
                    Err(format!(
                        "the invitation is for run `{}`, but the run id is `{run_id}`",
                        invitation.run_id
                    ))
                } else if !invitation.verifies(run_key) {
                    Err(format!(
                        "the invitation was not signed by run key {}",
                        public_key_text(run_key)
                    ))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Our proof for the peers we knock on.
    pub(crate) fn proof(&self, run_id: &str, local: &PeerId) -> Proof {
        match self {
            Admission::Open | Admission::Allow(_) => Proof::RunId(run_id_proof(run_id, local)),
            Admission::Invited { invitation, .. } => {
                Proof::Invitation(invitation.signature.clone())
            }
        }
    }

    /// Whether `peer` could be admitted at all, known from its peer id
    /// alone: we knock only on those, so that a peer off the allowlist never
    /// sees even our proof.
    pub(crate) fn may_admit(&self, peer: &PeerId) -> bool {
        match self {
            Admission::Allow(list) => list.contains(peer),
            Admission::Open | Admission::Invited { .. } => true,
        }
    }

    /// Whether `peer` (authenticated by the connection) is admitted with
    /// `proof`; the error is for our own log only.
    pub(crate) fn admits(&self, run_id: &str, peer: &PeerId, proof: &Proof) -> Result<(), String> {
        match (self, proof) {
            (Admission::Allow(list), _) if !list.contains(peer) => {
                Err("not on the allowlist".into())
            }
            (Admission::Open | Admission::Allow(_), Proof::RunId(p)) => {
                if *p == run_id_proof(run_id, peer) {
                    Ok(())
                } else {
                    Err("its proof does not match our run id (another run)".into())
                }
            }
            (Admission::Invited { run_key, .. }, Proof::Invitation(sig)) => {
                if run_key.verify(&invitation_message(run_id, peer), sig) {
                    Ok(())
                } else {
                    Err("its invitation does not verify against the run key".into())
                }
            }
            (Admission::Invited { .. }, Proof::RunId(_)) => {
                Err("it presents no invitation (an open or allowlist node?)".into())
            }
            (_, Proof::Invitation(_)) => {
                Err("it presents an invitation, but this run is not by invitation".into())
            }
        }
    }

    /// The key that orders peers into places (and ranks): smaller first.
    pub(crate) fn place(&self, run_id: &str, peer: &PeerId) -> (u64, String) {
        match self {
            Admission::Open => (0, peer.to_string()),
            Admission::Allow(list) => (
                list.iter()
                    .position(|p| p == peer)
                    .map_or(u64::MAX, |i| i as u64),
                peer.to_string(),
            ),
            Admission::Invited { .. } => (
                0,
                hex(&Sha256::digest(tagged(b"slowmo-place/1\0", run_id, peer))),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(i: u8) -> PeerId {
        libp2p::identity::Keypair::ed25519_from_bytes([i; 32])
            .unwrap()
            .public()
            .to_peer_id()
    }

    #[test]
    fn invitations_verify_only_for_their_peer_run_and_key() {
        let key = RunKey::generate("r");
        let other = RunKey::generate("r");
        let inv = key.invite(peer(1));
        let policy = Admission::Invited {
            run_key: key.keypair.public(),
            invitation: inv.clone(),
        };
        policy.check_self("r", &peer(1)).unwrap();
        assert!(policy.check_self("r", &peer(2)).is_err());
        assert!(policy.check_self("s", &peer(1)).is_err());
        let proof = policy.proof("r", &peer(1));
        policy.admits("r", &peer(1), &proof).unwrap();
        // The same signature does not admit another peer, run or key.
        assert!(policy.admits("r", &peer(2), &proof).is_err());
        assert!(policy.admits("s", &peer(1), &proof).is_err());
        let foreign = Admission::Invited {
            run_key: other.keypair.public(),
            invitation: other.invite(peer(1)),
        };
        assert!(foreign.admits("r", &peer(1), &proof).is_err());
        assert!(
            policy
                .admits("r", &peer(1), &Proof::RunId(run_id_proof("r", &peer(1))))
                .is_err()
        );
    }

    #[test]
    fn files_round_trip_and_bad_ones_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let key = RunKey::generate("run-7");
        let kp = dir.path().join("run.key");
        std::fs::write(&kp, key.to_file_text()).unwrap();
        let back = RunKey::read(&kp).unwrap();
        assert_eq!(back.public_text(), key.public_text());
        assert_eq!(back.run_id, "run-7");
        let inv = back.invite(peer(3));
        let ip = dir.path().join("inv.toml");
        std::fs::write(&ip, inv.to_file_text(&key.keypair.public())).unwrap();
        assert_eq!(Invitation::read(&ip).unwrap(), inv);
        let pk = parse_public_key(&key.public_text()).unwrap();
        assert!(inv.verifies(&pk));
        let pubfile = dir.path().join("run.pub");
        std::fs::write(&pubfile, format!("# run key\n{}\n", key.public_text())).unwrap();
        assert_eq!(parse_public_key(pubfile.to_str().unwrap()).unwrap(), pk);
        let e = parse_public_key("ed25519:abcd").unwrap_err();
        assert!(e.contains("64 hex digits"), "{e}");
        std::fs::write(&ip, "run_id = 1").unwrap();
        let e = Invitation::read(&ip).unwrap_err();
        assert!(e.contains("inv.toml"), "{e}");
    }

    #[test]
    fn allowlists_keep_their_order_and_refuse_junk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("allow.txt");
        let text = format!(
            "# members\n{}\n\n{}  # second\n{}\n",
            peer(3),
            peer(1),
            peer(2)
        );
        std::fs::write(&path, text).unwrap();
        let list = read_allowlist(&path).unwrap();
        assert_eq!(list, vec![peer(3), peer(1), peer(2)]);
        let policy = Admission::Allow(list);
        assert!(policy.place("r", &peer(3)) < policy.place("r", &peer(1)));
        assert!(policy.place("r", &peer(1)) < policy.place("r", &peer(2)));
        // We do not even knock on a peer off the list.
        assert!(policy.may_admit(&peer(1)) && !policy.may_admit(&peer(9)));
        let proof = policy.proof("r", &peer(9));
        assert_eq!(
            policy.admits("r", &peer(9), &proof).unwrap_err(),
            "not on the allowlist"
        );
        std::fs::write(&path, format!("{}\nnot-a-peer\n", peer(1))).unwrap();
        let e = read_allowlist(&path).unwrap_err();
        assert!(e.contains("line 2") && e.contains("not-a-peer"), "{e}");
        std::fs::write(&path, format!("{}\n{}\n", peer(1), peer(1))).unwrap();
        assert!(read_allowlist(&path).unwrap_err().contains("twice"));
    }
}
