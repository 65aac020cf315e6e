#![no_main]
//! `cargo fuzz run knock`: see `slowmo_gossip::p2p::fuzz::knock`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::knock(data);
});
