//! Fuzz targets for the admission messages (see [`super`]): `knock`
//! (the first message of a membership exchange, as the answering side reads
//! and checks it) and `door` (the answer, as the knocking side reads and
//! checks it). An input is `[peer byte][policy byte]` then the stream: the
//! peer byte picks the authenticated sender (a member or the outsider), the
//! policy byte open, allowlist (the members) or invitations (the members
//! hold one).

use std::sync::OnceLock;

use futures::executor::block_on;
use futures::io::Cursor;
use libp2p::PeerId;
use libp2p::identity::ed25519;

use super::ctx::Outcome;
use super::rng::Rng;
use crate::p2p::admission::{Admission, Door, Knock, Proof, RunKey};
use crate::p2p::membership::msg::{read_msg, write_msg};
use crate::p2p::wire::WIRE_VERSION;

struct Policies {
    run_id: String,
    key: RunKey,
    policies: [Admission; 3],
}

fn policies(members: &[PeerId]) -> &'static Policies {
    static P: OnceLock<Policies> = OnceLock::new();
    P.get_or_init(|| {
        let mut secret = [7u8; 32];
        let key = RunKey {
            run_id: "fuzz-run".into(),
            keypair: ed25519::Keypair::from(
                ed25519::SecretKey::try_from_bytes(&mut secret).expect("32 bytes are a key"),
            ),
        };
        let invited = Admission::Invited {
            run_key: key.keypair.public(),
            invitation: key.invite(members[1]),
        };
        Policies {
            run_id: key.run_id.clone(),
            policies: [Admission::Open, Admission::Allow(members.to_vec()), invited],
            key,
        }
    })
}

/// The policy an input runs under, and the rest of it.
fn policy_of<'a>(members: &[PeerId], data: &'a [u8]) -> (&'static Policies, usize, &'a [u8]) {
    let p = policies(members);
    match data.split_first() {
        Some((b, rest)) => (p, *b as usize % 3, rest),
        None => (p, 0, data),
    }
}

fn taken() -> Outcome {
    Outcome {
        accepted: 1,
        ..Outcome::default()
    }
}

fn refused(e: impl ToString) -> Outcome {
    Outcome {
        error: Some(e.to_string()),
        ..Outcome::default()
    }
}

/// A knock as the answering side reads and checks it.
pub(super) fn knock(peer: PeerId, members: &[PeerId], data: &[u8]) -> Outcome {
    let (p, which, stream) = policy_of(members, data);
    match block_on(read_msg::<Knock, _>(&mut Cursor::new(stream))) {
        Ok(k) if k.version != WIRE_VERSION => refused(format!("version {}", k.version)),
        Ok(k) => match p.policies[which].admits(&p.run_id, &peer, &k.proof) {
            Ok(()) => taken(),
            Err(e) => refused(e),
        },
        Err(e) => refused(e),
    }
}

/// A door as the knocking side reads and checks it: `Closed` is a valid
/// answer; `Open` must carry a proof our policy admits.
pub(super) fn door(peer: PeerId, members: &[PeerId], data: &[u8]) -> Outcome {
    let (p, which, stream) = policy_of(members, data);
    match block_on(read_msg::<Door, _>(&mut Cursor::new(stream))) {
        Ok(Door::Closed) => taken(),
        Ok(Door::Open(proof)) => match p.policies[which].admits(&p.run_id, &peer, &proof) {
            Ok(()) => taken(),
            Err(e) => refused(e),
        },
        Err(e) => refused(e),
    }
}

/// A knock (or a door) from member `rank`, valid unless `hostile`.
pub(super) fn generate(
    rng: &mut Rng,
    members: &[PeerId],
    outsider: PeerId,
    hostile: bool,
    as_door: bool,
) -> (Vec<u8>, usize) {
    let which = rng.below(3);
    let p = policies(members);
    let mut rank = rng.below(members.len());
    let proof_of = |peer: &PeerId| match which {
        2 => Proof::Invitation(p.key.invite(*peer).signature),
        _ => p.policies[which].proof(&p.run_id, peer),
    };
    let mut version = WIRE_VERSION;
    let mut proof = proof_of(&members[rank]);
    if hostile {
        match rng.below(5) {
            0 => version = rng.next_u64() as u16 | 0x100,
            // The outsider is admitted only where the run is open.
            1 if which != 0 => rank = members.len(),
            1 => proof = Proof::RunId(vec![0; 32]),
            2 => proof = proof_of(&members[(rank + 1) % members.len()]),
            3 => {
                let bytes = match &mut proof {
                    Proof::RunId(b) | Proof::Invitation(b) => b,
                };
                let i = rng.below(bytes.len());
                bytes[i] ^= 1 << rng.below(8);
            }
            _ => {
                proof = match proof {
                    Proof::RunId(b) => Proof::Invitation(b),
                    Proof::Invitation(b) => Proof::RunId(b),
                }
            }
        }
    }
    let peer_byte = if rank == members.len() {
        // The outsider's index in the fuzz context's peer list.
        let _ = outsider;
        members.len() as u8
    } else {
        rank as u8
    };
    let mut out = vec![peer_byte, which as u8];
    let wrote = if as_door {
        if !hostile && rng.chance(20) {
            block_on(write_msg(&mut out, &Door::Closed))
        } else if hostile && version != WIRE_VERSION {
            // A door has no version: spoil its proof instead.
            block_on(write_msg(&mut out, &Door::Open(Proof::RunId(Vec::new()))))
        } else {
            block_on(write_msg(&mut out, &Door::Open(proof)))
        }
    } else {
        block_on(write_msg(&mut out, &Knock { version, proof }))
    };
    wrote.expect("writing into a Vec cannot fail");
    (out, 1)
}
