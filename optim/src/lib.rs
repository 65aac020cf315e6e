//! The math of slowmo: base optimizers, learning-rate schedules, push-sum
//! state and the SlowMo outer step, all over flat `f32` buffers. No I/O.

pub mod rng;

pub use rng::Rng;
