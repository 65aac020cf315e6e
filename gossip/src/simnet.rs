//! A seeded, deterministic model of a network and of node speeds, in virtual
//! time, for the in-memory transport.
//!
//! Three pieces:
//! - [`NetworkProfile`]: the TOML description (links, node slowdowns,
//!   scripted faults), in the docker testnet's vocabulary.
//! - [`SimNetwork`]: pure functions of the seed and a message's identity:
//!   how long a node's step takes, when (and whether) a message arrives,
//!   which faults hold at a step. Each sender owns its out-links' state
//!   ([`OutLinks`]), so the answers never depend on thread scheduling.
//! - [`ClockBoard`]: the few shared facts threads need to agree on virtual
//!   time (each worker's clock, each message's arrival), with waits that
//!   give the same answer however the threads are scheduled.
//!
//! How a worker uses them (`net: SimNetwork`, `board: ClockBoard` shared,
//! `out = net.out_links(rank)` its own), for each base step `k`:
//! 1. if `net.is_crashed(rank, k)`: `board.finish(rank)` and stop;
//! 2. `board.advance(rank, board.clock(rank) + net.step_time(rank, k))`;
//! 3. each message: `board.send(&mut out, message, k)` (sent at its clock);
//! 4. a message it must have: `board.wait_arrival(key)` (its clock moves to
//!    the arrival); one it takes only if already there: `board.arrived_by(key)`;
//! 5. at the end of its run: `board.finish(rank)`.

mod clock;
mod profile;

pub use clock::{ClockBoard, Stalled};
pub use profile::{
    Fault, LinkSettings, NetworkProfile, NetworkProfileError, NodeSettings, parse_duration,
    parse_rate,
};

use std::sync::Arc;

use crate::Rank;

/// The shortest time any message takes, in seconds. A positive floor keeps
/// the [`ClockBoard`] deadlock-free (see there) even on links with no delay.
pub const MIN_LATENCY_S: f64 = 1e-6;

/// What a message is, as part of its identity (jitter and loss are drawn per
/// identity, so distinct kinds with the same sequence number differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MessageKind {
    /// A push-sum share; the sequence number is its round.
    Share,
    /// A piece of a collective (all-reduce chunk, barrier token).
    Collective,
    /// Anything else the protocol sends.
    Control,
}

impl MessageKind {
    fn tag(self) -> u64 {
        match self {
            MessageKind::Share => 1,
            MessageKind::Collective => 2,
            MessageKind::Control => 3,
        }
    }
}

/// The identity of one message: unique per `(from, to, kind, seq)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageKey {
    pub from: Rank,
    pub to: Rank,
    pub kind: MessageKind,
    pub seq: u64,
}

impl std::fmt::Display for MessageKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            MessageKind::Share => "share",
            MessageKind::Collective => "collective message",
            MessageKind::Control => "control message",
        };
        write!(
            f,
            "{kind} {} from worker {} to worker {}",
            self.seq, self.from, self.to
        )
    }
}

impl From<Stalled> for crate::CommError {
    fn from(e: Stalled) -> Self {
        crate::CommError::PeerTimeout {
            peer: format!("worker-{}", e.key.from),
            rank: e.key.from,
            round: e.key.seq,
            operation: "a simulated wait",
            timeout: e.timeout,
        }
    }
}

/// One message a sender hands to its [`OutLinks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    pub to: Rank,
    pub kind: MessageKind,
    pub seq: u64,
    /// Size on the wire, which sets its transmission time.
    pub bytes: u64,
}

/// What becomes of a message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Delivery {
    /// It arrives at this virtual time (seconds).
    Arrives(f64),
    /// Dropped by the link's loss probability (it still used the link).
    Lost,
    /// A partition separates sender and receiver at the sender's step.
    Partitioned,
    /// The sender has crashed: it sends nothing.
    SenderCrashed,
    /// The receiver has crashed (at the sender's step).
    ReceiverCrashed,
}

impl Delivery {
    /// The arrival time, if it arrives.
    pub fn arrival(self) -> Option<f64> {
        match self {
            Delivery::Arrives(t) => Some(t),
            _ => None,
        }
    }
}

/// One directed link, resolved from a profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    pub delay_s: f64,
    pub jitter_s: f64,
    /// `None`: unlimited (no transmission time).
    pub rate_bit_s: Option<f64>,
    pub loss: f64,
}

impl Link {
    /// The least time a message can take on this link: the lower bound the
    /// [`ClockBoard`] uses to answer "cannot have arrived yet".
    pub fn lookahead(&self) -> f64 {
        (self.delay_s - self.jitter_s).max(MIN_LATENCY_S)
    }

    /// Propagation delay for a uniform draw `u` in [0, 1): never below
    /// [`Link::lookahead`], so the board's bound holds bit for bit.
    fn propagation(&self, u: f64) -> f64 {
        (self.delay_s + (2.0 * u - 1.0) * self.jitter_s).max(self.lookahead())
    }

    fn transmission(&self, bytes: u64) -> f64 {
        self.rate_bit_s
            .map_or(0.0, |rate| bytes as f64 * 8.0 / rate)
    }
}

struct Model {
    size: usize,
    seed: u64,
    compute_s: Vec<f64>,
    /// `links[from * size + to]`.
    links: Vec<Link>,
    faults: Vec<Fault>,
}

/// A profile resolved for one run: cheap to clone, shared by every worker.
#[derive(Clone)]
pub struct SimNetwork {
    model: Arc<Model>,
}

/// Random streams drawn per message identity.
const JITTER_STREAM: u64 = 1;
const LOSS_STREAM: u64 = 2;

impl SimNetwork {
    /// Checks `profile` against `world_size` and resolves every node and link.
    pub fn new(
        profile: &NetworkProfile,
        world_size: usize,
        seed: u64,
    ) -> Result<Self, NetworkProfileError> {
        profile.validate(world_size)?;
        let compute_s = (0..world_size)
            .map(|r| profile.compute_s * profile.node(r).cpu_slowdown.unwrap_or(1.0))
            .collect();
        let mut links = Vec::with_capacity(world_size * world_size);
        for from in 0..world_size {
            for to in 0..world_size {
                let s = profile.link(from, to);
                links.push(Link {
                    delay_s: s.delay_s.unwrap_or(0.0),
                    jitter_s: s.jitter_s.unwrap_or(0.0),
                    rate_bit_s: s.rate_bit_s,
                    loss: s.loss.unwrap_or(0.0),
                });
            }
        }
        Ok(SimNetwork {
            model: Arc::new(Model {
                size: world_size,
                seed,
                compute_s,
                links,
                faults: profile.faults.clone(),
            }),
        })
    }

    pub fn world_size(&self) -> usize {
        self.model.size
    }

    /// The resolved link `from -> to`.
    pub fn link(&self, from: Rank, to: Rank) -> Link {
        self.model.links[from * self.model.size + to]
    }

    /// Compute time of one base step of `rank` (seconds): the profile's
    /// `compute_ms` times the node's slowdown. Nothing random.
    pub fn compute_time(&self, rank: Rank) -> f64 {
        self.model.compute_s[rank]
    }

    /// Time `rank` stands frozen before computing `step` (seconds): a pause
    /// of `n` steps starting there lasts `n` of its compute times.
    pub fn pause_time(&self, rank: Rank, step: u64) -> f64 {
        self.model
            .faults
            .iter()
            .map(|f| match *f {
                Fault::Pause {
                    node,
                    at_step,
                    steps,
                } if node == rank && at_step == step => steps as f64 * self.compute_time(rank),
                _ => 0.0,
            })
            .sum()
    }

    /// Virtual time that step `step` of `rank` takes: pause plus compute.
    pub fn step_time(&self, rank: Rank, step: u64) -> f64 {
        self.pause_time(rank, step) + self.compute_time(rank)
    }

    /// Whether `rank` has crashed by `step` (it computes no step from its
    /// crash step on).
    pub fn is_crashed(&self, rank: Rank, step: u64) -> bool {
        self.model.faults.iter().any(
            |f| matches!(*f, Fault::Crash { node, at_step } if node == rank && step >= at_step),
        )
    }

    /// Whether a partition separates `a` and `b` at `step`.
    pub fn partitioned(&self, a: Rank, b: Rank, step: u64) -> bool {
        self.model.faults.iter().any(|f| match f {
            Fault::Partition {
                groups,
                from_step,
                to_step,
            } if (*from_step..*to_step).contains(&step) => {
                let group_of = |r: Rank| groups.iter().position(|g| g.contains(&r));
                group_of(a) != group_of(b)
            }
            _ => false,
        })
    }

    /// The state of `rank`'s out-links: one per sender, owned by its thread.
    pub fn out_links(&self, rank: Rank) -> OutLinks {
        OutLinks {
            net: self.clone(),
            from: rank,
            busy_until: vec![f64::NEG_INFINITY; self.model.size],
        }
    }

    /// A clock board for this network's workers; `timeout` bounds every
    /// real-time wait.
    pub fn clock_board(&self, timeout: std::time::Duration) -> ClockBoard {
        ClockBoard::new(
            self.model.size,
            |from, to| self.link(from, to).lookahead(),
            timeout,
        )
    }

    /// A uniform draw in [0, 1), a pure function of the seed, the stream and
    /// the message identity.
    fn draw(&self, stream: u64, from: Rank, key: &Message) -> f64 {
        let parts = [stream, from as u64, key.to as u64, key.kind.tag(), key.seq];
        let hash = parts
            .iter()
            .fold(splitmix64(self.model.seed), |h, &p| splitmix64(h ^ p));
        (hash >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// One sender's out-links: when each becomes free. A link sends one message
/// at a time, so a message waits for the previous one to leave.
pub struct OutLinks {
    net: SimNetwork,
    from: Rank,
    busy_until: Vec<f64>,
}

impl OutLinks {
    pub fn rank(&self) -> Rank {
        self.from
    }

    /// Sends `message` at virtual time `send_time` from the sender's step
    /// `step` (faults are judged at the sender's step). The arrival is
    /// `max(send_time, link free) + bytes * 8 / rate + delay + jitter`, the
    /// jitter uniform in [-jitter, jitter] and drawn, like the loss, from the
    /// seed and the message identity.
    pub fn send(&mut self, message: Message, send_time: f64, step: u64) -> Delivery {
        let (from, to) = (self.from, message.to);
        if self.net.is_crashed(from, step) {
            return Delivery::SenderCrashed;
        }
        if self.net.is_crashed(to, step) {
            return Delivery::ReceiverCrashed;
        }
        if self.net.partitioned(from, to, step) {
            return Delivery::Partitioned;
        }
        let link = self.net.link(from, to);
        let start = send_time.max(self.busy_until[to]);
        let sent = start + link.transmission(message.bytes);
        self.busy_until[to] = sent;
        if self.net.draw(LOSS_STREAM, from, &message) < link.loss {
            return Delivery::Lost;
        }
        Delivery::Arrives(sent + link.propagation(self.net.draw(JITTER_STREAM, from, &message)))
    }
}

/// The splitmix64 mixing function: a fast, well-spread 64-bit hash.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
