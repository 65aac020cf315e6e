//! All-gather of a few exact words round the ring: the transport under the
//! typed collectives ([`crate::ReduceOp`]). In `m - 1` steps every rank
//! passes on the block it received last, so every rank ends with every
//! rank's values, bit for bit; nothing travels as `f32`.
//!
//! A block is one [`Kind::Gather`] frame of `u64` LE words: `step` is the
//! ring step, `offset` the rank whose values it carries, `total` the view's
//! size. Blocks of any length are passed on, so that ranks that disagree on
//! the length all finish and all report it (see [`crate::collectives`]).

use std::time::Instant;

use super::allreduce::Ring;
use super::state::ReduceMsg;
use super::wire::{ALL_REDUCE_PROTOCOL, Header, Kind, Reject, checksum};
pub(crate) use crate::le::{bytes_to_u64, u64_to_bytes};
use crate::{CommError, Rank};

impl Ring<'_> {
    /// Every rank's `values` in rank order.
    pub fn gather(&mut self, values: &[u64]) -> Result<Vec<Vec<u64>>, CommError> {
        let m = self.view.members.len();
        let bytes = 8 * values.len() as u64;
        if bytes > self.shared.cfg.max_message_bytes {
            return Err(CommError::Misuse(format!(
                "{} of {} values: {bytes} bytes exceed the message cap of {} bytes",
                self.operation,
                values.len(),
                self.shared.cfg.max_message_bytes
            )));
        }
        let mut blocks: Vec<Option<Vec<u64>>> = vec![None; m];
        blocks[self.rank] = Some(values.to_vec());
        for step in 0..m.saturating_sub(1) {
            let send_origin = (self.rank + m - step) % m;
            let payload = u64_to_bytes(blocks[send_origin].as_deref().unwrap_or_default());
            let sum = checksum(&payload);
            let len = payload.len() as u64 / 8;
            let header = Header {
                offset: send_origin as u64,
                total: m as u64,
                ..self.header(Kind::Gather, step as u32, len, sum)
            };
            self.send_frame((self.rank + 1) % m, header, payload)?;
            let recv_origin = (self.rank + 2 * m - step - 1) % m;
            let msg = self.recv_block(step as u32, recv_origin)?;
            blocks[recv_origin] = Some(bytes_to_u64(&msg.payload));
        }
        Ok(blocks.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// All-to-all: `blocks[j]` straight to rank `j`; what every rank sent
    /// us, in rank order (one hop; each rank sends one frame per link, as
    /// the direct all-reduce does).
    pub fn exchange(&mut self, blocks: &[Vec<u64>]) -> Result<Vec<Vec<u64>>, CommError> {
        let (m, me) = (self.view.members.len(), self.rank);
        let cap = self.shared.cfg.max_message_bytes;
        if let Some(big) = blocks.iter().find(|b| 8 * b.len() as u64 > cap) {
            return Err(CommError::Misuse(format!(
                "{} block of {} words: {} bytes exceed the message cap of {cap} bytes",
                self.operation,
                big.len(),
                8 * big.len()
            )));
        }
        for k in 1..m {
            let to = (me + k) % m;
            let payload = u64_to_bytes(&blocks[to]);
            let sum = checksum(&payload);
            let header = Header {
                offset: to as u64,
                total: m as u64,
                ..self.header(Kind::Exchange, 0, blocks[to].len() as u64, sum)
            };
            self.send_frame(to, header, payload)?;
        }
        let mut got: Vec<Option<Vec<u64>>> = vec![None; m];
        got[me] = Some(blocks[me].clone());
        let started = Instant::now();
        while let Some(first) = got.iter().position(Option::is_none) {
            let msg = self.next_msg(first, started)?;
            let (h, from) = (&msg.header, msg.from);
            let waited = got.get(from).is_some_and(Option::is_none);
            let verdict = if h.round == self.seq && h.kind != Kind::Exchange && waited {
                return Err(self.other_collective(from, h.kind));
            } else if h.kind != Kind::Exchange || h.round != self.seq {
                Some(format!(
                    "{:?} frame of collective {}, expected an exchange block of {}",
                    h.kind, h.round, self.seq
                ))
            } else if !waited {
                Some(format!("a second exchange block from rank {from}"))
            } else if h.offset != me as u64 || h.step != 0 {
                Some(format!(
                    "exchange block for rank {} at step {}, expected one for rank {me} at 0",
                    h.offset, h.step
                ))
            } else {
                None
            };
            match verdict {
                None => got[from] = Some(bytes_to_u64(&msg.payload)),
                Some(reason) => {
                    let peer = self.view.members[from];
                    self.shared.reject(
                        &peer,
                        ALL_REDUCE_PROTOCOL,
                        &Reject::MalformedHeader(reason),
                    );
                }
            }
        }
        Ok(got.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// Waits for the block of rank `origin` at ring step `step` from the
    /// left neighbour; frames that do not fit are dropped and counted, and
    /// one of another collective at our sequence number is an error.
    fn recv_block(&mut self, step: u32, origin: Rank) -> Result<ReduceMsg, CommError> {
        let left = self.left();
        let started = Instant::now();
        loop {
            let msg = self.next_msg(left, started)?;
            let verdict = block_verdict(&msg.header, msg.from, left, self.seq, step, origin);
            match verdict {
                BlockVerdict::Take => return Ok(msg),
                BlockVerdict::OtherCollective(kind) => {
                    return Err(self.other_collective(left, kind));
                }
                BlockVerdict::Drop(reason) => {
                    let peer = self.view.members[msg.from];
                    self.shared.reject(
                        &peer,
                        ALL_REDUCE_PROTOCOL,
                        &Reject::MalformedHeader(reason),
                    );
                }
            }
        }
    }
}

/// What becomes of a checked frame of the collective inbox (sent by rank
/// `from`) while gather `seq` waits for the block of rank `origin` at ring
/// step `step` from rank `left`.
#[derive(Debug, PartialEq)]
pub(super) enum BlockVerdict {
    Take,
    /// Dropped, for this reason.
    Drop(String),
    /// The left neighbour runs another kind of collective at our sequence
    /// number: the ranks disagree, which ends the gather.
    OtherCollective(Kind),
}

pub(super) fn block_verdict(
    h: &Header,
    from: Rank,
    left: Rank,
    seq: u64,
    step: u32,
    origin: Rank,
) -> BlockVerdict {
    if from == left && h.round == seq && h.kind != Kind::Gather {
        return BlockVerdict::OtherCollective(h.kind);
    }
    if from != left {
        BlockVerdict::Drop(format!(
            "gather block from rank {from}, expected the left neighbour {left}"
        ))
    } else if h.round != seq || h.step != step || h.offset != origin as u64 {
        BlockVerdict::Drop(format!(
            "gather block of rank {} in collective {} step {}, expected rank {origin} in \
             {seq} step {step}",
            h.offset, h.round, h.step
        ))
    } else {
        BlockVerdict::Take
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_through_bytes() {
        let v = [0, 1, u64::MAX, 0x0123_4567_89ab_cdef, f64::NAN.to_bits()];
        assert_eq!(bytes_to_u64(&u64_to_bytes(&v)), v);
        assert_eq!(u64_to_bytes(&[1]), [1, 0, 0, 0, 0, 0, 0, 0]);
    }
}
