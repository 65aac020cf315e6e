//! The start-up exchange of one pair of peers, from both sides: the knock
//! and door of [`crate::p2p::admission`], then hellos compared field by field;
//! refusals (never carrying a value over the wire) and duplicated
//! identities. Part of [`super`] (membership).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::AsyncWriteExt;
use libp2p::{PeerId, Stream, StreamProtocol};

use super::join::Membership;
use super::msg::{
    DUPLICATE, EXCHANGE_TIMEOUT, Hello, Refusal, Refused, Reply, read_msg, write_msg,
};
use crate::CommError;
use crate::p2p::admission::{Door, Knock};
use crate::p2p::command::SwarmCmd;
use crate::p2p::wire::{MEMBERSHIP_PROTOCOL, WIRE_VERSION};
use crate::sync::lock;

impl Membership {
    /// The first field in which an admitted peer's hello differs from
    /// ours: what to tell it, and the line for our own log.
    pub(super) fn compare(&self, theirs: &Hello) -> Option<(Refusal, String)> {
        let refuse = |field: &str, settings: Vec<String>, text: String| {
            let refusal = Refusal {
                field: field.into(),
                settings,
            };
            Some((refusal, format!("{field} differs: {text}")))
        };
        if theirs.version != WIRE_VERSION {
            let text = format!("ours {WIRE_VERSION} theirs {}", theirs.version);
            return refuse("protocol version", Vec::new(), text);
        }
        if let Some((field, ours, other)) = self.identity.first_difference(&theirs.identity) {
            let differing = settings_differing(&self.settings, &theirs.settings);
            let text = if field == "config hash" && !differing.is_empty() {
                differing
                    .iter()
                    .map(|k| {
                        let show = |m: &BTreeMap<String, String>| {
                            m.get(k).cloned().unwrap_or_else(|| "(unset)".into())
                        };
                        format!(
                            "{k}: ours {} theirs {}",
                            show(&self.settings),
                            show(&theirs.settings)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            } else {
                format!("ours {ours} theirs {other}")
            };
            return refuse(field, differing, text);
        }
        if theirs.nodes != self.nodes as u64 {
            let text = format!("ours {} theirs {}", self.nodes, theirs.nodes);
            return refuse("node count", Vec::new(), text);
        }
        if theirs.admission != self.admission.digest() {
            let text = format!(
                "ours {} theirs {}",
                self.admission.digest(),
                theirs.admission
            );
            return refuse("admission policy", Vec::new(), text);
        }
        None
    }

    /// Notes the process instance behind `peer`'s hello; true when the
    /// peer id is two processes (an instance seen before, then another,
    /// comes back: a restart never does).
    pub(super) fn duplicated(&self, peer: PeerId, instance: u64) -> bool {
        let mut st = lock(&self.state);
        if st.duplicates.contains(&peer) {
            return true;
        }
        let seen = st.instances.entry(peer).or_default();
        let dup = match seen.iter().position(|i| *i == instance) {
            Some(i) => i + 1 != seen.len(),
            None => {
                seen.push(instance);
                false
            }
        };
        if dup {
            st.duplicates.insert(peer);
        }
        dup
    }

    /// Refuses a peer id that two processes use.
    pub(super) fn refuse_duplicate(&self, peer: PeerId) -> Refusal {
        let text = format!(
            "peer {peer} is two processes sharing one identity (their hellos come from two \
             live instances); each node needs its own identity file"
        );
        self.record_refusal(peer, DUPLICATE, text, false);
        Refusal {
            field: DUPLICATE.into(),
            settings: Vec::new(),
        }
    }

    pub(super) async fn answer(self: Arc<Self>, peer: PeerId, mut stream: Stream) {
        let knock: Knock = match read_msg(&mut stream).await {
            Ok(k) => k,
            Err(e) => {
                if let Some(held) = self.shared.warnings.admit("bad-knock") {
                    tracing::warn!(%peer, "bad knock from peer {peer}: {e}{held}");
                }
                return;
            }
        };
        let verdict = if knock.version != WIRE_VERSION {
            Err(format!(
                "it speaks protocol version {}, we speak {WIRE_VERSION}",
                knock.version
            ))
        } else {
            self.admission
                .admits(&self.identity.run_id, &peer, &knock.proof)
        };
        if let Err(why) = verdict {
            let text = format!(
                "peer {peer} not admitted ({} policy): {why}",
                self.admission.name()
            );
            self.record_refusal(peer, "admission", text, false);
            let _ = write_msg(&mut stream, &Door::Closed).await;
            self.close_and_drop(peer, stream).await;
            return;
        }
        if write_msg(&mut stream, &Door::Open(self.proof.clone()))
            .await
            .is_err()
        {
            return;
        }
        let hello: Hello = match read_msg(&mut stream).await {
            Ok(h) => h,
            // The greeter did not admit us (it logs why) or went away.
            Err(e) => {
                tracing::debug!(%peer, "no hello from admitted peer {peer}: {e}");
                return;
            }
        };
        if hello.peer != peer.to_string() {
            tracing::warn!(%peer, claimed = %hello.peer, "hello from peer {peer} claims to be {}", hello.peer);
            return;
        }
        let refusal = if self.duplicated(peer, hello.instance) {
            Some(self.refuse_duplicate(peer))
        } else if let Some((r, text)) = self.compare(&hello) {
            let field = r.field.clone();
            self.record_refusal(peer, &field, format!("peer {peer} refused: {text}"), false);
            Some(r)
        } else {
            None
        };
        if let Some(r) = refusal {
            let _ = write_msg(&mut stream, &Reply::Refused(r)).await;
            self.close_and_drop(peer, stream).await;
            return;
        }
        self.learn(peer, &hello);
        let reply = Reply::Welcome(self.hello_locked(&lock(&self.state)));
        let _ = write_msg(&mut stream, &reply).await;
        let _ = stream.close().await;
    }

    /// Closes a stream after a refusal and drops the connection once the
    /// refusal had time to arrive.
    pub(super) async fn close_and_drop(&self, peer: PeerId, mut stream: Stream) {
        let _ = stream.close().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = self.swarm.send(SwarmCmd::Disconnect(peer));
    }

    /// Drops the connection to a peer we refused after its own next knock
    /// had time to hear why (dropping at once would race it).
    pub(super) fn drop_later(&self, peer: PeerId) {
        let swarm = self.swarm.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let _ = swarm.send(SwarmCmd::Disconnect(peer));
        });
    }

    /// One exchange with `peer`, started by us: knock, check its proof,
    /// then hellos.
    pub(super) async fn greet(self: Arc<Self>, mut control: libp2p_stream::Control, peer: PeerId) {
        enum Outcome {
            Closed,
            NotAdmitted(String),
            Reply(Box<Reply>),
        }
        let result = tokio::time::timeout(EXCHANGE_TIMEOUT, async {
            if !self.admission.may_admit(&peer) {
                return Ok(Outcome::NotAdmitted("not on the allowlist".into()));
            }
            let mut stream = control
                .open_stream(peer, StreamProtocol::new(MEMBERSHIP_PROTOCOL))
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let knock = Knock {
                version: WIRE_VERSION,
                proof: self.proof.clone(),
            };
            write_msg(&mut stream, &knock).await?;
            let proof = match read_msg(&mut stream).await? {
                Door::Closed => return Ok(Outcome::Closed),
                Door::Open(proof) => proof,
            };
            if let Err(why) = self.admission.admits(&self.identity.run_id, &peer, &proof) {
                let _ = stream.close().await;
                return Ok(Outcome::NotAdmitted(why));
            }
            let hello = self.hello_locked(&lock(&self.state));
            write_msg(&mut stream, &hello).await?;
            let reply: Reply = read_msg(&mut stream).await?;
            let _ = stream.close().await;
            Ok::<Outcome, std::io::Error>(Outcome::Reply(Box::new(reply)))
        })
        .await;
        lock(&self.state).in_flight.remove(&peer);
        match result {
            Ok(Ok(Outcome::Reply(reply))) => match *reply {
                Reply::Welcome(hello) => self.on_welcome(peer, &hello),
                Reply::Refused(r) => self.on_refused(peer, &r),
            },
            Ok(Ok(Outcome::Closed)) => {
                let text = format!(
                    "peer {peer} did not admit us (its log says why: not on its allowlist, \
                     no valid invitation, another run id, another policy or protocol version)"
                );
                self.record_refusal(peer, "admission", text, true);
            }
            Ok(Ok(Outcome::NotAdmitted(why))) => {
                let text = format!(
                    "peer {peer} not admitted ({} policy): {why}",
                    self.admission.name()
                );
                self.record_refusal(peer, "admission", text, false);
                self.drop_later(peer);
            }
            Ok(Err(e)) => tracing::debug!(%peer, "hello exchange with {peer} failed: {e}"),
            Err(_) => tracing::debug!(%peer, "hello exchange with {peer} timed out"),
        }
    }

    /// Their welcome, checked like a hello they sent.
    fn on_welcome(&self, peer: PeerId, hello: &Hello) {
        if hello.peer != peer.to_string() {
            tracing::warn!(%peer, "welcome from peer {peer} claims to be {}", hello.peer);
        } else if self.duplicated(peer, hello.instance) {
            self.refuse_duplicate(peer);
            self.drop_later(peer);
        } else if let Some((r, text)) = self.compare(hello) {
            let text = format!("peer {peer} refused: {text}");
            self.record_refusal(peer, &r.field, text, false);
            self.drop_later(peer);
        } else {
            self.learn(peer, hello);
        }
    }

    /// Their refusal of our hello, in our log (and our error if fatal).
    fn on_refused(&self, peer: PeerId, r: &Refusal) {
        let text = if r.field == DUPLICATE {
            format!(
                "peer {peer} saw two processes with our peer id {}: another process \
                 uses this node's identity{}",
                self.local,
                self.identity_file_note()
            )
        } else if r.settings.is_empty() {
            format!("peer {peer} refused us: {} differs", r.field)
        } else {
            format!(
                "peer {peer} refused us: {} differs in the settings {}",
                r.field,
                r.settings.join(", ")
            )
        };
        self.record_refusal(peer, &r.field, text, true);
    }

    pub(super) fn identity_file_note(&self) -> String {
        match &self.identity_file {
            Some(f) => format!(" ({}); give each node its own --identity", f.display()),
            None => String::new(),
        }
    }

    /// Logs a refusal in either direction and remembers the peer as one
    /// we do not run with. Being refused by, or refusing, a bootstrap peer
    /// ends our join: we were told that peer is in our run, so we are the
    /// odd one out.
    pub(super) fn record_refusal(&self, peer: PeerId, field: &str, text: String, by_them: bool) {
        let mut st = lock(&self.state);
        // A peer that knocks again and again is logged once per reason.
        let repeated = st.refused.get(&peer).is_some_and(|r| r.reason == text);
        if repeated {
            tracing::debug!(%peer, field, "{text}");
        } else if by_them {
            tracing::error!(%peer, field, "{text}");
        } else {
            tracing::warn!(%peer, field, "{text}");
        }
        let r = Refused {
            field: field.to_string(),
            reason: text.clone(),
        };
        if !repeated && st.refusals.len() < 64 {
            st.refusals.push(text);
        }
        st.verified.remove(&peer);
        st.proposals.remove(&peer);
        // Told that our identity is used twice, we stop whoever told us.
        let fatal = st.bootstrap_peers.contains(&peer) || (by_them && field == DUPLICATE);
        if fatal && st.fatal.is_none() {
            st.fatal = Some(Self::fatal_refusal(peer, &r));
        }
        st.refused.insert(peer, r);
        drop(st);
        self.changed.notify_one();
    }

    pub(super) fn fatal_refusal(peer: PeerId, r: &Refused) -> CommError {
        if r.field == DUPLICATE {
            return CommError::DuplicateIdentity(r.reason.clone());
        }
        CommError::Refused {
            peer: peer.to_string(),
            field: r.field.clone(),
            reason: r.reason.clone(),
        }
    }
}

/// Names of the settings whose values differ (or are set on one side only).
fn settings_differing(
    ours: &BTreeMap<String, String>,
    theirs: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut keys: Vec<&String> = ours.keys().chain(theirs.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| ours.get(*k) != theirs.get(*k))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use libp2p::identity::Keypair;
    use tokio::sync::{mpsc, watch};

    use super::*;
    use crate::p2p::config::{P2pConfig, RunIdentity};
    use crate::p2p::views::board::Board;

    fn node(settings: &[(&str, &str)]) -> Membership {
        let run = RunIdentity {
            run_id: "secret-run".into(),
            config_hash: "c0ffee11".into(),
            init_hash: "beef22".into(),
        };
        let mut cfg = P2pConfig::new(run, 2, 4);
        cfg.settings = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let local = Keypair::generate_ed25519().public().to_peer_id();
        Membership::new(
            local,
            &cfg,
            Arc::new(Mutex::new(Vec::new())),
            Vec::new(),
            watch::channel(None).0,
            Arc::new(crate::p2p::state::Shared::new(
                cfg.clone(),
                local,
                watch::channel(None).1,
                mpsc::channel(1).0,
                mpsc::unbounded_channel().0,
            )),
            Arc::new(Board::default()),
        )
    }

    fn cbor<T: serde::Serialize>(msg: &T) -> Vec<u8> {
        cbor4ii::serde::to_vec(Vec::new(), msg).unwrap()
    }

    fn holds(bytes: &[u8], text: &str) -> bool {
        bytes.windows(text.len()).any(|w| w == text.as_bytes())
    }

    #[test]
    fn refusals_on_the_wire_carry_no_run_id_hash_or_value() {
        let ours = node(&[("lr", "0.0123"), ("steps", "600")]);
        let mut theirs = ours.hello_locked(&lock(&ours.state));
        theirs.identity.config_hash = "f00d33".into();
        theirs.settings.insert("lr".into(), "0.0456".into());
        let (refusal, log) = ours.compare(&theirs).expect("the config differs");
        let wire = cbor(&Reply::Refused(refusal));
        for secret in [
            "secret-run",
            "c0ffee11",
            "f00d33",
            "beef22",
            "0.0123",
            "0.0456",
        ] {
            assert!(!holds(&wire, secret), "the refusal carries {secret}");
        }
        assert!(holds(&wire, "config hash") && holds(&wire, "lr"));
        assert!(!holds(&wire, "steps"));
        // The refuser's own log has the values.
        assert!(log.contains("0.0123") && log.contains("0.0456"), "{log}");
        // A closed door says nothing at all.
        let closed = cbor(&Door::Closed);
        assert!(closed.len() < 16, "{closed:?}");
        for secret in ["secret-run", "c0ffee11", "beef22"] {
            assert!(!holds(&closed, secret));
        }
        // Another init hash: named, its value not sent.
        let mut theirs = ours.hello_locked(&lock(&ours.state));
        theirs.identity.init_hash = "0ther".into();
        let (refusal, _) = ours.compare(&theirs).unwrap();
        assert_eq!(refusal.field, "init hash");
        assert!(!holds(&cbor(&refusal), "beef22"));
    }

    #[test]
    fn a_peer_id_whose_instances_alternate_is_two_processes() {
        let m = node(&[]);
        let peer = Keypair::generate_ed25519().public().to_peer_id();
        // A restart (a new instance) is no duplicate...
        assert!(!m.duplicated(peer, 1));
        assert!(!m.duplicated(peer, 1));
        assert!(!m.duplicated(peer, 2));
        assert!(!m.duplicated(peer, 2));
        // ...an old instance coming back is.
        assert!(m.duplicated(peer, 1));
        assert!(m.duplicated(peer, 3));
    }
}
