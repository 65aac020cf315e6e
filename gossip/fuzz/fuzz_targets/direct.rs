#![no_main]
//! `cargo fuzz run direct`: see `slowmo_gossip::p2p::fuzz::direct`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::direct(data);
});
