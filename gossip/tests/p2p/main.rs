//! Real libp2p nodes on 127.0.0.1, several per process (one binary so that
//! libp2p is linked once).

mod admission;
mod all_reduce;
mod collectives;
mod common;
mod join;
mod lane;
mod push_sum;
mod validation;
mod views;
