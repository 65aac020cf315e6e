//! In-memory communicator: `m` workers inside one process, one thread each.
//!
//! Deterministic by construction: a push-sum share sent in round `r` is added
//! by its receiver exactly in round `r + s` (the staleness bound, the worst
//! delay OSGP allows; see the `ledger` module), shares are added in
//! `(round, sender)` order, and all-reduce sums in the ring's order. The same
//! seed therefore gives the same bits.
//!
//! Delivery is synchronous: a share is in its receiver's inbox when `send`
//! returns. When it arrives in the model's time is what [`Arrival`] says,
//! or, with a network model ([`MemoryNetwork::with_network`]), the seeded
//! simulated network in virtual time (see `simulated`).

mod faults;
mod simulated;

mod ring;

pub use slowmo_runspec::faults::{SimFault, SimScript};

use crate::sync::lock;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::compress::{Compression, MemShare};
use crate::ledger::{Inbox, Ledger, Mixing, ShareSink, Waiting, check_round, send_half};
use crate::simnet::SimNetwork;
use crate::{
    Admission, CommError, CommStats, Communicator, Interrupt, PushSumMass, PushSumRound, Rank,
    Schedule, ViewChange, VirtualTime,
};
use faults::Board;
use simulated::Simulated;

/// Bytes a push-sum message would take on the wire: payload plus weight.
fn message_bytes(len: usize) -> u64 {
    4 * len as u64 + 8
}

/// When a share counts as arrived for [`Communicator::shares_arrived`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Arrival {
    /// Every worker moves at the same pace over a network without latency:
    /// a share its sender has reached is there, even if the sender's thread
    /// has not been scheduled yet, so `shares_arrived` waits for it (the
    /// timeout still names a silent peer). The answer does not depend on
    /// thread scheduling: background gossip starts a round every step and
    /// the simulator stays deterministic.
    #[default]
    Lockstep,
    /// A share has arrived once its sender's thread sent it, and
    /// `shares_arrived` answers at once. Background gossip then really runs
    /// at each worker's pace, and the result depends on thread scheduling.
    AsSent,
}

/// One rank's contribution to a collective.
enum Contribution {
    /// All-reduce and barrier: a vector and a scalar.
    Floats(Vec<f32>, f64),
    /// All-gather of exact words.
    Words(Vec<u64>),
    /// Exchange: the block for each rank.
    Blocks(Vec<Vec<u64>>),
    /// All-reduce over the ring: the buffer's length, checked first.
    RingLength(usize),
}

/// The ranks' float contributions, or an error if some rank is in another
/// kind of collective (the ranks called collectives in different orders).
fn floats(all: &[Contribution]) -> Result<Vec<(&[f32], f64)>, CommError> {
    all.iter()
        .enumerate()
        .map(|(rank, c)| match c {
            Contribution::Floats(v, s) => Ok((v.as_slice(), *s)),
            _ => Err(out_of_order(rank)),
        })
        .collect()
}

fn out_of_order(rank: Rank) -> CommError {
    CommError::Protocol(format!(
        "rank {rank} was in another kind of collective: the ranks called collectives in \
         different orders"
    ))
}

#[derive(Default)]
struct Reduce {
    generation: u64,
    arrived: usize,
    slots: Vec<Option<Contribution>>,
    result: Option<Arc<Vec<Contribution>>>,
    /// Why no collective can complete any more (a simulated crash).
    closed: Option<String>,
}

struct Shared {
    size: usize,
    timeout: Duration,
    arrival: Arrival,
    inboxes: Vec<Inbox<MemShare>>,
    reduce: Mutex<Reduce>,
    reduce_done: Condvar,
}

/// Factory for the communicators of one in-process run.
pub struct MemoryNetwork;

impl MemoryNetwork {
    /// One communicator per rank, with the [`Arrival::Lockstep`] model.
    /// `timeout` bounds every wait; a rank that waits longer reports the
    /// silent peer.
    #[allow(clippy::new_ret_no_self)] // a network is only its communicators
    pub fn new(size: usize, timeout: Duration) -> Vec<MemoryComm> {
        Self::with_arrival(size, timeout, Arrival::Lockstep)
    }

    /// One communicator per rank, with the given arrival model.
    pub fn with_arrival(size: usize, timeout: Duration, arrival: Arrival) -> Vec<MemoryComm> {
        Self::build(size, timeout, arrival, None)
    }

    /// One communicator per rank of `net`'s run, over the simulated network
    /// in virtual time: deterministic given `net`'s seed, and background
    /// gossip runs at each worker's own pace.
    pub fn with_network(timeout: Duration, net: SimNetwork) -> Vec<MemoryComm> {
        let size = net.world_size();
        let sims = Simulated::workers(net, timeout);
        Self::build(size, timeout, Arrival::Lockstep, Some(sims))
    }

    /// One communicator per worker of a run with scripted membership
    /// faults (see [`SimScript`]), and one more per `restart` in the
    /// script: a worker that starts outside the view and waits in
    /// [`Communicator::rejoin`]. Deterministic like [`MemoryNetwork::new`].
    pub fn with_faults(
        size: usize,
        timeout: Duration,
        script: SimScript,
    ) -> (Vec<MemoryComm>, Vec<MemoryComm>) {
        let arrival = Arrival::Lockstep;
        let joiners = script.joiners();
        let build = Box::new(move |n: usize| handouts(n, timeout, arrival));
        let board = Arc::new(Board::new(script, size, timeout, build));
        let mut members = Self::build(size, timeout, arrival, None);
        for c in &mut members {
            c.board = Some(board.clone());
        }
        let rejoining = joiners
            .into_iter()
            .map(|id| {
                let mut c = Self::build(1, timeout, arrival, None)
                    .pop()
                    .expect("one communicator");
                c.id = id;
                c.board = Some(board.clone());
                c
            })
            .collect();
        (members, rejoining)
    }

    fn build(
        size: usize,
        timeout: Duration,
        arrival: Arrival,
        sims: Option<Vec<Simulated>>,
    ) -> Vec<MemoryComm> {
        let mut sims = sims.map(Vec::into_iter);
        handouts(size, timeout, arrival)
            .into_iter()
            .map(|h| MemoryComm {
                id: h.rank,
                rank: h.rank,
                ring: h.ring,
                shared: h.shared,
                ledger: Ledger::new(Mixing::Due),
                stats: CommStats::default(),
                len: None,
                sim: sims.as_mut().and_then(Iterator::next),
                board: None,
                step: 0,
                rejoined: false,
                interrupt: Interrupt::new(),
                compress: Compression::None,
            })
            .collect()
    }
}

/// One rank's place in a freshly built network.
pub(crate) struct Handout {
    rank: Rank,
    ring: ring::RingEnds,
    shared: Arc<Shared>,
}

fn handouts(size: usize, timeout: Duration, arrival: Arrival) -> Vec<Handout> {
    {
        let shared = Arc::new(Shared {
            size,
            timeout,
            arrival,
            // In-process senders are trusted and never resend: no window.
            inboxes: (0..size).map(|_| Inbox::new(u64::MAX)).collect(),
            reduce: Mutex::new(Reduce {
                slots: (0..size).map(|_| None).collect(),
                ..Reduce::default()
            }),
            reduce_done: Condvar::new(),
        });
        ring::ring_ends(size)
            .into_iter()
            .enumerate()
            .map(|(rank, ring)| Handout {
                rank,
                ring,
                shared: shared.clone(),
            })
            .collect()
    }
}

/// One rank's end of a [`MemoryNetwork`].
pub struct MemoryComm {
    /// The worker's id in the run (its rank in the first view).
    id: usize,
    rank: Rank,
    ring: ring::RingEnds,
    shared: Arc<Shared>,
    ledger: Ledger,
    stats: CommStats,
    len: Option<usize>,
    sim: Option<Simulated>,
    /// Scripted membership faults, shared by the run's workers.
    board: Option<Arc<Board>>,
    /// The base step begun last.
    step: u64,
    /// This communicator came in through [`Communicator::rejoin`].
    rejoined: bool,
    interrupt: Interrupt,
    /// How this worker's push-sum shares travel ([`MemoryComm::set_compression`]).
    compress: Compression,
}

fn worker_name(rank: Rank) -> String {
    format!("worker-{rank}")
}

/// Runs `f` with waits that give up `timeout` after they began, once
/// `interrupt` is raised, or once a member of a faulted run began a view
/// change (the share waited for may never come).
fn waiting<R>(
    timeout: Duration,
    interrupt: &Interrupt,
    board: Option<(&Board, usize, bool)>,
    f: impl FnOnce(&Waiting<'_>) -> R,
) -> R {
    let deadline = move |_: Rank, started: Instant| started + timeout;
    let check = || {
        interrupt.check()?;
        board.map_or(Ok(()), |(b, id, restarted)| b.check_pending(id, restarted))
    };
    f(&Waiting {
        timeout,
        deadline: &deadline,
        peer_name: &worker_name,
        check: &check,
    })
}

impl MemoryComm {
    /// Sums `buf` and `scalar` over the ranks, then scales the sum by
    /// `scale`, if any ([`crate::ring::all_reduce`]).
    fn all_reduce(
        &mut self,
        buf: &mut [f32],
        scalar: &mut f64,
        scale: Option<f32>,
    ) -> Result<(), CommError> {
        let size = self.shared.size;
        self.enter_collective();
        // Every rank checks every rank's kind of collective and length
        // first, so a mismatch fails them all alike; then the ring sums.
        let lengths = self.gather(Contribution::RingLength(buf.len()), "all-reduce")?;
        for (rank, c) in lengths.iter().enumerate() {
            match c {
                Contribution::RingLength(n) if *n == buf.len() => {}
                Contribution::RingLength(n) => {
                    return Err(CommError::ShapeMismatch {
                        expected: buf.len(),
                        got: *n,
                    });
                }
                _ => return Err(out_of_order(rank)),
            }
        }
        drop(lengths);
        let timeout = self.shared.timeout;
        ring::all_reduce(&mut self.ring, self.rank, size, timeout, buf, scalar, scale)?;
        // The simulated network pays for the schedule the network would
        // pick (its messages of at most CHUNK_FLOATS).
        let schedule = Schedule::choose(
            buf.len(),
            size,
            crate::CHUNK_FLOATS,
            crate::DIRECT_MAX_BYTES,
        );
        self.leave_collective(message_bytes(buf.len()), schedule);
        // What a bandwidth-optimal all-reduce moves (either schedule).
        if size > 1 {
            let bytes = 2 * (size as u64 - 1) * (4 * buf.len() as u64 + 8) / size as u64;
            self.stats.bytes_sent += bytes;
            self.stats.bytes_received += bytes;
        }
        Ok(())
    }

    /// Sends this worker's push-sum shares compressed with `codec` (every
    /// worker of a run must use the same; see [`crate::compress`]).
    pub fn set_compression(&mut self, codec: Compression) {
        self.compress = codec;
    }

    /// Takes a place in a new view's network; nothing of the old view's
    /// push-sum rounds is kept.
    fn install(&mut self, h: Handout) {
        self.rank = h.rank;
        self.ring = h.ring;
        self.shared = h.shared;
        self.ledger = Ledger::new(Mixing::Due);
    }

    fn board(&self) -> Result<&Arc<Board>, CommError> {
        self.board.as_ref().ok_or_else(|| {
            CommError::Unsupported("this in-memory run has no membership changes".into())
        })
    }

    fn check_len(&mut self, len: usize) -> Result<(), CommError> {
        match self.len {
            None => {
                self.len = Some(len);
                Ok(())
            }
            Some(expected) if expected == len => Ok(()),
            Some(expected) => Err(CommError::ShapeMismatch { expected, got: len }),
        }
    }

    /// Adds the due shares, waiting for those of rounds `<= wait_up_to`.
    fn collect(
        &mut self,
        wait_up_to: Option<u64>,
        x: &mut [f32],
        w: &mut f64,
        operation: &'static str,
    ) -> Result<(), CommError> {
        if let (Some(sim), Some(up_to)) = (&mut self.sim, wait_up_to) {
            sim.await_shares(&mut self.ledger, up_to)?;
        }
        let before = self.ledger.mass().shares_added;
        let shared = self.shared.clone();
        let inbox = &shared.inboxes[self.rank];
        let ledger = &mut self.ledger;
        waiting(
            shared.timeout,
            &self.interrupt,
            self.board.as_deref().map(|b| (b, self.id, self.rejoined)),
            |waiting| ledger.collect(inbox, waiting, wait_up_to, x, w, operation, &mut drop),
        )?;
        let added = self.ledger.mass().shares_added - before;
        self.stats.messages_received += added;
        let share = crate::compress::encoded_bytes(self.compress, x.len()) as u64 + 8;
        self.stats.bytes_received += added * share;
        Ok(())
    }

    /// Puts a share of round `round` into `peer`'s inbox.
    fn enter_collective(&mut self) {
        if let Some(sim) = &mut self.sim {
            sim.enter_collective();
        }
    }

    /// `bytes`: what each rank contributed.
    /// Leaves a collective of `bytes` moved with `schedule` (the simulated
    /// network's clock pays for it).
    fn leave_collective(&mut self, bytes: u64, schedule: Schedule) {
        if let Some(sim) = &mut self.sim {
            sim.leave_collective(bytes, schedule);
        }
    }

    /// Every rank's contribution, in rank order, once all have arrived.
    fn gather(
        &mut self,
        contribution: Contribution,
        operation: &'static str,
    ) -> Result<Arc<Vec<Contribution>>, CommError> {
        let shared = self.shared.clone();
        let mut state = lock(&shared.reduce);
        let generation = state.generation;
        state.slots[self.rank] = Some(contribution);
        state.arrived += 1;
        if state.arrived == shared.size {
            let all: Vec<Contribution> = state
                .slots
                .iter_mut()
                .map(|slot| slot.take().expect("every rank deposited"))
                .collect();
            // Overwriting the previous result is safe: every rank took it
            // before it could deposit into this generation.
            state.result = Some(Arc::new(all));
            state.arrived = 0;
            state.generation += 1;
            shared.reduce_done.notify_all();
        } else {
            let deadline = Instant::now() + shared.timeout;
            while state.generation == generation {
                if let Some(reason) = &state.closed {
                    return Err(CommError::Closed(reason.clone()));
                }
                let now = Instant::now();
                if now >= deadline {
                    let missing = state.slots.iter().position(|s| s.is_none()).unwrap_or(0);
                    return Err(CommError::PeerTimeout {
                        peer: format!("worker-{missing}"),
                        rank: missing,
                        round: generation,
                        operation,
                        timeout: shared.timeout,
                    });
                }
                // A member lost, or the view gone on without us: the
                // others may never come.
                self.interrupt.check()?;
                if let Some(board) = &self.board {
                    board.check_pending(self.id, self.rejoined)?;
                }
                state = shared
                    .reduce_done
                    .wait_timeout(state, (deadline - now).min(crate::POLL))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        let result = state.result.clone().expect("result of a finished gather");
        Ok(result)
    }
}

/// The in-memory transport's half of the shared push-sum send path: a share
/// is a vector delivered straight into the receiver's inbox (through the
/// simulated network when there is one).
impl ShareSink for MemoryComm {
    type Share = MemShare;

    fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    fn scale_and_encode(
        &mut self,
        _round: u64,
        x: &mut [f32],
        p: f32,
        out_peers: usize,
        _w: f64,
    ) -> MemShare {
        MemShare::encode(self.compress, x, p, out_peers)
    }

    fn send_share(&mut self, peer: Rank, round: u64, x: MemShare, w: f64) -> Result<(), CommError> {
        let bytes = x.wire_bytes() + 8;
        let (shared, rank) = (&self.shared, self.rank);
        let deliver = move || {
            shared.inboxes[peer]
                .deliver(round, rank, w, x)
                .map_err(|refusal| {
                    CommError::Protocol(format!(
                        "push-sum share of round {round} from rank {rank} to rank {peer} refused: {refusal}"
                    ))
                })
        };
        let arrives = match &mut self.sim {
            Some(sim) => sim.send_share(peer, round, bytes, deliver)?,
            None => deliver().map(|()| true)?,
        };
        self.stats.messages_sent += 1;
        self.stats.bytes_sent += bytes;
        if !arrives {
            self.stats.messages_dropped += 1;
        }
        Ok(())
    }
}

impl Communicator for MemoryComm {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.size
    }

    fn push_sum(
        &mut self,
        round: &PushSumRound<'_>,
        x: &mut [f32],
        w: &mut f64,
    ) -> Result<(), CommError> {
        self.check_len(x.len())?;
        check_round(round, self.rank, self.shared.size)?;
        let shared = self.shared.clone();
        self.ledger
            .begin(&shared.inboxes[self.rank], round.round, round.in_peers)?;
        send_half(round, x, w, self)?;
        let wait = round.round.checked_sub(round.staleness);
        self.collect(wait, x, w, "push-sum")
    }

    fn shares_arrived(&mut self, up_to: u64) -> Result<bool, CommError> {
        if let Some(sim) = &self.sim {
            return sim.shares_arrived(&self.ledger, up_to);
        }
        let inbox = &self.shared.inboxes[self.rank];
        match self.shared.arrival {
            Arrival::AsSent => Ok(self.ledger.arrived(inbox, up_to)),
            Arrival::Lockstep => {
                let ledger = &self.ledger;
                waiting(
                    self.shared.timeout,
                    &self.interrupt,
                    self.board.as_deref().map(|b| (b, self.id, self.rejoined)),
                    |waiting| ledger.wait_arrived(inbox, up_to, waiting, "background push-sum"),
                )?;
                Ok(true)
            }
        }
    }

    fn drain(&mut self, x: &mut [f32], w: &mut f64) -> Result<(), CommError> {
        self.check_len(x.len())?;
        self.collect(Some(u64::MAX), x, w, "drain")
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32], scalar: &mut f64) -> Result<(), CommError> {
        self.all_reduce(buf, scalar, None)
    }

    fn all_reduce_sum_scaled(
        &mut self,
        buf: &mut [f32],
        scalar: &mut f64,
        factor: f32,
    ) -> Result<(), CommError> {
        self.all_reduce(buf, scalar, Some(factor))
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.enter_collective();
        let all = self.gather(Contribution::Floats(Vec::new(), 0.0), "barrier")?;
        self.leave_collective(0, Schedule::Ring);
        floats(&all).map(drop)
    }

    fn all_gather_u64(&mut self, values: &[u64]) -> Result<Vec<Vec<u64>>, CommError> {
        self.enter_collective();
        let all = self.gather(Contribution::Words(values.to_vec()), "all-gather")?;
        let words = all
            .iter()
            .enumerate()
            .map(|(rank, c)| match c {
                Contribution::Words(v) => Ok(v.clone()),
                _ => Err(out_of_order(rank)),
            })
            .collect::<Result<Vec<_>, _>>()?;
        // What a ring all-gather would move: each rank forwards the others'.
        let total: u64 = words.iter().map(|v| 8 * v.len() as u64).sum();
        let block = words.iter().map(|v| 8 * v.len() as u64).max().unwrap_or(0);
        if let Some(sim) = &mut self.sim {
            sim.leave_gather(block);
        }
        let others = total - 8 * values.len() as u64;
        self.stats.bytes_sent += others;
        self.stats.bytes_received += others;
        Ok(words)
    }

    fn exchange_u64(&mut self, blocks: &[Vec<u64>]) -> Result<Vec<Vec<u64>>, CommError> {
        let m = self.shared.size;
        if blocks.len() != m {
            return Err(CommError::Misuse(format!(
                "exchange of {} blocks in a view of {m}",
                blocks.len()
            )));
        }
        self.enter_collective();
        let all = self.gather(Contribution::Blocks(blocks.to_vec()), "exchange")?;
        let me = self.rank;
        let mine = all
            .iter()
            .enumerate()
            .map(|(rank, c)| match c {
                Contribution::Blocks(b) if b.len() == m => Ok(b[me].clone()),
                _ => Err(out_of_order(rank)),
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Each block goes straight to its rank: one hop, as slow as the
        // largest block.
        let largest = all
            .iter()
            .flat_map(|c| match c {
                Contribution::Blocks(b) => b.iter().map(|b| 8 * b.len() as u64).max(),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        if let Some(sim) = &mut self.sim {
            sim.leave_exchange(largest);
        }
        let words = |b: &[Vec<u64>], skip: usize| -> u64 {
            b.iter()
                .enumerate()
                .filter(|(r, _)| *r != skip)
                .map(|(_, b)| 8 * b.len() as u64)
                .sum()
        };
        self.stats.bytes_sent += words(blocks, me);
        self.stats.bytes_received += words(&mine, me);
        Ok(mine)
    }

    fn base_step(&mut self, step: u64) -> Result<(), CommError> {
        self.interrupt.check()?;
        self.step = step;
        if let Some(board) = &self.board {
            board.base_step(self.id, step, self.rejoined)?;
        }
        let Some(sim) = &mut self.sim else {
            return Ok(());
        };
        sim.base_step(step).inspect_err(|e| {
            // Nobody can complete a collective with a crashed worker.
            lock(&self.shared.reduce).closed = Some(e.to_string());
            self.shared.reduce_done.notify_all();
        })
    }

    fn virtual_time(&self) -> Option<VirtualTime> {
        self.sim.as_ref().map(Simulated::virtual_time)
    }

    fn interrupt_handle(&self) -> Option<Interrupt> {
        Some(self.interrupt.clone())
    }

    fn change_view(&mut self, last_barrier: u64) -> Result<ViewChange, CommError> {
        let board = self.board()?.clone();
        let (change, handout) =
            board.change_view(self.id, self.step, last_barrier, self.rejoined)?;
        if let Some(h) = handout {
            self.install(h);
        }
        Ok(change)
    }

    fn at_barrier(&mut self, steps: u64) -> Result<bool, CommError> {
        Ok(self.board.as_ref().is_some_and(|b| b.at_barrier(steps)))
    }

    fn send_state(&mut self, state: &[u8]) -> Result<(), CommError> {
        self.board()?.send_state(state);
        Ok(())
    }

    fn rejoin(&mut self) -> Result<Admission, CommError> {
        let board = self.board()?.clone();
        let (admission, handout) = board.rejoin(self.id)?;
        self.rejoined = true;
        if let Some(h) = handout {
            self.install(h);
        }
        Ok(admission)
    }

    fn stats(&self) -> CommStats {
        self.stats
    }

    fn push_sum_mass(&self) -> PushSumMass {
        self.ledger.mass()
    }
}
