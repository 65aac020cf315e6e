#![no_main]
//! `cargo fuzz run header`: see `slowmo_gossip::p2p::fuzz::header`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::header(data);
});
