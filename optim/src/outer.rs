//! The outer loop of one worker as one state machine (docs/algorithm.md, "The
//! loop"): SlowMo's Algorithm 1 over any base.
//!
//! [`OuterLoop`] owns everything the algorithm keeps between steps: the
//! push-sum state `(x, w)`, the base optimizer, the anchor and slow momentum
//! (in [`SlowMo`]), tau, the buffer policy, and the step and gossip-round
//! counters. It also owns the order of events. Communication is the caller's:
//! [`OuterLoop::step`] calls an [`Exchange`] at the points the algorithm
//! needs one, so the same machine runs over the in-memory network, over real
//! peers, and in the equivalence tests (which implement [`Exchange`] with
//! plain loops over threads).
//!
//! One step:
//! ```text
//! gradient at z = x / w (the caller's model, at OuterLoop::params)
//! ar-sgd: average the gradient
//! base step on z; x = w * z            (the numerator moves by w times the step)
//! sgp/osgp: one push-sum round          (background gossip: only if the last one arrived)
//! every tau-th step, the outer boundary:
//!     background gossip: every worker to the same round count
//!     drain, exact average (unless noaverage), buffer average (policy `average`)
//!     slow-momentum step; buffer reset (policy `reset`)
//! ```

use crate::error::{OptimError, check_finite};
use crate::optimizer::{Optimizer, OptimizerConfig};
use crate::preset::{Algorithm, Base};
use crate::push_sum::PushSum;
use crate::slowmo::{BufferPolicy, SlowMo};

/// The communication the outer loop asks for. Every worker of a run makes the
/// same calls in the same order, so collective implementations may block until
/// all have made them.
pub trait Exchange {
    /// The error a communication failure returns.
    type Error;
    /// AR-SGD: replace `grad` and `loss` by their means over the workers.
    fn average_gradient(&mut self, grad: &mut [f32], loss: &mut f32) -> Result<(), Self::Error>;
    /// One push-sum round `round` on `(x, w)`; returns once every share of
    /// rounds `<= round - staleness` has been added.
    fn push_sum_round(
        &mut self,
        round: u64,
        staleness: u64,
        state: &mut PushSum,
    ) -> Result<(), Self::Error>;
    /// Background gossip: whether every share of rounds `<= round` has
    /// arrived; never blocks. An exchange that cannot tell says `true`.
    fn round_arrived(&mut self, round: u64) -> Result<bool, Self::Error>;
    /// Background gossip: the largest count of started rounds over the workers.
    fn max_rounds(&mut self, rounds: u64) -> Result<u64, Self::Error>;
    /// Add every push-sum share still in flight towards this worker.
    fn drain(&mut self, state: &mut PushSum) -> Result<(), Self::Error>;
    /// The exact average after a drain: `x = sum x_i / sum w_i`, `w = 1`, the
    /// same bits on every worker.
    fn exact_average(&mut self, state: &mut PushSum) -> Result<(), Self::Error>;
    /// The exact average with the outer step's pseudo-gradient compressed
    /// (`--compress-average`, docs/algorithm.md "Compressed exact
    /// averages"), after a drain: each worker encodes `g = anchor * w - x +
    /// residual`, keeps `g - D(Q(g))` as its new `residual`, and every
    /// worker sets `x = anchor - sum_i D(Q(g_i)) / sum_i w_i` (summed in rank
    /// order) and `w = 1`: the same bits on every worker.
    fn compressed_average(
        &mut self,
        state: &mut PushSum,
        anchor: &[f32],
        residual: &mut [f32],
    ) -> Result<(), Self::Error>;
    /// Replace each buffer by its elementwise mean over the workers.
    fn average_buffers(&mut self, buffers: Vec<&mut [f32]>) -> Result<(), Self::Error>;
}

/// Everything an [`OuterLoop`] holds between steps: what a checkpoint must
/// keep so that a resumed run continues bit for bit (docs/algorithm.md,
/// "Checkpoints").
#[derive(Debug, Clone, PartialEq)]
pub struct LoopState {
    /// Push-sum numerator.
    pub x: Vec<f32>,
    /// Push-sum weight.
    pub w: f64,
    /// SlowMo anchor `x_{t,0}`.
    pub anchor: Vec<f32>,
    /// Slow momentum `u` (gradient units).
    pub momentum: Vec<f32>,
    /// Outer steps taken.
    pub outer_steps: u64,
    /// Base-optimizer buffers, in the order of [`Optimizer::state_names`].
    pub optimizer_buffers: Vec<Vec<f32>>,
    /// Base-optimizer step counter (Adam's bias correction).
    pub optimizer_steps: u64,
    /// Base steps taken.
    pub steps: u64,
    /// Push-sum rounds started.
    pub rounds: u64,
    /// The compressed exact average's error-feedback residual (empty when
    /// the run averages exactly).
    pub average_residual: Vec<f32>,
}

impl LoopState {
    /// The de-biased parameters `x / w` (the bits of
    /// [`PushSum::debiased`]).
    pub fn debiased(&self) -> Vec<f32> {
        let mut z = vec![0.0; self.x.len()];
        crate::push_sum::debias_into(&self.x, self.w, &mut z);
        z
    }
}

/// What a step did, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepReport {
    /// The step ended an outer iteration (the slow-momentum step ran).
    pub outer_boundary: bool,
}

/// One worker's outer loop. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct OuterLoop {
    alg: Algorithm,
    state: PushSum,
    opt: Optimizer,
    slowmo: SlowMo,
    /// Scratch for `z = x / w` when `w != 1`.
    z: Vec<f32>,
    /// Whether `z` holds `x / w` of the current state.
    z_fresh: bool,
    /// Base steps taken.
    steps: u64,
    /// Push-sum rounds started.
    rounds: u64,
    /// What the compressed exact average has not sent yet (empty: the run
    /// averages exactly).
    average_residual: Vec<f32>,
}

impl OuterLoop {
    /// Starts at `x0` (the same on every worker) with `w = 1`, `u = 0`, and the
    /// anchor captured here, before the first base step.
    pub fn new(alg: Algorithm, opt: &OptimizerConfig, x0: Vec<f32>) -> Result<Self, OptimError> {
        alg.slowmo.validate()?;
        let opt = Optimizer::new(opt, x0.len())?;
        let slowmo = SlowMo::new(alg.slowmo.clone(), &x0);
        Ok(Self {
            alg,
            z: vec![0.0; x0.len()],
            z_fresh: false,
            state: PushSum::new(x0),
            opt,
            slowmo,
            steps: 0,
            rounds: 0,
            average_residual: Vec::new(),
        })
    }

    /// The exact averages at the outer boundaries go compressed through
    /// [`Exchange::compressed_average`], with a residual that starts at 0.
    /// (The average after a membership change stays exact.)
    pub fn with_compressed_average(mut self) -> Self {
        self.average_residual = vec![0.0; self.state.len()];
        self
    }

    /// Forgets the compressed average's residual: a worker that takes over
    /// another's state has not kept that worker's compression error (it
    /// stays with the worker that made it).
    pub fn clear_average_residual(&mut self) {
        self.average_residual.iter_mut().for_each(|v| *v = 0.0);
    }

    /// The de-biased parameters `z = x / w` at which the next gradient is
    /// taken (the numerator itself, uncopied, while `w == 1`).
    pub fn params(&mut self) -> &[f32] {
        if self.state.w == 1.0 {
            return &self.state.x;
        }
        if !self.z_fresh {
            self.state.debiased_into(&mut self.z);
            self.z_fresh = true;
        }
        &self.z
    }

    /// One base step with the gradient taken at [`OuterLoop::params`], then
    /// the base's exchange, then (every tau-th step) the outer boundary.
    /// `lr` is the base learning rate of this step; at a boundary it is the
    /// `gamma` of the slow-momentum step.
    pub fn step<E: Exchange>(
        &mut self,
        ex: &mut E,
        grad: &mut [f32],
        loss: &mut f32,
        lr: f32,
    ) -> Result<StepReport, E::Error> {
        if self.alg.base == Base::ArSgd {
            ex.average_gradient(grad, loss)?;
        }
        self.base_step(grad, lr);
        if self.alg.base.uses_push_sum() {
            self.gossip(ex)?;
        }
        self.steps += 1;
        let outer_boundary = self.steps.is_multiple_of(self.alg.slowmo.tau);
        if outer_boundary {
            self.outer_boundary(ex, lr)?;
        }
        Ok(StepReport { outer_boundary })
    }

    /// The end of the run: every worker at the same round count, nothing in
    /// flight. Afterwards `(x, w)` holds every share that was sent.
    pub fn finish<E: Exchange>(&mut self, ex: &mut E) -> Result<(), E::Error> {
        if self.alg.base.uses_push_sum() {
            self.catch_up(ex)?;
            ex.drain(&mut self.state)?;
            self.z_fresh = false;
        }
        Ok(())
    }

    /// The base step moves the de-biased point: `z <- z - lr * d(g)` and
    /// `x = w * z`, so the numerator moves by `w` times the step and the
    /// learning rate seen by `z` is `lr` whatever the weight (docs/algorithm.md,
    /// "The push-sum step rule"). While `w == 1` that is a step on `x` itself,
    /// bit for bit.
    fn base_step(&mut self, grad: &[f32], lr: f32) {
        if self.state.w == 1.0 {
            self.opt.step(&mut self.state.x, grad, lr);
        } else {
            if !self.z_fresh {
                self.state.debiased_into(&mut self.z);
            }
            self.opt.step(&mut self.z, grad, lr);
            self.state.set_debiased(&self.z);
        }
        self.z_fresh = false;
    }

    /// The base's per-step push-sum round. With background gossip round
    /// `r` starts only once round `r - s` fully arrived (`s` the staleness
    /// bound, at least 1: at most `s` rounds in flight), so rounds advance at
    /// the network's pace and a step never waits.
    fn gossip<E: Exchange>(&mut self, ex: &mut E) -> Result<(), E::Error> {
        let s = self.alg.staleness;
        if !self.alg.background_gossip {
            ex.push_sum_round(self.steps, s, &mut self.state)?;
            self.rounds = self.steps + 1;
        } else if self.rounds < s || ex.round_arrived(self.rounds - s)? {
            ex.push_sum_round(self.rounds, s, &mut self.state)?;
            self.rounds += 1;
        }
        self.z_fresh = false;
        Ok(())
    }

    /// Background gossip: start rounds until every worker has started as many
    /// as the most advanced one, so that a drain waits for exactly what was sent.
    fn catch_up<E: Exchange>(&mut self, ex: &mut E) -> Result<(), E::Error> {
        if !self.alg.background_gossip {
            return Ok(());
        }
        let target = ex.max_rounds(self.rounds)?;
        while self.rounds < target {
            ex.push_sum_round(self.rounds, self.alg.staleness, &mut self.state)?;
            self.rounds += 1;
        }
        Ok(())
    }

    fn outer_boundary<E: Exchange>(&mut self, ex: &mut E, gamma: f32) -> Result<(), E::Error> {
        let policy = self.alg.slowmo.buffer_policy;
        if self.alg.slowmo.average {
            if self.alg.base.uses_push_sum() {
                self.catch_up(ex)?;
                ex.drain(&mut self.state)?;
            }
            // AR-SGD keeps every worker identical: nothing to average.
            if self.alg.base != Base::ArSgd {
                if self.average_residual.is_empty() {
                    ex.exact_average(&mut self.state)?;
                } else {
                    ex.compressed_average(
                        &mut self.state,
                        self.slowmo.anchor(),
                        &mut self.average_residual,
                    )?;
                }
            }
            if policy == BufferPolicy::Average {
                ex.average_buffers(self.opt.state_buffers_mut())?;
            }
            self.slowmo.outer_step(&mut self.state.x, gamma);
        } else {
            // noaverage: each worker steps its own de-biased parameters with
            // its own anchor and momentum.
            self.slowmo.outer_step_push_sum(&mut self.state, gamma);
        }
        if policy == BufferPolicy::Reset {
            self.opt.reset();
        }
        self.z_fresh = false;
        Ok(())
    }

    /// Brings the loop to a point with nothing in flight (background gossip:
    /// every worker at the same round count; then a drain), for a checkpoint
    /// outside an exact average. Collective.
    pub fn settle<E: Exchange>(&mut self, ex: &mut E) -> Result<(), E::Error> {
        self.finish(ex)
    }

    /// An exact average of `(x, w)` now, outside the schedule: after a
    /// membership change, the live members' consensus (`sum x / sum w`)
    /// with `w = 1` again, whatever mass was lost. Collective.
    pub fn average_now<E: Exchange>(&mut self, ex: &mut E) -> Result<(), E::Error> {
        ex.exact_average(&mut self.state)?;
        self.z_fresh = false;
        Ok(())
    }

    /// After a membership change, background gossip: every member starts
    /// the new view's rounds at the count of the most advanced one. Rounds
    /// run at each worker's own pace, so members returning to their
    /// recovery points hold different counts, and a round's shares must be
    /// sent by the members that expect them (the graph of round `r` names
    /// them): a member that began round 160 would otherwise wait for ever
    /// on a peer that went on from 165. Collective; nothing without
    /// background gossip (the rounds follow the steps there).
    pub fn align_rounds<E: Exchange>(&mut self, ex: &mut E) -> Result<(), E::Error> {
        if self.alg.background_gossip && self.alg.base.uses_push_sum() {
            self.rounds = ex.max_rounds(self.rounds)?;
        }
        Ok(())
    }

    /// A copy of everything the loop holds.
    pub fn state(&self) -> LoopState {
        LoopState {
            x: self.state.x.clone(),
            w: self.state.w,
            anchor: self.slowmo.anchor().to_vec(),
            momentum: self.slowmo.momentum().to_vec(),
            outer_steps: self.slowmo.outer_steps(),
            optimizer_buffers: self
                .opt
                .state_buffers()
                .into_iter()
                .map(<[f32]>::to_vec)
                .collect(),
            optimizer_steps: self.opt.steps(),
            steps: self.steps,
            rounds: self.rounds,
            average_residual: self.average_residual.clone(),
        }
    }

    /// Continues from `s` (a checkpoint of a loop with the same algorithm,
    /// optimizer and parameter count). Every buffer is checked for its length
    /// and finiteness and the weight for being finite and positive; on error
    /// nothing changes.
    pub fn restore(&mut self, s: LoopState) -> Result<(), OptimError> {
        let n = self.state.len();
        if s.x.len() != n {
            return Err(OptimError::LengthMismatch {
                what: "push-sum numerator",
                expected: n,
                got: s.x.len(),
            });
        }
        check_finite("push-sum numerator", &s.x)?;
        if !(s.w.is_finite() && s.w > 0.0) {
            return Err(OptimError::InvalidField {
                field: "push-sum weight",
                value: s.w.to_string(),
                expected: "a finite number > 0",
            });
        }
        if s.average_residual.len() != self.average_residual.len() {
            return Err(OptimError::LengthMismatch {
                what: "compressed-average residual",
                expected: self.average_residual.len(),
                got: s.average_residual.len(),
            });
        }
        check_finite("compressed-average residual", &s.average_residual)?;
        let names = self.opt.state_names();
        if s.optimizer_buffers.len() != names.len() {
            return Err(OptimError::InvalidField {
                field: "optimizer buffers",
                value: s.optimizer_buffers.len().to_string(),
                expected: "one per state buffer of the configured optimizer",
            });
        }
        for buf in &s.optimizer_buffers {
            if buf.len() != n {
                return Err(OptimError::LengthMismatch {
                    what: "optimizer buffer",
                    expected: n,
                    got: buf.len(),
                });
            }
            check_finite("optimizer buffer", buf)?;
        }
        let mut slowmo = self.slowmo.clone();
        slowmo.restore(s.anchor, s.momentum, s.outer_steps)?;
        self.slowmo = slowmo;
        for (dst, src) in self
            .opt
            .state_buffers_mut()
            .into_iter()
            .zip(&s.optimizer_buffers)
        {
            dst.copy_from_slice(src);
        }
        self.opt.set_steps(s.optimizer_steps);
        self.state = PushSum { x: s.x, w: s.w };
        self.steps = s.steps;
        self.rounds = s.rounds;
        self.average_residual = s.average_residual;
        self.z_fresh = false;
        Ok(())
    }

    /// The push-sum state `(x, w)`.
    pub fn push_sum(&self) -> &PushSum {
        &self.state
    }

    /// The push-sum weight `w`.
    pub fn weight(&self) -> f64 {
        self.state.w
    }

    /// Base steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Push-sum rounds started (one per step unless gossip runs in the
    /// background; 0 for bases without push-sum).
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// The outer-step state: anchor, slow momentum, outer steps taken.
    pub fn slowmo(&self) -> &SlowMo {
        &self.slowmo
    }

    /// The base optimizer.
    pub fn optimizer(&self) -> &Optimizer {
        &self.opt
    }

    /// What the compressed exact average has kept back (empty when the run
    /// averages exactly).
    pub fn average_residual(&self) -> &[f32] {
        &self.average_residual
    }

    /// The algorithm this loop runs.
    pub fn algorithm(&self) -> &Algorithm {
        &self.alg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optimizer::OptimizerKind;
    use crate::slowmo::SlowMoConfig;

    /// A single worker whose push-sum round halves `(x, w)` and keeps the rest
    /// (a peer that never answers), counting every call.
    #[derive(Default)]
    struct Lonely {
        calls: Vec<String>,
    }

    impl Exchange for Lonely {
        type Error = ();
        fn average_gradient(&mut self, _: &mut [f32], _: &mut f32) -> Result<(), ()> {
            self.calls.push("grad".into());
            Ok(())
        }
        fn push_sum_round(&mut self, round: u64, _: u64, s: &mut PushSum) -> Result<(), ()> {
            s.scale(0.5);
            self.calls.push(format!("round {round}"));
            Ok(())
        }
        fn round_arrived(&mut self, _: u64) -> Result<bool, ()> {
            Ok(true)
        }
        fn max_rounds(&mut self, rounds: u64) -> Result<u64, ()> {
            Ok(rounds)
        }
        fn drain(&mut self, _: &mut PushSum) -> Result<(), ()> {
            self.calls.push("drain".into());
            Ok(())
        }
        fn exact_average(&mut self, s: &mut PushSum) -> Result<(), ()> {
            self.calls.push("average".into());
            let z = s.debiased();
            s.set_average(&z);
            Ok(())
        }
        /// Alone, with a codec that rounds to halves.
        fn compressed_average(
            &mut self,
            s: &mut PushSum,
            anchor: &[f32],
            residual: &mut [f32],
        ) -> Result<(), ()> {
            self.calls.push("compressed average".into());
            let w = s.w as f32;
            for ((x, a), e) in s.x.iter_mut().zip(anchor).zip(residual.iter_mut()) {
                let g = a * w - *x + *e;
                let d = (g * 2.0).round() / 2.0;
                *e = g - d;
                *x = a - d / w;
            }
            s.w = 1.0;
            Ok(())
        }
        fn average_buffers(&mut self, _: Vec<&mut [f32]>) -> Result<(), ()> {
            self.calls.push("buffers".into());
            Ok(())
        }
    }

    fn alg(base: Base, tau: u64, average: bool) -> Algorithm {
        Algorithm {
            base,
            slowmo: SlowMoConfig {
                tau,
                alpha: 1.0,
                beta: 0.0,
                average,
                buffer_policy: BufferPolicy::Average,
                ..SlowMoConfig::default()
            },
            staleness: 0,
            background_gossip: false,
        }
    }

    fn plain_sgd() -> OptimizerConfig {
        OptimizerConfig {
            kind: OptimizerKind::Sgd,
            momentum: 0.0,
            ..OptimizerConfig::default()
        }
    }

    #[test]
    fn events_come_in_the_algorithms_order() {
        let mut ex = Lonely::default();
        let mut l = OuterLoop::new(alg(Base::Sgp, 2, true), &plain_sgd(), vec![1.0; 3]).unwrap();
        let mut grad = vec![0.0; 3];
        for _ in 0..2 {
            l.step(&mut ex, &mut grad, &mut 0.0, 0.1).unwrap();
        }
        assert_eq!(
            ex.calls,
            ["round 0", "round 1", "drain", "average", "buffers"]
        );
        assert_eq!((l.steps(), l.rounds(), l.weight()), (2, 2, 1.0));
        let mut ex = Lonely::default();
        let mut l = OuterLoop::new(alg(Base::ArSgd, 1, true), &plain_sgd(), vec![1.0]).unwrap();
        l.step(&mut ex, &mut [0.0], &mut 0.0, 0.1).unwrap();
        assert_eq!(
            ex.calls,
            ["grad", "buffers"],
            "ar-sgd has nothing to average"
        );
    }

    #[test]
    fn state_round_trips_and_bad_state_changes_nothing() {
        let mut ex = Lonely::default();
        let opt = OptimizerConfig::default(); // sgd with momentum: one buffer
        let mut a = OuterLoop::new(alg(Base::Osgp, 2, false), &opt, vec![1.0, 2.0]).unwrap();
        for g in [0.5f32, -1.0, 0.25] {
            a.step(&mut ex, &mut [g, g], &mut 0.0, 0.1).unwrap();
        }
        let saved = a.state();
        let mut b = OuterLoop::new(alg(Base::Osgp, 2, false), &opt, vec![0.0, 0.0]).unwrap();
        b.restore(saved.clone()).unwrap();
        assert_eq!(b.state(), saved);
        for l in [&mut a, &mut b] {
            l.step(&mut ex, &mut [1.0, 1.0], &mut 0.0, 0.1).unwrap();
        }
        assert_eq!(
            a.state(),
            b.state(),
            "the restored loop continues identically"
        );
        let fresh = OuterLoop::new(alg(Base::Osgp, 2, false), &opt, vec![0.0, 0.0]).unwrap();
        let bad = [
            LoopState {
                w: 0.0,
                ..saved.clone()
            },
            LoopState {
                x: vec![1.0],
                ..saved.clone()
            },
            LoopState {
                anchor: vec![f32::NAN, 0.0],
                ..saved.clone()
            },
            LoopState {
                optimizer_buffers: vec![],
                ..saved.clone()
            },
            LoopState {
                average_residual: vec![0.0, 0.0],
                ..saved.clone()
            },
        ];
        for s in bad {
            let mut c = fresh.clone();
            assert!(c.restore(s).is_err());
            assert_eq!(c.state(), fresh.state());
        }
    }

    #[test]
    fn the_base_step_moves_the_debiased_point_by_lr() {
        // After one round of the lonely exchange w = 1/2: a plain SGD step of
        // lr moves z = x / w by exactly lr * g, and x by w * lr * g.
        let mut ex = Lonely::default();
        let mut l = OuterLoop::new(alg(Base::Osgp, 100, false), &plain_sgd(), vec![2.0]).unwrap();
        l.step(&mut ex, &mut [0.0], &mut 0.0, 0.5).unwrap();
        assert_eq!((l.push_sum().x[0], l.weight()), (1.0, 0.5));
        assert_eq!(l.params(), &[2.0]);
        // step: z = 2 - 0.5 * 1 = 1.5; x = 0.5 * 1.5 = 0.75; then the round halves it
        l.step(&mut ex, &mut [1.0], &mut 0.0, 0.5).unwrap();
        assert_eq!((l.push_sum().x[0], l.weight()), (0.375, 0.25));
        assert_eq!(l.params(), &[1.5]);
    }

    #[test]
    fn the_compressed_average_sends_what_it_kept_at_the_next_boundary() {
        let mut ex = Lonely::default();
        let mut l = OuterLoop::new(alg(Base::LocalSgd, 1, true), &plain_sgd(), vec![0.0])
            .unwrap()
            .with_compressed_average();
        // x moves to 0.3; the boundary sends -0.5 (0.3 rounded to a half)
        // and keeps 0.2.
        l.step(&mut ex, &mut [-0.3], &mut 0.0, 1.0).unwrap();
        assert_eq!(l.params(), [0.5]);
        let kept = l.state().average_residual[0];
        assert!((kept - 0.2).abs() < 1e-6, "{kept}");
        // A move of 0.2 and the 0.2 kept cancel: the total sent is the
        // total moved, 0.5.
        l.step(&mut ex, &mut [-0.2], &mut 0.0, 1.0).unwrap();
        assert_eq!(l.params(), [0.5]);
        assert!(l.state().average_residual[0].abs() < 1e-6);
        assert_eq!(ex.calls, ["compressed average", "buffers"].repeat(2));
        // The residual is state: it round-trips, and a joiner forgets it.
        let mut b = OuterLoop::new(alg(Base::LocalSgd, 1, true), &plain_sgd(), vec![0.0])
            .unwrap()
            .with_compressed_average();
        b.restore(l.state()).unwrap();
        assert_eq!(b.state(), l.state());
        b.clear_average_residual();
        assert_eq!(b.state().average_residual, [0.0]);
        let plain = OuterLoop::new(alg(Base::LocalSgd, 1, true), &plain_sgd(), vec![0.0]).unwrap();
        assert!(
            plain.clone().restore(l.state()).is_err(),
            "a residual for a run that averages exactly is refused"
        );
    }
}
