//! The data lane's cipher, AEGIS-256X4, against AES-256-GCM on AWS-LC (the
//! lane's cipher before it), called as the lane calls them: each 1 MiB
//! record sealed from its source into a record buffer with a detached
//! tag, and opened from there into a destination. GB/s of one core on a
//! record in cache and on 64 MiB streamed from memory record by record,
//! the best of 7 passes after a warm-up. `cargo bench -p slowmo-gossip`.

use std::hint::black_box;
use std::time::Instant;

use aegis::aegis256x4::Aegis256X4;
use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

const RECORD: usize = 1 << 20;
const TAG: usize = 16;

trait Cipher {
    fn seal(&self, n: u64, src: &[u8], dst: &mut [u8]) -> [u8; TAG];
    fn open(&self, n: u64, src: &[u8], tag: &[u8; TAG], dst: &mut [u8]) -> bool;
}

struct Aegis([u8; 32]);

impl Aegis {
    fn cipher(&self, n: u64) -> Aegis256X4<TAG> {
        let mut nonce = [0u8; 32];
        nonce[4..12].copy_from_slice(&n.to_be_bytes());
        Aegis256X4::new(&self.0, &nonce)
    }
}

impl Cipher for Aegis {
    fn seal(&self, n: u64, src: &[u8], dst: &mut [u8]) -> [u8; TAG] {
        let mut enc = self.cipher(n).encryptor(&[]);
        enc.update(src, dst);
        enc.finalize()
    }
    fn open(&self, n: u64, src: &[u8], tag: &[u8; TAG], dst: &mut [u8]) -> bool {
        let cipher = self.cipher(n);
        let mut dec = cipher.decryptor(&[], dst);
        dec.update(src).is_ok() && dec.finalize(tag).is_ok()
    }
}

struct Gcm(LessSafeKey);

fn gcm_nonce(n: u64) -> Nonce {
    let mut nonce = [0u8; 12];
    nonce[4..].copy_from_slice(&n.to_be_bytes());
    Nonce::assume_unique_for_key(nonce)
}

impl Cipher for Gcm {
    fn seal(&self, n: u64, src: &[u8], dst: &mut [u8]) -> [u8; TAG] {
        let mut tag = [0u8; TAG];
        self.0
            .seal_out_of_place_scatter(gcm_nonce(n), Aad::empty(), src, dst, &[], &mut tag)
            .expect("lengths match");
        tag
    }
    fn open(&self, n: u64, src: &[u8], tag: &[u8; TAG], dst: &mut [u8]) -> bool {
        self.0
            .open_separate_gather(gcm_nonce(n), Aad::empty(), src, tag, dst)
            .is_ok()
    }
}

/// Best GB/s of sealing and of opening `data` record by record.
fn measure(c: &dyn Cipher, data: &mut [u8], sealed: &mut [u8]) -> (f64, f64) {
    let records = data.len().div_ceil(RECORD);
    let mut tags = vec![[0u8; TAG]; records];
    let (mut seal, mut open) = (f64::MAX, f64::MAX);
    for pass in 0..8 {
        let at = Instant::now();
        for (i, (s, d)) in data
            .chunks(RECORD)
            .zip(sealed.chunks_mut(RECORD))
            .enumerate()
        {
            tags[i] = c.seal(i as u64, s, d);
        }
        let t = at.elapsed().as_secs_f64();
        let at = Instant::now();
        for (i, (s, d)) in sealed
            .chunks(RECORD)
            .zip(data.chunks_mut(RECORD))
            .enumerate()
        {
            assert!(c.open(i as u64, s, &tags[i], d), "a record failed to open");
        }
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
    let aegis = Aegis([7u8; 32]);
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
        let mut sealed = vec![0u8; len];
        for (name, c) in [
            ("AEGIS-256X4", &aegis as &dyn Cipher),
            ("AES-256-GCM", &gcm),
        ] {
            let (s, o) = measure(c, &mut data, &mut sealed);
            assert_eq!(data, want, "{name} did not give the data back");
            println!("{name:>16} {what:>16} {s:>10.2} {o:>10.2}");
        }
    }
}
