//! A conservative clock board: threads that each run one worker agree on
//! virtual time without depending on how the OS schedules them.
//!
//! Each worker publishes its virtual clock and, for every message it sends,
//! the message's arrival time (or that it never arrives). A receiver asks
//! about a message by its own clock `T`:
//! - posted: arrived iff its arrival is `<= T`;
//! - not posted, and the sender cannot send before `T - lookahead`: it
//!   cannot arrive by `T`, so "no";
//! - otherwise the receiver waits (real time) until one of the two holds.
//!
//! Every answer is the one a sequential simulation would give, so repeated
//! multi-threaded runs agree bit for bit. This is conservative parallel
//! discrete-event simulation with lookahead: the lookahead of a link is the
//! least time a message takes on it, never below
//! [`super::MIN_LATENCY_S`].
//!
//! Deadlock freedom: a worker waiting in [`ClockBoard::arrived_by`] at clock
//! `T` waits only for a sender whose bound `b` has `b + lookahead <= T`, so
//! `b < T`: it waits only on workers behind it. The bound of a worker blocked
//! in [`ClockBoard::wait_arrival`] is at least its own sender's bound plus
//! that link's lookahead (it resumes no earlier than the message can
//! arrive), so following waits always leads to strictly smaller clocks; the
//! worker with the least clock waits on nobody and, by stepping, advances.
//! Only a cycle of [`ClockBoard::wait_arrival`] calls (a protocol that
//! waits for messages nobody will send before their own wait ends) can
//! block, as it would on a real network; the real-time timeout reports it.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Delivery, Message, MessageKey, OutLinks};
use crate::Rank;

/// A wait on the board outlasted its real-time timeout.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "worker {waiting} waited {timeout:?} (real time) for {key} at virtual time {at:.6} s; \
     the sender's clock stayed at {sender_clock:.6} s"
)]
pub struct Stalled {
    pub waiting: Rank,
    pub key: MessageKey,
    pub at: f64,
    pub sender_clock: f64,
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Posted {
    send_time: f64,
    arrival: Option<f64>,
}

struct Board {
    clocks: Vec<f64>,
    finished: Vec<bool>,
    /// The message a worker blocks on in `wait_arrival`.
    waiting: Vec<Option<MessageKey>>,
    /// Workers inside a collective (see [`ClockBoard::enter_collective`]).
    in_collective: Vec<bool>,
    posted: HashMap<MessageKey, Posted>,
}

/// Shared virtual-time facts of one run's workers (see the module docs).
pub struct ClockBoard {
    size: usize,
    /// `lookahead[from * size + to]`, seconds, positive.
    lookahead: Vec<f64>,
    timeout: Duration,
    board: Mutex<Board>,
    changed: Condvar,
}

impl ClockBoard {
    /// A board for `size` workers, all at virtual time 0. `lookahead(from,
    /// to)` must be positive and no more than any message on that link takes.
    pub fn new(size: usize, lookahead: impl Fn(Rank, Rank) -> f64, timeout: Duration) -> Self {
        let lookahead: Vec<f64> = (0..size * size)
            .map(|i| lookahead(i / size, i % size))
            .collect();
        assert!(
            lookahead.iter().all(|l| l.is_finite() && *l > 0.0),
            "the clock board needs a positive lookahead on every link"
        );
        ClockBoard {
            size,
            lookahead,
            timeout,
            board: Mutex::new(Board {
                clocks: vec![0.0; size],
                finished: vec![false; size],
                waiting: vec![None; size],
                in_collective: vec![false; size],
                posted: HashMap::new(),
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lookahead(&self, from: Rank, to: Rank) -> f64 {
        self.lookahead[from * self.size + to]
    }

    /// `rank`'s published virtual clock.
    pub fn clock(&self, rank: Rank) -> f64 {
        self.lock().clocks[rank]
    }

    /// Publishes that `rank` has reached virtual time `to`: it will send
    /// nothing stamped earlier. Clocks never go back.
    pub fn advance(&self, rank: Rank, to: f64) {
        let mut board = self.lock();
        assert!(
            to >= board.clocks[rank],
            "worker {rank}'s clock would go back from {} to {to}",
            board.clocks[rank]
        );
        board.clocks[rank] = to;
        self.changed.notify_all();
    }

    /// `rank` sends nothing more (end of its run, or a crash).
    pub fn finish(&self, rank: Rank) {
        let mut board = self.lock();
        board.finished[rank] = true;
        board.in_collective[rank] = false;
        self.changed.notify_all();
    }

    /// `rank` enters a collective: it sends nothing until every worker has
    /// entered it, and it leaves no earlier than the latest of their clocks,
    /// so its bound is the largest clock of the workers still running.
    pub fn enter_collective(&self, rank: Rank) {
        self.lock().in_collective[rank] = true;
        self.changed.notify_all();
    }

    /// `rank` leaves its collective at virtual time `to` (not before its
    /// clock).
    pub fn leave_collective(&self, rank: Rank, to: f64) {
        let mut board = self.lock();
        board.in_collective[rank] = false;
        board.clocks[rank] = board.clocks[rank].max(to);
        self.changed.notify_all();
    }

    /// Records a message sent at `send_time` (not before the sender's clock)
    /// and its arrival; `None` if it never arrives.
    pub fn post(&self, key: MessageKey, send_time: f64, arrival: Option<f64>) {
        let mut board = self.lock();
        assert!(
            !board.finished[key.from] && send_time >= board.clocks[key.from],
            "worker {} posted {key:?} stamped {send_time}, behind its clock {} or after finishing",
            key.from,
            board.clocks[key.from]
        );
        board.posted.insert(key, Posted { send_time, arrival });
        self.changed.notify_all();
    }

    /// Sends `message` over `out` at the sender's clock and posts the result.
    pub fn send(&self, out: &mut OutLinks, message: Message, step: u64) -> Delivery {
        let from = out.rank();
        let send_time = self.clock(from);
        let delivery = out.send(message, send_time, step);
        if delivery != Delivery::SenderCrashed {
            let key = MessageKey {
                from,
                to: message.to,
                kind: message.kind,
                seq: message.seq,
            };
            self.post(key, send_time, delivery.arrival());
        }
        delivery
    }

    /// Drops a message's record once its receiver is done with it.
    pub fn forget(&self, key: &MessageKey) {
        self.lock().posted.remove(key);
    }

    /// The earliest virtual time at which `rank` can still send.
    fn bound(&self, board: &Board, rank: Rank, depth: usize) -> f64 {
        if board.finished[rank] {
            return f64::INFINITY;
        }
        if board.in_collective[rank] {
            let running = (0..self.size).filter(|r| !board.finished[*r]);
            return running
                .map(|r| board.clocks[r])
                .fold(board.clocks[rank], f64::max);
        }
        let Some(key) = board.waiting[rank] else {
            return board.clocks[rank];
        };
        if let Some(resume) = self.resume_time(board, &key) {
            return resume;
        }
        // Behind a cycle of waits: fall back to the plain clock.
        let sender = if depth > self.size {
            board.clocks[key.from]
        } else {
            self.bound(board, key.from, depth + 1)
        };
        board.clocks[rank].max(sender + self.lookahead(key.from, rank))
    }

    /// When a receiver blocked on `key` resumes, once that is decided: at the
    /// arrival, or (lost, or the sender finished without sending it) at the
    /// earliest time it could have arrived.
    fn resume_time(&self, board: &Board, key: &MessageKey) -> Option<f64> {
        let own = board.clocks[key.to];
        let lookahead = self.lookahead(key.from, key.to);
        match board.posted.get(key) {
            Some(p) => Some(own.max(p.arrival.unwrap_or(p.send_time + lookahead))),
            None if board.finished[key.from] => Some(own.max(board.clocks[key.from] + lookahead)),
            None => None,
        }
    }

    /// Blocks the receiver `key.to` until message `key` arrives; its clock
    /// moves to the arrival. `None`: it never arrives (lost, or the sender
    /// finished without sending it); the clock then moves to the earliest
    /// time it could have arrived, which is when a receiver learns of it.
    pub fn wait_arrival(&self, key: MessageKey) -> Result<Option<f64>, Stalled> {
        let deadline = Instant::now() + self.timeout;
        let mut board = self.lock();
        board.waiting[key.to] = Some(key);
        self.changed.notify_all();
        loop {
            if let Some(resume) = self.resume_time(&board, &key) {
                board.clocks[key.to] = resume;
                board.waiting[key.to] = None;
                self.changed.notify_all();
                return Ok(board.posted.get(&key).and_then(|p| p.arrival));
            }
            board = match self.wait(board, deadline) {
                Ok(board) => board,
                Err(mut board) => {
                    board.waiting[key.to] = None;
                    return Err(self.stalled(&board, key));
                }
            };
        }
    }

    /// Whether message `key` has arrived by the receiver's clock. Waits
    /// (real time) only while the sender is behind enough that it could
    /// still send it in time.
    pub fn arrived_by(&self, key: MessageKey) -> Result<bool, Stalled> {
        let deadline = Instant::now() + self.timeout;
        let mut board = self.lock();
        let now = board.clocks[key.to];
        loop {
            if let Some(p) = board.posted.get(&key) {
                return Ok(p.arrival.is_some_and(|a| a <= now));
            }
            if self.bound(&board, key.from, 0) + self.lookahead(key.from, key.to) > now {
                return Ok(false);
            }
            board = self
                .wait(board, deadline)
                .map_err(|board| self.stalled(&board, key))?;
        }
    }

    /// Whether message `key` is settled by the receiver's clock: it has
    /// arrived, or it is known never to arrive (lost, or its sender finished
    /// without sending it) by the earliest time it could have arrived. Waits
    /// like [`ClockBoard::arrived_by`].
    pub fn settled_by(&self, key: MessageKey) -> Result<bool, Stalled> {
        let deadline = Instant::now() + self.timeout;
        let mut board = self.lock();
        let now = board.clocks[key.to];
        let lookahead = self.lookahead(key.from, key.to);
        loop {
            if let Some(p) = board.posted.get(&key) {
                return Ok(p.arrival.unwrap_or(p.send_time + lookahead) <= now);
            }
            if board.finished[key.from] {
                return Ok(board.clocks[key.from] + lookahead <= now);
            }
            if self.bound(&board, key.from, 0) + lookahead > now {
                return Ok(false);
            }
            board = self
                .wait(board, deadline)
                .map_err(|board| self.stalled(&board, key))?;
        }
    }

    /// One condvar wait; `Err` with the guard once `deadline` has passed.
    fn wait<'a>(
        &self,
        board: MutexGuard<'a, Board>,
        deadline: Instant,
    ) -> Result<MutexGuard<'a, Board>, MutexGuard<'a, Board>> {
        let now = Instant::now();
        if now >= deadline {
            return Err(board);
        }
        Ok(self
            .changed
            .wait_timeout(board, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0)
    }

    fn stalled(&self, board: &Board, key: MessageKey) -> Stalled {
        Stalled {
            waiting: key.to,
            key,
            at: board.clocks[key.to],
            sender_clock: board.clocks[key.from],
            timeout: self.timeout,
        }
    }
}
