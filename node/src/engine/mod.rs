//! Training: the loop of one worker, its elastic recovery, the simulator
//! and the setup a run shares between the simulator and `slowmo node`.

mod elastic;
pub mod exchange;
pub mod gate;
pub mod setup;
pub mod simulate;
pub mod stopping;
pub mod train;
mod worker;
