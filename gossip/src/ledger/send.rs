//! The send half of a push-sum round, written once for both transports: the
//! peers checked against the view, the uniform share `p = 1 / (out + 1)`,
//! `x` and `w` scaled by it in one pass, the same share handed to every
//! out-peer, then counted in the ledger. A transport says only how a share
//! is built and how it reaches one peer ([`ShareSink`]).

use super::Ledger;
use crate::{CommError, PushSumRound, Rank, push_sum_share};

/// How a transport builds one round's share and hands it to a peer.
pub(crate) trait ShareSink {
    /// The share as the transport moves it (a vector in memory, an encoded
    /// payload and header over the network); cloned for all out-peers but
    /// the last, so a clone should be cheap where it can be.
    type Share: Clone;
    /// The push-sum ledger the sent shares are counted in.
    fn ledger(&mut self) -> &mut Ledger;
    /// Scales `x` by `p` in place and returns the share of `round` every
    /// out-peer gets (`w` is the weight it carries, already scaled). Under
    /// compression `x` keeps `x - out_peers * D(Q(p x))` instead
    /// ([`crate::compress::encode_share`]).
    fn scale_and_encode(
        &mut self,
        round: u64,
        x: &mut [f32],
        p: f32,
        out_peers: usize,
        w: f64,
    ) -> Self::Share;
    /// Hands `share` of `round` with weight `w` to `peer`.
    fn send_share(
        &mut self,
        peer: Rank,
        round: u64,
        share: Self::Share,
        w: f64,
    ) -> Result<(), CommError>;
}

/// Refuses a round whose peers include `rank` itself or a rank outside the
/// view of `size`.
pub(crate) fn check_round(
    round: &PushSumRound<'_>,
    rank: Rank,
    size: usize,
) -> Result<(), CommError> {
    for (what, ranks) in [("out-peer", round.out_peers), ("in-peer", round.in_peers)] {
        if let Some(r) = ranks.iter().find(|r| **r >= size || **r == rank) {
            return Err(CommError::Misuse(format!(
                "push-sum round {}: {what} rank {r} is ourselves or outside 0..{size}",
                round.round
            )));
        }
    }
    Ok(())
}

/// Scales `x` and `w` by this round's share and sends the share to every
/// out-peer, then counts them in the sink's ledger. Without out-peers
/// nothing changes.
pub(crate) fn send_half<S: ShareSink>(
    round: &PushSumRound<'_>,
    x: &mut [f32],
    w: &mut f64,
    sink: &mut S,
) -> Result<(), CommError> {
    let Some((&last, others)) = round.out_peers.split_last() else {
        return Ok(());
    };
    let p = push_sum_share(round.out_peers.len());
    *w *= p;
    let out = round.out_peers.len();
    let share = sink.scale_and_encode(round.round, x, p as f32, out, *w);
    for &peer in others {
        sink.send_share(peer, round.round, share.clone(), *w)?;
    }
    sink.send_share(last, round.round, share, *w)?;
    sink.ledger().sent(round.out_peers.len(), *w);
    Ok(())
}
