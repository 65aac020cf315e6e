//! The arguments of `slowmo study` and the bases a study compares.

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use slowmo_optim::{Base, Preset};
use slowmo_runspec::{ConfigArgs, ModelKind};

/// Arguments of `slowmo study`.
#[derive(Debug, clap::Args)]
pub struct StudyArgs {
    #[command(subcommand)]
    pub command: StudyCommand,
}

/// The studies.
#[derive(Debug, clap::Subcommand)]
pub enum StudyCommand {
    /// Every base with and without slow momentum, over seeds and models,
    /// beta chosen on a validation split: a table of mean +- std.
    Paper(Box<PaperArgs>),
}

/// Arguments of `slowmo study paper`.
#[derive(Debug, Clone, clap::Args)]
pub struct PaperArgs {
    /// Models, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "mlp,cnn")]
    pub models: Vec<ModelKind>,
    /// Bases, comma separated: local-sgd, sgp, osgp, ar-sgd, local-adam.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "local-sgd,sgp,osgp,ar-sgd,local-adam"
    )]
    pub bases: Vec<StudyBase>,
    /// Slow momentum grid, comma separated, each in (0, 1); the plain base
    /// runs besides.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.7")]
    pub betas: Vec<f32>,
    /// Seeds per configuration (seeds 1..=N).
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    pub seeds: i64,
    /// Training samples held out (by a permutation drawn from the seed) as
    /// the validation split that chooses beta.
    #[arg(long, default_value_t = 5000, allow_negative_numbers = true)]
    pub validation: i64,
    /// Learning rate of Local Adam (`--lr` sets the SGD bases').
    #[arg(long, default_value_t = 0.001, allow_negative_numbers = true)]
    pub adam_lr: f32,
    /// Output folder: the tables, the page and a folder per run.
    #[arg(long, default_value = "study-paper")]
    pub out: PathBuf,
    /// Print one line per finished run only at the end of each.
    #[arg(long)]
    pub quiet: bool,
    /// Training settings shared by every run (the study sets preset, base,
    /// beta, model and seed itself; `--optimizer` sets every base's inner
    /// optimizer, without local-adam in --bases). Defaults here: dataset
    /// fashion-mnist, 4 workers, 600 steps, an evaluation every 150 steps.
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// A base of the study.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StudyBase {
    LocalSgd,
    Sgp,
    Osgp,
    ArSgd,
    LocalAdam,
}

impl StudyBase {
    const ALL: [StudyBase; 5] = [
        Self::LocalSgd,
        Self::Sgp,
        Self::Osgp,
        Self::ArSgd,
        Self::LocalAdam,
    ];

    /// The name on the command line and in folder names.
    pub fn name(self) -> &'static str {
        match self {
            Self::LocalSgd => "local-sgd",
            Self::Sgp => "sgp",
            Self::Osgp => "osgp",
            Self::ArSgd => "ar-sgd",
            Self::LocalAdam => "local-adam",
        }
    }

    /// The name in tables.
    pub fn label(self) -> &'static str {
        match self {
            Self::LocalSgd => "Local SGD",
            Self::Sgp => "SGP",
            Self::Osgp => "OSGP",
            Self::ArSgd => "AR-SGD",
            Self::LocalAdam => "Local Adam",
        }
    }

    pub(super) fn base(self) -> Base {
        match self {
            Self::LocalSgd | Self::LocalAdam => Base::LocalSgd,
            Self::Sgp => Base::Sgp,
            Self::Osgp => Base::Osgp,
            Self::ArSgd => Base::ArSgd,
        }
    }

    /// The preset of the plain base.
    pub(super) fn preset(self) -> Preset {
        match self {
            Self::LocalSgd | Self::LocalAdam => Preset::LocalSgd,
            Self::Sgp => Preset::Sgp,
            Self::Osgp => Preset::Osgp,
            Self::ArSgd => Preset::ArSgd,
        }
    }
}

impl std::fmt::Display for StudyBase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StudyBase {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|b| b.name() == s.trim())
            .ok_or_else(|| {
                format!(
                    "unknown base {s:?}; expected one of {}",
                    Self::ALL.map(Self::name).join(", ")
                )
            })
    }
}
