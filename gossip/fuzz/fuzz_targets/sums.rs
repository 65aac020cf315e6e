#![no_main]
//! `cargo fuzz run sums`: see `slowmo_gossip::p2p::fuzz::sums`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::sums(data);
});
