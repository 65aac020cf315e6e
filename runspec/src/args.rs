//! The training part of every command line that starts a run: `--config
//! FILE` plus one flag per training option.

use std::path::PathBuf;

use crate::options::{ConfigError, TrainOptions};
use crate::resolve::RunConfig;

/// `--config FILE` and the training flags, which override the file. Used by
/// `slowmo simulate`, `slowmo node`, `slowmo topology sweep` and
/// `slowmo-testnet local`, so they all layer settings the same way.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// TOML file with training settings (flags override it). Every node of a
    /// run must resolve to the same settings.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub train: TrainOptions,
}

impl ConfigArgs {
    /// The file's settings (if any) with every flag given overlaid, before
    /// defaults; for commands that set some options themselves.
    pub fn options(&self) -> Result<TrainOptions, ConfigError> {
        // Before the overlay, which goes through TOML and would fail vaguely.
        self.train.check_paths()?;
        match &self.config {
            Some(path) => TrainOptions::from_file(path)?.overlaid(&self.train),
            None => Ok(self.train.clone()),
        }
    }

    /// File, then flags, then defaults and validation.
    pub fn resolve(&self) -> Result<RunConfig, ConfigError> {
        self.options()?.resolve()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use slowmo_optim::Base;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: ConfigArgs,
    }

    fn parse(argv: &[&str]) -> Result<ConfigArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("slowmo").chain(argv.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn boolean_options_are_switches() {
        let a = parse(&["--no-average", "--nesterov-outer", "--nesterov"]).unwrap();
        assert_eq!(a.train.no_average, Some(true));
        assert_eq!(a.train.nesterov_outer, Some(true));
        assert_eq!(a.train.nesterov, Some(true));
        assert_eq!(a.train.background_gossip, None);
        let a = parse(&["--background-gossip", "--no-average=false"]).unwrap();
        assert_eq!(a.train.background_gossip, Some(true));
        assert_eq!(a.train.no_average, Some(false));
        // the old spelling with a separate value is refused, not misread
        assert!(parse(&["--no-average", "true"]).is_err());
    }

    #[test]
    fn negative_numbers_reach_validation() {
        let a = parse(&["--lr", "-1"]).unwrap();
        let e = a.resolve().unwrap_err().to_string();
        assert!(e.contains("lr") && e.contains("positive"), "{e}");
        let a = parse(&["--beta", "-0.5"]).unwrap();
        assert!(a.resolve().unwrap_err().to_string().contains("beta"));
    }

    #[test]
    fn flags_override_the_file_and_the_file_fills_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(&path, "preset = \"osgp\"\nbeta = 0.2\nsteps = 50\n").unwrap();
        let path = path.to_str().unwrap();
        let c = parse(&["--config", path, "--beta", "0.4", "--background-gossip"])
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(c.algorithm.base, Base::Osgp);
        assert_eq!(c.algorithm.slowmo.beta, 0.4);
        assert!(c.algorithm.background_gossip);
        assert_eq!(c.steps, 50);
        let e = parse(&["--config", "/no/such/run.toml"])
            .unwrap()
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("/no/such/run.toml"), "{e}");
    }
}
