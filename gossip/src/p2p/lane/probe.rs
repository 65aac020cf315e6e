//! Bytes only: the lane without the protocol above it, for the transport
//! benchmark (`slowmo bench transport`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::frame::{FrameHeader, FrameKind};
use super::{Job, MIN_PART, Session};
use crate::p2p::comm::P2pComm;
use crate::p2p::links::Payload;
use crate::{CommError, Rank};

impl Session {
    async fn send_probe(&self, payload: &Arc<Vec<u8>>) -> Result<(), String> {
        let writers = super::lock(&self.writers).clone();
        if writers.is_empty() {
            return Err("the lane has no connections".into());
        }
        let parts = writers.len().min(payload.len().div_ceil(MIN_PART)).max(1);
        let first = self.messages.fetch_add(1, Ordering::Relaxed) as usize;
        for part in 0..parts {
            let range = payload.len() * part / parts..payload.len() * (part + 1) / parts;
            let header = FrameHeader {
                part: part as u16,
                parts: parts as u16,
                len: range.len() as u64,
                ..FrameHeader::of(FrameKind::Probe)
            };
            let job = Job::Frame {
                header,
                payload: Payload::Owned(payload.clone()),
                range,
            };
            writers[(first + part) % writers.len()]
                .send(job)
                .await
                .map_err(|_| "a lane connection is gone".to_string())?;
        }
        Ok(())
    }
}

impl P2pComm {
    /// The addresses this node takes data-lane connections on (empty with
    /// `--data-lane libp2p`). For tests that knock on the lane by hand.
    #[doc(hidden)]
    pub fn lane_addrs(&self) -> Vec<String> {
        self.lanes
            .as_ref()
            .map(|l| l.announced())
            .unwrap_or_default()
    }

    /// Sends `rounds` messages of `bytes` bytes to `rank` over the data lane
    /// and waits until `until_received` probe bytes in all have come from
    /// the peers; returns the seconds taken. For benchmarks: the bytes are
    /// dropped on arrival.
    #[doc(hidden)]
    pub fn lane_probe(
        &self,
        rank: Rank,
        bytes: usize,
        rounds: u64,
        until_received: u64,
    ) -> Result<f64, CommError> {
        let lanes = self.lanes.clone().ok_or_else(|| {
            CommError::Unsupported("this node has no data lane (--data-lane libp2p)".into())
        })?;
        let peer = *self
            .view
            .members
            .get(rank)
            .ok_or_else(|| CommError::Misuse(format!("no rank {rank} in the view")))?;
        let wait = self.shared.cfg.peer_timeout;
        let view = self.view.number;
        let rt = self.runtime()?;
        rt.block_on(async move {
            let session = lanes.ready(&peer, view, wait).await.ok_or_else(|| {
                CommError::Network(format!("no data lane to {peer} within {wait:?}"))
            })?;
            let payload = Arc::new(vec![7u8; bytes]);
            let start = Instant::now();
            let receiving = async {
                loop {
                    let arrived = lanes.probe_arrived.notified();
                    if lanes.probe_bytes.load(Ordering::SeqCst) >= until_received {
                        return;
                    }
                    let _ = tokio::time::timeout(Duration::from_millis(50), arrived).await;
                }
            };
            let sending = async {
                for _ in 0..rounds {
                    session.send_probe(&payload).await?;
                }
                Ok::<_, String>(())
            };
            let (sent, ()) = tokio::join!(sending, receiving);
            sent.map_err(CommError::Network)?;
            Ok(start.elapsed().as_secs_f64())
        })
    }
}
