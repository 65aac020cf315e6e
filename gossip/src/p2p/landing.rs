//! Landing: the lane's readers write ring all-reduce parts straight into
//! the caller's buffer, record by record as they are opened (added in the
//! reduce-scatter, copied in the all-gather), instead of into a buffer of
//! their own that the training thread adds from once the part is whole.
//!
//! The ring says what it waits for next ([`Landing::expect`]): the sender,
//! the step, where the next chunk must start and where the segment ends,
//! and the buffer there. A reader whose frame is exactly such a part (the
//! same checks the ring makes of a part it receives:
//! [`crate::ring::Expected::check`]) claims its range; ranges claimed stay
//! disjoint, so every element still gets one addition from each step, in
//! the ring's order, and the sums are bit-identical to adding from a
//! buffer. The reader then hands the ring an empty part marked as landed,
//! in the sender's order, and the ring moves its cursor over it as over
//! any other part. A part that arrived before the ring said it waited for
//! it comes the old way, and the ring refuses to add it over a range a
//! reader claimed (only a sender that sent one range twice can make that
//! happen, and that ends the collective).
//!
//! Safety: the buffer is the caller's, alive for the collective; the ring
//! reads and writes it outside the claimed ranges only (it sends what it
//! already received, it adds what came the old way where nothing was
//! claimed), and [`Landing::close`] (run as the collective ends, by error
//! too) waits for a write under way and stops every later one: a write
//! happens under the read lock, and checks the zone is still the one it
//! claimed from.

use std::ops::Range;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use super::payload::{add_bytes, copy_bytes};
use super::wire::{Header, Kind};
use crate::Rank;
use crate::ring::Expected;

/// Where the ring wants its next parts written; see the module docs.
#[derive(Default)]
pub(crate) struct Landing {
    zone: RwLock<Option<Zone>>,
    /// Zones opened so far: each gets the next number as its id.
    opened: AtomicU64,
}

struct Zone {
    /// A write checks its claim is of the zone still open.
    id: u64,
    view: u64,
    /// The collective's sequence number.
    round: u64,
    /// What the ring waits for: the parts of its current step, and of the
    /// next one.
    windows: Vec<Window>,
    /// The address of the buffer's element 0.
    origin: usize,
    /// Ranges readers claimed and the ring has not moved past yet.
    claimed: Vec<Range<usize>>,
}

/// The parts of one ring step still awaited.
struct Window {
    from: Rank,
    kind: Kind,
    step: u32,
    total: u64,
    /// Where the next part must start and where the segment ends.
    cursor: usize,
    end: usize,
    add: bool,
}

/// One part a reader may write: `at` is where it lies in the buffer.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    id: u64,
    at: Range<usize>,
    /// Added into the buffer, not copied.
    pub add: bool,
}

/// A claim of a zone closed since: the ring gave up on the collective.
#[derive(Debug)]
pub(crate) struct Closed;

/// Whether two ranges share an element.
pub(crate) fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

impl Landing {
    /// The ring of collective `round` in view `view`, summing `buf`, waits
    /// for the parts of `windows` (each an expectation and whether its
    /// parts are added): its current step's, and the next step's. Claims
    /// still open in them stay (the ring moved its cursor over parts that
    /// came before them).
    ///
    /// # Safety
    /// `buf` must stay valid until [`Landing::close`] returns, and be read
    /// and written by the caller only outside the ranges claimed; nothing
    /// sent from the windows' ranges may still be read by the lane.
    pub(crate) unsafe fn expect(
        &self,
        view: u64,
        round: u64,
        buf: &mut [f32],
        windows: &[(&Expected, bool)],
    ) {
        let mut zone = self.zone.write().unwrap_or_else(|e| e.into_inner());
        let origin = buf.as_mut_ptr() as usize;
        let windows: Vec<Window> = windows
            .iter()
            .map(|(e, add)| Window {
                from: e.from,
                kind: Kind::of_phase(e.phase),
                step: e.step,
                total: e.total as u64,
                cursor: e.cursor,
                end: e.segment.end.min(buf.len()),
                add: *add,
            })
            .collect();
        // One zone a collective: claims the ring moved past are written
        // (it moves past a claimed part on its landed marker only).
        let (id, mut claimed) = match zone.take() {
            Some(z) if z.view == view && z.round == round && z.origin == origin => {
                (z.id, z.claimed)
            }
            _ => (self.opened.fetch_add(1, Ordering::Relaxed) + 1, Vec::new()),
        };
        claimed.retain(|r| {
            windows
                .iter()
                .any(|w| r.start >= w.cursor && r.end <= w.end)
        });
        *zone = Some(Zone {
            id,
            view,
            round,
            windows,
            origin,
            claimed,
        });
    }

    /// Claims the range of a checked all-reduce frame `h` from rank `from`
    /// if it is a part the ring waits for and no reader claimed any of it.
    pub(crate) fn claim(&self, view: u64, from: Rank, h: &Header) -> Option<Claim> {
        let mut zone = self.zone.write().unwrap_or_else(|e| e.into_inner());
        let z = zone.as_mut()?;
        let start = usize::try_from(h.offset).ok()?;
        let end = start.checked_add(usize::try_from(h.len).ok()?)?;
        if z.view != view || z.round != h.round || start >= end {
            return None;
        }
        let w = z.windows.iter().find(|w| {
            w.from == from
                && w.kind == h.kind
                && w.step == h.step
                && w.total == h.total
                && start >= w.cursor
                && end <= w.end
        })?;
        if z.claimed.iter().any(|r| overlaps(r, &(start..end))) {
            return None;
        }
        let add = w.add;
        z.claimed.push(start..end);
        Some(Claim {
            id: z.id,
            at: start..end,
            add,
        })
    }

    /// Writes `bytes` (`f32` LE, checked finite), element `at` on of the
    /// claimed part, into the buffer: added or copied as the ring said.
    pub(crate) fn write(&self, claim: &Claim, at: usize, bytes: &[u8]) -> Result<(), Closed> {
        self.with_place(claim, 4 * at, bytes.len() / 4 * 4, |place| {
            // Whole `f32`s of the buffer: its element 0 is aligned and the
            // place starts and ends on elements.
            let into: &mut [f32] = bytemuck::cast_slice_mut(place);
            if claim.add {
                add_bytes(into, bytes);
            } else {
                copy_bytes(into, bytes);
            }
        })
    }

    /// Runs `f` on the bytes of the claimed part's place from byte `at` on
    /// (at most `len` of them), if the zone is still open: a part that is
    /// copied can be read straight there. Under the zone's read lock: `f`
    /// must not wait.
    pub(crate) fn with_place<R>(
        &self,
        claim: &Claim,
        at: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, Closed> {
        let zone = self.zone.read().unwrap_or_else(|e| e.into_inner());
        let Some(z) = zone.as_ref().filter(|z| z.id == claim.id) else {
            return Err(Closed);
        };
        let start = 4 * claim.at.start + at;
        let n = len.min((4 * claim.at.end).saturating_sub(start));
        // SAFETY: the bytes lie inside the claimed range, which lies inside
        // the buffer of the zone that is still open (`expect`'s contract);
        // no one else touches a claimed range, and ranges are claimed once.
        let place = unsafe { std::slice::from_raw_parts_mut((z.origin + start) as *mut u8, n) };
        Ok(f(place))
    }

    /// Claims `at` for a part that came the old way (the ring adds it
    /// itself); `false` if a reader claimed any of it.
    pub(crate) fn reserve(&self, at: &Range<usize>) -> bool {
        let mut zone = self.zone.write().unwrap_or_else(|e| e.into_inner());
        let Some(z) = zone.as_mut() else { return true };
        if z.claimed.iter().any(|r| overlaps(r, at)) {
            return false;
        }
        z.claimed.push(at.clone());
        true
    }

    /// Ends the zone: waits for a write under way; no later one happens.
    pub(crate) fn close(&self) {
        *self.zone.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::p2p::wire::{DType, WIRE_VERSION};
    use crate::ring::Phase;

    fn expected(step: u32, cursor: usize, segment: Range<usize>) -> Expected {
        Expected {
            from: 2,
            phase: Phase::ReduceScatter,
            step,
            segment,
            cursor,
            total: 12,
        }
    }

    fn part(step: u32, offset: u64, len: u64) -> Header {
        Header {
            version: WIRE_VERSION,
            run_id: "r".into(),
            view: 1,
            sender: String::new(),
            round: 7,
            kind: Kind::ReduceScatter,
            dtype: DType::F32,
            len,
            weight: 0.0,
            checksum: 0,
            step,
            offset,
            total: 12,
        }
    }

    fn le(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn only_the_awaited_parts_are_claimed_once_and_added_in_place() {
        let landing = Landing::default();
        let mut buf = vec![1.0f32; 12];
        // Nothing awaited yet.
        assert!(landing.claim(1, 2, &part(0, 4, 2)).is_none());
        unsafe { landing.expect(1, 7, &mut buf, &[(&expected(0, 4, 4..8), true)]) };
        // Another sender, view, collective, step, a place before the
        // cursor or past the segment: not ours.
        assert!(landing.claim(1, 1, &part(0, 4, 2)).is_none());
        assert!(landing.claim(2, 2, &part(0, 4, 2)).is_none());
        assert!(
            landing
                .claim(
                    1,
                    2,
                    &Header {
                        round: 8,
                        ..part(0, 4, 2)
                    }
                )
                .is_none()
        );
        assert!(landing.claim(1, 2, &part(1, 4, 2)).is_none());
        assert!(landing.claim(1, 2, &part(0, 2, 2)).is_none());
        assert!(landing.claim(1, 2, &part(0, 6, 3)).is_none());
        assert!(landing.claim(1, 2, &part(0, 4, 0)).is_none());
        assert!(
            landing
                .claim(
                    1,
                    2,
                    &Header {
                        total: 13,
                        ..part(0, 4, 2)
                    }
                )
                .is_none()
        );
        assert!(
            landing
                .claim(
                    1,
                    2,
                    &Header {
                        kind: Kind::AllGather,
                        ..part(0, 4, 2)
                    }
                )
                .is_none()
        );
        // The second part first, then the first; neither twice.
        let second = landing.claim(1, 2, &part(0, 6, 2)).expect("second part");
        assert!(landing.claim(1, 2, &part(0, 5, 2)).is_none());
        let first = landing.claim(1, 2, &part(0, 4, 2)).expect("first part");
        assert!(landing.claim(1, 2, &part(0, 4, 2)).is_none());
        landing.write(&second, 0, &le(&[0.5])).unwrap();
        landing.write(&second, 1, &le(&[0.25])).unwrap();
        landing.write(&first, 0, &le(&[2.0, 3.0])).unwrap();
        // A part that came the old way over a claimed range is refused.
        assert!(!landing.reserve(&(4..6)));
        // The next step's parts (all-gather, copied) land while the ring
        // still waits for this step's.
        let next = Expected {
            phase: Phase::AllGather,
            ..expected(1, 8, 8..12)
        };
        unsafe {
            landing.expect(
                1,
                7,
                &mut buf,
                &[(&expected(0, 4, 4..8), true), (&next, false)],
            )
        };
        let gather = Header {
            kind: Kind::AllGather,
            ..part(1, 8, 4)
        };
        assert!(landing.claim(1, 2, &part(1, 8, 4)).is_none(), "wrong phase");
        let copied = landing.claim(1, 2, &gather).expect("next step's part");
        assert!(!copied.add && first.add);
        landing
            .write(&copied, 0, &le(&[-1.0, -2.0, -3.0, -4.0]))
            .unwrap();
        landing.close();
        assert_eq!(
            buf,
            [
                1.0, 1.0, 1.0, 1.0, 3.0, 4.0, 1.5, 1.25, -1.0, -2.0, -3.0, -4.0
            ]
        );
    }

    #[test]
    fn claims_outlive_the_cursor_moving_but_not_the_zone() {
        let landing = Landing::default();
        let mut buf = vec![0.0f32; 12];
        unsafe { landing.expect(1, 7, &mut buf, &[(&expected(0, 0, 0..4), false)]) };
        // The first part came the old way: the ring reserves it.
        assert!(landing.reserve(&(0..2)));
        assert!(landing.claim(1, 2, &part(0, 0, 2)).is_none());
        let later = landing.claim(1, 2, &part(0, 2, 2)).expect("second part");
        // The ring moves its cursor over the first part: the claim holds.
        unsafe { landing.expect(1, 7, &mut buf, &[(&expected(0, 2, 0..4), false)]) };
        assert!(landing.claim(1, 2, &part(0, 2, 2)).is_none());
        landing.write(&later, 0, &le(&[9.0, 8.0])).unwrap();
        assert_eq!(buf[2..4], [9.0, 8.0]);
        // The next collective's zone does not take the old claim.
        unsafe { landing.expect(1, 8, &mut buf, &[(&expected(0, 0, 0..4), false)]) };
        assert!(landing.write(&later, 0, &le(&[7.0])).is_err());
        let now = landing
            .claim(
                1,
                2,
                &Header {
                    round: 8,
                    ..part(0, 0, 4)
                },
            )
            .expect("claim");
        assert!(!now.add);
        // A copied part is read straight into its place, clipped to it.
        let wrote = landing.with_place(&now, 4, 100, |place| {
            place.copy_from_slice(&le(&[5.0, 6.0, 7.0]));
            place.len()
        });
        assert_eq!(wrote.unwrap(), 12);
        landing.close();
        assert!(landing.write(&now, 0, &le(&[7.0])).is_err());
        assert!(landing.with_place(&now, 0, 4, |_| ()).is_err());
        assert!(
            landing
                .claim(
                    1,
                    2,
                    &Header {
                        round: 8,
                        ..part(0, 0, 4)
                    }
                )
                .is_none()
        );
        assert_eq!(
            buf,
            [0.0, 5.0, 6.0, 7.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        );
    }
}
