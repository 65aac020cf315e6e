//! The lane's fixed binary frame header.
//!
//! A frame is one header record then the payload in records of at most
//! [`RECORD`] bytes (each followed by its tag when the lane is encrypted).
//! The run and the sender are the lane's own (fixed when it was set up), so
//! the header only says what the payload is and where it goes:
//!
//! | bytes | field |
//! |---|---|
//! | 0 | kind ([`FrameKind`]; a compressed share is its own kind) |
//! | 1..4 | zero |
//! | 4..6, 6..8 | part, parts (u16 LE): this frame's piece of a message |
//! | 8..16 | sequence (u64 LE): the sender's count of its shares, or of its all-reduce pieces |
//! | 16..24 | view |
//! | 24..32 | round (push-sum round or collective number) |
//! | 32..36 | step (ring step) |
//! | 36..40 | scale (f32 LE bits; zero: none): a push-sum share sent unscaled, whose receiver adds `scale * value` for each value |
//! | 40..48, 48..56, 56..64 | offset, len, total (elements) |
//! | 64..72 | weight (f64 LE bits) |
//! | 72..80 | zero |

use super::super::wire::Kind;

/// Bytes of a header.
pub const HEADER: usize = 80;
/// Largest payload record.
pub const RECORD: usize = 1 << 20;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// One of the protocol's tensor frames.
    Tensor(Kind),
    /// Bytes that the receiver counts and drops (the transport benchmark).
    Probe,
    /// The sender's last frame on this connection.
    End,
    /// A compressed push-sum share, whole in one part: `len` and `total`
    /// are its bytes (the run's codec says how to read them).
    Coded,
}

impl FrameKind {
    fn code(self) -> u8 {
        match self {
            FrameKind::Tensor(Kind::PushSum) => 1,
            FrameKind::Tensor(Kind::ReduceScatter) => 2,
            FrameKind::Tensor(Kind::AllGather) => 3,
            FrameKind::Tensor(Kind::Gather) => 4,
            FrameKind::Probe => 5,
            FrameKind::End => 6,
            FrameKind::Coded => 7,
            FrameKind::Tensor(Kind::Exchange) => 8,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => FrameKind::Tensor(Kind::PushSum),
            2 => FrameKind::Tensor(Kind::ReduceScatter),
            3 => FrameKind::Tensor(Kind::AllGather),
            4 => FrameKind::Tensor(Kind::Gather),
            5 => FrameKind::Probe,
            6 => FrameKind::End,
            7 => FrameKind::Coded,
            8 => FrameKind::Tensor(Kind::Exchange),
            _ => return None,
        })
    }

    /// Bytes per element of the payload.
    pub fn element_size(self) -> u64 {
        match self {
            FrameKind::Tensor(Kind::Gather | Kind::Exchange) => 8,
            FrameKind::Tensor(_) => 4,
            FrameKind::Probe | FrameKind::Coded => 1,
            FrameKind::End => 0,
        }
    }
}

/// A decoded header.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub part: u16,
    pub parts: u16,
    pub sequence: u64,
    pub view: u64,
    pub round: u64,
    pub step: u32,
    pub offset: u64,
    pub len: u64,
    pub total: u64,
    pub weight: f64,
    /// The factor of a push-sum share sent unscaled (the sender's `x`
    /// straight from its memory): the receiver adds `scale * value`, the
    /// bits of the scaled value the sender would have sent. In `(0, 1]`.
    pub scale: Option<f32>,
}

impl FrameHeader {
    /// A header of `kind` with every other field zero.
    pub fn of(kind: FrameKind) -> Self {
        Self {
            kind,
            part: 0,
            parts: 1,
            sequence: 0,
            view: 0,
            round: 0,
            step: 0,
            offset: 0,
            len: 0,
            total: 0,
            weight: 0.0,
            scale: None,
        }
    }

    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0] = self.kind.code();
        b[4..6].copy_from_slice(&self.part.to_le_bytes());
        b[6..8].copy_from_slice(&self.parts.to_le_bytes());
        b[8..16].copy_from_slice(&self.sequence.to_le_bytes());
        b[16..24].copy_from_slice(&self.view.to_le_bytes());
        b[24..32].copy_from_slice(&self.round.to_le_bytes());
        b[32..36].copy_from_slice(&self.step.to_le_bytes());
        b[36..40].copy_from_slice(&self.scale.map_or(0, f32::to_bits).to_le_bytes());
        b[40..48].copy_from_slice(&self.offset.to_le_bytes());
        b[48..56].copy_from_slice(&self.len.to_le_bytes());
        b[56..64].copy_from_slice(&self.total.to_le_bytes());
        b[64..72].copy_from_slice(&self.weight.to_bits().to_le_bytes());
        b
    }

    /// Decodes a header; the error names what is malformed.
    pub fn decode(b: &[u8; HEADER]) -> Result<Self, String> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let kind = FrameKind::from_code(b[0])
            .ok_or_else(|| format!("unknown lane frame kind {:#04x}", b[0]))?;
        if b[1..4] != [0; 3] || b[72..] != [0; 8] {
            return Err("reserved header bytes are not zero".into());
        }
        let h = Self {
            kind,
            part: u16_at(4),
            parts: u16_at(6),
            sequence: u64_at(8),
            view: u64_at(16),
            round: u64_at(24),
            step: u32::from_le_bytes(b[32..36].try_into().expect("4 bytes")),
            offset: u64_at(40),
            len: u64_at(48),
            total: u64_at(56),
            weight: f64::from_bits(u64_at(64)),
            scale: match u32::from_le_bytes(b[36..40].try_into().expect("4 bytes")) {
                0 => None,
                bits => Some(f32::from_bits(bits)),
            },
        };
        if h.parts == 0 || h.part >= h.parts {
            return Err(format!("part {} of {}", h.part, h.parts));
        }
        if let Some(s) = h.scale {
            if h.kind != FrameKind::Tensor(Kind::PushSum) {
                return Err(format!("a scale on a {:?} frame", h.kind));
            }
            // Also refuses NaN: a share's factor is 1/(out-peers + 1).
            if !(s > 0.0 && s <= 1.0) {
                return Err(format!("share scale {s} outside (0, 1]"));
            }
        }
        Ok(h)
    }

    /// Payload bytes that follow the header (saturating: the caller caps it).
    pub fn payload_bytes(&self) -> u64 {
        self.len.saturating_mul(self.kind.element_size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_garbage_is_refused() {
        let h = FrameHeader {
            part: 1,
            parts: 3,
            sequence: 9,
            view: 2,
            round: 77,
            step: 5,
            offset: 100,
            len: 50,
            total: 1000,
            weight: 0.25,
            ..FrameHeader::of(FrameKind::Tensor(Kind::ReduceScatter))
        };
        assert_eq!(FrameHeader::decode(&h.encode()).unwrap(), h);
        assert_eq!(h.payload_bytes(), 200);
        let mut bad = h.encode();
        bad[0] = 0x77;
        assert!(FrameHeader::decode(&bad).unwrap_err().contains("kind"));
        let mut bad = h.encode();
        bad[75] = 1;
        assert!(FrameHeader::decode(&bad).is_err());
        let mut bad = h.encode();
        bad[4] = 3; // part 3 of 3
        assert!(FrameHeader::decode(&bad).is_err());
        // A scale rides on push-sum shares only, within (0, 1].
        let share = FrameHeader {
            scale: Some(1.0 / 3.0),
            ..FrameHeader::of(FrameKind::Tensor(Kind::PushSum))
        };
        assert_eq!(FrameHeader::decode(&share.encode()).unwrap(), share);
        let scaled_part = FrameHeader {
            scale: Some(0.5),
            ..h.clone()
        };
        assert!(
            FrameHeader::decode(&scaled_part.encode())
                .unwrap_err()
                .contains("scale")
        );
        for s in [f32::NAN, f32::INFINITY, -0.5, 1.5, -0.0] {
            let bad = FrameHeader {
                scale: Some(s),
                ..share.clone()
            };
            let err = FrameHeader::decode(&bad.encode()).unwrap_err();
            assert!(err.contains("scale"), "{s}: {err}");
        }
    }
}
