//! Fuzzing every decoder of peer input: frame headers, push-sum shares,
//! all-reduce chunks, gather blocks, membership hellos and replies, and the
//! admission knock and door before them ([`knock`]), compressed shares
//! ([`coded`]) and the compressed average's words ([`sums`]).
//!
//! Each target takes arbitrary bytes (what one peer could write on one
//! stream) and runs them through the code a node runs on them, against a
//! fixed run of four members in which we are rank 1. A bad input must come
//! out as an error in the [`Outcome`]; a panic is a bug. The seeded
//! [`generate`] makes inputs worth trying: valid streams (which must be
//! taken whole), the same with fields set to hostile values (huge lengths and
//! offsets, NaN weights and payloads, wrong senders, views, kinds), byte-level
//! mutations (bit flips, truncations, huge length prefixes, splices) and
//! plain random bytes.
//!
//! Used by the `cargo fuzz` targets in `gossip/fuzz`, by the
//! `fuzz_decoders` test (a bounded number of cases in CI) and by the
//! `fuzz_decoders` example (millions of cases). Not a stable API.

mod coded;
mod ctx;
mod decode;
mod generate;
mod knock;
mod lane;
mod rng;
mod sums;

pub use coded::coded;
pub use ctx::Outcome;
pub use decode::{TARGETS, chunk, direct, door, gather, header, hello, knock, reply, run, share};
pub use generate::{Case, generate};
pub use lane::lane;
pub use rng::Rng;
pub use sums::sums;
