//! A join ticket: one copyable string that tells a new machine how to join
//! a run. It carries the addresses of the node that printed it (multiaddrs
//! ending in `/p2p/<peer id>`), the run id, the config hash (the SHA-256 of
//! the run's settings, which the joiner fetches from that node and checks
//! against it), how tensors travel, and, under invitations, the run's
//! public key.
//!
//! Form: `slowmo1` then base64url (no padding) of a compact JSON object
//! followed by the first 4 bytes of its SHA-256. The checksum tells a
//! string damaged in copying from one that decodes to another ticket.

use data_encoding::BASE64URL_NOPAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The prefix of every ticket of this layout.
pub const TICKET_PREFIX: &str = "slowmo1";
/// The longest ticket string read (a few dozen addresses).
pub const MAX_TICKET_CHARS: usize = 16 * 1024;
const CHECKSUM_BYTES: usize = 4;

/// What a ticket carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinTicket {
    /// Where to reach a member: multiaddrs ending in `/p2p/<peer id>`.
    #[serde(rename = "a")]
    pub addrs: Vec<String>,
    /// The run id.
    #[serde(rename = "r")]
    pub run_id: String,
    /// The config hash: 64 lowercase hex digits.
    #[serde(rename = "h")]
    pub config_hash: String,
    /// How tensors travel (`encrypted`, `plaintext`, `libp2p`).
    #[serde(rename = "l")]
    pub data_lane: String,
    /// The run's public key (`ed25519:<hex>`) when admission is by
    /// invitation.
    #[serde(rename = "k", default, skip_serializing_if = "Option::is_none")]
    pub run_key_public: Option<String>,
}

/// Why a string is not a ticket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("a join ticket starts with `{TICKET_PREFIX}`; this one starts with `{0}`")]
    Prefix(String),
    #[error("the ticket is {0} characters long, more than any ticket ({MAX_TICKET_CHARS})")]
    TooLong(usize),
    #[error(
        "the ticket is damaged ({0}): copy it again whole, from `{TICKET_PREFIX}` to its last character"
    )]
    Damaged(String),
    #[error("the ticket's {field} is not valid: {why}")]
    Field { field: &'static str, why: String },
}

impl JoinTicket {
    /// The ticket as one string.
    pub fn encode(&self) -> String {
        let mut bytes = serde_json::to_vec(self).expect("a ticket serialises");
        let sum = Sha256::digest(&bytes);
        bytes.extend_from_slice(&sum[..CHECKSUM_BYTES]);
        format!("{TICKET_PREFIX}{}", BASE64URL_NOPAD.encode(&bytes))
    }

    /// Reads a ticket, checking its form and every field it carries.
    pub fn decode(text: &str) -> Result<Self, TicketError> {
        let text = text.trim();
        if text.len() > MAX_TICKET_CHARS {
            return Err(TicketError::TooLong(text.len()));
        }
        let Some(body) = text.strip_prefix(TICKET_PREFIX) else {
            let start: String = text.chars().take(TICKET_PREFIX.len()).collect();
            return Err(TicketError::Prefix(start));
        };
        let bytes = BASE64URL_NOPAD
            .decode(body.as_bytes())
            .map_err(|e| TicketError::Damaged(format!("not base64url: {e}")))?;
        if bytes.len() <= CHECKSUM_BYTES {
            return Err(TicketError::Damaged("too short".into()));
        }
        let (json, sum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
        if Sha256::digest(json)[..CHECKSUM_BYTES] != *sum {
            return Err(TicketError::Damaged("its checksum does not match".into()));
        }
        let ticket: JoinTicket = serde_json::from_slice(json)
            .map_err(|e| TicketError::Damaged(format!("not a ticket's fields: {e}")))?;
        ticket.check()?;
        Ok(ticket)
    }

    /// Checks each field's form (what a joiner relies on before it dials).
    pub fn check(&self) -> Result<(), TicketError> {
        let field = |field, why: &str| {
            Err(TicketError::Field {
                field,
                why: why.to_string(),
            })
        };
        if self.addrs.is_empty() {
            return field("address list", "it is empty");
        }
        if let Some(a) = self
            .addrs
            .iter()
            .find(|a| !a.starts_with('/') || !a.contains("/p2p/"))
        {
            return field(
                "address list",
                &format!("`{a}` is not a multiaddr ending in /p2p/<peer id>"),
            );
        }
        if self.run_id.is_empty() || self.run_id.len() > 256 {
            return field("run id", "it must be 1 to 256 bytes");
        }
        if self.config_hash.len() != 64
            || !self
                .config_hash
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return field("config hash", "it must be 64 lowercase hex digits");
        }
        if !["encrypted", "plaintext", "libp2p"].contains(&self.data_lane.as_str()) {
            return field("data lane", "expected encrypted, plaintext or libp2p");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket() -> JoinTicket {
        JoinTicket {
            addrs: vec![
                "/ip4/10.0.0.1/tcp/7000/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
                    .into(),
            ],
            run_id: "demo".into(),
            config_hash: "ab".repeat(32),
            data_lane: "encrypted".into(),
            run_key_public: None,
        }
    }

    #[test]
    fn a_ticket_reads_back_as_written() {
        let t = ticket();
        let s = t.encode();
        assert!(s.starts_with(TICKET_PREFIX));
        assert!(
            s[TICKET_PREFIX.len()..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "{s}"
        );
        assert_eq!(JoinTicket::decode(&s).unwrap(), t);
        assert_eq!(JoinTicket::decode(&format!("  {s}\n")).unwrap(), t);
        let mut k = t.clone();
        k.run_key_public = Some(format!("ed25519:{}", "0".repeat(64)));
        assert_eq!(JoinTicket::decode(&k.encode()).unwrap(), k);
    }

    #[test]
    fn a_mangled_ticket_is_refused_as_damaged() {
        let s = ticket().encode();
        // Every single-character change inside the body is caught.
        let body = TICKET_PREFIX.len();
        for i in (body..s.len()).step_by(7) {
            let mut b = s.clone().into_bytes();
            b[i] = if b[i] == b'A' { b'B' } else { b'A' };
            let e = JoinTicket::decode(std::str::from_utf8(&b).unwrap()).unwrap_err();
            assert!(matches!(e, TicketError::Damaged(_)), "at {i}: {e}");
        }
        // Cut short, as a terminal's line wrap might.
        let e = JoinTicket::decode(&s[..s.len() - 10]).unwrap_err();
        assert!(matches!(e, TicketError::Damaged(_)), "{e}");
        assert!(e.to_string().contains("copy it again"), "{e}");
        let e = JoinTicket::decode("/ip4/1.2.3.4/tcp/1").unwrap_err();
        assert!(matches!(e, TicketError::Prefix(_)), "{e}");
        let e = JoinTicket::decode(&"slowmo1A".repeat(4000)).unwrap_err();
        assert!(matches!(e, TicketError::TooLong(_)), "{e}");
    }

    #[test]
    fn a_ticket_with_bad_fields_is_refused_naming_the_field() {
        type Spoil = fn(&mut JoinTicket);
        let cases: [(&str, Spoil); 4] = [
            ("address list", |t| {
                t.addrs = vec!["/ip4/1.2.3.4/tcp/1".into()]
            }),
            ("run id", |t| t.run_id.clear()),
            ("config hash", |t| t.config_hash = "XYZ".into()),
            ("data lane", |t| t.data_lane = "carrier-pigeon".into()),
        ];
        for (name, spoil) in cases {
            let mut t = ticket();
            spoil(&mut t);
            match JoinTicket::decode(&t.encode()) {
                Err(TicketError::Field { field, .. }) => assert_eq!(field, name),
                other => panic!("{name}: {other:?}"),
            }
        }
    }
}
