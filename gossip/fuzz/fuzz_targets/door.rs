#![no_main]
//! `cargo fuzz run door`: see `slowmo_gossip::p2p::fuzz::door`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::door(data);
});
