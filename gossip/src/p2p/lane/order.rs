//! Putting a lane's frames back in order: all-reduce parts in the sender's
//! sequence, push-sum shares from their parts, each handed on once whole
//! and next in the sender's order.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::super::payload::LeBytes;
use super::super::state::ReduceMsg;
use super::frame::FrameHeader;
use crate::compress::Compression;
use crate::sync::lock;

/// All-reduce parts held back waiting for an earlier one.
const MAX_HELD: usize = 4096;

/// All-reduce parts put back in the sender's order.
#[derive(Default)]
pub(crate) struct ReduceOrder {
    next: u64,
    held: BTreeMap<u64, ReduceMsg>,
}

impl ReduceOrder {
    /// Files part `sequence`; returns the parts now next in order.
    pub(crate) fn file(&mut self, sequence: u64, msg: ReduceMsg) -> Result<Vec<ReduceMsg>, String> {
        if sequence < self.next || self.held.contains_key(&sequence) {
            return Err(format!("all-reduce part {sequence} came twice"));
        }
        if self.held.len() >= MAX_HELD {
            return Err(format!(
                "more than {MAX_HELD} all-reduce parts ahead of part {}",
                self.next
            ));
        }
        self.held.insert(sequence, msg);
        let mut ready = Vec::new();
        while let Some(msg) = self.held.remove(&self.next) {
            self.next += 1;
            ready.push(msg);
        }
        Ok(ready)
    }
}

/// Push-sum shares put together from their parts and handed on in the
/// sender's order.
pub(crate) struct ShareAssembly {
    /// How far a share may be ahead of the next one in the sender's order:
    /// the round window ([`P2pConfig::round_window`](crate::p2p::P2pConfig::round_window)),
    /// since a sender has at most one share per round in flight to us and
    /// rounds stay within that window.
    max_ahead: u64,
    /// Shares being assembled, by the sender's count.
    shares: Mutex<HashMap<u64, Assembly>>,
    /// Whole shares waiting for an earlier one: the inbox takes a sender's
    /// shares in the order they were sent.
    order: Mutex<BTreeMap<u64, (u64, f64, LeBytes)>>,
    next: AtomicU64,
}

/// A push-sum share whose parts are arriving.
struct Assembly {
    round: u64,
    parts: u16,
    weight: f64,
    got: Vec<(u16, usize, Vec<u8>)>,
}

impl ShareAssembly {
    /// An empty assembly for a run whose round window is `round_window`.
    pub(crate) fn new(round_window: u64) -> Self {
        Self {
            max_ahead: round_window.max(1),
            shares: Mutex::default(),
            order: Mutex::default(),
            next: AtomicU64::new(0),
        }
    }

    /// Files a push-sum part; hands the shares that are now whole and next
    /// in the sender's order to `deliver` as (round, weight, share), in that
    /// order (under a lock, so that no other connection's share overtakes).
    /// A compressed share (`coded`: the run's codec and share length) comes
    /// in one part and is checked by its decoder.
    pub(crate) fn add_part(
        &self,
        h: &FrameHeader,
        payload: Vec<u8>,
        coded: Option<(Compression, usize)>,
        deliver: &mut dyn FnMut(u64, f64, LeBytes) -> Result<(), String>,
    ) -> Result<(), String> {
        let seq = h.sequence;
        let mut shares = lock(&self.shares);
        let next = self.next.load(Ordering::SeqCst);
        if seq < next {
            return Err(format!("share {seq} (round {}) came twice", h.round));
        }
        if seq - next >= self.max_ahead {
            return Err(format!(
                "share {seq} is {} ahead of share {next}, still missing (at most {}, the \
                 round window)",
                seq - next,
                self.max_ahead
            ));
        }
        if !shares.contains_key(&seq) && shares.len() >= MAX_HELD {
            return Err(format!("more than {MAX_HELD} shares being assembled"));
        }
        let a = shares.entry(seq).or_insert_with(|| Assembly {
            round: h.round,
            parts: h.parts,
            weight: h.weight,
            got: Vec::new(),
        });
        if a.round != h.round || a.parts != h.parts || a.weight.to_bits() != h.weight.to_bits() {
            return Err(format!(
                "share {seq} announced as round {} in {} parts of weight {} and as round {} in \
                 {} of weight {}",
                a.round, a.parts, a.weight, h.round, h.parts, h.weight
            ));
        }
        if a.got.iter().any(|(p, _, _)| *p == h.part) {
            return Err(format!("part {} of round {} came twice", h.part, h.round));
        }
        a.got.push((h.part, h.offset as usize, payload));
        if a.got.len() < a.parts as usize {
            return Ok(());
        }
        let mut a = shares.remove(&seq).expect("present above");
        drop(shares);
        a.got.sort_by_key(|(p, _, _)| *p);
        let unit = if coded.is_some() { 1 } else { 4 };
        let mut next = 0;
        for (_, offset, bytes) in &a.got {
            if *offset != next {
                return Err(format!(
                    "the parts of round {}'s share leave a gap or overlap at element {next}",
                    h.round
                ));
            }
            next += bytes.len() / unit;
        }
        if next as u64 != h.total {
            return Err(format!(
                "the parts of round {}'s share hold {next} of {} elements",
                h.round, h.total
            ));
        }
        let share = match coded {
            Some((codec, floats)) => {
                let (_, _, bytes) = a.got.pop().expect("one part");
                LeBytes::share(codec, floats, bytes).map_err(|e| e.to_string())?
            }
            None => LeBytes::parts(a.got.into_iter().map(|(_, o, b)| (o, b)).collect()),
        };
        let mut order = lock(&self.order);
        order.insert(seq, (a.round, a.weight, share));
        loop {
            let next = self.next.load(Ordering::SeqCst);
            let Some((round, weight, share)) = order.remove(&next) else {
                return Ok(());
            };
            self.next.store(next + 1, Ordering::SeqCst);
            deliver(round, weight, share)?;
        }
    }
}
