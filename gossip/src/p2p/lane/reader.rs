//! Reading a lane connection's records: each opened (on a sealed lane) and
//! checked, into a buffer of the reader's or straight into the place the
//! ring waits for ([`crate::p2p::landing`]).

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::crypto::TAG;
use super::frame::RECORD;
use super::{Lanes, Session};
use crate::p2p::payload::{first_non_finite, has_non_finite};
use crate::p2p::state::Shared;
use crate::p2p::wire::{ReadError, Reject};

/// Bytes of a plaintext payload read (and scanned) at a time.
pub(super) const SCAN_PIECE: usize = 128 << 10;

/// Why a connection's reading stopped.
pub(super) enum Stop {
    /// The peer broke the connection (or the node stops).
    Io(std::io::Error),
    /// A frame we refuse: the connection is out of step now and is closed.
    Rejected(Reject),
    /// A frame of a view we have left: the connection is closed without
    /// blame (its sender has left that view too, or soon will).
    Stale { view: u64, ours: u64 },
}

impl From<ReadError> for Stop {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Stale { view, ours } => Stop::Stale { view, ours },
            ReadError::Rejected(r) => Stop::Rejected(r),
            ReadError::Io(e) => Stop::Io(e),
            ReadError::Eof => Stop::Io(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        Stop::Io(e)
    }
}

/// The reading end of one lane connection.
pub(super) struct Reader<'a> {
    pub(super) shared: &'a Shared,
    pub(super) lanes: &'a Lanes,
    pub(super) session: &'a Session,
    pub(super) stream: TcpStream,
    pub(super) opener: super::crypto::Opener<'a>,
    pub(super) encrypted: bool,
}

impl Reader<'_> {
    /// Reads one record of `buf.len()` bytes into `buf` and opens it there.
    pub(super) async fn record(&mut self, buf: &mut [u8]) -> Result<(), Stop> {
        let tag = self.raw(buf).await?;
        if self.encrypted && !self.opener.open(buf, tag) {
            return Err(forged());
        }
        self.shared.activity.touch(&self.session.peer);
        Ok(())
    }

    /// Reads one record of `buf.len()` bytes into `buf` as it came, and on
    /// a sealed lane its tag.
    async fn raw(&mut self, buf: &mut [u8]) -> Result<[u8; TAG], Stop> {
        self.stream.read_exact(buf).await?;
        let mut tag = [0u8; TAG];
        if self.encrypted {
            self.stream.read_exact(&mut tag).await?;
        }
        Ok(tag)
    }

    /// Reads a payload of `bytes` into `buf` a record at a time; `f32`
    /// payloads are scanned for infinities and NaNs record by record.
    pub(super) async fn payload(&mut self, buf: &mut [u8], floats: bool) -> Result<(), Stop> {
        let mut at = 0;
        // Sealed records are read whole; plaintext bytes in pieces small
        // enough that the scan reads them from the cache the socket's copy
        // left them in.
        let piece = if self.encrypted { RECORD } else { SCAN_PIECE };
        for piece in buf.chunks_mut(piece) {
            self.record(piece).await?;
            if floats {
                finite(piece, at)?;
            }
            at += piece.len() / 4;
        }
        Ok(())
    }
}

impl Reader<'_> {
    /// Reads a claimed plaintext all-reduce part that is copied (the
    /// all-gather) straight into its place, a piece at a time, each piece
    /// checked finite while in the cache. A zone closed meanwhile (the ring
    /// gave up) takes no more bytes; the part is read to its end.
    pub(super) async fn land_in_place(
        &mut self,
        claim: &crate::p2p::landing::Claim,
        bytes: usize,
        scratch: &mut Vec<u8>,
    ) -> Result<(), Stop> {
        let shared = self.shared;
        let (mut at, mut open) = (0, true);
        while at < bytes {
            let end = (at + SCAN_PIECE).min(bytes);
            let mut got = at;
            while got < end {
                self.stream.readable().await?;
                let stream = &self.stream;
                let read = match open {
                    true => shared
                        .landing
                        .with_place(claim, got, end - got, |place| stream.try_read(place)),
                    false => Err(crate::p2p::landing::Closed),
                };
                let read = read.unwrap_or_else(|_| {
                    open = false;
                    stream.try_read(&mut at_least(scratch, SCAN_PIECE)[..end - got])
                });
                match read {
                    Ok(0) => {
                        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e.into()),
                }
            }
            shared.activity.touch(&self.session.peer);
            if open {
                // A zone closed since took nothing to check.
                let checked = shared
                    .landing
                    .with_place(claim, at, end - at, |piece| finite(piece, at / 4));
                checked.unwrap_or(Ok(()))?;
            }
            at = end;
        }
        Ok(())
    }

    /// Reads a claimed all-reduce part of `bytes` a record at a time into
    /// `scratch`, checks each is finite and writes it into the ring's
    /// buffer ([`crate::p2p::landing`]). A sealed part that is copied (the
    /// all-gather) is opened from `scratch` straight into its place and
    /// checked there. A zone closed meanwhile (the ring gave up) takes no
    /// more writes; the part is read to its end.
    pub(super) async fn land(
        &mut self,
        claim: &crate::p2p::landing::Claim,
        bytes: usize,
        scratch: &mut Vec<u8>,
    ) -> Result<(), Stop> {
        let piece = if self.encrypted { RECORD } else { SCAN_PIECE };
        at_least(scratch, piece.min(bytes));
        let into_place = self.encrypted && !claim.add && cfg!(target_endian = "little");
        let (mut at, mut open) = (0, true);
        while at < bytes {
            let n = (bytes - at).min(piece);
            let record = &mut scratch[..n];
            if into_place && open {
                let tag = self.raw(record).await?;
                let (landing, opener) = (&self.shared.landing, &mut self.opener);
                let opened = landing.with_place(claim, at, n, |place| {
                    match opener.open_into(record, tag, place) {
                        true => finite(place, at / 4),
                        false => Err(forged()),
                    }
                });
                match opened {
                    Ok(checked) => checked?,
                    // The zone closed: the record is still opened, in
                    // order, and dropped.
                    Err(_) => {
                        open = false;
                        if !self.opener.open(record, tag) {
                            return Err(forged());
                        }
                    }
                }
                self.shared.activity.touch(&self.session.peer);
            } else {
                self.record(record).await?;
                finite(record, at / 4)?;
                open = open && self.shared.landing.write(claim, at / 4, record).is_ok();
            }
            at += n;
        }
        Ok(())
    }
}

/// A record that failed authentication.
fn forged() -> Stop {
    Stop::Rejected(Reject::MalformedHeader(
        "a lane record failed authentication".into(),
    ))
}

/// Refuses a piece of an `f32` payload, the one from value `at` on, that
/// holds an infinity or a NaN (named with its index in the payload).
fn finite(piece: &[u8], at: usize) -> Result<(), Stop> {
    if has_non_finite(piece)
        && let Some((i, value)) = first_non_finite(piece)
    {
        return Err(Stop::Rejected(Reject::NonFinite {
            index: at + i,
            value,
        }));
    }
    Ok(())
}

/// `buf` grown to at least `n` bytes: a scratch buffer is read or opened
/// over, so what it holds is zeroed once, when it first grows, and never
/// again (shrinking it would zero it on every regrowth).
pub(super) fn at_least(buf: &mut Vec<u8>, n: usize) -> &mut [u8] {
    if buf.len() < n {
        buf.resize(n, 0);
    }
    buf
}
