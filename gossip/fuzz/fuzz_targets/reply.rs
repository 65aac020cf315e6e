#![no_main]
//! `cargo fuzz run reply`: see `slowmo_gossip::p2p::fuzz::reply`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::reply(data);
});
