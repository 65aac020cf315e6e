//! Moving weighted flat tensors between peers.
//!
//! The training loop is written once against [`Communicator`]; two
//! implementations exist: [`memory`] (many workers inside one process, used by
//! the simulator and most tests) and the libp2p one (real peers in real
//! processes). This crate knows nothing about models: it moves `f32` buffers
//! and their push-sum weights.

mod collectives;
pub mod compress;
mod le;
mod ledger;
pub mod memory;
mod ring;
pub mod simnet;
pub mod sync;
pub mod view_rule;

pub use collectives::ReduceOp;
pub use ring::{CHUNK_FLOATS, DIRECT_MAX_BYTES, DIRECT_MAX_RANKS, Schedule};

use std::time::Duration;

/// A worker's index in the current membership view (over libp2p: the
/// admission policy's place order, sorted peer ids when open).
pub type Rank = usize;

/// Errors of a communication operation.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// A peer stayed silent for longer than the peer timeout.
    #[error(
        "peer {peer} (rank {rank}) sent nothing for {timeout:?} during {operation} of round {round}"
    )]
    PeerTimeout {
        peer: String,
        rank: Rank,
        round: u64,
        operation: &'static str,
        timeout: Duration,
    },
    /// The buffers handed to an operation do not fit the run.
    #[error("buffer of {got} floats where the run exchanges {expected}")]
    ShapeMismatch { expected: usize, got: usize },
    /// The transport or a peer is gone.
    #[error("communication closed: {0}")]
    Closed(String),
    /// A setting or an input the node was given is refused: the p2p
    /// configuration, a multiaddr, the identity file, the admission policy
    /// for this node, a peer id or protocol name handed to a call.
    #[error("{0}")]
    Config(String),
    /// The network could not be set up or used: the runtime, the swarm, a
    /// listener, a protocol's acceptor, the data lane, a raw stream.
    #[error("{0}")]
    Network(String),
    /// A peer broke the protocol, or the ranks disagree on it: a bad peer
    /// id in a member list or decision, a share of the wrong length,
    /// collectives called in different orders or with different lengths.
    #[error("{0}")]
    Protocol(String),
    /// The caller broke an operation's contract: rounds that do not
    /// increase, a rank outside the view, a message over the cap.
    #[error("{0}")]
    Misuse(String),
    /// A typed collective's values cannot be combined (a sum beyond
    /// `u64::MAX`, a non-finite value).
    #[error("{0}")]
    Value(String),
    /// This node is not a member of the run (yet): outside the view, not
    /// admitted in time, no state received, or its places are taken.
    #[error("{0}")]
    NotAdmitted(String),
    /// The run cannot go on: fewer members than it needs and nobody joined
    /// in time, no side with a quorum, or a membership change timed out.
    #[error("{0}")]
    RunStopped(String),
    /// The transport cannot do this (a membership change on a transport
    /// without views, the data lane's probe without a lane).
    #[error("{0}")]
    Unsupported(String),
    /// The operation was interrupted on request ([`Interrupt::raise`]).
    #[error("interrupted on request")]
    Interrupted,
    /// A member of the view is gone (its connection closed, or a simulated
    /// crash): the view must change ([`Communicator::change_view`]).
    #[error("member {peer} (rank {rank}) is lost: {reason}")]
    PeerLost {
        peer: String,
        rank: Rank,
        reason: String,
    },
    /// Another member started a change of the view (it lost a peer, or
    /// joiners wait): this operation cannot complete in the current view.
    #[error("the view is changing: {0}")]
    ViewChanging(String),
    /// Joining failed: a peer of the run (a bootstrap peer) refused us, or
    /// we refused it. `field` is what differs (`admission` when the peer
    /// did not admit us: its reason stays in its own log); `reason` says
    /// what this node knows of it, never the other side's values.
    #[error("refused by the run at peer {peer}: {reason}")]
    Refused {
        peer: String,
        field: String,
        reason: String,
    },
    /// Another process uses this node's identity (peer id): every node
    /// needs its own identity file.
    #[error("duplicated identity: {0}")]
    DuplicateIdentity(String),
    /// The run's members did not all turn up (or agree) in time.
    #[error(
        "join timed out after {timeout:?}: {} of {nodes} peers present ({}), {missing} missing{}",
        present.len(),
        present.join(", "),
        if detail.is_empty() { String::new() } else { format!("; {detail}") }
    )]
    JoinTimeout {
        timeout: Duration,
        nodes: usize,
        present: Vec<String>,
        missing: usize,
        detail: String,
    },
}

impl CommError {
    /// Whether the run can go on in a new view without the peer this error
    /// is about (a silent or lost member, or a view change started by
    /// another member); see [`Communicator::change_view`].
    pub fn needs_view_change(&self) -> bool {
        matches!(
            self,
            CommError::PeerTimeout { .. } | CommError::PeerLost { .. } | CommError::ViewChanging(_)
        )
    }
}

/// Makes a communicator's blocked operations return
/// [`CommError::Interrupted`] promptly (within about 100 ms), for example
/// from a signal handler. Cloneable; raising it is permanent.
#[derive(Debug, Clone, Default)]
pub struct Interrupt(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Interrupt {
    /// A handle not raised yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Interrupts every blocked and later operation.
    pub fn raise(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether [`Interrupt::raise`] was called.
    pub fn is_raised(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `Err(Interrupted)` once raised.
    pub fn check(&self) -> Result<(), CommError> {
        if self.is_raised() {
            Err(CommError::Interrupted)
        } else {
            Ok(())
        }
    }
}

/// How often a blocked wait looks at its [`Interrupt`] and at membership
/// alarms.
pub(crate) const POLL: Duration = Duration::from_millis(100);

/// The outcome of [`Communicator::change_view`] for one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewChange {
    /// The worker is a member of the new view.
    Member(NewView),
    /// The worker is not in the new view (it sits in a minority partition,
    /// or the others decided it was lost): it must pause and come back
    /// through [`Communicator::rejoin`].
    Excluded(String),
}

/// A view the live members agreed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewView {
    /// The view's number (it increases with every change).
    pub number: u64,
    /// This worker's rank in it.
    pub rank: Rank,
    /// Its size.
    pub world: usize,
    /// The outer iteration every member returns to: the latest barrier all
    /// of them completed (each keeps the state of its last barriers).
    pub rollback_to: u64,
    /// Members of the old view that are not in the new one.
    pub lost: Vec<String>,
    /// Peers that joined in this change (they receive the state from one
    /// member that stays, see [`Communicator::send_state`]).
    pub joined: Vec<String>,
    /// Whether this worker hands the state to the joiners: the
    /// lowest-ranked member that was in the old view too.
    pub sends_state: bool,
    /// The members in rank order, by name (`worker-W` in the simulator,
    /// peer ids over the network).
    pub members: Vec<String>,
    /// The rank that sends the state to the joiners (`None`: nobody
    /// joined), see [`view_rule::state_sender`].
    pub state_sender: Option<Rank>,
}

/// What a joiner receives when it is admitted ([`Communicator::rejoin`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The view it joined.
    pub view: NewView,
    /// The training state sent by a member, opaque to this crate (the
    /// transport verified its hash).
    pub state: Vec<u8>,
}

/// One push-sum round as seen by one rank.
#[derive(Debug, Clone, Copy)]
pub struct PushSumRound<'a> {
    /// The gossip round (one per base step).
    pub round: u64,
    /// Ranks this rank sends a share to in this round.
    pub out_peers: &'a [Rank],
    /// Ranks that send a share to this rank in this round.
    pub in_peers: &'a [Rank],
    /// Staleness bound `s`: the call returns once every share of rounds
    /// `<= round - s` has arrived. `0` is synchronous SGP.
    pub staleness: u64,
}

/// Bytes and messages a communicator has moved so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CommStats {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
    /// Messages refused by validation (bad shape, run id, non-finite, ...).
    pub messages_dropped: u64,
    /// All-reduce parts written into the caller's buffer as they arrived
    /// (the data lane), not read into a buffer of their own first.
    #[serde(default)]
    pub parts_landed: u64,
    /// Of `bytes_sent`, those the data lane carried (the rest took libp2p
    /// streams: a lane-less run, or peers whose lane could not be dialed).
    #[serde(default)]
    pub lane_bytes_sent: u64,
}

/// Push-sum mass a rank has sent and added so far: after a drain, the
/// weights sent by all ranks sum to the weights they added (no mass lost).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PushSumMass {
    /// Shares sent (one per out-peer and round).
    pub shares_sent: u64,
    /// Sum of the weights of the shares sent.
    pub weight_sent: f64,
    /// Shares received and added into `(x, w)`.
    pub shares_added: u64,
    /// Sum of the weights of the shares added.
    pub weight_added: f64,
}

/// A worker's place in simulated time: the in-memory network with a network
/// model (see [`simnet`]). Seconds of virtual time.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VirtualTime {
    /// The worker's clock now.
    pub clock: f64,
    /// Base steps whose exchange has ended (every step before the latest
    /// one), and the clock when the latest one began: `step_clock / steps`
    /// is the worker's pace, free of the end-of-run collectives.
    pub steps: u64,
    pub step_clock: f64,
    /// Compute time of one base step of this worker, without waits.
    pub compute: f64,
}

/// The operations the training loop needs from the network.
///
/// All operations are blocking; every rank of the run calls the collective
/// ones ([`Communicator::all_reduce_sum`], [`Communicator::barrier`],
/// [`Communicator::all_gather_u64`] and the typed collectives over it) in the
/// same order.
pub trait Communicator: Send {
    /// This worker's rank.
    fn rank(&self) -> Rank;
    /// Number of workers in the current view.
    fn world_size(&self) -> usize;
    /// One push-sum round: keep the share `p = 1 / (|out| + 1)` of `(x, w)`,
    /// send the same share to each out-peer, add the shares that have arrived
    /// and wait, as far as the staleness bound demands, for the rest. No mass
    /// is dropped: a share that arrives late is added by a later call.
    fn push_sum(
        &mut self,
        round: &PushSumRound<'_>,
        x: &mut [f32],
        w: &mut f64,
    ) -> Result<(), CommError>;
    /// Whether every push-sum share of rounds `<= up_to` has arrived; adds
    /// nothing. Over a real network it never blocks. The in-memory network
    /// in its default, lockstep model waits until the answer is `true`
    /// (see [`memory::Arrival`]), which keeps the simulator deterministic.
    fn shares_arrived(&mut self, up_to: u64) -> Result<bool, CommError>;
    /// Wait for every push-sum share still in flight towards this rank and add
    /// it into `(x, w)`.
    fn drain(&mut self, x: &mut [f32], w: &mut f64) -> Result<(), CommError>;
    /// Sum `buf` and `scalar` over all ranks; every rank ends with the same
    /// bits.
    fn all_reduce_sum(&mut self, buf: &mut [f32], scalar: &mut f64) -> Result<(), CommError>;
    /// [`Communicator::all_reduce_sum`], then every element of the sum
    /// multiplied by `factor`: the same bits as that pass, which the
    /// transports fold into the all-reduce (each element is scaled once, by
    /// the rank that finished its sum, before the all-gather sends it on).
    fn all_reduce_sum_scaled(
        &mut self,
        buf: &mut [f32],
        scalar: &mut f64,
        factor: f32,
    ) -> Result<(), CommError> {
        self.all_reduce_sum(buf, scalar)?;
        ledger::scale(buf, factor);
        Ok(())
    }
    /// Wait until every rank reached the barrier.
    fn barrier(&mut self) -> Result<(), CommError>;
    /// Called once by every member of the view a run starts with, before
    /// its first step (not by a worker admitted later: its admission is
    /// the synchronisation). Returns when every member has installed the
    /// view, so that no member trains ahead of one still joining; with
    /// background gossip nothing else would hold them together. In-process
    /// workers start together already.
    fn start_together(&mut self) -> Result<(), CommError> {
        Ok(())
    }
    /// Every rank's `values`, exactly, in rank order (a collective). The
    /// lengths may differ: the typed collectives below check them.
    fn all_gather_u64(&mut self, values: &[u64]) -> Result<Vec<Vec<u64>>, CommError>;
    /// All-to-all (a collective): `blocks[j]` goes to rank `j` (one block
    /// per rank, this rank's own included); returns what every rank sent
    /// this one, in rank order, exactly. Lengths may differ; the caller
    /// checks them. The default moves every block to every rank over
    /// [`Communicator::all_gather_u64`] (correct, `m` times the bytes);
    /// the transports send each block only to its rank.
    fn exchange_u64(&mut self, blocks: &[Vec<u64>]) -> Result<Vec<Vec<u64>>, CommError> {
        let m = self.world_size();
        if blocks.len() != m {
            return Err(CommError::Misuse(format!(
                "exchange of {} blocks in a view of {m}",
                blocks.len()
            )));
        }
        // The lengths first, then the blocks end to end.
        let mut mine: Vec<u64> = blocks.iter().map(|b| b.len() as u64).collect();
        for b in blocks {
            mine.extend_from_slice(b);
        }
        let all = self.all_gather_u64(&mine)?;
        collectives::pick_exchanged(&all, self.rank(), m)
    }
    /// Combines `values` over all ranks with `op`; every rank gets the
    /// result. A sum beyond `u64::MAX`, or ranks with different lengths, is
    /// an error on every rank.
    fn all_reduce_u64(&mut self, values: &mut [u64], op: ReduceOp) -> Result<(), CommError> {
        let all = self.all_gather_u64(values)?;
        collectives::reduce_u64(&all, values, op)
    }
    /// f64 sums in rank order `((v_0 + v_1) + v_2) ...`: every rank gets the
    /// same bits. A non-finite value from any rank is an error on every rank.
    fn all_reduce_f64(&mut self, values: &mut [f64]) -> Result<(), CommError> {
        let bits: Vec<u64> = values.iter().map(|v| v.to_bits()).collect();
        let all = self.all_gather_u64(&bits)?;
        collectives::sum_f64_in_rank_order(&all, values)
    }
    /// The training loop is about to compute base step `step` (every step,
    /// whether or not it gossips). A simulated network advances this
    /// worker's virtual clock by the step's compute time, or fails with
    /// [`CommError::Closed`] if the worker crashes there; others ignore it.
    fn base_step(&mut self, step: u64) -> Result<(), CommError> {
        let _ = step;
        Ok(())
    }
    /// The handle that interrupts this communicator's blocked operations,
    /// if it supports interruption.
    fn interrupt_handle(&self) -> Option<Interrupt> {
        None
    }
    /// After an operation failed with an error for which
    /// [`CommError::needs_view_change`] holds: agree with the live members on
    /// a new view. `last_barrier` is the newest outer iteration this worker
    /// completed (and can return to). Transports without membership
    /// changes return the error.
    fn change_view(&mut self, last_barrier: u64) -> Result<ViewChange, CommError> {
        let _ = last_barrier;
        Err(CommError::Unsupported(
            "this transport cannot change the membership view".into(),
        ))
    }
    /// Called by every member after each outer barrier `round` it completed
    /// (a collective): `true` when the view must change here (joiners are
    /// waiting), in which case the caller calls [`Communicator::change_view`].
    fn at_barrier(&mut self, round: u64) -> Result<bool, CommError> {
        let _ = round;
        Ok(false)
    }
    /// Nodes this one knows to be waiting to join the run (a harness holding
    /// the run at a step waits until a node it started is known).
    fn joiners_waiting(&self) -> usize {
        0
    }
    /// The member with [`NewView::sends_state`], after a change with joiners: hands the
    /// training state to them.
    fn send_state(&mut self, state: &[u8]) -> Result<(), CommError> {
        let _ = state;
        Ok(())
    }
    /// A worker outside the view (excluded, or new): waits until the run
    /// admits it at a barrier and returns its place and the state.
    fn rejoin(&mut self) -> Result<Admission, CommError> {
        Err(CommError::Unsupported(
            "this transport cannot admit a worker into a running view".into(),
        ))
    }
    /// This worker's virtual time, when the network is simulated.
    fn virtual_time(&self) -> Option<VirtualTime> {
        None
    }
    /// Traffic so far.
    fn stats(&self) -> CommStats;
    /// Push-sum mass sent and added so far.
    fn push_sum_mass(&self) -> PushSumMass;
}

/// Exact push-sum average: drain what is in flight, then set every rank's
/// `x` to `sum x_i / sum w_i` and `w` to 1.
pub fn exact_average(
    comm: &mut dyn Communicator,
    x: &mut [f32],
    w: &mut f64,
) -> Result<(), CommError> {
    comm.drain(x, w)?;
    weighted_average(comm, x, w)
}

/// [`exact_average`] for a run whose weights are all 1 by construction (a
/// base without push-sum: Local SGD, and SlowMo over it). `sum w` is then
/// the member count, exactly, so the factor `(1 / m) as f32` is known
/// before the sum and folds into the all-reduce
/// ([`Communicator::all_reduce_sum_scaled`]): no pass over the model
/// afterwards, and the same bits as [`exact_average`]. A weight other than
/// 1 is a misuse, refused before (ours) or after (any rank's) the sum.
pub fn unit_weight_average(
    comm: &mut dyn Communicator,
    x: &mut [f32],
    w: &mut f64,
) -> Result<(), CommError> {
    if *w != 1.0 {
        return Err(CommError::Misuse(format!(
            "an average of unit weights with a weight of {w}"
        )));
    }
    comm.drain(x, w)?;
    let m = comm.world_size();
    let mut total_w = *w;
    comm.all_reduce_sum_scaled(x, &mut total_w, (1.0 / m as f64) as f32)?;
    if total_w != m as f64 {
        return Err(CommError::Protocol(format!(
            "the weights of an average of unit weights summed to {total_w} over {m} members"
        )));
    }
    *w = 1.0;
    Ok(())
}

/// Sets every rank's `x` to `sum x_i / sum w_i` and `w` to 1 (nothing in
/// flight: [`exact_average`] drains first): one all-reduce of `x` whose
/// scalar is `w`, then every element multiplied by `(1 / sum w) as f32`.
/// (Folding that multiplication into the all-reduce, as
/// [`Communicator::all_reduce_sum_scaled`] does for a factor known
/// beforehand, would need the weight sum first: one more round trip, which
/// measured on two cores cost about what the pass saves, and more over a
/// WAN.)
pub fn weighted_average(
    comm: &mut dyn Communicator,
    x: &mut [f32],
    w: &mut f64,
) -> Result<(), CommError> {
    let mut total_w = *w;
    comm.all_reduce_sum(x, &mut total_w)?;
    ledger::scale(x, (1.0 / total_w) as f32);
    *w = 1.0;
    Ok(())
}

/// Segment `i` of `n` elements cut into `m` near-equal contiguous parts: the
/// unit of the exact average's summation order (see [`sum_segment_in_ring_order`]).
pub fn segment(n: usize, m: usize, i: usize) -> std::ops::Range<usize> {
    let at = |k: usize| ((k as u128 * n as u128) / m as u128) as usize;
    at(i)..at(i + 1)
}

/// The one summation order of every sum over ranks (docs/algorithm.md,
/// "Summation order"): segment `j` of the buffer is summed starting with rank
/// `j`'s values, then rank `j + 1`, ..., `j + m - 1` (mod m), which is the
/// order in which a ring reduce-scatter adds them. `contributions[r]` is rank
/// r's buffer; `out` receives segment `j` of the sum. The reference the ring
/// all-reduce (`ring.rs`) is tested against.
pub fn sum_segment_in_ring_order(contributions: &[&[f32]], j: usize, out: &mut [f32]) {
    let m = contributions.len();
    let n = contributions.first().map_or(0, |c| c.len());
    let seg = segment(n, m, j);
    out.copy_from_slice(&contributions[j][seg.clone()]);
    for k in 1..m {
        let next = &contributions[(j + k) % m][seg.clone()];
        for (a, b) in out.iter_mut().zip(next) {
            *a += *b;
        }
    }
}

/// The scalar of an all-reduce summed in rank order `((s_0 + s_1) + s_2) ...`,
/// as the ring carries it on segment 0.
pub fn sum_scalars_in_rank_order(scalars: impl IntoIterator<Item = f64>) -> f64 {
    let mut it = scalars.into_iter();
    let first = it.next().unwrap_or(0.0);
    it.fold(first, |t, s| t + s)
}

/// Uniform push-sum share kept and sent for a node with `out_degree` out-peers.
pub fn push_sum_share(out_degree: usize) -> f64 {
    1.0 / (out_degree as f64 + 1.0)
}
pub mod p2p;
