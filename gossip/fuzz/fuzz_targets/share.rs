#![no_main]
//! `cargo fuzz run share`: see `slowmo_gossip::p2p::fuzz::share`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = slowmo_gossip::p2p::fuzz::share(data);
});
