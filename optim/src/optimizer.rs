//! Base optimizers over one flat parameter buffer: SGD (heavy-ball or
//! Nesterov momentum, L2 weight decay), Adam and AdamW.
//!
//! The update rules follow PyTorch's `torch.optim` exactly (no dampening, Adam's
//! bias correction with `lr / (1 - beta1^t)` and `sqrt(v) / sqrt(1 - beta2^t) + eps`),
//! so results can be compared with reference runs and with the paper's setups.
//! State buffers are plain `Vec<f32>` aligned element by element with the
//! parameters; the training loop reaches them through [`Optimizer::state_buffers`]
//! to checkpoint them or to exact-average them (the `average` buffer policy).

use crate::error::{OptimError, check_non_negative, check_positive, check_unit_interval};
use crate::wide::wide;

crate::named_enum! {
    /// Which base optimizer to run.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum OptimizerKind: "optimizer" {
        /// SGD with optional heavy-ball / Nesterov momentum and L2 weight decay.
        Sgd = "sgd",
        /// Adam with L2 weight decay added to the gradient.
        Adam = "adam",
        /// Adam with decoupled weight decay (Loshchilov and Hutter).
        Adamw = "adamw",
    }
}

/// Hyper-parameters of the base optimizer (the learning rate comes per step,
/// from a [`crate::Schedule`]). SGD ignores the betas and eps; Adam and AdamW
/// ignore momentum and nesterov.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct OptimizerConfig {
    /// Which optimizer.
    pub kind: OptimizerKind,
    /// SGD momentum in [0, 1); 0 disables the momentum buffer.
    pub momentum: f32,
    /// Nesterov momentum for SGD (needs momentum > 0).
    pub nesterov: bool,
    /// Weight decay >= 0: L2 (added to the gradient) for SGD and Adam, decoupled for AdamW.
    pub weight_decay: f32,
    /// Adam first-moment decay in [0, 1).
    pub beta1: f32,
    /// Adam second-moment decay in [0, 1).
    pub beta2: f32,
    /// Adam denominator term > 0.
    pub eps: f32,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            kind: OptimizerKind::Sgd,
            momentum: 0.9,
            nesterov: false,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

impl OptimizerConfig {
    /// Checks every field's range; the error names the first bad field.
    pub fn validate(&self) -> Result<(), OptimError> {
        check_unit_interval("optimizer.momentum", self.momentum)?;
        check_non_negative("optimizer.weight_decay", self.weight_decay)?;
        check_unit_interval("optimizer.beta1", self.beta1)?;
        check_unit_interval("optimizer.beta2", self.beta2)?;
        check_positive("optimizer.eps", self.eps)?;
        if self.kind == OptimizerKind::Sgd && self.nesterov && self.momentum <= 0.0 {
            return Err(OptimError::InvalidField {
                field: "optimizer.nesterov",
                value: "true".to_string(),
                expected: "false when optimizer.momentum is 0 (Nesterov needs momentum > 0)",
            });
        }
        Ok(())
    }
}

/// Per-kind state buffers.
#[derive(Debug, Clone)]
enum State {
    Sgd {
        momentum: Option<Vec<f32>>,
    },
    Adam {
        exp_avg: Vec<f32>,
        exp_avg_sq: Vec<f32>,
    },
}

/// A base optimizer bound to a parameter buffer of fixed length.
#[derive(Debug, Clone)]
pub struct Optimizer {
    cfg: OptimizerConfig,
    len: usize,
    state: State,
    steps: u64,
}

impl Optimizer {
    /// Validates `cfg` and allocates zeroed state for `len` parameters.
    pub fn new(cfg: &OptimizerConfig, len: usize) -> Result<Self, OptimError> {
        cfg.validate()?;
        let state = match cfg.kind {
            OptimizerKind::Sgd => State::Sgd {
                momentum: (cfg.momentum > 0.0).then(|| vec![0.0; len]),
            },
            OptimizerKind::Adam | OptimizerKind::Adamw => State::Adam {
                exp_avg: vec![0.0; len],
                exp_avg_sq: vec![0.0; len],
            },
        };
        Ok(Self {
            cfg: cfg.clone(),
            len,
            state,
            steps: 0,
        })
    }

    /// One update of `x` with gradient `grad` and learning rate `lr`.
    ///
    /// # Panics
    /// If `x` or `grad` does not have [`Optimizer::len`] elements. The lengths
    /// are fixed by the model when the loop is built, so a mismatch is a bug in
    /// the caller, never bad user input.
    pub fn step(&mut self, x: &mut [f32], grad: &[f32], lr: f32) {
        assert_eq!(x.len(), self.len, "Optimizer::step: parameter length");
        assert_eq!(grad.len(), self.len, "Optimizer::step: gradient length");
        self.steps += 1;
        let wd = self.cfg.weight_decay;
        match &mut self.state {
            State::Sgd { momentum: None } => sgd(x, grad, lr, wd),
            State::Sgd {
                momentum: Some(buf),
            } => {
                let (mu, nesterov) = (self.cfg.momentum, self.cfg.nesterov);
                sgd_momentum(x, grad, buf, lr, wd, mu, nesterov);
            }
            State::Adam {
                exp_avg,
                exp_avg_sq,
            } => {
                let decoupled = self.cfg.kind == OptimizerKind::Adamw;
                let (b1, b2, eps) = (self.cfg.beta1, self.cfg.beta2, self.cfg.eps);
                let t = self.steps as f64;
                let bc1 = 1.0 - (b1 as f64).powf(t);
                let bc2_sqrt = (1.0 - (b2 as f64).powf(t)).sqrt();
                let step_size = (lr as f64 / bc1) as f32;
                let bc2_sqrt = bc2_sqrt as f32;
                let moments = Moments {
                    b1,
                    b2,
                    eps,
                    wd,
                    decoupled,
                    decay: 1.0 - lr * wd,
                    step_size,
                    bc2_sqrt,
                };
                adam(x, grad, exp_avg, exp_avg_sq, moments);
            }
        }
    }

    /// Number of parameters this optimizer updates.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the parameter buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &OptimizerConfig {
        &self.cfg
    }

    /// Names of the state buffers, in the order of [`Optimizer::state_buffers`]:
    /// `["momentum"]` for SGD with momentum, `[]` for plain SGD,
    /// `["exp_avg", "exp_avg_sq"]` for Adam and AdamW.
    pub fn state_names(&self) -> Vec<&'static str> {
        match &self.state {
            State::Sgd { momentum: None } => vec![],
            State::Sgd { momentum: Some(_) } => vec!["momentum"],
            State::Adam { .. } => vec!["exp_avg", "exp_avg_sq"],
        }
    }

    /// The state buffers (each of [`Optimizer::len`] elements), for checkpoints.
    pub fn state_buffers(&self) -> Vec<&[f32]> {
        match &self.state {
            State::Sgd { momentum: None } => vec![],
            State::Sgd { momentum: Some(b) } => vec![b.as_slice()],
            State::Adam {
                exp_avg,
                exp_avg_sq,
            } => vec![exp_avg.as_slice(), exp_avg_sq.as_slice()],
        }
    }

    /// Mutable state buffers, for restoring checkpoints and averaging buffers.
    pub fn state_buffers_mut(&mut self) -> Vec<&mut [f32]> {
        match &mut self.state {
            State::Sgd { momentum: None } => vec![],
            State::Sgd { momentum: Some(b) } => vec![b.as_mut_slice()],
            State::Adam {
                exp_avg,
                exp_avg_sq,
            } => vec![exp_avg.as_mut_slice(), exp_avg_sq.as_mut_slice()],
        }
    }

    /// Steps taken since construction or the last [`Optimizer::reset`]
    /// (Adam's bias-correction counter `t`).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Sets the step counter (checkpoint resume).
    pub fn set_steps(&mut self, n: u64) {
        self.steps = n;
    }

    /// Zeroes every state buffer and the step counter (the `reset` buffer
    /// policy). Adam's bias correction then restarts too, as it must with
    /// zeroed moments.
    pub fn reset(&mut self) {
        for b in self.state_buffers_mut() {
            b.fill(0.0);
        }
        self.steps = 0;
    }
}

/// Adam's constants for one step.
#[derive(Clone, Copy)]
pub(crate) struct Moments {
    pub(crate) b1: f32,
    pub(crate) b2: f32,
    pub(crate) eps: f32,
    pub(crate) wd: f32,
    pub(crate) decoupled: bool,
    /// AdamW's `1 - lr * wd`.
    pub(crate) decay: f32,
    pub(crate) step_size: f32,
    pub(crate) bc2_sqrt: f32,
}

wide! {
    /// Plain SGD: `x -= lr * (g + wd * x)`.
    pub(crate) fn sgd / sgd_portable(x: &mut [f32], grad: &[f32], lr: f32, wd: f32) {
        for (xi, &gi) in x.iter_mut().zip(grad) {
            let d = if wd != 0.0 { gi + wd * *xi } else { gi };
            *xi -= lr * d;
        }
    }
}

wide! {
    /// SGD with (Nesterov) momentum, PyTorch's form.
    pub fn sgd_momentum / sgd_momentum_portable(
        x: &mut [f32],
        grad: &[f32],
        buf: &mut [f32],
        lr: f32,
        wd: f32,
        mu: f32,
        nesterov: bool,
    ) {
        for ((xi, &gi), bi) in x.iter_mut().zip(grad).zip(buf.iter_mut()) {
            let d = if wd != 0.0 { gi + wd * *xi } else { gi };
            *bi = mu * *bi + d;
            let d = if nesterov { d + mu * *bi } else { *bi };
            *xi -= lr * d;
        }
    }
}

wide! {
    /// Adam and AdamW, PyTorch's form.
    pub(crate) fn adam / adam_portable(
        x: &mut [f32],
        grad: &[f32],
        exp_avg: &mut [f32],
        exp_avg_sq: &mut [f32],
        k: Moments,
    ) {
        for (((xi, &gi), mi), vi) in x
            .iter_mut()
            .zip(grad)
            .zip(exp_avg.iter_mut())
            .zip(exp_avg_sq.iter_mut())
        {
            let g = if k.decoupled {
                if k.wd != 0.0 {
                    *xi *= k.decay;
                }
                gi
            } else if k.wd != 0.0 {
                gi + k.wd * *xi
            } else {
                gi
            };
            *mi = k.b1 * *mi + (1.0 - k.b1) * g;
            *vi = k.b2 * *vi + (1.0 - k.b2) * g * g;
            let denom = vi.sqrt() / k.bc2_sqrt + k.eps;
            *xi -= k.step_size * *mi / denom;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(kind: OptimizerKind) -> OptimizerConfig {
        OptimizerConfig {
            kind,
            ..OptimizerConfig::default()
        }
    }

    /// Within a few f32 roundings of the f64 reference.
    fn close(a: f32, b: f64) -> bool {
        ((a as f64) - b).abs() <= 2e-6 * b.abs().max(1e-6)
    }

    #[test]
    fn kind_names_round_trip_and_unknown_lists_choices() {
        for k in OptimizerKind::ALL {
            assert_eq!(k.to_string().parse::<OptimizerKind>().unwrap(), k);
        }
        assert_eq!(
            " AdamW ".parse::<OptimizerKind>().unwrap(),
            OptimizerKind::Adamw
        );
        let e = "rmsprop".parse::<OptimizerKind>().unwrap_err().to_string();
        assert!(
            e.contains("rmsprop") && e.contains("sgd, adam, adamw"),
            "{e}"
        );
    }

    #[test]
    fn validate_names_the_field() {
        let cases: Vec<(OptimizerConfig, &str)> = vec![
            (
                OptimizerConfig {
                    momentum: 1.0,
                    ..Default::default()
                },
                "optimizer.momentum",
            ),
            (
                OptimizerConfig {
                    momentum: -0.1,
                    ..Default::default()
                },
                "optimizer.momentum",
            ),
            (
                OptimizerConfig {
                    weight_decay: -1e-4,
                    ..Default::default()
                },
                "optimizer.weight_decay",
            ),
            (
                OptimizerConfig {
                    beta1: 1.0,
                    ..Default::default()
                },
                "optimizer.beta1",
            ),
            (
                OptimizerConfig {
                    beta2: f32::NAN,
                    ..Default::default()
                },
                "optimizer.beta2",
            ),
            (
                OptimizerConfig {
                    eps: 0.0,
                    ..Default::default()
                },
                "optimizer.eps",
            ),
            (
                OptimizerConfig {
                    momentum: 0.0,
                    nesterov: true,
                    ..Default::default()
                },
                "optimizer.nesterov",
            ),
        ];
        for (c, field) in cases {
            let e = c.validate().unwrap_err();
            assert!(
                matches!(e, OptimError::InvalidField { field: f, .. } if f == field),
                "{e}"
            );
            assert!(e.to_string().contains(field));
            assert!(Optimizer::new(&c, 3).is_err());
        }
        assert!(OptimizerConfig::default().validate().is_ok());
    }

    #[test]
    fn plain_sgd_with_weight_decay_two_steps() {
        let c = OptimizerConfig {
            momentum: 0.0,
            weight_decay: 0.1,
            ..cfg(OptimizerKind::Sgd)
        };
        let mut opt = Optimizer::new(&c, 2).unwrap();
        assert!(opt.state_names().is_empty() && opt.state_buffers().is_empty());
        let mut x = [1.0f32, -2.0];
        opt.step(&mut x, &[0.5, 0.25], 0.1);
        // x -= 0.1 * (g + 0.1 x)
        let e0 = [1.0 - 0.1 * (0.5 + 0.1), -2.0 - 0.1 * (0.25 - 0.2)];
        assert!(close(x[0], e0[0]) && close(x[1], e0[1]), "{x:?}");
        opt.step(&mut x, &[0.5, 0.25], 0.2);
        let e1 = [
            e0[0] - 0.2 * (0.5 + 0.1 * e0[0]),
            e0[1] - 0.2 * (0.25 + 0.1 * e0[1]),
        ];
        assert!(close(x[0], e1[0]) && close(x[1], e1[1]), "{x:?}");
        assert_eq!(opt.steps(), 2);
    }

    #[test]
    fn sgd_momentum_and_nesterov_two_steps() {
        for nesterov in [false, true] {
            let c = OptimizerConfig {
                momentum: 0.9,
                nesterov,
                weight_decay: 0.01,
                ..cfg(OptimizerKind::Sgd)
            };
            let mut opt = Optimizer::new(&c, 1).unwrap();
            assert_eq!(opt.state_names(), vec!["momentum"]);
            let mut x = [2.0f32];
            let (mut xe, mut buf) = (2.0f64, 0.0f64);
            for (g, lr) in [(1.0f64, 0.1f64), (-0.5, 0.05)] {
                opt.step(&mut x, &[g as f32], lr as f32);
                let d = g + 0.01 * xe;
                buf = 0.9 * buf + d;
                let d = if nesterov { d + 0.9 * buf } else { buf };
                xe -= lr * d;
                assert!(close(x[0], xe), "nesterov {nesterov}: {} vs {xe}", x[0]);
                assert!(close(opt.state_buffers()[0][0], buf));
            }
        }
    }

    #[test]
    fn adam_and_adamw_two_steps() {
        for kind in [OptimizerKind::Adam, OptimizerKind::Adamw] {
            let c = OptimizerConfig {
                weight_decay: 0.1,
                ..cfg(kind)
            };
            let mut opt = Optimizer::new(&c, 1).unwrap();
            assert_eq!(opt.state_names(), vec!["exp_avg", "exp_avg_sq"]);
            let mut x = [1.5f32];
            let (mut xe, mut m, mut v) = (1.5f64, 0.0f64, 0.0f64);
            // the f32 hyper-parameters as the optimizer sees them
            let (b1, b2, eps) = (0.9f32 as f64, 0.999f32 as f64, 1e-8f32 as f64);
            for (t, (g, lr)) in [(0.3f64, 0.01f64), (-0.7, 0.02)].into_iter().enumerate() {
                opt.step(&mut x, &[g as f32], lr as f32);
                let t = (t + 1) as i32;
                let g = if kind == OptimizerKind::Adam {
                    g + 0.1 * xe
                } else {
                    xe *= 1.0 - lr * 0.1;
                    g
                };
                m = b1 * m + (1.0 - b1) * g;
                v = b2 * v + (1.0 - b2) * g * g;
                let mhat = m / (1.0 - b1.powi(t));
                let vhat = v / (1.0 - b2.powi(t));
                xe -= lr * mhat / (vhat.sqrt() + eps);
                assert!(close(x[0], xe), "{kind}: {} vs {xe}", x[0]);
                let bufs = opt.state_buffers();
                assert!(close(bufs[0][0], m) && close(bufs[1][0], v));
            }
        }
    }

    #[test]
    fn adam_first_step_moves_by_lr_and_adamw_decay_is_decoupled() {
        // Bias correction makes Adam's first step exactly lr * sign(g) (eps aside).
        let mut opt = Optimizer::new(&cfg(OptimizerKind::Adam), 2).unwrap();
        let mut x = [0.0f32, 0.0];
        opt.step(&mut x, &[3.0, -1e-3], 0.5);
        assert!(
            (x[0] + 0.5).abs() < 1e-5 && (x[1] - 0.5).abs() < 1e-4,
            "{x:?}"
        );
        // AdamW with zero gradient only decays: x (1 - lr wd).
        let c = OptimizerConfig {
            weight_decay: 0.5,
            ..cfg(OptimizerKind::Adamw)
        };
        let mut opt = Optimizer::new(&c, 1).unwrap();
        let mut x = [4.0f32];
        opt.step(&mut x, &[0.0], 0.1);
        assert_eq!(x[0], 4.0 * (1.0 - 0.05));
    }

    #[test]
    fn reset_zeroes_state_and_counter() {
        for kind in OptimizerKind::ALL {
            let mut opt = Optimizer::new(&cfg(kind), 3).unwrap();
            let mut x = [1.0f32, 2.0, 3.0];
            opt.step(&mut x, &[0.1, 0.2, 0.3], 0.1);
            assert!(
                opt.state_buffers()
                    .iter()
                    .all(|b| b.iter().any(|&v| v != 0.0))
            );
            opt.reset();
            assert_eq!(opt.steps(), 0);
            assert!(
                opt.state_buffers()
                    .iter()
                    .all(|b| b.iter().all(|&v| v == 0.0))
            );
            assert_eq!(opt.state_buffers().len(), opt.state_names().len());
        }
    }

    #[test]
    fn state_restore_reproduces_the_trajectory() {
        let c = cfg(OptimizerKind::Adam);
        let mut a = Optimizer::new(&c, 2).unwrap();
        let mut xa = [1.0f32, -1.0];
        a.step(&mut xa, &[0.2, 0.4], 0.01);
        let mut b = Optimizer::new(&c, 2).unwrap();
        for (dst, src) in b.state_buffers_mut().into_iter().zip(a.state_buffers()) {
            dst.copy_from_slice(src);
        }
        b.set_steps(a.steps());
        let mut xb = xa;
        a.step(&mut xa, &[-0.3, 0.1], 0.01);
        b.step(&mut xb, &[-0.3, 0.1], 0.01);
        assert_eq!(xa, xb);
    }

    #[test]
    #[should_panic(expected = "gradient length")]
    fn length_mismatch_panics() {
        let mut opt = Optimizer::new(&OptimizerConfig::default(), 2).unwrap();
        opt.step(&mut [0.0, 0.0], &[1.0], 0.1);
    }
}
