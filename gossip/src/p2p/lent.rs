//! A push-sum share lent to the lane's writers straight from the caller's
//! parameters, so that it is never copied into a share buffer (nor `x`
//! scaled in a pass of its own).
//!
//! In a synchronous push-sum round (staleness 0) the caller's `x` stays
//! untouched from the send until the in-peers' shares are added, and that
//! add waits for our shares to be on the wire anyway. So instead of
//! scaling `x` and encoding it into a buffer (two more passes over the
//! model through memory), the round lends `x`'s bytes (little-endian
//! `f32`s are their own wire encoding) with the share's factor to the
//! connections' writers. The data lane sends them as they are, sealed
//! straight from `x` or written from it into the socket, with the factor
//! in the frame header: the receiver multiplies as it adds
//! ([`crate::le::add_scaled_bytes`]), the product rounded as the sender's
//! would have been, so the bits are those of a scaled share. A path that
//! needs the bytes scaled and owned (the libp2p streams) copies them,
//! scaling as it copies ([`LentShare::copy_into`]). The round scales the
//! `x` it keeps in the same pass as it adds the first in-peer's share
//! ([`crate::ledger::Ledger::collect_scaling`]), rounded as a multiply then
//! an add, so the bits are those of scaling first. The ring's chunks are
//! lent unscaled.
//!
//! The lender ([`Lender`]) waits until every holder ([`LentShare`]: the
//! queued frames and the writers' jobs) is done before `x` is touched again
//! ([`Lender::settle`]), and revokes the loan when it goes out of scope, on
//! every path out of the round (an error or a panic included): a writer
//! copies under a read lock and finds the loan revoked after that, so no
//! copy reads `x` once the lender has left.

use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

use crate::sync::lock;

/// The lent bytes: where they are and how many.
struct Source {
    at: *const u8,
    len: usize,
}

// SAFETY: `Source` is only read through the loan's lock, and the lender
// revokes it (under the write lock) before the memory it names may change
// or go: the pointer is never used after that.
unsafe impl Send for Source {}
unsafe impl Sync for Source {}

struct Loan {
    source: RwLock<Option<Source>>,
    len: usize,
    /// The factor the holders multiply each `f32` by as they copy (a
    /// push-sum share of unscaled `x`), or `None`: the bytes as they are.
    scale: Option<f32>,
    holders: Mutex<usize>,
    released: Condvar,
}

/// Where a push-sum round's loan of `x` waits for the round to settle it.
pub(crate) type LendSlot = Arc<Mutex<Option<Lender>>>;

/// The lender's side: revokes the loan when dropped.
pub(crate) struct Lender {
    loan: Arc<Loan>,
}

/// A holder's side: a frame or a writer's job that may copy from the loan.
pub(crate) struct LentShare {
    loan: Arc<Loan>,
}

/// The loan was revoked before a holder copied its bytes.
#[derive(Debug)]
pub(crate) struct Revoked;

impl std::fmt::Display for Revoked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the lent share was taken back before it was sent")
    }
}

impl std::error::Error for Revoked {}

impl Lender {
    /// Lends `x`'s bytes to the holders.
    ///
    /// # Safety
    /// `x` must stay alive and unchanged until the returned lender is
    /// dropped (it borrows nothing, so the compiler does not see to that:
    /// a push-sum round scales `x` and touches it again only after
    /// [`Lender::settle`]; the ring writes a place of its buffer only
    /// after settling the chunks lent from there).
    pub(crate) unsafe fn lend(x: &[f32]) -> (Self, LentShare) {
        // SAFETY: the caller's contract.
        unsafe { Self::lend_scaled(x, None) }
    }

    /// Lends `x`, whose holders copy `scale * x[i]` (as `f32` LE bytes)
    /// when `scale` is set: a push-sum share sent without scaling `x`
    /// first.
    ///
    /// # Safety
    /// As [`Lender::lend`].
    pub(crate) unsafe fn lend_scaled(x: &[f32], scale: Option<f32>) -> (Self, LentShare) {
        let len = std::mem::size_of_val(x);
        let loan = Arc::new(Loan {
            source: RwLock::new(Some(Source {
                at: x.as_ptr().cast(),
                len,
            })),
            len,
            scale,
            holders: Mutex::new(1),
            released: Condvar::new(),
        });
        (Self { loan: loan.clone() }, LentShare { loan })
    }

    /// The factor the holders scale by ([`Lender::lend_scaled`]).
    pub(crate) fn scale(&self) -> Option<f32> {
        self.loan.scale
    }

    /// Whether no holder is left (the share is on its way), without waiting.
    pub(crate) fn settled(&self) -> bool {
        *lock(&self.loan.holders) == 0
    }

    /// Waits until no holder is left, checking `give_up` every `poll`;
    /// `Err` with its reason if it gives up. The loan is revoked either way.
    pub(crate) fn settle<E>(
        self,
        poll: Duration,
        mut give_up: impl FnMut() -> Result<(), E>,
    ) -> Result<(), E> {
        loop {
            let held = lock(&self.loan.holders);
            let (held, _) = self
                .loan
                .released
                .wait_timeout_while(held, poll, |h| *h > 0)
                .unwrap_or_else(|e| e.into_inner());
            if *held == 0 {
                return Ok(());
            }
            drop(held);
            give_up()?;
        }
    }
}

impl Drop for Lender {
    fn drop(&mut self) {
        // Waits for a copy under way, then no holder reads `x` again.
        *self.loan.source.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl LentShare {
    /// Bytes lent.
    pub(crate) fn len(&self) -> usize {
        self.loan.len
    }

    /// The factor of a scaled loan ([`Lender::lend_scaled`]): its bytes
    /// are unscaled, [`LentShare::copy_into`] scales them, and a frame
    /// that sends them as they are carries the factor.
    pub(crate) fn scale(&self) -> Option<f32> {
        self.loan.scale
    }

    /// Runs `f` on the lent bytes of `range`, under the loan's read lock
    /// (so `f` must not wait: a copy, or one non-blocking socket write).
    /// The bytes as lent: a scaled loan's are not scaled.
    pub(crate) fn with_bytes<R>(
        &self,
        range: std::ops::Range<usize>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, Revoked> {
        let source = self.loan.source.read().unwrap_or_else(|e| e.into_inner());
        let Some(src) = source.as_ref() else {
            return Err(Revoked);
        };
        assert!(
            range.start <= range.end && range.end <= src.len,
            "a lent range within the share"
        );
        // SAFETY: the lender keeps `src.len` bytes at `src.at` unchanged and
        // alive while the source is set, and it is set under our read lock.
        let bytes = unsafe { std::slice::from_raw_parts(src.at, src.len) };
        Ok(f(&bytes[range]))
    }

    /// Copies the lent bytes of `range` into `out` (cleared first), each
    /// `f32` scaled by a scaled loan's factor (`range` then lies on whole
    /// values).
    pub(crate) fn copy_into(
        &self,
        range: std::ops::Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<(), Revoked> {
        let scale = self.loan.scale;
        self.with_bytes(range, |bytes| {
            out.clear();
            match scale {
                None => out.extend_from_slice(bytes),
                // Scaled as it is copied: one pass.
                Some(p) => {
                    assert!(
                        bytes.len() % 4 == 0,
                        "a scaled loan is lent in whole values"
                    );
                    out.reserve(bytes.len());
                    let spare = &mut out.spare_capacity_mut()[..bytes.len()];
                    for (o, v) in spare.chunks_exact_mut(4).zip(bytes.chunks_exact(4)) {
                        let v = f32::from_le_bytes([v[0], v[1], v[2], v[3]]) * p;
                        for (o, b) in o.iter_mut().zip(v.to_le_bytes()) {
                            o.write(b);
                        }
                    }
                    // SAFETY: the loop wrote all `bytes.len()` bytes, a
                    // whole number of values.
                    unsafe { out.set_len(bytes.len()) };
                }
            }
        })?;
        Ok(())
    }

    /// All the lent bytes in a new buffer from `pool` (for a path that
    /// needs them owned: the libp2p streams).
    pub(crate) fn to_vec(&self, pool: &super::payload::BufferPool) -> Result<Vec<u8>, Revoked> {
        let mut out = pool.take(self.len());
        self.copy_into(0..self.len(), &mut out)?;
        Ok(out)
    }
}

impl Clone for LentShare {
    fn clone(&self) -> Self {
        *lock(&self.loan.holders) += 1;
        Self {
            loan: self.loan.clone(),
        }
    }
}

impl Drop for LentShare {
    fn drop(&mut self) {
        let mut held = lock(&self.loan.holders);
        *held -= 1;
        if *held == 0 {
            self.loan.released.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_copy_until_the_lender_settles_and_never_after() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let x = vec![1.0f32, 2.0, 3.0, 4.0];
        // SAFETY: `x` outlives the lender and is not changed.
        let (lender, share) = unsafe { Lender::lend(&x) };
        let other = share.clone();
        let mut out = Vec::new();
        share.copy_into(4..12, &mut out).unwrap();
        assert_eq!(out, [2.0f32.to_le_bytes(), 3.0f32.to_le_bytes()].concat());
        let copied = Arc::new(AtomicBool::new(false));
        let flag = copied.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            let mut out = Vec::new();
            other.copy_into(0..16, &mut out).unwrap();
            flag.store(true, Ordering::SeqCst);
            drop(other);
            out.len()
        });
        drop(share);
        lender
            .settle(Duration::from_millis(5), || Ok::<(), ()>(()))
            .unwrap();
        // Settled only once the last holder had copied and let go.
        assert!(copied.load(Ordering::SeqCst));
        assert_eq!(writer.join().unwrap(), 16);
    }

    #[test]
    fn a_scaled_loan_copies_the_scaled_values_and_leaves_x() {
        let x = vec![1.5f32, -2.0, 3.25, 1e-3];
        let p = 1.0f32 / 3.0;
        // SAFETY: `x` outlives the lender and is not changed.
        let (lender, share) = unsafe { Lender::lend_scaled(&x, Some(p)) };
        assert_eq!(share.scale(), Some(p));
        let mut out = Vec::new();
        share.copy_into(4..16, &mut out).unwrap();
        let want: Vec<u8> = x[1..].iter().flat_map(|v| (v * p).to_le_bytes()).collect();
        assert_eq!(out, want);
        let pool = crate::p2p::payload::BufferPool::new(2, 1 << 20);
        let all = share.to_vec(&pool).unwrap();
        let want: Vec<u8> = x.iter().flat_map(|v| (v * p).to_le_bytes()).collect();
        assert_eq!(all, want);
        drop(share);
        lender
            .settle(Duration::from_millis(1), || Ok::<(), ()>(()))
            .unwrap();
        assert_eq!(x, [1.5, -2.0, 3.25, 1e-3]);
    }

    #[test]
    fn a_revoked_loan_is_not_read() {
        let x = vec![5.0f32; 8];
        // SAFETY: `x` outlives the lender and is not changed.
        let (lender, share) = unsafe { Lender::lend(&x) };
        let kept = share.clone();
        drop(share);
        // Giving up leaves the holder with a loan it can no longer read.
        let r = lender.settle(Duration::from_millis(1), || Err("peer gone"));
        assert_eq!(r, Err("peer gone"));
        let mut out = Vec::new();
        assert!(kept.copy_into(0..4, &mut out).is_err());
        assert!(out.is_empty());
    }
}
