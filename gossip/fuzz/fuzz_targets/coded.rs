#![no_main]
//! `cargo fuzz run coded`: see `slowmo_gossip::p2p::fuzz::coded`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::coded(data);
});
