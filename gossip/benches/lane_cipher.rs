//! The data lane's cipher, AEGIS-256X4 (the lane's own sealer and opener),
//! against AES-256-GCM on AWS-LC (the lane's cipher before it), called the
//! same way: each 1 MiB record sealed from its source into a record buffer
//! with its tag after it, and opened from there into a destination. GB/s of
//! one core on a record in cache and on 64 MiB streamed from memory record
//! by record, the best of 7 passes after a warm-up. `cargo bench -p
//! slowmo-gossip`.

use std::hint::black_box;
use std::time::Instant;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use libp2p::PeerId;
use slowmo_gossip::p2p::lane::crypto::{CONTRIBUTION, LaneKeys, SESSION_ID, TAG};

const RECORD: usize = 1 << 20;

/// One pass over `data`: every record sealed, or every record opened.
/// `pass` keeps each pass's nonces apart.
trait Cipher {
    fn seal_pass(&self, pass: u16, data: &[u8], records: &mut [Vec<u8>]);
    fn open_pass(&self, pass: u16, records: &[Vec<u8>], data: &mut [u8]) -> bool;
}

/// The lane's keys of both sides of one session.
struct Lane {
    ours: LaneKeys,
    theirs: LaneKeys,
}

impl Lane {
    fn new() -> Self {
        let (a, b) = (PeerId::random(), PeerId::random());
        let id = [3u8; SESSION_ID];
        let (ca, cb) = ([1u8; CONTRIBUTION], [2u8; CONTRIBUTION]);
        Self {
            ours: LaneKeys::derive(&id, &a, &ca, &b, &cb),
            theirs: LaneKeys::derive(&id, &b, &cb, &a, &ca),
        }
    }
}

impl Cipher for Lane {
    fn seal_pass(&self, pass: u16, data: &[u8], records: &mut [Vec<u8>]) {
        let mut sealer = self.ours.sealer(pass);
        for (src, out) in data.chunks(RECORD).zip(records) {
            sealer.seal_from(src, out);
        }
    }
    fn open_pass(&self, pass: u16, records: &[Vec<u8>], data: &mut [u8]) -> bool {
        let mut opener = self.theirs.opener(pass);
        data.chunks_mut(RECORD).zip(records).all(|(dst, record)| {
            let (body, tag) = record[..dst.len() + TAG].split_at(dst.len());
            opener.open_into(body, tag.try_into().expect("a tag"), dst)
        })
    }
}

struct Gcm(LessSafeKey);

fn gcm_nonce(pass: u16, record: usize) -> Nonce {
    let mut nonce = [0u8; 12];
    nonce[2..4].copy_from_slice(&pass.to_be_bytes());
    nonce[4..].copy_from_slice(&(record as u64).to_be_bytes());
    Nonce::assume_unique_for_key(nonce)
}

impl Cipher for Gcm {
    fn seal_pass(&self, pass: u16, data: &[u8], records: &mut [Vec<u8>]) {
        for (i, (src, out)) in data.chunks(RECORD).zip(records).enumerate() {
            out.resize(src.len() + TAG, 0);
            let (body, tag) = out.split_at_mut(src.len());
            self.0
                .seal_out_of_place_scatter(gcm_nonce(pass, i), Aad::empty(), src, body, &[], tag)
                .expect("lengths match");
        }
    }
    fn open_pass(&self, pass: u16, records: &[Vec<u8>], data: &mut [u8]) -> bool {
        data.chunks_mut(RECORD)
            .zip(records)
            .enumerate()
            .all(|(i, (dst, record))| {
                let (body, tag) = record[..dst.len() + TAG].split_at(dst.len());
                let tag: [u8; TAG] = tag.try_into().expect("a tag");
                self.0
                    .open_separate_gather(gcm_nonce(pass, i), Aad::empty(), body, &tag, dst)
                    .is_ok()
            })
    }
}

/// Best GB/s of sealing and of opening `data` record by record.
fn measure(c: &dyn Cipher, data: &mut [u8]) -> (f64, f64) {
    let mut records = vec![Vec::with_capacity(RECORD + TAG); data.len().div_ceil(RECORD)];
    let (mut seal, mut open) = (f64::MAX, f64::MAX);
    for pass in 0..8 {
        let at = Instant::now();
        c.seal_pass(pass, data, &mut records);
        let t = at.elapsed().as_secs_f64();
        let at = Instant::now();
        assert!(c.open_pass(pass, &records, data), "a record failed to open");
        let o = at.elapsed().as_secs_f64();
        if pass > 0 {
            seal = seal.min(t);
            open = open.min(o);
        }
        black_box(&data);
    }
    let gb = data.len() as f64 / 1e9;
    (gb / seal, gb / open)
}

fn main() {
    let lane = Lane::new();
    let gcm = Gcm(LessSafeKey::new(
        UnboundKey::new(&AES_256_GCM, &[7u8; 32]).expect("a 32-byte key"),
    ));
    println!(
        "{:>16} {:>16} {:>10} {:>10}",
        "cipher", "records", "seal GB/s", "open GB/s"
    );
    for (what, len) in [("1 MiB, in cache", RECORD), ("64 MiB, memory", 64 * RECORD)] {
        let mut data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let want = data.clone();
        for (name, c) in [("AEGIS-256X4", &lane as &dyn Cipher), ("AES-256-GCM", &gcm)] {
            let (s, o) = measure(c, &mut data);
            assert_eq!(data, want, "{name} did not give the data back");
            println!("{name:>16} {what:>16} {s:>10.2} {o:>10.2}");
        }
    }
}
