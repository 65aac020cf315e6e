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
    scale: Option<f32>,
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
            scale: h.scale,
            got: Vec::new(),
        });
        if a.round != h.round
            || a.parts != h.parts
            || a.weight.to_bits() != h.weight.to_bits()
            || a.scale.map(f32::to_bits) != h.scale.map(f32::to_bits)
        {
            return Err(format!(
                "share {seq} announced as round {} in {} parts of weight {} scaled by {:?} and as \
                 round {} in {} of weight {} scaled by {:?}",
                a.round, a.parts, a.weight, a.scale, h.round, h.parts, h.weight, h.scale
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
            // The header's decoding refuses a scale on a compressed share.
            Some((codec, floats)) => {
                let (_, _, bytes) = a.got.pop().expect("one part");
                LeBytes::share(codec, floats, bytes).map_err(|e| e.to_string())?
            }
            None => LeBytes::parts(a.got.into_iter().map(|(_, o, b)| (o, b)).collect())
                .scaled_by(a.scale),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::p2p::lane::frame::FrameKind;
    use crate::p2p::wire::Kind;

    fn part(part: u16, scale: Option<f32>) -> FrameHeader {
        FrameHeader {
            part,
            parts: 2,
            round: 4,
            offset: 2 * part as u64,
            len: 2,
            total: 4,
            weight: 0.5,
            scale,
            ..FrameHeader::of(FrameKind::Tensor(Kind::PushSum))
        }
    }

    #[test]
    fn a_share_keeps_its_scale_and_parts_that_disagree_on_it_are_refused() {
        use crate::ledger::SharePayload;
        let bytes = |v: [f32; 2]| v.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
        let q = Some(0.25f32);
        let shares = ShareAssembly::new(4);
        let mut got = Vec::new();
        let mut deliver = |round, weight, share: LeBytes| {
            got.push((round, weight, share));
            Ok(())
        };
        shares
            .add_part(&part(1, q), bytes([8.0, 12.0]), None, &mut deliver)
            .unwrap();
        shares
            .add_part(&part(0, q), bytes([1.0, -4.0]), None, &mut deliver)
            .unwrap();
        assert_eq!(got.len(), 1);
        let mut x = vec![1.0f32; 4];
        got[0].2.add_into(&mut x);
        assert_eq!(x, [1.25, 0.0, 3.0, 4.0]);

        for (first, second) in [(q, None), (None, q), (q, Some(0.5))] {
            let shares = ShareAssembly::new(4);
            let mut deliver = |_, _, _| Ok(());
            shares
                .add_part(&part(0, first), bytes([1.0, 2.0]), None, &mut deliver)
                .unwrap();
            let err = shares
                .add_part(&part(1, second), bytes([3.0, 4.0]), None, &mut deliver)
                .unwrap_err();
            assert!(err.contains("scaled by"), "{err}");
        }
    }
}
