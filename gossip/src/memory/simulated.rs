//! The in-memory communicator over a simulated network ([`crate::simnet`]).
//!
//! [`super::MemoryComm`] calls these hooks at a few points and otherwise
//! runs as without a model; each worker's virtual clock lives on a shared
//! [`ClockBoard`]:
//! - [`Simulated::base_step`]: the clock advances by the step's compute (and
//!   pause) time; a crash there ends the worker;
//! - [`Simulated::send_share`]: the share leaves at the sender's clock over
//!   its link; it reaches the receiver's inbox only if it is not lost;
//! - [`Simulated::await_shares`]: before a push-sum call adds the shares
//!   it must have, the receiver's clock moves to their arrivals; a share
//!   that never comes is dropped from the ledger (its mass is gone);
//! - [`Simulated::shares_arrived`]: the truthful answer at the receiver's
//!   clock, so background gossip runs at each worker's own pace;
//! - collectives ([`Simulated::enter_collective`],
//!   [`Simulated::leave_collective`]): every worker leaves at the latest
//!   entry clock plus the time of the collective's schedule: `2 (m - 1)`
//!   hops of `bytes / m` over the slowest link for a ring, 2 for a direct
//!   all-reduce (as [`crate::Schedule::choose`] picks over the network).
//!   Collectives are not lost (a real transport retransmits).
//!
//! Every answer is a function of the seed and the clocks, never of thread
//! scheduling, so a run replays bit for bit.

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Schedule;
use crate::ledger::Ledger;
use crate::simnet::{
    ClockBoard, Delivery, MIN_LATENCY_S, Message, MessageKey, MessageKind, OutLinks, SimNetwork,
};
use crate::{CommError, Rank, VirtualTime};

/// What the workers of one simulated run share.
struct Common {
    net: SimNetwork,
    board: ClockBoard,
    /// Collective number -> each worker's entry clock and how many workers
    /// have not read them yet.
    entries: Mutex<HashMap<u64, (Vec<f64>, usize)>>,
}

/// One worker's view of the simulated network.
pub(super) struct Simulated {
    rank: Rank,
    common: Arc<Common>,
    out: OutLinks,
    /// The latest base step begun (faults are judged at it).
    step: u64,
    /// Base steps begun, and the clock when the latest one began.
    steps_begun: u64,
    step_clock: f64,
    /// Collectives entered so far (every worker calls them in one order).
    collectives: u64,
}

impl Simulated {
    /// One per rank of a run over `net`.
    pub fn workers(net: SimNetwork, timeout: Duration) -> Vec<Simulated> {
        let common = Arc::new(Common {
            board: net.clock_board(timeout),
            entries: Mutex::new(HashMap::new()),
            net,
        });
        (0..common.net.world_size())
            .map(|rank| Simulated {
                rank,
                out: common.net.out_links(rank),
                common: common.clone(),
                step: 0,
                steps_begun: 0,
                step_clock: 0.0,
                collectives: 0,
            })
            .collect()
    }

    fn board(&self) -> &ClockBoard {
        &self.common.board
    }

    fn key(&self, from: Rank, round: u64) -> MessageKey {
        MessageKey {
            from,
            to: self.rank,
            kind: MessageKind::Share,
            seq: round,
        }
    }

    /// The worker computes base step `step`.
    pub fn base_step(&mut self, step: u64) -> Result<(), CommError> {
        let (rank, net) = (self.rank, &self.common.net);
        if net.is_crashed(rank, step) {
            self.board().finish(rank);
            return Err(CommError::Closed(format!(
                "worker {rank} crashed at step {step}, as the simulated network's profile says"
            )));
        }
        let clock = self.board().clock(rank);
        self.step = step;
        self.steps_begun += 1;
        self.step_clock = clock;
        self.board()
            .advance(rank, clock + net.step_time(rank, step));
        Ok(())
    }

    /// Sends a share of `round` to `to` over the simulated link; `deliver`
    /// puts it into the receiver's inbox if it arrives. `false`: it is lost.
    pub fn send_share(
        &mut self,
        to: Rank,
        round: u64,
        bytes: u64,
        deliver: impl FnOnce() -> Result<(), CommError>,
    ) -> Result<bool, CommError> {
        let message = Message {
            to,
            kind: MessageKind::Share,
            seq: round,
            bytes,
        };
        let board = &self.common.board;
        let send_time = board.clock(self.rank);
        let delivery = self.out.send(message, send_time, self.step);
        if delivery == Delivery::SenderCrashed {
            return Err(CommError::Closed(format!(
                "worker {} has crashed in the simulated network and sends nothing",
                self.rank
            )));
        }
        let arrival = delivery.arrival();
        // Into the inbox before the board says it arrived, so a receiver the
        // board lets go finds it there.
        if arrival.is_some() {
            deliver()?;
        }
        let key = MessageKey {
            from: self.rank,
            to,
            kind: MessageKind::Share,
            seq: round,
        };
        board.post(key, send_time, arrival);
        Ok(arrival.is_some())
    }

    /// Waits (in virtual time) for every expected share of rounds `<= up_to`;
    /// the ones that never come leave the ledger.
    pub fn await_shares(&mut self, ledger: &mut Ledger, up_to: u64) -> Result<(), CommError> {
        for (round, from) in ledger.pending(up_to) {
            let key = self.key(from, round);
            let arrival = self.board().wait_arrival(key)?;
            self.board().forget(&key);
            if arrival.is_none() {
                ledger.forgo(round, from);
            }
        }
        Ok(())
    }

    /// Whether every expected share of rounds `<= up_to` has arrived (or is
    /// known never to arrive) by this worker's clock.
    pub fn shares_arrived(&self, ledger: &Ledger, up_to: u64) -> Result<bool, CommError> {
        for (round, from) in ledger.pending(up_to) {
            if !self.board().settled_by(self.key(from, round))? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Before a collective's first exchange.
    pub fn enter_collective(&mut self) {
        let (rank, board) = (self.rank, &self.common.board);
        let size = self.common.net.world_size();
        let mut entries = lock(&self.common.entries);
        let (clocks, _) = entries
            .entry(self.collectives)
            .or_insert_with(|| (vec![0.0; size], size));
        clocks[rank] = board.clock(rank);
        drop(entries);
        board.enter_collective(rank);
    }

    /// After the collective completed (every worker entered it); `bytes` is
    /// what each worker contributed.
    pub fn leave_collective(&mut self, bytes: u64, schedule: Schedule) {
        let m = self.common.net.world_size() as u64;
        let hops = match schedule {
            Schedule::Ring => 2 * m.saturating_sub(1),
            Schedule::Direct => 2,
        };
        self.leave_after(hops, bytes as f64 / m.max(1) as f64);
    }

    /// After a ring all-gather completed whose largest contribution was
    /// `block` bytes: `m - 1` hops, each forwarding one contribution.
    pub fn leave_gather(&mut self, block: u64) {
        let m = self.common.net.world_size() as u64;
        self.leave_after(m.saturating_sub(1), block as f64);
    }

    /// After an exchange completed whose largest block was `block` bytes:
    /// one hop, each block over its own link.
    pub fn leave_exchange(&mut self, block: u64) {
        self.leave_after(1, block as f64);
    }

    /// Leaves the collective `hops` hops of `chunk` bytes after the last
    /// worker entered it.
    fn leave_after(&mut self, hops: u64, chunk: f64) {
        let seq = self.collectives;
        self.collectives += 1;
        let latest = {
            let mut entries = lock(&self.common.entries);
            let latest = entries.get_mut(&seq).map(|(clocks, unread)| {
                *unread -= 1;
                clocks.iter().copied().fold(f64::NEG_INFINITY, f64::max)
            });
            if entries.get(&seq).is_some_and(|(_, unread)| *unread == 0) {
                entries.remove(&seq);
            }
            latest.unwrap_or_else(|| self.board().clock(self.rank))
        };
        let to = latest + hops as f64 * self.hop_time(chunk);
        self.board().leave_collective(self.rank, to);
    }

    /// One hop of a collective moving `chunk` bytes over every link at once
    /// (a ring's step, or a direct schedule's round: each rank's messages
    /// go over their own links), as slow as the slowest link (without
    /// jitter).
    fn hop_time(&self, chunk: f64) -> f64 {
        let net = &self.common.net;
        let m = net.world_size();
        if m < 2 {
            return 0.0;
        }
        let chunk_bits = chunk * 8.0;
        let mut hop: f64 = 0.0;
        for from in 0..m {
            for to in (0..m).filter(|to| *to != from) {
                let link = net.link(from, to);
                let send = link.rate_bit_s.map_or(0.0, |rate| chunk_bits / rate);
                hop = hop.max(send + link.delay_s.max(MIN_LATENCY_S));
            }
        }
        hop
    }

    pub fn virtual_time(&self) -> VirtualTime {
        VirtualTime {
            clock: self.board().clock(self.rank),
            steps: self.steps_begun.saturating_sub(1),
            step_clock: self.step_clock,
            compute: self.common.net.compute_time(self.rank),
        }
    }
}

impl Drop for Simulated {
    fn drop(&mut self) {
        // Others waiting for this worker's messages learn it sends no more.
        self.board().finish(self.rank);
    }
}
