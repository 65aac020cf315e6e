//! Waiting on a peer from the training thread: as long as bytes move, up
//! to an interrupt or a membership alarm.

use std::time::Duration;

use libp2p::PeerId;
use tokio::runtime::Runtime;

use super::state::Shared;
use crate::CommError;

/// Why [`block_on_active`] gave up.
pub(crate) enum Stopped {
    /// `limit` passed without bytes moving to or from the peer.
    Silent,
    /// Interrupted, or the view cannot go on ([`Shared::check`]).
    Alarm(CommError),
}

/// Runs `fut` on the node's runtime from a plain thread, giving up only
/// after `limit` without any bytes moving to or from `peer` (see
/// [`super::counters::Activity`]), counted from `started` at the earliest: a slow
/// transfer that progresses is waited for. An interrupt or a membership
/// alarm ends the wait within [`crate::POLL`]. (The timer must be created
/// inside the runtime, hence the wrapper.)
pub(crate) fn block_on_active<F: std::future::Future>(
    rt: &Runtime,
    shared: &Shared,
    peer: &PeerId,
    started: std::time::Instant,
    limit: Duration,
    fut: F,
) -> Result<F::Output, Stopped> {
    rt.block_on(async move {
        let mut fut = std::pin::pin!(fut);
        loop {
            shared.check().map_err(Stopped::Alarm)?;
            let deadline = shared.activity.deadline(peer, started, limit);
            let slice = deadline.min(std::time::Instant::now() + crate::POLL);
            match tokio::time::timeout_at(slice.into(), fut.as_mut()).await {
                Ok(out) => return Ok(out),
                Err(_) => {
                    if shared.activity.deadline(peer, started, limit) <= std::time::Instant::now() {
                        shared.observed.timed_out(peer);
                        return Err(Stopped::Silent);
                    }
                }
            }
        }
    })
}
