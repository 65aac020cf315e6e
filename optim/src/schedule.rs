//! Learning-rate schedules: the base learning rate gamma as a function of the
//! global base-step index.
//!
//! The SlowMo outer step uses the gamma in force at the barrier step (see
//! [`crate::SlowMo::outer_step`]), so a schedule is a pure function of the step
//! and every worker computes the same value without talking to anyone.
//!
//! Textual forms (config files and `--lr-schedule`), which `Display` writes back:
//! `constant`, `warmup:<steps>`, `step:<every>:<factor>`, `cosine`,
//! `cosine:<min_factor>`, `warmup-cosine:<warmup>`, `warmup-cosine:<warmup>:<min_factor>`.

use std::fmt;
use std::str::FromStr;

use crate::error::OptimError;

/// A learning-rate schedule. `step` is the 0-based index of the base step about
/// to be taken; `total_steps` the run's length in base steps.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Schedule {
    /// Always `base_lr`.
    #[default]
    Constant,
    /// Linear warmup: `base_lr * (step + 1) / steps` for the first `steps`
    /// steps (starting at `base_lr / steps`, never 0), then `base_lr`.
    Warmup {
        /// Warmup length in base steps (>= 1).
        steps: u64,
    },
    /// `base_lr * factor^(step / every)` (integer division).
    Step {
        /// Decay period in base steps (>= 1).
        every: u64,
        /// Multiplier per period (> 0).
        factor: f32,
    },
    /// Cosine decay from `base_lr` at step 0 to `base_lr * min_factor` at
    /// `total_steps`.
    Cosine {
        /// Final fraction of `base_lr`, in [0, 1].
        min_factor: f32,
    },
    /// Linear warmup over `warmup` steps (as [`Schedule::Warmup`]), then cosine
    /// decay from `base_lr` at step `warmup` to `base_lr * min_factor` at `total_steps`.
    WarmupCosine {
        /// Warmup length in base steps (>= 1).
        warmup: u64,
        /// Final fraction of `base_lr`, in [0, 1].
        min_factor: f32,
    },
}

/// Linear warmup factor in (0, 1]; `warmup == 0` means no warmup.
fn warmup_factor(step: u64, warmup: u64) -> f64 {
    if step >= warmup {
        1.0
    } else {
        (step + 1) as f64 / warmup as f64
    }
}

/// Cosine factor from 1 at `progress == 0` to `min_factor` at `progress >= 1`.
fn cosine_factor(done: u64, span: u64, min_factor: f32) -> f64 {
    if span == 0 {
        return 1.0;
    }
    let p = (done.min(span) as f64) / span as f64;
    let m = min_factor as f64;
    m + (1.0 - m) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
}

impl Schedule {
    /// Whether the rate at a step depends on the run's total length (the
    /// cosine decays): a run with such a schedule cannot be extended, since
    /// the rates of the steps already taken would differ.
    pub fn depends_on_total(&self) -> bool {
        matches!(self, Self::Cosine { .. } | Self::WarmupCosine { .. })
    }

    /// The learning rate for base step `step` of a run of `total_steps` steps.
    /// Degenerate parameters (a zero period, `total_steps == 0`) fall back to
    /// `base_lr` instead of dividing by zero; [`Schedule::validate`] rejects them
    /// up front.
    pub fn lr(&self, base_lr: f32, step: u64, total_steps: u64) -> f32 {
        let factor = match *self {
            Self::Constant => 1.0,
            Self::Warmup { steps } => warmup_factor(step, steps),
            Self::Step { every, factor } => match step.checked_div(every) {
                None => 1.0,
                Some(k) => (factor as f64).powi(k.min(i32::MAX as u64) as i32),
            },
            Self::Cosine { min_factor } => cosine_factor(step, total_steps, min_factor),
            Self::WarmupCosine { warmup, min_factor } => {
                if step < warmup {
                    warmup_factor(step, warmup)
                } else {
                    cosine_factor(
                        step - warmup,
                        total_steps.saturating_sub(warmup),
                        min_factor,
                    )
                }
            }
        };
        (base_lr as f64 * factor) as f32
    }

    /// Checks the parameters' ranges; the error quotes the textual form.
    pub fn validate(&self) -> Result<(), OptimError> {
        let bad = |reason: &str| OptimError::BadSchedule {
            given: self.to_string(),
            reason: reason.to_string(),
        };
        match *self {
            Self::Constant => Ok(()),
            Self::Warmup { steps: 0 } => Err(bad("warmup steps must be >= 1")),
            Self::WarmupCosine { warmup: 0, .. } => Err(bad("warmup steps must be >= 1")),
            Self::Step { every: 0, .. } => Err(bad("the step period must be >= 1")),
            Self::Step { factor, .. } if !(factor.is_finite() && factor > 0.0) => {
                Err(bad("the step factor must be a finite number > 0"))
            }
            Self::Cosine { min_factor } | Self::WarmupCosine { min_factor, .. }
                if !(0.0..=1.0).contains(&min_factor) =>
            {
                Err(bad("min_factor must be in [0, 1]"))
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Constant => write!(f, "constant"),
            Self::Warmup { steps } => write!(f, "warmup:{steps}"),
            Self::Step { every, factor } => write!(f, "step:{every}:{factor}"),
            Self::Cosine { min_factor: 0.0 } => write!(f, "cosine"),
            Self::Cosine { min_factor } => write!(f, "cosine:{min_factor}"),
            Self::WarmupCosine {
                warmup,
                min_factor: 0.0,
            } => {
                write!(f, "warmup-cosine:{warmup}")
            }
            Self::WarmupCosine { warmup, min_factor } => {
                write!(f, "warmup-cosine:{warmup}:{min_factor}")
            }
        }
    }
}

impl FromStr for Schedule {
    type Err = OptimError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: String| OptimError::BadSchedule {
            given: s.to_string(),
            reason,
        };
        let lower = s.trim().to_ascii_lowercase();
        let parts: Vec<&str> = lower.split(':').map(str::trim).collect();
        let int = |name: &str, v: &str| {
            v.parse::<u64>()
                .map_err(|_| bad(format!("{name} {v:?} is not a non-negative integer")))
        };
        let float = |name: &str, v: &str| {
            v.parse::<f32>()
                .map_err(|_| bad(format!("{name} {v:?} is not a number")))
        };
        let sched = match parts.as_slice() {
            ["constant"] => Self::Constant,
            ["warmup", n] => Self::Warmup {
                steps: int("warmup steps", n)?,
            },
            ["step", every, factor] => Self::Step {
                every: int("step period", every)?,
                factor: float("step factor", factor)?,
            },
            ["cosine"] => Self::Cosine { min_factor: 0.0 },
            ["cosine", m] => Self::Cosine {
                min_factor: float("min_factor", m)?,
            },
            ["warmup-cosine", w] => Self::WarmupCosine {
                warmup: int("warmup steps", w)?,
                min_factor: 0.0,
            },
            ["warmup-cosine", w, m] => Self::WarmupCosine {
                warmup: int("warmup steps", w)?,
                min_factor: float("min_factor", m)?,
            },
            _ => return Err(bad("unknown form".to_string())),
        };
        sched.validate().map_err(|e| match e {
            OptimError::BadSchedule { reason, .. } => bad(reason),
            other => other,
        })?;
        Ok(sched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approx(a: f32, b: f64) {
        assert!(
            ((a as f64) - b).abs() <= 1e-6 * b.abs().max(1e-6),
            "{a} vs {b}"
        );
    }

    #[test]
    fn constant_and_step_values() {
        assert_eq!(Schedule::Constant.lr(0.3, 12345, 10), 0.3);
        let s = Schedule::Step {
            every: 10,
            factor: 0.1,
        };
        approx(s.lr(1.0, 0, 100), 1.0);
        approx(s.lr(1.0, 9, 100), 1.0);
        approx(s.lr(1.0, 10, 100), 0.1);
        approx(s.lr(1.0, 25, 100), 0.01);
    }

    #[test]
    fn warmup_starts_above_zero_and_reaches_base() {
        let s = Schedule::Warmup { steps: 4 };
        let lrs: Vec<f32> = (0..6).map(|k| s.lr(0.4, k, 100)).collect();
        for (got, want) in lrs.iter().zip([0.1, 0.2, 0.3, 0.4, 0.4, 0.4]) {
            approx(*got, want);
        }
        assert!(lrs[0] > 0.0);
        assert!(lrs.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn cosine_values() {
        let s = Schedule::Cosine { min_factor: 0.0 };
        approx(s.lr(2.0, 0, 100), 2.0);
        approx(s.lr(2.0, 50, 100), 1.0);
        approx(s.lr(2.0, 100, 100), 0.0);
        approx(s.lr(2.0, 500, 100), 0.0);
        let s = Schedule::Cosine { min_factor: 0.1 };
        approx(s.lr(1.0, 50, 100), 0.1 + 0.9 * 0.5);
        approx(s.lr(1.0, 100, 100), 0.1);
        // total 0 must not divide by zero
        assert_eq!(s.lr(1.0, 3, 0), 1.0);
    }

    #[test]
    fn warmup_cosine_values() {
        let s = Schedule::WarmupCosine {
            warmup: 10,
            min_factor: 0.0,
        };
        approx(s.lr(1.0, 0, 110), 0.1);
        approx(s.lr(1.0, 9, 110), 1.0);
        approx(s.lr(1.0, 10, 110), 1.0);
        approx(s.lr(1.0, 60, 110), 0.5);
        approx(s.lr(1.0, 110, 110), 0.0);
        // total shorter than warmup: plain warmup, then base
        approx(s.lr(1.0, 20, 5), 1.0);
    }

    #[test]
    fn text_round_trip() {
        for text in [
            "constant",
            "warmup:100",
            "step:500:0.1",
            "cosine",
            "cosine:0.01",
            "warmup-cosine:100",
            "warmup-cosine:100:0.05",
        ] {
            let s: Schedule = text.parse().unwrap();
            assert_eq!(s.to_string(), text);
            assert_eq!(s.to_string().parse::<Schedule>().unwrap(), s);
        }
        assert_eq!(
            "Warmup-Cosine: 100".parse::<Schedule>().unwrap(),
            Schedule::WarmupCosine {
                warmup: 100,
                min_factor: 0.0
            }
        );
    }

    #[test]
    fn bad_strings_name_the_accepted_forms() {
        for text in [
            "linear",
            "warmup",
            "warmup:0",
            "warmup:-3",
            "step:10",
            "step:0:0.1",
            "step:10:0",
            "step:10:abc",
            "cosine:1.5",
            "cosine:0.1:3",
            "",
        ] {
            let e = text.parse::<Schedule>().unwrap_err().to_string();
            assert!(
                e.contains("warmup-cosine:<warmup>") && e.contains("step:<every>:<factor>"),
                "{e}"
            );
            assert!(e.contains(&format!("{text:?}")), "{e}");
        }
        assert!(
            Schedule::Step {
                every: 0,
                factor: 0.5
            }
            .validate()
            .is_err()
        );
        assert!(Schedule::Cosine { min_factor: 0.5 }.validate().is_ok());
    }
}
