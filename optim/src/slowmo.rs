//! The SlowMo outer step (Wang et al., ICLR 2020, Algorithm 1): every `tau`
//! base steps, heavy-ball (or Nesterov) SGD with learning rate `alpha * gamma_t`
//! and momentum `beta` on the pseudo-gradient `(x_{t,0} - x_{t,tau}) / gamma_t`.
//!
//! [`SlowMo`] holds the anchor `x_{t,0}`, the slow momentum `u` and the count of
//! outer steps. The anchor is captured when the struct is built, before the
//! first base step (fairscale captures it lazily after one, which loses that
//! step's progress from the first pseudo-gradient). In the noaverage variant
//! every worker owns one [`SlowMo`] and feeds it its own de-biased parameters.
//!
//! The base-optimizer buffer policy at an outer iteration is the loop's job (it
//! may need a collective); [`BufferPolicy`] only names the choice.

use crate::error::{OptimError, check_finite, check_positive, check_unit_interval};
use crate::push_sum::PushSum;
use crate::wide::wide;

crate::named_enum! {
    /// What happens to base-optimizer buffers (momentum, Adam moments) at the start
    /// of each outer iteration.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum BufferPolicy: "buffer policy" {
        /// Leave them untouched (the reference code's behaviour; the default).
        Maintain = "maintain",
        /// Zero them (and Adam's step counter): [`crate::Optimizer::reset`].
        Reset = "reset",
        /// Exact-average them over the workers, like the parameters (one more all-reduce).
        Average = "average",
    }
}

/// Settings of the outer loop.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SlowMoConfig {
    /// Base steps per outer iteration (>= 1).
    pub tau: u64,
    /// Slow learning rate (> 0; 1 in the paper).
    pub alpha: f32,
    /// Slow momentum in [0, 1).
    pub beta: f32,
    /// Nesterov outer step instead of heavy-ball.
    pub nesterov: bool,
    /// Exact-average the parameters before the outer step (false: the noaverage variant).
    pub average: bool,
    /// Base-optimizer buffers at each outer iteration.
    pub buffer_policy: BufferPolicy,
}

impl Default for SlowMoConfig {
    /// The paper's SlowMo: tau 12, alpha 1, beta 0.5, heavy-ball, exact average, maintain.
    fn default() -> Self {
        Self {
            tau: crate::DEFAULT_TAU,
            alpha: 1.0,
            beta: 0.5,
            nesterov: false,
            average: true,
            buffer_policy: BufferPolicy::Maintain,
        }
    }
}

impl SlowMoConfig {
    /// Checks tau >= 1, alpha > 0, beta in [0, 1); the error names the field.
    pub fn validate(&self) -> Result<(), OptimError> {
        if self.tau == 0 {
            return Err(OptimError::InvalidField {
                field: "slowmo.tau",
                value: "0".to_string(),
                expected: "an integer >= 1",
            });
        }
        check_positive("slowmo.alpha", self.alpha)?;
        check_unit_interval("slowmo.beta", self.beta)
    }

    /// Whether the outer step leaves the parameters exactly as they are
    /// (alpha = 1, beta = 0: Local SGD, plain SGP, AR-SGD).
    pub fn is_identity(&self) -> bool {
        self.alpha == 1.0 && self.beta == 0.0
    }
}

/// Outer-loop state of one worker: anchor `x_{t,0}`, slow momentum `u`, counter.
#[derive(Debug, Clone, PartialEq)]
pub struct SlowMo {
    cfg: SlowMoConfig,
    anchor: Vec<f32>,
    u: Vec<f32>,
    outer_steps: u64,
}

impl SlowMo {
    /// Starts the outer loop at `x0`: the anchor is `x0`, captured here, before
    /// the first base step; `u = 0`. `cfg` is taken as is; call
    /// [`SlowMoConfig::validate`] (or use [`SlowMo::try_new`]) on user input.
    pub fn new(cfg: SlowMoConfig, x0: &[f32]) -> Self {
        Self {
            cfg,
            anchor: x0.to_vec(),
            u: vec![0.0; x0.len()],
            outer_steps: 0,
        }
    }

    /// [`SlowMo::new`] after validating `cfg`.
    pub fn try_new(cfg: SlowMoConfig, x0: &[f32]) -> Result<Self, OptimError> {
        cfg.validate()?;
        Ok(Self::new(cfg, x0))
    }

    /// One outer step.
    ///
    /// On entry `x` holds `x_{t,tau}` (the exact average, or this worker's own
    /// de-biased parameters in the noaverage variant); on exit `x_{t+1,0}`; the
    /// anchor becomes `x_{t+1,0}`. `gamma` is the base learning rate in force at
    /// the barrier step. With `g = (anchor - x) / gamma`:
    ///
    /// - heavy-ball (default): `u = beta*u + g; x = anchor - alpha*gamma*u`
    /// - Nesterov: `u = beta*u + g; x = anchor - alpha*gamma*(g + beta*u)`
    ///
    /// `u` is kept in gradient units (as PyTorch's SGD keeps its buffer), so when
    /// gamma changes between outer steps (warmup, decay) the momentum carried
    /// from step t moves the parameters by `alpha*gamma_{t+1}*beta*u_t`: its effect
    /// in parameter units is rescaled by `gamma_{t+1}/gamma_t`. With tau = 1 this
    /// is exactly heavy-ball SGD with a schedule.
    ///
    /// When `alpha == 1` and `beta == 0` (either form) the step is the identity:
    /// `x` is left bit-for-bit as given, so Local SGD equals plain periodic
    /// averaging exactly; `u` is still updated (to `g`).
    ///
    /// When `gamma` is not a finite number `> 0` the pseudo-gradient is
    /// undefined; the step then treats it as zero without producing NaN:
    /// `u = beta*u`, and `x = anchor + alpha*(x - anchor)`, the limit of the
    /// update as gamma goes to 0 (with an exact average and lr 0, `x` equals the
    /// anchor and stays there; with alpha = 1 it keeps e.g. gossip's progress).
    /// Arithmetic runs in f64 per element and rounds once to f32.
    ///
    /// # Panics
    /// If `x.len()` differs from the anchor's length (a bug in the caller).
    pub fn outer_step(&mut self, x: &mut [f32], gamma: f32) {
        assert_eq!(
            x.len(),
            self.anchor.len(),
            "SlowMo::outer_step: parameter length"
        );
        let identity = self.cfg.is_identity();
        let (alpha, beta) = (self.cfg.alpha as f64, self.cfg.beta as f64);
        let nesterov = self.cfg.nesterov;
        if gamma.is_finite() && gamma > 0.0 {
            let k = Outer {
                alpha,
                beta,
                gamma: gamma as f64,
                nesterov,
                identity,
            };
            outer(x, &self.anchor, &mut self.u, k);
        } else {
            outer_without_gamma(x, &self.anchor, &mut self.u, alpha, beta, identity);
        }
        self.anchor.copy_from_slice(x);
        self.outer_steps += 1;
    }

    /// The noaverage outer step on push-sum state: de-bias `z = x / w`, run
    /// [`SlowMo::outer_step`] on `z`, and write the result back as `x = w * z`.
    /// When the step is the identity (alpha = 1, beta = 0: plain SGP/OSGP) the
    /// numerator is left untouched, because `w * (x / w)` is not bit-exact in
    /// f32; `u` and the anchor are still updated.
    ///
    /// # Panics
    /// If `ps.len()` differs from the anchor's length (a bug in the caller).
    pub fn outer_step_push_sum(&mut self, ps: &mut PushSum, gamma: f32) {
        let mut z = ps.debiased();
        self.outer_step(&mut z, gamma);
        if !self.cfg.is_identity() {
            ps.set_debiased(&z);
        }
    }

    /// The anchor `x_{t,0}`.
    pub fn anchor(&self) -> &[f32] {
        &self.anchor
    }

    /// The slow momentum `u_t` (gradient units).
    pub fn momentum(&self) -> &[f32] {
        &self.u
    }

    /// Outer steps taken.
    pub fn outer_steps(&self) -> u64 {
        self.outer_steps
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.anchor.len()
    }

    /// Whether the parameter buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.anchor.is_empty()
    }

    /// The configuration.
    pub fn config(&self) -> &SlowMoConfig {
        &self.cfg
    }

    /// Restores checkpointed state. Both buffers must have [`SlowMo::len`]
    /// elements and be finite; on error nothing changes.
    pub fn restore(
        &mut self,
        anchor: Vec<f32>,
        momentum: Vec<f32>,
        outer_steps: u64,
    ) -> Result<(), OptimError> {
        for (what, buf) in [("slowmo anchor", &anchor), ("slowmo momentum", &momentum)] {
            if buf.len() != self.len() {
                return Err(OptimError::LengthMismatch {
                    what,
                    expected: self.len(),
                    got: buf.len(),
                });
            }
            check_finite(what, buf)?;
        }
        self.anchor = anchor;
        self.u = momentum;
        self.outer_steps = outer_steps;
        Ok(())
    }

    /// Replaces the anchor, keeping `u` (e.g. when the loop re-synchronises
    /// parameters after a membership change). Length-checked.
    pub fn set_anchor(&mut self, x: &[f32]) -> Result<(), OptimError> {
        if x.len() != self.len() {
            return Err(OptimError::LengthMismatch {
                what: "slowmo anchor",
                expected: self.len(),
                got: x.len(),
            });
        }
        self.anchor.copy_from_slice(x);
        Ok(())
    }
}

/// The outer step's constants.
#[derive(Clone, Copy)]
pub(crate) struct Outer {
    pub(crate) alpha: f64,
    pub(crate) beta: f64,
    pub(crate) gamma: f64,
    pub(crate) nesterov: bool,
    pub(crate) identity: bool,
}

wide! {
    /// The outer step with a learning rate `gamma > 0`, per element in `f64`.
    pub(crate) fn outer / outer_portable(x: &mut [f32], anchor: &[f32], u: &mut [f32], k: Outer) {
        for ((xi, &ai), ui) in x.iter_mut().zip(anchor).zip(u.iter_mut()) {
            let anchor = ai as f64;
            let g = (anchor - *xi as f64) / k.gamma;
            let u = k.beta * *ui as f64 + g;
            *ui = u as f32;
            if !k.identity {
                let dir = if k.nesterov { g + k.beta * u } else { u };
                *xi = (anchor - k.alpha * k.gamma * dir) as f32;
            }
        }
    }
}

wide! {
    /// The outer step's limit as `gamma` goes to 0.
    pub(crate) fn outer_without_gamma / outer_without_gamma_portable(
        x: &mut [f32],
        anchor: &[f32],
        u: &mut [f32],
        alpha: f64,
        beta: f64,
        identity: bool,
    ) {
        for ((xi, &ai), ui) in x.iter_mut().zip(anchor).zip(u.iter_mut()) {
            *ui = (beta * *ui as f64) as f32;
            if !identity {
                let anchor = ai as f64;
                *xi = (anchor + alpha * (*xi as f64 - anchor)) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(alpha: f32, beta: f32, nesterov: bool) -> SlowMoConfig {
        SlowMoConfig {
            alpha,
            beta,
            nesterov,
            ..SlowMoConfig::default()
        }
    }

    fn approx(a: f32, b: f64) {
        assert!(
            ((a as f64) - b).abs() <= 1e-6 * b.abs().max(1e-3),
            "{a} vs {b}"
        );
    }

    #[test]
    fn policy_names_round_trip() {
        for p in BufferPolicy::ALL {
            assert_eq!(p.to_string().parse::<BufferPolicy>().unwrap(), p);
        }
        let e = "keep".parse::<BufferPolicy>().unwrap_err().to_string();
        assert!(e.contains("maintain, reset, average"), "{e}");
    }

    #[test]
    fn validate_names_the_field() {
        let bad = [
            (
                SlowMoConfig {
                    tau: 0,
                    ..Default::default()
                },
                "slowmo.tau",
            ),
            (cfg(0.0, 0.5, false), "slowmo.alpha"),
            (cfg(f32::INFINITY, 0.5, false), "slowmo.alpha"),
            (cfg(1.0, 1.0, false), "slowmo.beta"),
            (cfg(1.0, -0.5, false), "slowmo.beta"),
        ];
        for (c, field) in bad {
            let e = c.validate().unwrap_err();
            assert!(e.to_string().contains(field), "{e}");
            assert!(SlowMo::try_new(c, &[0.0]).is_err());
        }
        assert!(SlowMoConfig::default().validate().is_ok());
    }

    #[test]
    fn anchor_is_captured_at_construction() {
        let x0 = vec![1.0f32, -2.0, 0.5];
        let mut x = x0.clone();
        let mut sm = SlowMo::new(cfg(1.0, 0.5, false), &x);
        // base steps happen after construction
        for v in x.iter_mut() {
            *v -= 0.25;
        }
        assert_eq!(sm.anchor(), &x0[..]);
        sm.outer_step(&mut x, 0.5);
        // g = 0.25/0.5 = 0.5; u = 0.5; x = x0 - 1*0.5*0.5
        for (xi, a) in x.iter().zip(&x0) {
            approx(*xi, *a as f64 - 0.25);
        }
        assert!(sm.momentum().iter().all(|&u| u == 0.5));
        assert_eq!(sm.anchor(), &x[..]);
        assert_eq!(sm.outer_steps(), 1);
    }

    #[test]
    fn gamma_change_rescales_carried_momentum() {
        // Warmup over 4 steps to 0.4 with tau = 2: gamma_0 = lr at step 1 = 0.2,
        // gamma_1 = lr at step 3 = 0.4.
        let sched = crate::Schedule::Warmup { steps: 4 };
        let (g0, g1) = (sched.lr(0.4, 1, 100), sched.lr(0.4, 3, 100));
        approx(g0, 0.2);
        approx(g1, 0.4);
        let mut sm = SlowMo::new(cfg(1.0, 0.5, false), &[1.0]);
        let mut x = [0.9f32]; // x_{0,tau}
        sm.outer_step(&mut x, g0);
        // g = 0.1/0.2 = 0.5; u1 = 0.5; x1 = 1 - 0.2*0.5 = 0.9
        approx(sm.momentum()[0], 0.5);
        approx(x[0], 0.9);
        let mut x = [0.7f32]; // x_{1,tau}: the base steps moved 0.2
        sm.outer_step(&mut x, g1);
        // g = 0.2/0.4 = 0.5; u2 = 0.5*0.5 + 0.5 = 0.75; x2 = 0.9 - 0.4*0.75 = 0.6.
        // The carried 0.25 moves x by 0.4*0.25 = 0.1, twice the 0.2*0.25 it
        // would with constant gamma: rescaled by gamma_1/gamma_0 = 2.
        approx(sm.momentum()[0], 0.75);
        approx(x[0], 0.6);
    }

    #[test]
    fn nesterov_outer_step_by_hand() {
        let mut sm = SlowMo::new(cfg(0.8, 0.6, true), &[2.0, -1.0]);
        let mut x = [1.5f32, -0.5];
        sm.outer_step(&mut x, 0.5);
        // g = (0.5/0.5, -0.5/0.5) = (1, -1); u = g; x = a - 0.8*0.5*(g + 0.6 u) = a - 0.64 g
        approx(x[0], 2.0 - 0.64);
        approx(x[1], -1.0 + 0.64);
        let (a, u1) = ([2.0 - 0.64, -1.0 + 0.64], [1.0, -1.0]);
        let mut x = [x[0] - 0.1, x[1] + 0.3];
        sm.outer_step(&mut x, 0.25);
        for i in 0..2 {
            let xt = [a[0] - 0.1, a[1] + 0.3][i];
            let g = (a[i] - xt) / 0.25;
            let u = 0.6 * u1[i] + g;
            approx(sm.momentum()[i], u);
            approx(x[i], a[i] - 0.8 * 0.25 * (g + 0.6 * u));
        }
    }

    #[test]
    fn identity_config_is_bit_exact_for_both_forms() {
        for nesterov in [false, true] {
            let mut sm = SlowMo::new(cfg(1.0, 0.0, nesterov), &[0.1, 0.2, 0.3]);
            let xt = [0.123_456_79f32, -7.654_321, 1e-7];
            let mut x = xt;
            sm.outer_step(&mut x, 0.03);
            assert_eq!(x, xt);
            assert_eq!(sm.anchor(), &xt[..]);
            approx(
                sm.momentum()[0],
                (0.1 - 0.123_456_79f32 as f64) / 0.03f32 as f64,
            );
        }
        // Far-apart magnitudes: anchor - gamma * ((anchor - x) / gamma) would
        // lose x entirely even in f64; the identity must not do arithmetic.
        let mut sm = SlowMo::new(cfg(1.0, 0.0, false), &[1e30, -3.0e20]);
        let mut x = [1e-30f32, 7.0];
        sm.outer_step(&mut x, 0.1);
        assert_eq!(x, [1e-30, 7.0]);
        assert!(sm.momentum().iter().all(|u| u.is_finite()));
    }

    #[test]
    fn zero_or_bad_gamma_gives_no_nan() {
        for gamma in [0.0f32, -0.1, f32::NAN, f32::INFINITY] {
            let mut sm = SlowMo::new(cfg(0.5, 0.5, false), &[1.0]);
            sm.restore(vec![1.0], vec![2.0], 3).unwrap();
            let mut x = [1.0f32];
            sm.outer_step(&mut x, gamma);
            assert_eq!(x[0], 1.0, "gamma {gamma}: lr 0 leaves x at the anchor");
            assert_eq!(sm.momentum()[0], 1.0, "gamma {gamma}: u = beta u");
            let mut x = [0.0f32];
            sm.outer_step(&mut x, gamma);
            assert_eq!(x[0], 0.5, "gamma {gamma}: x = anchor + alpha (x - anchor)");
            assert_eq!(sm.outer_steps(), 5);
        }
        // identity config keeps x as given even then
        let mut sm = SlowMo::new(cfg(1.0, 0.0, false), &[1.0]);
        let mut x = [0.25f32];
        sm.outer_step(&mut x, 0.0);
        assert_eq!((x[0], sm.momentum()[0]), (0.25, 0.0));
    }

    #[test]
    fn restore_checks_lengths_and_finiteness() {
        let mut sm = SlowMo::new(SlowMoConfig::default(), &[0.0; 3]);
        let e = sm.restore(vec![0.0; 2], vec![0.0; 3], 1).unwrap_err();
        assert_eq!(
            e,
            OptimError::LengthMismatch {
                what: "slowmo anchor",
                expected: 3,
                got: 2
            }
        );
        let e = sm.restore(vec![0.0; 3], vec![0.0; 4], 1).unwrap_err();
        assert!(e.to_string().contains("slowmo momentum"), "{e}");
        let e = sm
            .restore(vec![0.0; 3], vec![0.0, f32::NAN, 0.0], 1)
            .unwrap_err();
        assert!(matches!(e, OptimError::NonFinite { index: 1, .. }), "{e}");
        assert_eq!(sm.outer_steps(), 0);
        sm.restore(vec![1.0; 3], vec![2.0; 3], 7).unwrap();
        assert_eq!(
            (sm.anchor(), sm.momentum(), sm.outer_steps()),
            (&[1.0; 3][..], &[2.0; 3][..], 7)
        );
        assert!(sm.set_anchor(&[0.0; 2]).is_err());
        sm.set_anchor(&[3.0; 3]).unwrap();
        assert_eq!(sm.anchor(), &[3.0; 3]);
    }
}
