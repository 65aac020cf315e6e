#![no_main]
//! `cargo fuzz run chunk`: see `slowmo_gossip::p2p::fuzz::chunk`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::chunk(data);
});
