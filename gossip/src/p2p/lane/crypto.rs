//! Keys of a lane and the sealing of its records.
//!
//! Both peers contribute fresh random key material through the control
//! plane (libp2p, itself authenticated and encrypted); HKDF-SHA256 over both
//! contributions, the session id and both peer ids gives a MAC key (for the
//! connection set-up) and one AEGIS-256X4 key per direction. A record's
//! nonce is the connection's index and a counter of the records sent on it,
//! so no nonce repeats under a key and a record replayed, dropped or moved
//! to another place fails to open.
//!
//! AEGIS-256X4 (the AEGIS family of the IETF's CFRG draft: a 256-bit key,
//! a 256-bit nonce, here a 128-bit tag) runs four AEGIS-256 states side by
//! side on the AES round instruction, with VAES where the CPU has it, and
//! seals about three times as fast as AES-256-GCM on one core; the library
//! chooses its code for the CPU at run time and has a portable one.

use aegis::aegis256x4::Aegis256X4;
use aws_lc_rs::{hkdf, hmac};
use libp2p::PeerId;

/// Bytes of each side's key contribution and of the session id.
pub const CONTRIBUTION: usize = 32;
pub const SESSION_ID: usize = 16;
/// Bytes of an AEAD tag.
pub const TAG: usize = 16;
/// Bytes of an AEAD key and of a nonce.
const KEY: usize = 32;
const NONCE: usize = 32;

type Aead = Aegis256X4<TAG>;

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// One direction's AEAD key, wiped when dropped.
struct Key([u8; KEY]);

impl Drop for Key {
    fn drop(&mut self) {
        for b in self.0.iter_mut() {
            // SAFETY: a valid, aligned, exclusively borrowed byte.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// The keys of one lane between us and one peer.
pub struct LaneKeys {
    pub mac: hmac::Key,
    /// Seals what we send.
    send: Key,
    /// Opens what the peer sends.
    recv: Key,
}

fn expand(prk: &hkdf::Prk, label: &[u8], peer: &PeerId, out: &mut [u8]) {
    let peer = peer.to_bytes();
    // "3": the lane version whose records are sealed with AEGIS-256X4, so
    // no key is shared with the AES-GCM lane of earlier versions.
    let info = [b"slowmo lane 3 ".as_slice(), label, &peer];
    prk.expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .expect("HKDF-SHA256 yields 32 bytes");
}

impl LaneKeys {
    /// Derives the keys of session `id` between `local` and `remote` from
    /// both contributions (the same on both sides, whoever offered).
    pub fn derive(
        id: &[u8; SESSION_ID],
        local: &PeerId,
        ours: &[u8; CONTRIBUTION],
        remote: &PeerId,
        theirs: &[u8; CONTRIBUTION],
    ) -> Self {
        let (lo, hi) = if local.to_bytes() < remote.to_bytes() {
            ((local, ours), (remote, theirs))
        } else {
            ((remote, theirs), (local, ours))
        };
        let mut ikm = Vec::with_capacity(2 * CONTRIBUTION + 80);
        ikm.extend_from_slice(lo.1);
        ikm.extend_from_slice(hi.1);
        ikm.extend_from_slice(&lo.0.to_bytes());
        ikm.extend_from_slice(&hi.0.to_bytes());
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, id).extract(&ikm);
        let mut mac = [0u8; 32];
        expand(&prk, b"mac", lo.0, &mut mac);
        let key = |sender: &PeerId| {
            let mut k = Key([0u8; KEY]);
            expand(&prk, b"data from ", sender, &mut k.0);
            k
        };
        Self {
            mac: hmac::Key::new(hmac::HMAC_SHA256, &mac),
            send: key(local),
            recv: key(remote),
        }
    }

    /// The MAC of `parts` under the lane's MAC key.
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut ctx = hmac::Context::with_key(&self.mac);
        for p in parts {
            ctx.update(p);
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    /// Whether `tag` is the MAC of `parts` (in constant time).
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        hmac::verify(&self.mac, &parts.concat(), tag).is_ok()
    }

    /// A sealer for connection `conn` of our sending direction.
    pub fn sealer(&self, conn: u16) -> Sealer<'_> {
        Sealer {
            key: &self.send,
            nonces: Nonces::new(conn),
        }
    }

    /// An opener for connection `conn` of the peer's sending direction.
    pub fn opener(&self, conn: u16) -> Opener<'_> {
        Opener {
            key: &self.recv,
            nonces: Nonces::new(conn),
        }
    }
}

/// Record nonces of one connection: its index, then a counter.
struct Nonces {
    conn: u16,
    next: u64,
}

impl Nonces {
    fn new(conn: u16) -> Self {
        Self { conn, next: 0 }
    }

    /// The cipher for the next record under `key`.
    fn next(&mut self, key: &Key) -> Aead {
        let mut n = [0u8; NONCE];
        n[2..4].copy_from_slice(&self.conn.to_be_bytes());
        n[4..12].copy_from_slice(&self.next.to_be_bytes());
        // 2^64 records of a connection are out of reach.
        self.next += 1;
        Aead::new(&key.0, &n)
    }
}

/// Seals the records one connection sends.
pub struct Sealer<'k> {
    key: &'k Key,
    nonces: Nonces,
}

impl Sealer<'_> {
    /// Encrypts `data` in place and returns its tag.
    pub fn seal(&mut self, data: &mut [u8]) -> [u8; TAG] {
        self.nonces.next(self.key).encrypt_in_place(data, &[])
    }

    /// Encrypts `data` into the start of `out`, its tag after it, and
    /// returns their length: the seal and the copy into the record buffer
    /// in one pass. `out` only grows: a record buffer is sealed over, so it
    /// is zeroed once, when it first grows, not before every record.
    pub fn seal_from(&mut self, data: &[u8], out: &mut Vec<u8>) -> usize {
        let sealed = data.len() + TAG;
        if out.len() < sealed {
            out.resize(sealed, 0);
        }
        let (body, rest) = out.split_at_mut(data.len());
        let mut enc = self.nonces.next(self.key).encryptor(&[]);
        enc.update(data, body);
        rest[..TAG].copy_from_slice(&enc.finalize());
        sealed
    }
}

/// Opens the records one connection receives.
pub struct Opener<'k> {
    key: &'k Key,
    nonces: Nonces,
}

impl Opener<'_> {
    /// Decrypts `data` in place; `false` if it is not the next record sealed
    /// by the peer on this connection.
    pub fn open(&mut self, data: &mut [u8], tag: [u8; TAG]) -> bool {
        self.nonces
            .next(self.key)
            .decrypt_in_place(data, &tag, &[])
            .is_ok()
    }

    /// Decrypts `sealed` into `out` (of the same length); `false` as
    /// [`Opener::open`]. On `false` `out` holds bytes of no meaning.
    pub fn open_into(&mut self, sealed: &[u8], tag: [u8; TAG], out: &mut [u8]) -> bool {
        if out.len() != sealed.len() {
            return false;
        }
        let cipher = self.nonces.next(self.key);
        let mut dec = cipher.decryptor(&[], out);
        dec.update(sealed).is_ok() && dec.finalize(&tag).is_ok()
    }
}

/// Fresh random bytes from the operating system.
pub(crate) fn random<const N: usize>() -> Result<[u8; N], String> {
    use aws_lc_rs::rand::SecureRandom;
    let mut out = [0u8; N];
    aws_lc_rs::rand::SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| "the operating system's random source failed".to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (LaneKeys, LaneKeys) {
        let (a, b) = (PeerId::random(), PeerId::random());
        let id = [3u8; SESSION_ID];
        let (ca, cb) = ([1u8; CONTRIBUTION], [2u8; CONTRIBUTION]);
        (
            LaneKeys::derive(&id, &a, &ca, &b, &cb),
            LaneKeys::derive(&id, &b, &cb, &a, &ca),
        )
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn the_record_cipher_is_aegis_256x4_of_the_cfrg_draft() {
        // Test vector 2 of AEGIS-256X4 in draft-irtf-cfrg-aegis-aead
        // (128-bit tag): another cipher, variant or tag length fails it.
        let key: [u8; KEY] =
            hex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
                .try_into()
                .unwrap();
        let nonce: [u8; NONCE] =
            hex("101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f")
                .try_into()
                .unwrap();
        let ad = hex("0102030401020304");
        let msg = hex(&"04050607".repeat(30));
        let ct = hex(concat!(
            "bfc2085b7e8017da99b0b6d646ae4d01f4ba8f2e7dfca1d759ae48a135139b9a",
            "aac6b4f5db810d426be1fdaff4e1454153a34b11da78ed7e418ee2ee9853042e",
            "95536aecbb694cea1b16a478eb0d4d1bf6509b1ce652a45af58e0e46ffccfa2d",
            "0426e702391d2ff5813808b81748a490dd656465fed61f09"
        ));
        let mut data = msg.clone();
        let tag = Aead::new(&key, &nonce).encrypt_in_place(&mut data, &ad);
        assert_eq!(data, ct);
        assert_eq!(tag.to_vec(), hex("b63b611b13975e2f3dc3cb6c2397bfcd"));
    }

    #[test]
    fn a_record_nonce_is_the_connection_then_the_record_counter() {
        let (a, _) = pair();
        let mut s = a.sealer(0x0102);
        for _ in 0..2 {
            s.seal(&mut b"earlier".to_vec());
        }
        let mut ours = b"third record".to_vec();
        let tag = s.seal(&mut ours);
        // Big-endian connection index in bytes 2..4, the record counter
        // in 4..12, the rest zero.
        let mut nonce = [0u8; NONCE];
        nonce[2..4].copy_from_slice(&[1, 2]);
        nonce[11] = 2;
        let mut expected = b"third record".to_vec();
        let want = Aead::new(&a.send.0, &nonce).encrypt_in_place(&mut expected, &[]);
        assert_eq!((ours, tag), (expected, want));
    }

    #[test]
    fn both_sides_derive_matching_keys() {
        let (a, b) = pair();
        assert_eq!(a.tag(&[b"x"]), b.tag(&[b"x"]));
        let mut data = b"hello lane".to_vec();
        let tag = a.sealer(1).seal(&mut data);
        assert_ne!(&data, b"hello lane");
        assert!(b.opener(1).open(&mut data, tag));
        assert_eq!(&data, b"hello lane");
    }

    #[test]
    fn a_record_out_of_place_does_not_open() {
        let (a, b) = pair();
        let mut s = a.sealer(0);
        let mut r1 = b"first".to_vec();
        let t1 = s.seal(&mut r1);
        let mut r2 = b"second".to_vec();
        let t2 = s.seal(&mut r2);
        // Skipping a record, another connection, or our own key: refused.
        assert!(!b.opener(0).open(&mut r2.clone(), t2));
        assert!(!b.opener(1).open(&mut r1.clone(), t1));
        assert!(!a.opener(0).open(&mut r1.clone(), t1));
        let mut o = b.opener(0);
        assert!(o.open(&mut r1, t1));
        let mut flipped = r2.clone();
        flipped[0] ^= 1;
        assert!(!o.open(&mut flipped, t2));
    }

    #[test]
    fn a_record_sealed_from_another_buffer_opens_as_one_sealed_in_place() {
        let (a, b) = pair();
        let (mut s, mut o) = (a.sealer(4), b.opener(4));
        let mut out = vec![9u8; 8];
        // A longer record grows the buffer; a shorter one after it is
        // sealed over its start, the rest left as it was.
        for text in [b"a longer first record".as_slice(), b"short"] {
            let n = s.seal_from(text, &mut out);
            assert_eq!(n, text.len() + TAG);
            assert!(out.len() >= n);
            let (body, tag) = out[..n].split_at_mut(text.len());
            assert_ne!(&*body, text);
            assert!(o.open(body, tag.try_into().unwrap()));
            assert_eq!(&*body, text);
        }
        assert_eq!(out.len(), b"a longer first record".len() + TAG);
        // The same bytes as a seal in place under the same nonce.
        let mut in_place = b"same".to_vec();
        let t1 = a.sealer(5).seal(&mut in_place);
        let n = a.sealer(5).seal_from(b"same", &mut out);
        assert_eq!(&out[..4], in_place.as_slice());
        assert_eq!(out[4..n], t1);
    }

    #[test]
    fn a_record_opens_into_another_buffer_in_the_same_order() {
        let (a, b) = pair();
        let mut s = a.sealer(2);
        let mut r1 = b"first record".to_vec();
        let t1 = s.seal(&mut r1);
        let mut r2 = b"second one".to_vec();
        let t2 = s.seal(&mut r2);
        let mut o = b.opener(2);
        let mut out = vec![0u8; r1.len()];
        // Of another length, or tampered with: refused, and the nonce is
        // not spent by a length refused before opening.
        assert!(!o.open_into(&r1, t1, &mut out[..3]));
        assert!(o.open_into(&r1, t1, &mut out));
        assert_eq!(&out, b"first record");
        let mut bad = r2.clone();
        bad[3] ^= 0x40;
        let mut out2 = vec![0u8; r2.len()];
        assert!(!b.opener(2).open_into(&r2, t2, &mut out2));
        assert!(!o.open_into(&bad, t2, &mut out2));
    }
}
