//! Every decoder of peer input on a bounded number of generated inputs
//! (valid streams, hostile fields, byte mutations, truncations, huge length
//! prefixes, NaN payloads, random bytes): no input makes one panic, a bad
//! input is an error, and a valid one is taken whole. The same harness runs
//! for millions of inputs in the `fuzz_decoders` example and under
//! `cargo fuzz` (gossip/fuzz).

use slowmo_gossip::p2p::fuzz::{self, Outcome, Rng, TARGETS};
use slowmo_gossip::p2p::wire::{DType, Header, Kind, WIRE_VERSION, encode_header};

const CASES: usize = 5000;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `CASES` generated inputs through `target`; returns how many were
/// valid and how many refused.
fn exercise(target: &str, seed: u64) -> (usize, usize) {
    let mut rng = Rng::new(seed);
    let (mut valid, mut refused) = (0, 0);
    for i in 0..CASES {
        let case = fuzz::generate(target, &mut rng);
        let out =
            std::panic::catch_unwind(|| fuzz::run(target, &case.bytes)).unwrap_or_else(|_| {
                panic!(
                    "{target}: input {i} of seed {seed} panicked: {}",
                    hex(&case.bytes)
                )
            });
        if out.error.is_some() {
            refused += 1;
        }
        if let Some(n) = case.valid {
            valid += 1;
            assert_eq!(
                out,
                Outcome {
                    accepted: n,
                    dropped: 0,
                    error: None
                },
                "{target}: valid input {i} of seed {seed} not taken whole: {}",
                hex(&case.bytes)
            );
        }
    }
    (valid, refused)
}

fn exercise_all_seeds(target: &str) {
    let (mut valid, mut refused) = (0, 0);
    for seed in [1, 2] {
        let (v, r) = exercise(target, seed);
        valid += v;
        refused += r;
    }
    // The generator reaches both sides of every decoder.
    assert!(valid > CASES / 10, "{target}: only {valid} valid inputs");
    assert!(
        refused > CASES / 10,
        "{target}: only {refused} refused inputs"
    );
}

#[test]
fn every_target_has_a_generator() {
    let mut rng = Rng::new(3);
    for t in TARGETS {
        let _ = fuzz::run(t, &fuzz::generate(t, &mut rng).bytes);
        // An empty stream delivers nothing (for a stream of frames, a clean
        // end is no error).
        assert_eq!(fuzz::run(t, &[]).accepted, 0, "{t}");
    }
}

#[test]
fn frame_headers_never_panic_and_round_trip() {
    exercise_all_seeds("header");
}

#[test]
fn push_sum_shares_never_panic() {
    exercise_all_seeds("share");
}

#[test]
fn all_reduce_chunks_never_panic() {
    exercise_all_seeds("chunk");
}

#[test]
fn direct_all_reduce_chunks_from_every_member_never_panic() {
    exercise_all_seeds("direct");
}

#[test]
fn gather_blocks_never_panic() {
    exercise_all_seeds("gather");
}

#[test]
fn compressed_shares_never_panic() {
    exercise_all_seeds("coded");
}

#[test]
fn compressed_average_words_never_panic() {
    exercise_all_seeds("sums");
}

#[test]
fn data_lane_frames_never_panic() {
    exercise_all_seeds("lane");
}

#[test]
fn membership_hellos_never_panic() {
    exercise_all_seeds("hello");
}

#[test]
fn membership_replies_never_panic() {
    exercise_all_seeds("reply");
}

#[test]
fn admission_knocks_never_panic() {
    exercise_all_seeds("knock");
}

#[test]
fn admission_doors_never_panic() {
    exercise_all_seeds("door");
}

#[test]
fn knocks_from_the_outsider_are_refused_under_allowlist_and_invitations() {
    // Valid knocks of members, re-addressed as coming from the outsider
    // (peer byte 4): refused unless the run is open (policy byte 0).
    let mut rng = Rng::new(9);
    let mut checked = [0usize; 3];
    while checked.iter().any(|n| *n < 20) {
        let case = fuzz::generate("knock", &mut rng);
        if case.valid.is_none() {
            continue;
        }
        let mut bytes = case.bytes.clone();
        bytes[0] = 4;
        let policy = bytes[1] as usize % 3;
        checked[policy] += 1;
        let out = fuzz::run("knock", &bytes);
        if policy == 0 {
            // The open policy admits on knowledge of the run id: a member's
            // proof is bound to the member's peer id, so it still fails.
            assert!(out.error.is_some(), "{out:?}");
        } else {
            let e = out.error.expect("an outsider was admitted");
            assert!(e.contains("allowlist") || e.contains("invitation"), "{e}");
        }
    }
}

fn share_header(len: u64) -> Header {
    Header {
        version: WIRE_VERSION,
        run_id: "fuzz-run".into(),
        view: 3,
        sender: String::new(),
        round: 0,
        kind: Kind::PushSum,
        dtype: DType::F32,
        len,
        weight: 0.5,
        checksum: 0,
        step: 0,
        offset: 0,
        total: len,
    }
}

#[test]
fn hostile_lengths_are_refused_before_any_allocation() {
    // A header length prefix of 4 GiB.
    let out = fuzz::run("header", &[0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
    assert!(out.error.unwrap().contains("header length"));
    // A membership message of 4 GiB, and one of 1 MiB + 1.
    for len in [u32::MAX, (1 << 20) + 1] {
        let mut input = vec![0u8];
        input.extend_from_slice(&len.to_le_bytes());
        let out = fuzz::run("hello", &input);
        assert!(out.error.unwrap().contains("exceeds"), "{len}");
    }
    // A payload of u64::MAX elements (the element count times the size
    // saturates rather than wrapping).
    let mut input = vec![0u8];
    input.extend_from_slice(&encode_header(&share_header(u64::MAX)));
    let out = fuzz::run("share", &input);
    assert!(out.error.is_some());
    let mut input = vec![0u8];
    input.extend_from_slice(&encode_header(&share_header(1 << 62)));
    let out = fuzz::run("chunk", &input);
    assert!(out.error.is_some());
}
