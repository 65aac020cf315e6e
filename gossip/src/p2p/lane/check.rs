//! The checks of a lane frame's header before its payload is read: the
//! view of the lane, and the frame as the libp2p streams would have
//! carried it (sizes, shapes, run, view, round window).

use libp2p::PeerId;

use super::frame::FrameHeader;
use crate::Rank;
use crate::p2p::config::P2pConfig;
use crate::p2p::inbound::check_header;
use crate::p2p::state::View;
use crate::p2p::wire::{
    ALL_REDUCE_PROTOCOL, DType, Header, Kind, PUSH_SUM_PROTOCOL, Reject, WIRE_VERSION,
};

/// A lane carries the frames of the view it was set up for.
pub(crate) fn check_session_view(session_view: u64, h: &FrameHeader) -> Result<(), Reject> {
    if h.view != session_view {
        return Err(Reject::View {
            expected: session_view,
            got: h.view,
        });
    }
    Ok(())
}

/// Checks a tensor frame's header as the libp2p streams check theirs
/// ([`check_header`]), for the frame as they would have carried it (for a
/// share, the whole share; the part must lie inside it; a `coded`
/// (compressed) share comes whole, at the exact size of the run's codec).
/// Returns that frame and the sender's rank.
pub(crate) fn check_frame(
    cfg: &P2pConfig,
    view: &View,
    peer: &PeerId,
    h: &FrameHeader,
    kind: Kind,
    coded: bool,
) -> Result<(Header, Rank), Reject> {
    let push = kind == Kind::PushSum;
    if coded {
        check_coded(cfg, h)?;
    }
    let as_frame = Header {
        version: WIRE_VERSION,
        run_id: cfg.run.run_id.clone(),
        view: h.view,
        sender: crate::p2p::addrs::name_of(peer),
        round: h.round,
        kind,
        dtype: match (coded, push) {
            (true, _) => DType::of_share(cfg.compress),
            (false, true) => DType::F32,
            (false, false) => DType::of(kind),
        },
        len: match (coded, push) {
            (true, _) => cfg.payload_floats as u64,
            (false, true) => h.total,
            (false, false) => h.len,
        },
        weight: h.weight,
        checksum: 0,
        step: h.step,
        offset: if push { 0 } else { h.offset },
        total: h.total,
    };
    let protocol = if push {
        PUSH_SUM_PROTOCOL
    } else {
        ALL_REDUCE_PROTOCOL
    };
    let from = check_header(cfg, view, peer, &as_frame, protocol)?;
    if push && h.offset.checked_add(h.len).is_none_or(|end| end > h.total) {
        return Err(Reject::Layout {
            offset: h.offset,
            len: h.len,
            total: h.total,
        });
    }
    Ok((as_frame, from))
}

/// A compressed share's lane frame: a run that compresses, one whole part
/// of exactly the codec's size.
fn check_coded(cfg: &P2pConfig, h: &FrameHeader) -> Result<(), Reject> {
    let codec = cfg.compress;
    if codec.is_none() {
        return Err(Reject::MalformedHeader(
            "a compressed share in a run that sends shares uncompressed".into(),
        ));
    }
    let want = crate::compress::encoded_bytes(codec, cfg.payload_floats) as u64;
    if h.parts != 1 || h.offset != 0 || h.len != h.total || h.total != want {
        return Err(Reject::Coded(crate::compress::CodecError {
            codec: codec.to_string(),
            field: "length",
            detail: format!(
                "is {} bytes at offset {} of {} in part {} of {}; a share of {} values takes \
                 {want} bytes in one part",
                h.len, h.offset, h.total, h.part, h.parts, cfg.payload_floats
            ),
        }));
    }
    Ok(())
}
