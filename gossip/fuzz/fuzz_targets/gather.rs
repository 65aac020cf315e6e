#![no_main]
//! `cargo fuzz run gather`: see `slowmo_gossip::p2p::fuzz::gather`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::gather(data);
});
