#![no_main]
//! `cargo fuzz run lane`: see `slowmo_gossip::p2p::fuzz::lane`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::lane(data);
});
