//! Lane offers on the control plane (`/slowmo/lane/2`).
//!
//! For each view, the peer with the lower id opens a stream to the other
//! and sends an [`Offer`]: the view, a fresh session id, its key
//! contribution, its lane mode and the TCP addresses it takes connections
//! on; the other (once it has installed that view too) answers with its
//! own contribution and addresses, or a refusal naming why (not a member
//! of the view, an older view, another lane mode). Both then derive the
//! lane's keys and dial their connections. Messages are a `u32 LE` length
//! and CBOR.

use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use libp2p::{PeerId, Stream, StreamProtocol};
use serde::{Deserialize, Serialize};

use super::crypto::{CONTRIBUTION, LaneKeys, SESSION_ID, random};
use super::{Lanes, Session, conn};
use crate::p2p::state::Shared;

pub const LANE_PROTOCOL: &str = "/slowmo/lane/2";
const OFFER_VERSION: u16 = 3;
const MAX_MESSAGE: u32 = 4096;
const OFFER_TIMEOUT: Duration = Duration::from_secs(10);
/// The refusal of an offer from the higher peer id of a pair: the lower one
/// offers instead (a lane is needed outside the view's lanes, and the
/// higher end wanted it first). One offerer per pair keeps both ends on the
/// same session.
const LOWER_OFFERS: &str = "the lower peer id offers";

#[derive(Debug, Serialize, Deserialize)]
struct Offer {
    version: u16,
    run_id: String,
    /// The view the lane serves.
    view: u64,
    mode: String,
    session: Vec<u8>,
    contribution: Vec<u8>,
    addrs: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Answer {
    /// Why the offer is refused; empty when it is taken.
    refusal: String,
    contribution: Vec<u8>,
    addrs: Vec<String>,
}

async fn write_msg<T: Serialize>(s: &mut Stream, msg: &T) -> Result<(), String> {
    let body = cbor4ii::serde::to_vec(Vec::new(), msg).map_err(|e| e.to_string())?;
    s.write_all(&(body.len() as u32).to_le_bytes())
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(&body).await.map_err(|e| e.to_string())?;
    s.flush().await.map_err(|e| e.to_string())
}

async fn read_msg<T: for<'de> Deserialize<'de>>(s: &mut Stream) -> Result<T, String> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.map_err(|e| e.to_string())?;
    let len = u32::from_le_bytes(len);
    if len == 0 || len > MAX_MESSAGE {
        return Err(format!(
            "lane message of {len} bytes (at most {MAX_MESSAGE})"
        ));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).await.map_err(|e| e.to_string())?;
    cbor4ii::serde::from_slice(&body).map_err(|e| format!("malformed lane message: {e}"))
}

fn fixed<const N: usize>(bytes: &[u8], what: &str) -> Result<[u8; N], String> {
    bytes
        .try_into()
        .map_err(|_| format!("{what} of {} bytes, expected {N}", bytes.len()))
}

/// Offers a lane for `view` to `peer`, retrying until the peer timeout or
/// until a later view is ours.
pub(crate) async fn offer(
    shared: Arc<Shared>,
    lanes: Arc<Lanes>,
    mut control: libp2p_stream::Control,
    peer: PeerId,
    view: u64,
) {
    let until = tokio::time::Instant::now() + shared.cfg.peer_timeout;
    loop {
        match tokio::time::timeout(
            OFFER_TIMEOUT,
            offer_once(&shared, &lanes, &mut control, peer, view),
        )
        .await
        {
            Ok(Ok(())) => return,
            Ok(Err(_)) | Err(_) if superseded_view(&shared, view) => {
                tracing::debug!(%peer, "lane offer to {peer} for view {view} dropped: a later view began");
                return;
            }
            Ok(Err(e)) if e.starts_with("refused") => {
                if e.contains(LOWER_OFFERS) {
                    // It offers instead; our link waits for that lane.
                    tracing::debug!(%peer, "{peer} offers the lane to us instead");
                } else if e.contains("we are in view") {
                    // The peer is a view ahead of us: we follow soon.
                    tracing::debug!(%peer, "{peer} {e}");
                } else {
                    tracing::error!(%peer, "{peer} {e}");
                }
                return;
            }
            Ok(Err(e)) => tracing::debug!(%peer, "lane offer to {peer} failed, retrying: {e}"),
            Err(_) => tracing::debug!(%peer, "lane offer to {peer} timed out, retrying"),
        }
        if tokio::time::Instant::now() >= until
            || shared.stopping.load(std::sync::atomic::Ordering::Relaxed)
        {
            tracing::error!(%peer, "no data lane to {peer}: the offers failed until the peer timeout");
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn offer_once(
    shared: &Arc<Shared>,
    lanes: &Arc<Lanes>,
    control: &mut libp2p_stream::Control,
    peer: PeerId,
    view: u64,
) -> Result<(), String> {
    let mut s = control
        .open_stream(peer, StreamProtocol::new(LANE_PROTOCOL))
        .await
        .map_err(|e| e.to_string())?;
    let id: [u8; SESSION_ID] = random()?;
    let ours: [u8; CONTRIBUTION] = random()?;
    let offer = Offer {
        version: OFFER_VERSION,
        run_id: shared.cfg.run.run_id.clone(),
        view,
        mode: lanes.mode.name().into(),
        session: id.to_vec(),
        contribution: ours.to_vec(),
        addrs: lanes.announced(),
    };
    write_msg(&mut s, &offer).await?;
    let answer: Answer = read_msg(&mut s).await?;
    let _ = s.close().await;
    if !answer.refusal.is_empty() {
        return Err(format!("refused our data lane offer: {}", answer.refusal));
    }
    let theirs = fixed::<CONTRIBUTION>(&answer.contribution, "key contribution")?;
    let keys = LaneKeys::derive(&id, &shared.local, &ours, &peer, &theirs);
    let per_peer = match shared.view.borrow().as_ref() {
        Some(v) if v.number == view => lanes.per_peer_in(shared, v),
        _ => return Err(format!("view {view} is over")),
    };
    let session = Session::new(id, peer, view, keys, lanes.mode, per_peer, shared);
    lanes.register(session.clone());
    tokio::spawn(conn::open(
        shared.clone(),
        lanes.clone(),
        session,
        answer.addrs,
    ));
    Ok(())
}

/// Serves offers from members of our view.
pub(crate) fn spawn_acceptor(
    shared: &Arc<Shared>,
    lanes: &Arc<Lanes>,
    control: &mut libp2p_stream::Control,
) -> Result<(), String> {
    let mut incoming = control
        .accept(StreamProtocol::new(LANE_PROTOCOL))
        .map_err(|e| format!("{LANE_PROTOCOL}: {e}"))?;
    let (shared, lanes) = (shared.clone(), lanes.clone());
    tokio::spawn(async move {
        while let Some((peer, stream)) = incoming.next().await {
            let (shared, lanes) = (shared.clone(), lanes.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(OFFER_TIMEOUT * 3, take(&shared, &lanes, peer, stream))
                    .await
                {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) if e == LOWER_OFFERS => {
                        tracing::debug!(%peer, "{peer} asked for a data lane: we offer it");
                    }
                    Ok(Err(e)) => {
                        shared.counters.dropped();
                        if let Some(held) = shared.warnings.admit("lane-offer") {
                            tracing::warn!(%peer, "refused a data lane offer from {peer}: {e}{held}");
                        }
                    }
                    Err(_) => {
                        if let Some(held) = shared.warnings.admit("lane-offer-slow") {
                            tracing::warn!(%peer, "a data lane offer from {peer} took too long{held}");
                        }
                    }
                }
            });
        }
    });
    Ok(())
}

async fn take(
    shared: &Arc<Shared>,
    lanes: &Arc<Lanes>,
    peer: PeerId,
    mut s: Stream,
) -> Result<(), String> {
    let offer: Offer = read_msg(&mut s).await?;
    let refusal = async {
        if offer.version != OFFER_VERSION {
            return Err(format!(
                "lane version {}, we speak {OFFER_VERSION}",
                offer.version
            ));
        }
        // Offers may come before our own join finished, or before we
        // installed the offer's view: wait for it.
        let mut rx = shared.view.clone();
        let wait = shared.cfg.join_timeout.max(shared.cfg.peer_timeout) + Duration::from_secs(5);
        let wanted = offer.view;
        let ready = |v: &Option<Arc<crate::p2p::state::View>>| {
            v.as_ref().is_some_and(|v| v.number >= wanted)
        };
        let view = match tokio::time::timeout(wait, rx.wait_for(ready)).await {
            Ok(Ok(v)) => v.clone().expect("waited for a view"),
            _ => return Err(format!("we did not reach view {wanted}")),
        };
        if view.number != wanted {
            return Err(format!(
                "an offer for view {wanted}, we are in view {}",
                view.number
            ));
        }
        if view.rank_of(&peer).is_none() {
            return Err(format!("not a member of view {}", view.number));
        }
        if peer.to_bytes() > shared.local.to_bytes() {
            return Err(LOWER_OFFERS.to_string());
        }
        if offer.run_id != shared.cfg.run.run_id {
            return Err(format!(
                "run `{}`, ours is `{}`",
                offer.run_id, shared.cfg.run.run_id
            ));
        }
        if offer.mode != lanes.mode.name() {
            return Err(format!(
                "a {} data lane, ours is {} (--data-lane must be the same on every node)",
                offer.mode, lanes.mode
            ));
        }
        Ok(view)
    }
    .await;
    let view = match refusal {
        Ok(view) => view,
        Err(why) => {
            if why == LOWER_OFFERS {
                lanes.offer(shared, peer, offer.view);
            }
            let answer = Answer {
                refusal: why.clone(),
                contribution: Vec::new(),
                addrs: Vec::new(),
            };
            let _ = write_msg(&mut s, &answer).await;
            let _ = s.close().await;
            return Err(why);
        }
    };
    let id = fixed::<SESSION_ID>(&offer.session, "session id")?;
    let theirs = fixed::<CONTRIBUTION>(&offer.contribution, "key contribution")?;
    let ours: [u8; CONTRIBUTION] = random()?;
    let keys = LaneKeys::derive(&id, &shared.local, &ours, &peer, &theirs);
    let per_peer = lanes.per_peer_in(shared, &view);
    let session = Session::new(id, peer, offer.view, keys, lanes.mode, per_peer, shared);
    lanes.register(session.clone());
    let answer = Answer {
        refusal: String::new(),
        contribution: ours.to_vec(),
        addrs: lanes.announced(),
    };
    write_msg(&mut s, &answer).await?;
    let _ = s.close().await;
    tokio::spawn(conn::open(
        shared.clone(),
        lanes.clone(),
        session,
        offer.addrs,
    ));
    Ok(())
}

/// Whether our view is later than `view`.
fn superseded_view(shared: &Shared, view: u64) -> bool {
    shared
        .view
        .borrow()
        .as_ref()
        .is_some_and(|v| v.number > view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offer_with_the_longest_run_id_fits_the_message_limit() {
        // Sixteen IPv6 addresses of the longest form.
        let addrs = (0..16)
            .map(|i| format!("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff{i:02x}]:65535"))
            .collect();
        let offer = Offer {
            version: OFFER_VERSION,
            run_id: "r".repeat(crate::p2p::MAX_RUN_ID_BYTES),
            view: u64::MAX,
            mode: "plaintext".into(),
            session: vec![0xff; SESSION_ID],
            contribution: vec![0xff; CONTRIBUTION],
            addrs,
        };
        let body = cbor4ii::serde::to_vec(Vec::new(), &offer).unwrap();
        assert!(body.len() <= MAX_MESSAGE as usize, "{} bytes", body.len());
    }
}
