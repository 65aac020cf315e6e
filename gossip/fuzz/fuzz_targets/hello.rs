#![no_main]
//! `cargo fuzz run hello`: see `slowmo_gossip::p2p::fuzz::hello`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::hello(data);
});
