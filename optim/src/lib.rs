//! The math of slowmo: base optimizers, learning-rate schedules, push-sum
//! state and the SlowMo outer step, all over flat `f32` buffers. No I/O.
//!
//! [`OuterLoop`] composes them into SlowMo's Algorithm 1 as docs/algorithm.md
//! describes: `tau` base steps per worker (with push-sum gossip for SGP/OSGP,
//! state in [`PushSum`]); then drain, exact-average the parameters (unless the
//! noaverage variant), apply the [`BufferPolicy`], and take the
//! [`SlowMo::outer_step`] with the learning rate of the barrier step. It asks
//! an [`Exchange`] for communication, so the simulator, real peers and the
//! tests all run the same machine. [`Preset`] maps the named algorithms of the
//! paper onto these settings.

pub mod error;
mod named;
pub mod optimizer;
pub mod outer;
pub mod preset;
pub mod push_sum;
pub mod rng;
pub mod schedule;
pub mod slowmo;
mod wide;

/// The parameter loops dispatched by CPU features, each with its portable
/// body, for the benchmark that compares them (`cargo bench -p
/// slowmo-optim`).
#[doc(hidden)]
pub mod kernels {
    pub use crate::optimizer::{sgd_momentum, sgd_momentum_portable};
    pub use crate::push_sum::{
        divide, divide_by_division, divide_by_division_portable, divide_by_product,
        divide_by_product_portable, multiply, multiply_portable,
    };
}

pub use error::{OptimError, SCHEDULE_FORMS};
pub use optimizer::{Optimizer, OptimizerConfig, OptimizerKind};
pub use outer::{Exchange, LoopState, OuterLoop, StepReport};
pub use preset::{Algorithm, Base, DEFAULT_TAU, Preset};
pub use push_sum::PushSum;
pub use rng::Rng;
pub use schedule::Schedule;
pub use slowmo::{BufferPolicy, SlowMo, SlowMoConfig};
