//! The math of slowmo: base optimizers, learning-rate schedules, push-sum
//! state and the SlowMo outer step, all over flat `f32` buffers. No I/O.
//!
//! The training loop composes them per outer iteration t as ALGORITHMS.md
//! describes: apply the [`BufferPolicy`] to each [`Optimizer`]; run `tau` base
//! steps per worker (with push-sum gossip for SGP/OSGP, state in [`PushSum`]);
//! exact-average the parameters (unless the noaverage variant); then
//! [`SlowMo::outer_step`] with the learning rate of the barrier step.
//! [`Preset`] maps the named algorithms of the paper onto these settings.

pub mod error;
mod named;
pub mod optimizer;
pub mod preset;
pub mod push_sum;
pub mod rng;
pub mod schedule;
pub mod slowmo;

pub use error::{OptimError, SCHEDULE_FORMS};
pub use optimizer::{Optimizer, OptimizerConfig, OptimizerKind};
pub use preset::{Algorithm, Base, DEFAULT_TAU, Preset};
pub use push_sum::PushSum;
pub use rng::Rng;
pub use schedule::Schedule;
pub use slowmo::{BufferPolicy, SlowMo, SlowMoConfig};
