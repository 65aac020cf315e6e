//! The tensor wire format shared by our stream protocols.
//!
//! A frame is `u32 LE header length`, a CBOR [`Header`], then `len` elements
//! of little-endian payload (`f32`, or `u64` for [`Kind::Gather`] and
//! [`Kind::Exchange`]) written in
//! chunks. The header says what the
//! payload is, so the receiver can refuse it before reading a byte of it; the
//! checksum catches framing bugs (the transport already authenticates and
//! encrypts every byte, so it is no MAC).

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use serde::{Deserialize, Serialize};

use crate::compress::{CodecError, Compression, encoded_bytes};

/// Version of the frame layout and header fields, bumped on incompatible
/// change. The join handshake compares it, so nodes of different versions
/// never form a run. 2: [`Kind::Gather`] frames of [`DType::U64`]. 3: the
/// admission knock before membership hellos. 4: compressed push-sum shares
/// ([`DType::Bf16`], [`DType::Int8`], [`DType::TopK`]). 5: top-k shares
/// with block-relative `u16` indices and bfloat16 values. 6: [`Kind::Exchange`]
/// blocks (the compressed average's reduce-scatter). 7: the data lane's
/// records sealed with AEGIS-256X4 (lane version 3), so that nodes of the
/// AES-GCM lane are refused at the join, not after their lanes fail.
pub const WIRE_VERSION: u16 = 7;
/// Push-sum shares.
pub const PUSH_SUM_PROTOCOL: &str = "/slowmo/push-sum/1";
/// Ring all-reduce chunks (also the barrier).
pub const ALL_REDUCE_PROTOCOL: &str = "/slowmo/all-reduce/1";
/// Join handshake and view agreement.
pub const MEMBERSHIP_PROTOCOL: &str = "/slowmo/membership/1";
/// Largest CBOR header we read.
pub const MAX_HEADER_BYTES: u32 = 4096;
/// The byte a receiver writes when it takes a stream over, and again when it
/// has read the sender's end of stream: the sender then knows its data
/// arrived.
pub const READY: u8 = 0x5a;
/// Bytes written per `write_all` call of a payload.
const WRITE_CHUNK: usize = 1 << 20;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// One push-sum share: `len == payload_floats`, `weight` is the share of w.
    PushSum,
    /// A reduce-scatter chunk of a ring all-reduce: `len <= chunk`, located
    /// by `offset` inside a buffer of `total` floats; `weight` carries the
    /// partial scalar on the first chunk of segment 0.
    ReduceScatter,
    /// An all-gather chunk (fully reduced values), laid out as above.
    AllGather,
    /// A block of exact `u64` words of a typed collective: `offset` is the
    /// rank whose values it carries, `total` the view's size, `step` the ring
    /// step; `weight` is 0.
    Gather,
    /// A block of exact `u64` words sent straight to one rank in an
    /// exchange (all-to-all): `offset` is the rank it is for, `total` the
    /// view's size, `step` 0, `weight` 0.
    Exchange,
}

impl Kind {
    /// The frame kind of a ring phase's chunks.
    pub(crate) fn of_phase(phase: crate::ring::Phase) -> Self {
        match phase {
            crate::ring::Phase::ReduceScatter => Kind::ReduceScatter,
            crate::ring::Phase::AllGather => Kind::AllGather,
        }
    }
}

/// Element type of the payload: `f32` for tensors, `u64` for the words of
/// a typed collective (an `f64` travels as its bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    U64,
    /// A push-sum share of `len` values in bfloat16 (`--compress bf16`).
    Bf16,
    /// A push-sum share of `len` values in block-scaled int8.
    Int8,
    /// A push-sum share's top values and their indices (`--compress
    /// topk:F`, the fraction from the run's settings).
    #[serde(rename = "topk")]
    TopK,
}

impl DType {
    /// Bytes per element of a plain payload (a compressed share's size is
    /// [`payload_bytes`]'s: 1 here).
    pub fn size(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::U64 => 8,
            DType::Bf16 | DType::Int8 | DType::TopK => 1,
        }
    }

    /// The dtype of a push-sum share under `codec`.
    pub fn of_share(codec: Compression) -> Self {
        match codec {
            Compression::None => DType::F32,
            Compression::Bf16 => DType::Bf16,
            Compression::Int8 => DType::Int8,
            Compression::TopK(_) => DType::TopK,
        }
    }

    /// The element type frames of `kind` carry.
    pub fn of(kind: Kind) -> Self {
        match kind {
            Kind::PushSum | Kind::ReduceScatter | Kind::AllGather => DType::F32,
            Kind::Gather | Kind::Exchange => DType::U64,
        }
    }
}

/// Payload bytes that follow `h` in a run whose shares use `codec`: a
/// compressed share's exact size follows from its length in values (the
/// header's `len`) and the run's codec. Saturating: the caller caps it.
pub fn payload_bytes(h: &Header, codec: Compression) -> u64 {
    match h.dtype {
        DType::F32 | DType::U64 => h.len.saturating_mul(h.dtype.size()),
        _ => usize::try_from(h.len)
            .ok()
            .filter(|n| *n <= u32::MAX as usize)
            .map_or(u64::MAX, |n| encoded_bytes(codec, n) as u64),
    }
}

/// The CBOR header in front of every payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub version: u16,
    pub run_id: String,
    /// Membership view number the sender is in.
    pub view: u64,
    /// The sender's peer id (must match the authenticated connection).
    pub sender: String,
    /// Push-sum round, or the all-reduce sequence number.
    pub round: u64,
    pub kind: Kind,
    pub dtype: DType,
    /// Payload length in elements.
    pub len: u64,
    /// Push-sum weight, or the all-reduce scalar.
    pub weight: f64,
    /// [`checksum`] of the payload bytes.
    pub checksum: u64,
    /// All-reduce: ring step (0-based over reduce-scatter then all-gather).
    pub step: u32,
    /// All-reduce: index of the first element in the whole buffer.
    pub offset: u64,
    /// All-reduce: length of the whole buffer.
    pub total: u64,
}

/// Why a frame was refused. Displayed in the warning that names the peer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Reject {
    #[error("malformed header: {0}")]
    MalformedHeader(String),
    #[error("protocol version {got}, we speak {WIRE_VERSION}")]
    Version { got: u16 },
    #[error("run id `{got}`, ours is `{expected}`")]
    RunId { expected: String, got: String },
    #[error("view {got}, ours is {expected}")]
    View { expected: u64, got: u64 },
    #[error("header names sender {claimed} on a connection authenticated as {actual}")]
    Sender { claimed: String, actual: String },
    #[error("peer is not a member of view {view}")]
    NotMember { view: u64 },
    #[error("{kind:?} frame on protocol {protocol}")]
    WrongKind { kind: Kind, protocol: &'static str },
    #[error("{kind:?} frame of dtype {dtype:?}")]
    WrongDType { kind: Kind, dtype: DType },
    #[error("payload of {got} floats where the run exchanges {expected}")]
    Shape { expected: u64, got: u64 },
    #[error("chunk of {len} floats at offset {offset} does not fit a buffer of {total}")]
    Layout { offset: u64, len: u64, total: u64 },
    #[error("announced payload of {announced} bytes exceeds the cap of {cap} bytes")]
    TooLarge { announced: u64, cap: u64 },
    #[error("round {round} is more than {window} rounds ahead of our round {ours}")]
    RoundWindow { round: u64, ours: u64, window: u64 },
    #[error("sender already has {buffered} shares buffered with us (limit {limit})")]
    TooManyBuffered { buffered: usize, limit: u64 },
    #[error("duplicate share of round {round}")]
    Duplicate { round: u64 },
    #[error("payload truncated: announced {announced} bytes, stream ended after {got}")]
    Truncated { announced: u64, got: u64 },
    #[error("non-finite value {value} at index {index}")]
    NonFinite { index: usize, value: f32 },
    #[error("checksum mismatch: header says {announced:016x}, payload gives {actual:016x}")]
    Checksum { announced: u64, actual: u64 },
    #[error("weight {0} is not a finite number")]
    Weight(f64),
    #[error("{0}")]
    Coded(CodecError),
    /// A view message or state transfer refused (it names what was wrong).
    #[error("{0}")]
    Membership(String),
}

impl From<crate::ledger::Refusal> for Reject {
    fn from(r: crate::ledger::Refusal) -> Self {
        use crate::ledger::Refusal;
        match r {
            Refusal::Duplicate { round } => Reject::Duplicate { round },
            Refusal::RoundWindow {
                round,
                ours,
                window,
            } => Reject::RoundWindow {
                round,
                ours,
                window,
            },
            Refusal::TooManyBuffered { buffered, limit } => {
                Reject::TooManyBuffered { buffered, limit }
            }
            Refusal::Stale { epoch, ours } => Reject::View {
                expected: ours,
                got: epoch,
            },
        }
    }
}

/// Why reading a frame stopped.
#[derive(Debug)]
pub enum ReadError {
    /// The sender closed the stream cleanly between two frames.
    Eof,
    /// The stream broke.
    Io(std::io::Error),
    /// The frame was refused.
    Rejected(Reject),
    /// The frame belongs to an earlier membership view (the view changed
    /// while it travelled): dropped without blaming the sender.
    Stale { view: u64, ours: u64 },
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        ReadError::Io(e)
    }
}

pub use super::payload::{
    Scan, add_bytes, checksum, copy_bytes, encode_f32, f32_to_bytes, first_non_finite,
};

/// Length prefix and CBOR encoding of `header`.
pub fn encode_header(header: &Header) -> Vec<u8> {
    let cbor = cbor4ii::serde::to_vec(Vec::with_capacity(256), header)
        .expect("encoding a header into a Vec cannot fail");
    let mut out = Vec::with_capacity(4 + cbor.len());
    out.extend_from_slice(&(cbor.len() as u32).to_le_bytes());
    out.extend_from_slice(&cbor);
    out
}

/// Writes one frame: the encoded header, then the payload in chunks.
/// `progress` is called after every chunk written (see [`super::state::Activity`]).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &[u8],
    payload: &[u8],
    progress: &mut (dyn FnMut() + Send),
) -> std::io::Result<()> {
    w.write_all(header).await?;
    for chunk in payload.chunks(WRITE_CHUNK) {
        w.write_all(chunk).await?;
        progress();
    }
    w.flush().await
}

/// Reads the next header and returns it with its size on the wire. A clean
/// end of stream before the first byte is [`ReadError::Eof`].
pub async fn read_header<R: AsyncRead + Unpin>(r: &mut R) -> Result<(Header, u64), ReadError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = r.read(&mut prefix[got..]).await?;
        if n == 0 {
            return Err(if got == 0 {
                ReadError::Eof
            } else {
                ReadError::Rejected(Reject::MalformedHeader(
                    "stream ended inside the length prefix".into(),
                ))
            });
        }
        got += n;
    }
    let len = u32::from_le_bytes(prefix);
    if len == 0 || len > MAX_HEADER_BYTES {
        return Err(ReadError::Rejected(Reject::MalformedHeader(format!(
            "header length {len} outside 1..={MAX_HEADER_BYTES}"
        ))));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => ReadError::Rejected(Reject::MalformedHeader(
            "stream ended inside the header".into(),
        )),
        _ => ReadError::Io(e),
    })?;
    let header = cbor4ii::serde::from_slice(&buf).map_err(|e| {
        ReadError::Rejected(Reject::MalformedHeader(format!("not a CBOR header: {e}")))
    })?;
    Ok((header, 4 + len as u64))
}

/// Reads exactly `len` bytes of payload into `buf` (a recycled buffer, or
/// an empty one that grows as data arrives: a lying length costs the liar
/// bandwidth, not our memory up front), scanning each piece right after it
/// arrives.
/// `progress` is called after every read that returned bytes.
pub async fn read_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    len: u64,
    buf: Vec<u8>,
    progress: &mut (dyn FnMut() + Send),
) -> Result<(Vec<u8>, Scan), ReadError> {
    let len = len as usize;
    let mut out = buf;
    out.truncate(len);
    let mut scan = Scan::default();
    let (mut filled, mut scanned) = (0, 0);
    while filled < len {
        if filled == out.len() {
            let grow = (len - filled).min(out.len().max(1 << 20));
            out.resize(out.len() + grow, 0);
        }
        let n = r.read(&mut out[filled..]).await?;
        if n == 0 {
            return Err(ReadError::Rejected(Reject::Truncated {
                announced: len as u64,
                got: filled as u64,
            }));
        }
        filled += n;
        progress();
        let whole = if filled == len { len } else { filled & !3 };
        scan.feed(&out[scanned..whole]);
        scanned = whole;
    }
    Ok((out, scan))
}

/// Finiteness and checksum of a payload read for `header`, from the scan
/// made while reading it.
pub fn check_payload(header: &Header, payload: &[u8], scan: &Scan) -> Result<(), Reject> {
    if header.dtype == DType::F32
        && scan.non_finite()
        && let Some((index, value)) = first_non_finite(payload)
    {
        return Err(Reject::NonFinite { index, value });
    }
    let actual = scan.checksum();
    if actual != header.checksum {
        return Err(Reject::Checksum {
            announced: header.checksum,
            actual,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            version: WIRE_VERSION,
            run_id: "run".into(),
            view: 0,
            sender: "me".into(),
            round: 7,
            kind: Kind::PushSum,
            dtype: DType::F32,
            len: 3,
            weight: 0.5,
            checksum: 0,
            step: 0,
            offset: 0,
            total: 3,
        }
    }

    #[test]
    fn a_header_with_the_longest_run_id_fits_the_header_limit() {
        let longest = Header {
            run_id: "\u{10FFFF}".repeat(crate::p2p::MAX_RUN_ID_BYTES / 4),
            sender: libp2p::PeerId::random().to_string(),
            view: u64::MAX,
            round: u64::MAX,
            kind: Kind::AllGather,
            len: u64::MAX,
            weight: f64::MIN_POSITIVE,
            checksum: u64::MAX,
            step: u32::MAX,
            offset: u64::MAX,
            total: u64::MAX,
            ..header()
        };
        assert_eq!(longest.run_id.len(), crate::p2p::MAX_RUN_ID_BYTES);
        let cbor = encode_header(&longest).len() - 4;
        assert!(cbor <= MAX_HEADER_BYTES as usize / 2, "{cbor} bytes");
        crate::p2p::check_run_id(&longest.run_id).unwrap();
        let longer = format!("{}x", longest.run_id);
        let e = crate::p2p::check_run_id(&longer).unwrap_err();
        assert!(e.contains("257 bytes") && e.contains("at most 256"), "{e}");
    }

    #[test]
    fn header_round_trips_through_a_frame() {
        let payload = f32_to_bytes(&[1.0, -2.0, 3.5]);
        let mut h = header();
        h.checksum = checksum(&payload);
        let mut wire = Vec::new();
        futures::executor::block_on(write_frame(
            &mut wire,
            &encode_header(&h),
            &payload,
            &mut || {},
        ))
        .unwrap();
        let mut r = futures::io::Cursor::new(wire);
        let (got, size) = futures::executor::block_on(read_header(&mut r)).unwrap();
        assert_eq!(got, h);
        assert_eq!(size as usize, encode_header(&h).len());
        let (body, scan) =
            futures::executor::block_on(read_payload(&mut r, 12, vec![1; 40], &mut || {})).unwrap();
        assert_eq!(body, payload);
        check_payload(&got, &body, &scan).unwrap();
        assert!(matches!(
            futures::executor::block_on(read_header(&mut r)),
            Err(ReadError::Eof)
        ));
    }

    #[test]
    fn garbage_and_truncated_frames_are_refused() {
        let mut r = futures::io::Cursor::new(vec![5u8, 0, 0, 0, 1, 2, 3, 4, 5]);
        assert!(matches!(
            futures::executor::block_on(read_header(&mut r)),
            Err(ReadError::Rejected(Reject::MalformedHeader(_)))
        ));
        let mut r = futures::io::Cursor::new(vec![0xff, 0xff, 0xff, 0x7f]);
        assert!(matches!(
            futures::executor::block_on(read_header(&mut r)),
            Err(ReadError::Rejected(Reject::MalformedHeader(_)))
        ));
        let mut r = futures::io::Cursor::new(vec![1u8; 10]);
        assert!(matches!(
            futures::executor::block_on(read_payload(&mut r, 12, Vec::new(), &mut || {})),
            Err(ReadError::Rejected(Reject::Truncated {
                announced: 12,
                got: 10
            }))
        ));
    }
}
