//! The communicator's operations: push-sum (the network's half of the
//! shared send path, [`ShareSink`]) and the collectives on the ring.

use crate::compress::{encode_share, encoded_bytes};
use std::sync::Arc;

use super::allreduce::Ring;
use super::comm::P2pComm;
use super::lent::{LendSlot, Lender};
use super::links::{Outgoing, Payload};
use super::payload;
use super::wait::{Stopped, block_on_active};
use super::wire::{self, DType, Header, Kind, WIRE_VERSION};
use crate::ledger::{Ledger, ShareSink, Waiting, check_round, send_half};
use crate::sync::lock;
use crate::{CommError, CommStats, Communicator, PushSumMass, PushSumRound, Rank};

/// Revokes a round's loan (if still held) when the round is left.
struct RevokeOnDrop(LendSlot);

impl Drop for RevokeOnDrop {
    fn drop(&mut self) {
        drop(lock(&self.0).take());
    }
}

impl P2pComm {
    /// The encoded header of our push-sum share of `round`.
    fn share_header(&self, round: u64, floats: usize, w: f64, checksum: u64) -> Vec<u8> {
        wire::encode_header(&Header {
            version: WIRE_VERSION,
            run_id: self.shared.cfg.run.run_id.clone(),
            view: self.view.number,
            sender: super::addrs::name_of(&self.shared.local),
            round,
            kind: Kind::PushSum,
            dtype: DType::of_share(self.shared.cfg.compress),
            len: floats as u64,
            weight: w,
            checksum,
            step: 0,
            offset: 0,
            total: floats as u64,
        })
    }

    /// Waits until the share lent in this round ([`super::lent`]) is on the
    /// wire to every out-peer, for as long as none of them is silent for the
    /// peer timeout; the loan is revoked either way.
    fn settle_lent(&self, slot: &LendSlot, round: &PushSumRound<'_>) -> Result<(), CommError> {
        let Some(lender) = lock(slot).take() else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        let timeout = self.shared.cfg.peer_timeout;
        lender.settle(crate::POLL, || {
            self.shared.check()?;
            let now = std::time::Instant::now();
            let silent = |r: &Rank| {
                self.view
                    .members
                    .get(*r)
                    .is_none_or(|peer| self.shared.activity.deadline(peer, started, timeout) <= now)
            };
            match round.out_peers.iter().find(|r| silent(r)) {
                // An out-peer silent for the whole timeout holds the
                // round up: it is gone, as a send to it would find.
                Some(&rank) => Err(CommError::PeerTimeout {
                    peer: self
                        .view
                        .members
                        .get(rank)
                        .map(|p| p.to_string())
                        .unwrap_or_default(),
                    rank,
                    round: round.round,
                    operation: "push-sum send",
                    timeout,
                }),
                None => Ok(()),
            }
        })
    }

    /// Adds the shares due into `(x, w)`; `scale_first`: `x` is still to
    /// be scaled by it ([`Ledger::collect_scaling`]).
    fn collect(
        &mut self,
        wait_up_to: Option<u64>,
        scale_first: Option<f32>,
        x: &mut [f32],
        w: &mut f64,
        op: &'static str,
    ) -> Result<(), CommError> {
        let view = self.view.clone();
        let name = move |r: Rank| {
            view.members
                .get(r)
                .map(|p| p.to_string())
                .unwrap_or_default()
        };
        let members = self.view.clone();
        let shared = self.shared.clone();
        let timeout = shared.cfg.peer_timeout;
        let deadline = move |r: Rank, started: std::time::Instant| match members.members.get(r) {
            Some(peer) => shared.activity.deadline(peer, started, timeout),
            None => started + timeout,
        };
        let check_shared = self.shared.clone();
        let check = move || check_shared.check();
        let waiting = Waiting {
            timeout,
            deadline: &deadline,
            peer_name: &name,
            check: &check,
        };
        let pool = &self.shared.pool;
        let result = self.push.collect_scaling(
            &self.shared.push_inbox,
            &waiting,
            wait_up_to,
            scale_first,
            x,
            w,
            op,
            &mut |share| share.recycle(pool),
        );
        if let Err(CommError::PeerTimeout { rank, .. }) = &result
            && let Some(peer) = self.view.members.get(*rank)
        {
            self.shared.observed.timed_out(peer);
        }
        result
    }
    /// Runs `f` on the ring of the next collective; `None` in a run of one.
    fn on_ring<T>(
        &mut self,
        operation: &'static str,
        f: impl FnOnce(&mut Ring<'_>) -> Result<T, CommError>,
    ) -> Result<Option<T>, CommError> {
        self.runtime()?;
        self.seq += 1;
        let rt = self
            .rt
            .as_ref()
            .ok_or_else(|| CommError::Closed("node stopped".into()))?;
        if self.view.members.len() <= 1 || self.reduce_links.is_empty() {
            return Ok(None);
        }
        let mut ring = Ring {
            rt,
            shared: &self.shared,
            view: &self.view,
            rank: self.rank,
            links: &self.reduce_links,
            inbox: &mut self.reduce_rx,
            early: &mut self.early,
            seq: self.seq,
            operation,
            lane: self.lanes.is_some(),
            lent: Vec::new(),
        };
        let out = f(&mut ring)?;
        self.shared.collective_done();
        Ok(Some(out))
    }

    fn all_reduce(
        &mut self,
        buf: &mut [f32],
        scalar: &mut f64,
        scale: Option<f32>,
        operation: &'static str,
    ) -> Result<(), CommError> {
        match self.on_ring(operation, |ring| ring.run(&mut *buf, scalar, scale))? {
            Some(()) => Ok(()),
            // A run of one has nothing to add, only the scale to apply.
            None => {
                crate::ring::scale_sum(buf, scale);
                Ok(())
            }
        }
    }
}

/// The network's half of the shared push-sum send path: the share is scaled
/// and encoded in one pass into a pooled buffer (the payload every out-peer
/// gets, behind one `Arc`), and queued on each peer's link. A synchronous
/// round on the data lane skips the buffer and the scale: `x` is lent to
/// the lane's writers ([`super::lent`]), which send it unscaled with its
/// factor in the frame header (the receiver scales as it adds), until
/// the share is on the wire; `x` is scaled as the in-peers' shares are
/// added.
impl ShareSink for P2pComm {
    type Share = Outgoing;

    fn ledger(&mut self) -> &mut Ledger {
        &mut self.push
    }

    fn scale_and_encode(
        &mut self,
        round: u64,
        x: &mut [f32],
        p: f32,
        out_peers: usize,
        w: f64,
    ) -> Outgoing {
        let lane = self.lanes.is_some();
        let codec = self.shared.cfg.compress;
        // A synchronous round on the lane lends `x` itself
        // (little-endian `f32`s are their own wire bytes): no share buffer.
        let slot = self
            .lend
            .as_ref()
            .filter(|_| lane && codec.is_none() && cfg!(target_endian = "little"));
        if let Some(slot) = slot {
            // Not scaled here: the lane sends `x` with the factor (the
            // libp2p streams copy it scaled), and `x`
            // is scaled as the shares are added (`push_sum`).
            // SAFETY: the round touches `x` again only after settling the
            // loan (`push_sum`), and revokes it on every way out.
            let (lender, share) = unsafe { Lender::lend_scaled(x, Some(p)) };
            *lock(slot) = Some(lender);
            return Outgoing {
                header: self.share_header(round, x.len(), w, 0),
                payload: Payload::Lent(share),
            };
        }
        let buf = self.shared.pool.take(encoded_bytes(codec, x.len()));
        let (payload, sum) = if codec.is_none() {
            payload::scale_and_encode(lane, x, p, buf)
        } else {
            let bytes = encode_share(codec, x, p, out_peers, buf);
            let sum = if lane { 0 } else { payload::checksum(&bytes) };
            (bytes, sum)
        };
        Outgoing {
            header: self.share_header(round, x.len(), w, sum),
            payload: Payload::Owned(Arc::new(payload)),
        }
    }

    fn send_share(
        &mut self,
        peer: Rank,
        round: u64,
        msg: Outgoing,
        _w: f64,
    ) -> Result<(), CommError> {
        let rt = self.runtime()?;
        let link = self.push_links[peer]
            .as_ref()
            .expect("checked: not ourselves");
        let timeout = self.shared.cfg.peer_timeout;
        let send = link.queue.send(msg);
        let now = std::time::Instant::now();
        match block_on_active(rt, &self.shared, &link.peer, now, timeout, send) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(CommError::Closed(format!("link to rank {peer} is gone"))),
            Err(Stopped::Alarm(e)) => Err(e),
            Err(Stopped::Silent) => Err(CommError::PeerTimeout {
                peer: link.peer.to_string(),
                rank: peer,
                round,
                operation: "push-sum send",
                timeout,
            }),
        }
    }
}

impl Communicator for P2pComm {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.view.members.len()
    }

    /// A member lost, or a change another member began, is noticed as the
    /// next base step begins, not only at the next exchange: a local-SGD
    /// run does not compute on to its barrier in a view that is over, and
    /// the step a change begins at is the simulator's.
    fn base_step(&mut self, _step: u64) -> Result<(), CommError> {
        self.shared.check()
    }

    fn push_sum(
        &mut self,
        round: &PushSumRound<'_>,
        x: &mut [f32],
        w: &mut f64,
    ) -> Result<(), CommError> {
        let expected = self.shared.cfg.payload_floats;
        if x.len() != expected {
            return Err(CommError::ShapeMismatch {
                expected,
                got: x.len(),
            });
        }
        check_round(round, self.rank, self.view.members.len())?;
        self.runtime()?;
        self.push
            .begin(&self.shared.push_inbox, round.round, round.in_peers)?;
        if round.staleness == 0 {
            // `x` is not touched again before the shares are added: the
            // round may lend it. The guard revokes a loan on every way out.
            let slot = LendSlot::default();
            let guard = RevokeOnDrop(slot.clone());
            self.lend = Some(slot.clone());
            let sent = send_half(round, x, w, self);
            self.lend = None;
            // A share lent unscaled leaves `x` to scale as shares are added.
            let kept = lock(&slot).as_ref().and_then(|lender| lender.scale());
            let settled = self.settle_lent(&slot, round);
            drop(guard);
            if let Err(e) = sent.and(settled) {
                // The share left unscaled `x`: our part of it is kept.
                if let Some(p) = kept {
                    crate::ledger::scale(x, p);
                }
                return Err(e);
            }
            let wait = round.round.checked_sub(round.staleness);
            return self.collect(wait, kept, x, w, "push-sum");
        }
        send_half(round, x, w, self)?;
        let wait = round.round.checked_sub(round.staleness);
        self.collect(wait, None, x, w, "push-sum")
    }

    fn shares_arrived(&mut self, up_to: u64) -> Result<bool, CommError> {
        Ok(self.push.arrived(&self.shared.push_inbox, up_to))
    }

    fn drain(&mut self, x: &mut [f32], w: &mut f64) -> Result<(), CommError> {
        let expected = self.shared.cfg.payload_floats;
        if x.len() != expected {
            return Err(CommError::ShapeMismatch {
                expected,
                got: x.len(),
            });
        }
        self.runtime()?;
        self.collect(Some(u64::MAX), None, x, w, "drain")
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32], scalar: &mut f64) -> Result<(), CommError> {
        self.all_reduce(buf, scalar, None, "all-reduce")
    }

    fn all_reduce_sum_scaled(
        &mut self,
        buf: &mut [f32],
        scalar: &mut f64,
        factor: f32,
    ) -> Result<(), CommError> {
        self.all_reduce(buf, scalar, Some(factor), "all-reduce")
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.all_reduce(&mut [], &mut 0.0, None, "barrier")
    }

    fn start_together(&mut self) -> Result<(), CommError> {
        self.barrier()
    }

    fn all_gather_u64(&mut self, values: &[u64]) -> Result<Vec<Vec<u64>>, CommError> {
        let gathered = self.on_ring("all-gather", |ring| ring.gather(values))?;
        Ok(gathered.unwrap_or_else(|| vec![values.to_vec()]))
    }

    fn exchange_u64(&mut self, blocks: &[Vec<u64>]) -> Result<Vec<Vec<u64>>, CommError> {
        let m = self.view.members.len();
        if blocks.len() != m {
            return Err(CommError::Misuse(format!(
                "exchange of {} blocks in a view of {m}",
                blocks.len()
            )));
        }
        let got = self.on_ring("exchange", |ring| ring.exchange(blocks))?;
        Ok(got.unwrap_or_else(|| blocks.to_vec()))
    }

    fn change_view(&mut self, last_barrier: u64) -> Result<crate::ViewChange, CommError> {
        self.change_view_p2p(last_barrier)
    }

    fn at_barrier(&mut self, _round: u64) -> Result<bool, CommError> {
        self.at_barrier_p2p()
    }

    fn joiners_waiting(&self) -> usize {
        self.joiners_waiting_p2p()
    }

    fn send_state(&mut self, state: &[u8]) -> Result<(), CommError> {
        self.send_state_p2p(state)
    }

    fn rejoin(&mut self) -> Result<crate::Admission, CommError> {
        self.rejoin_p2p()
    }

    fn interrupt_handle(&self) -> Option<crate::Interrupt> {
        Some(self.shared.interrupt.clone())
    }

    fn stats(&self) -> CommStats {
        self.shared.counters.snapshot()
    }

    fn push_sum_mass(&self) -> PushSumMass {
        self.push.mass()
    }
}
