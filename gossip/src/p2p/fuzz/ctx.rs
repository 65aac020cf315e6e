//! The fixed run every target reads against (four members, we are rank 1),
//! and what a target makes of one input ([`Outcome`]).

use std::sync::OnceLock;

use libp2p::PeerId;
use libp2p::identity::Keypair;

use crate::Rank;
use crate::p2p::config::{P2pConfig, RunIdentity};
use crate::p2p::state::View;
use crate::p2p::wire::ReadError;

/// Members of the fuzzed run; we are rank [`OUR_RANK`], our left neighbour
/// rank 0.
pub(super) const MEMBERS: usize = 4;
pub(super) const OUR_RANK: Rank = 1;
pub(super) const LEFT: Rank = 0;
/// Floats of a push-sum share.
pub(super) const FLOATS: usize = 16;
/// Floats of the all-reduce buffer, and per chunk.
pub(super) const TOTAL: usize = 23;
pub(super) const CHUNK: usize = 4;
/// Payload cap in bytes.
pub(super) const CAP: u64 = 256;
/// Round window (and per-sender buffer) of the push-sum inbox.
pub(super) const WINDOW: u64 = 4;
pub(super) const VIEW: u64 = 3;
/// Sequence number of the collective being received.
pub(super) const SEQ: u64 = 7;
/// Words each rank contributes to the gather.
pub(super) const WORDS: usize = 3;
/// Frames read from one input at most.
pub(super) const MAX_FRAMES: usize = 64;

/// What a target made of one input.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    /// Messages taken (frames delivered, chunks applied, hellos accepted).
    pub accepted: usize,
    /// Messages dropped without ending the stream.
    pub dropped: usize,
    /// Why the input was refused or the stream ended early, if it was.
    pub error: Option<String>,
}

pub(super) struct Ctx {
    pub cfg: P2pConfig,
    pub view: View,
    /// Peer ids of the members by rank, then an outsider.
    pub peers: Vec<PeerId>,
    pub names: Vec<String>,
}

pub(super) fn ctx() -> &'static Ctx {
    static CTX: OnceLock<Ctx> = OnceLock::new();
    CTX.get_or_init(|| {
        let mut members: Vec<PeerId> = (1..=MEMBERS as u8)
            .map(|i| {
                Keypair::ed25519_from_bytes([i; 32])
                    .expect("32 bytes are an ed25519 secret key")
                    .public()
                    .to_peer_id()
            })
            .collect();
        let view = View::new(VIEW, members.clone());
        members.clone_from(&view.members);
        let outsider = Keypair::ed25519_from_bytes([99; 32])
            .expect("32 bytes are an ed25519 secret key")
            .public()
            .to_peer_id();
        members.push(outsider);
        let run = RunIdentity {
            run_id: "fuzz-run".into(),
            config_hash: "c0ffee".into(),
            init_hash: "f00d".into(),
        };
        let mut cfg = P2pConfig::new(run, MEMBERS, FLOATS);
        cfg.max_message_bytes = CAP;
        cfg.round_window = WINDOW;
        cfg.chunk_floats = CHUNK;
        Ctx {
            cfg,
            view,
            names: members.iter().map(|p| p.to_string()).collect(),
            peers: members,
        }
    })
}

pub(super) fn refused(accepted: usize, dropped: usize, e: impl ToString) -> Outcome {
    Outcome {
        accepted,
        dropped,
        error: Some(e.to_string()),
    }
}

pub(super) fn read_error(e: ReadError) -> String {
    match e {
        ReadError::Eof => "end of stream".into(),
        ReadError::Io(e) => format!("stream broke: {e}"),
        ReadError::Rejected(r) => r.to_string(),
        ReadError::Stale { view, ours } => format!("frame of view {view} after our view {ours}"),
    }
}

/// The authenticated peer of a stream: the first byte picks a member by rank
/// or (4) the outsider.
pub(super) fn peer_of(data: &[u8]) -> (PeerId, &[u8]) {
    let ctx = ctx();
    match data.split_first() {
        Some((b, rest)) => (ctx.peers[*b as usize % ctx.peers.len()], rest),
        None => (ctx.peers[LEFT], data),
    }
}
