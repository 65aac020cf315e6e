//! Named algorithms of the paper as settings of one loop.
//!
//! Every algorithm is a base (how workers communicate during the tau base
//! steps) plus a SlowMo outer step. Buffer policy is `maintain` everywhere.
//!
//! | preset    | base                  | staleness | tau | alpha | beta | average | note |
//! |-----------|-----------------------|-----------|-----|-------|------|---------|------|
//! | ar-sgd    | ar-sgd                | 0         | 1   | 1     | 0    | yes     | all-reduce every step |
//! | local-sgd | local-sgd             | 0         | 12  | 1     | 0    | yes     | periodic exact averaging |
//! | sgp       | sgp                   | 0         | 12  | 1     | 0    | no      | push-sum gossip, never exact-averages |
//! | osgp      | osgp                  | 1         | 12  | 1     | 0    | no      | overlapping gossip, one round of staleness |
//! | bmuf      | local-sgd             | 0         | 12  | 1     | 0.5  | yes     | block momentum, heavy-ball |
//! | lookahead | local-sgd             | 0         | 5   | 0.5   | 0    | yes     | Lookahead k = 5 (exact Lookahead when m = 1) |
//! | slowmo    | chosen (sgp/osgp/...) | 0 (1 for osgp) | 12 | 1 | 0.5 | yes   | the paper's SlowMo |
//!
//! With alpha = 1 and beta = 0 the outer step is the identity, so the first
//! four presets are the plain base algorithms.

use crate::error::OptimError;
use crate::slowmo::{BufferPolicy, SlowMoConfig};

/// Base steps per outer iteration in the paper's image experiments.
pub const DEFAULT_TAU: u64 = 12;

crate::named_enum! {
    /// How workers communicate during the base steps.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum Base: "base algorithm" {
        /// Exact average of gradients (or parameters) every step.
        ArSgd = "ar-sgd",
        /// No communication between outer steps.
        LocalSgd = "local-sgd",
        /// Synchronous push-sum gossip every step.
        Sgp = "sgp",
        /// Overlapping push-sum gossip with bounded staleness.
        Osgp = "osgp",
    }
}

impl Base {
    /// Whether the base steps gossip with push-sum (SGP, OSGP).
    pub fn uses_push_sum(self) -> bool {
        matches!(self, Self::Sgp | Self::Osgp)
    }

    /// The staleness bound this base runs with by default (1 for OSGP, else 0).
    pub fn default_staleness(self) -> u64 {
        u64::from(self == Self::Osgp)
    }
}

crate::named_enum! {
    /// A named algorithm from the paper.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum Preset: "preset" {
        /// AllReduce-SGD.
        ArSgd = "ar-sgd",
        /// Local SGD.
        LocalSgd = "local-sgd",
        /// Stochastic Gradient Push.
        Sgp = "sgp",
        /// Overlap SGP.
        Osgp = "osgp",
        /// Block-wise model-update filtering.
        Bmuf = "bmuf",
        /// Lookahead.
        Lookahead = "lookahead",
        /// SlowMo on a chosen base.
        Slowmo = "slowmo",
    }
}

/// A fully specified algorithm: base, outer loop and staleness bound.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Algorithm {
    /// Communication during base steps.
    pub base: Base,
    /// The outer loop.
    pub slowmo: SlowMoConfig,
    /// Rounds a worker may run ahead of its in-peers' messages (0 = synchronous).
    pub staleness: u64,
    /// OSGP only: gossip rounds advance at their own pace instead of one per
    /// step. A step never waits for a peer; it mixes in a round's shares once
    /// all of them have arrived and then starts the next round, so a slow
    /// link or a slow peer slows the mixing, not the stepping. Rounds stay
    /// coupled (round g + 1 starts after round g's shares arrived), which
    /// keeps push-sum weights balanced. Barriers first bring every worker to
    /// the same round.
    #[serde(default)]
    pub background_gossip: bool,
}

impl Algorithm {
    /// Validates the outer-loop settings.
    pub fn validate(&self) -> Result<(), OptimError> {
        self.slowmo.validate()
    }
}

impl Preset {
    /// The settings of this preset (see the module table). `base_for_slowmo`
    /// is used only by [`Preset::Slowmo`]; its staleness follows the base.
    pub fn algorithm(self, base_for_slowmo: Base) -> Algorithm {
        let outer = |tau: u64, alpha: f32, beta: f32, average: bool| SlowMoConfig {
            tau,
            alpha,
            beta,
            nesterov: false,
            average,
            buffer_policy: BufferPolicy::Maintain,
        };
        let (base, slowmo) = match self {
            Self::ArSgd => (Base::ArSgd, outer(1, 1.0, 0.0, true)),
            Self::LocalSgd => (Base::LocalSgd, outer(DEFAULT_TAU, 1.0, 0.0, true)),
            Self::Sgp => (Base::Sgp, outer(DEFAULT_TAU, 1.0, 0.0, false)),
            Self::Osgp => (Base::Osgp, outer(DEFAULT_TAU, 1.0, 0.0, false)),
            Self::Bmuf => (Base::LocalSgd, outer(DEFAULT_TAU, 1.0, 0.5, true)),
            Self::Lookahead => (Base::LocalSgd, outer(5, 0.5, 0.0, true)),
            Self::Slowmo => (base_for_slowmo, outer(DEFAULT_TAU, 1.0, 0.5, true)),
        };
        Algorithm {
            base,
            slowmo,
            staleness: base.default_staleness(),
            background_gossip: false,
        }
    }

    /// One line for `--help` and the README.
    pub fn describe(self) -> &'static str {
        match self {
            Self::ArSgd => "AllReduce-SGD: exact average every step (tau 1, no slow momentum)",
            Self::LocalSgd => "Local SGD: tau local steps, then an exact average (alpha 1, beta 0)",
            Self::Sgp => {
                "Stochastic Gradient Push: push-sum gossip every step, never exact-averages"
            }
            Self::Osgp => "Overlap SGP: gossip overlapped with compute, staleness bound 1",
            Self::Bmuf => "BMUF: Local SGD with block momentum 0.5 (SlowMo with a Local SGD base)",
            Self::Lookahead => {
                "Lookahead (k = 5, alpha 0.5): slow weights pulled halfway to fast weights"
            }
            Self::Slowmo => "SlowMo: base steps, exact average every 12 steps, slow momentum 0.5",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_lists_choices() {
        for p in Preset::ALL {
            assert_eq!(p.to_string().parse::<Preset>().unwrap(), p);
            assert!(!p.describe().is_empty());
        }
        for b in Base::ALL {
            assert_eq!(b.to_string().parse::<Base>().unwrap(), b);
        }
        let e = "easgd".parse::<Preset>().unwrap_err().to_string();
        assert!(
            e.contains("easgd") && e.contains("lookahead, slowmo"),
            "{e}"
        );
        let e = "gossip".parse::<Base>().unwrap_err().to_string();
        assert!(e.contains("local-sgd, sgp, osgp"), "{e}");
    }

    /// serde names (config files) agree with the Display/FromStr names (flags).
    #[test]
    fn serde_names_match_display() {
        use serde::Deserialize;
        use serde::de::IntoDeserializer;
        use serde::de::value::Error;
        fn de<'a, T: Deserialize<'a>>(s: &'a str) -> T {
            T::deserialize(IntoDeserializer::<Error>::into_deserializer(s)).unwrap()
        }
        for p in Preset::ALL {
            assert_eq!(de::<Preset>(p.as_str()), p);
        }
        for b in Base::ALL {
            assert_eq!(de::<Base>(b.as_str()), b);
        }
        for b in BufferPolicy::ALL {
            assert_eq!(de::<BufferPolicy>(b.as_str()), b);
        }
        for k in crate::OptimizerKind::ALL {
            assert_eq!(de::<crate::OptimizerKind>(k.as_str()), k);
        }
    }

    #[test]
    fn preset_table() {
        type Row = (Preset, Base, u64, u64, f32, f32, bool);
        let rows: [Row; 6] = [
            (Preset::ArSgd, Base::ArSgd, 0, 1, 1.0, 0.0, true),
            (Preset::LocalSgd, Base::LocalSgd, 0, 12, 1.0, 0.0, true),
            (Preset::Sgp, Base::Sgp, 0, 12, 1.0, 0.0, false),
            (Preset::Osgp, Base::Osgp, 1, 12, 1.0, 0.0, false),
            (Preset::Bmuf, Base::LocalSgd, 0, 12, 1.0, 0.5, true),
            (Preset::Lookahead, Base::LocalSgd, 0, 5, 0.5, 0.0, true),
        ];
        for (p, base, staleness, tau, alpha, beta, average) in rows {
            let a = p.algorithm(Base::Osgp);
            assert_eq!((a.base, a.staleness), (base, staleness), "{p}");
            let s = &a.slowmo;
            assert_eq!(
                (s.tau, s.alpha, s.beta, s.average, s.nesterov),
                (tau, alpha, beta, average, false),
                "{p}"
            );
            assert_eq!(s.buffer_policy, BufferPolicy::Maintain);
            assert_eq!(s.is_identity(), beta == 0.0 && alpha == 1.0);
            a.validate().unwrap();
        }
        for (base, staleness) in [(Base::Sgp, 0), (Base::Osgp, 1), (Base::LocalSgd, 0)] {
            let a = Preset::Slowmo.algorithm(base);
            assert_eq!((a.base, a.staleness), (base, staleness));
            assert_eq!(a.slowmo, SlowMoConfig::default());
        }
        assert!(Base::Sgp.uses_push_sum() && Base::Osgp.uses_push_sum());
        assert!(!Base::ArSgd.uses_push_sum() && !Base::LocalSgd.uses_push_sum());
    }
}
