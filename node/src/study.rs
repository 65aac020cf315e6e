//! `slowmo study paper`: the paper's comparison with error bars. Every base
//! (Local SGD, SGP, OSGP, AR-SGD, Local Adam) runs in the simulator without
//! slow momentum and with each slow momentum of a small grid, over several
//! seeds and models; the grid's beta is chosen per model and base by the
//! mean accuracy on a validation split held out of the training set, and
//! only the chosen beta's test accuracy is reported.
//!
//! Each run is one [`simulate_dataset`] call on the training set minus the
//! validation split; its folder (`runs/KEY/`: `metrics.jsonl`,
//! `summary.json`, `report.html`, `result.json`) is a simulate output that
//! `slowmo report` reads. A run whose `result.json` exists is not run again,
//! so an interrupted study resumes where it stopped.

mod page;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use slowmo_optim::{Base, OptimizerKind, Preset};
use slowmo_runspec::{ConfigArgs, DatasetKind, ModelKind, RunConfig, TrainOptions};

use crate::data::{Dataset, Split};
use crate::outputs::{OutputKind, write_atomically};
use crate::simulate::{EveryWorker, build_model, load_dataset, simulate_dataset};

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
    /// beta, optimizer, model and seed itself). Defaults here: dataset
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

    fn base(self) -> Base {
        match self {
            Self::LocalSgd | Self::LocalAdam => Base::LocalSgd,
            Self::Sgp => Base::Sgp,
            Self::Osgp => Base::Osgp,
            Self::ArSgd => Base::ArSgd,
        }
    }

    /// The preset of the plain base.
    fn preset(self) -> Preset {
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

/// One configuration of the study, before the seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Variant {
    pub model: ModelKind,
    pub base: StudyBase,
    /// `None`: the plain base; `Some(beta)`: SlowMo over it.
    pub beta: Option<f32>,
}

impl Variant {
    /// The folder name of this variant's run with `seed`.
    pub fn key(&self, seed: u64) -> String {
        let v = match self.beta {
            None => "plain".to_string(),
            Some(b) => format!("beta{b}"),
        };
        format!("{}-{}-{v}-seed{seed}", self.model, self.base)
    }
}

/// What one run left: the figures the tables are made of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub model: ModelKind,
    pub base: StudyBase,
    /// Slow momentum; absent for the plain base.
    pub beta: Option<f32>,
    pub seed: u64,
    /// The resolved configuration's hash: a folder of other settings is
    /// never taken for this run.
    pub config_hash: String,
    pub validation_samples: usize,
    /// Of the exactly averaged final model on the validation split.
    pub validation_accuracy: f32,
    pub validation_loss: f32,
    /// Of the same model on the test set.
    pub test_accuracy: f32,
    pub test_loss: f32,
    /// Mean over workers of the last 50 mini-batch losses.
    pub final_train_loss: f32,
    pub wall_seconds: f64,
}

/// Mean and sample standard deviation (n - 1; 0 for one value).
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// A configuration's figures over its seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Aggregate {
    pub model: ModelKind,
    pub base: StudyBase,
    pub beta: Option<f32>,
    pub seeds: usize,
    pub validation_accuracy_mean: f64,
    pub validation_accuracy_std: f64,
    pub test_accuracy_mean: f64,
    pub test_accuracy_std: f64,
    pub train_loss_mean: f64,
    pub train_loss_std: f64,
    /// For a beta of the grid: whether validation chose it.
    pub chosen: bool,
}

fn aggregate(variant: &Variant, runs: &[&RunResult]) -> Aggregate {
    let of =
        |f: fn(&RunResult) -> f32| -> Vec<f64> { runs.iter().map(|r| f64::from(f(r))).collect() };
    let (va, vs) = mean_std(&of(|r| r.validation_accuracy));
    let (ta, ts) = mean_std(&of(|r| r.test_accuracy));
    let (la, ls) = mean_std(&of(|r| r.final_train_loss));
    Aggregate {
        model: variant.model,
        base: variant.base,
        beta: variant.beta,
        seeds: runs.len(),
        validation_accuracy_mean: va,
        validation_accuracy_std: vs,
        test_accuracy_mean: ta,
        test_accuracy_std: ts,
        train_loss_mean: la,
        train_loss_std: ls,
        chosen: false,
    }
}

/// The grid's beta with the highest mean validation accuracy (the first of
/// equals, in grid order); only `validation_accuracy_mean` is read.
pub fn choose_beta(grid: &[Aggregate]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, a) in grid.iter().enumerate() {
        if a.beta.is_none() || !a.validation_accuracy_mean.is_finite() {
            continue;
        }
        if best.is_none_or(|b| a.validation_accuracy_mean > grid[b].validation_accuracy_mean) {
            best = Some(i);
        }
    }
    best
}

/// One line of the main table: a base, plain and with the chosen beta.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub model: ModelKind,
    pub base: StudyBase,
    pub plain: Option<Aggregate>,
    pub slowmo: Option<Aggregate>,
}

/// The study's outcome: every configuration and the comparisons.
#[derive(Debug, Clone, Serialize)]
pub struct StudyTable {
    pub settings: Settings,
    pub comparisons: Vec<Comparison>,
    pub grid: Vec<Aggregate>,
    pub runs: Vec<RunResult>,
}

/// The settings every run shares, for the tables' caption.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub dataset: DatasetKind,
    pub workers: usize,
    pub steps: u64,
    pub batch_size: usize,
    pub tau: u64,
    pub sgd_lr: f32,
    pub sgd_momentum: f32,
    pub adam_lr: f32,
    pub hidden: Vec<usize>,
    pub seeds: u64,
    pub betas: Vec<f32>,
    pub validation_samples: usize,
    pub train_samples: usize,
    pub test_samples: usize,
}

/// Builds the table from the runs' results: aggregates per configuration,
/// beta chosen per model and base by validation accuracy.
pub fn tabulate(settings: Settings, variants: &[Variant], runs: Vec<RunResult>) -> StudyTable {
    let mut grid = Vec::new();
    let mut comparisons = Vec::new();
    let mut groups: Vec<(ModelKind, StudyBase)> = Vec::new();
    for v in variants {
        if !groups.contains(&(v.model, v.base)) {
            groups.push((v.model, v.base));
        }
    }
    for (model, base) in groups {
        let mut plain = None;
        let mut betas = Vec::new();
        for v in variants
            .iter()
            .filter(|v| v.model == model && v.base == base)
        {
            let mine: Vec<&RunResult> = runs
                .iter()
                .filter(|r| r.model == model && r.base == base && r.beta == v.beta)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let a = aggregate(v, &mine);
            match v.beta {
                None => plain = Some(a),
                Some(_) => betas.push(a),
            }
        }
        let chosen = choose_beta(&betas);
        if let Some(i) = chosen {
            betas[i].chosen = true;
        }
        let slowmo = chosen.map(|i| betas[i].clone());
        grid.extend(plain.clone());
        grid.extend(betas);
        comparisons.push(Comparison {
            model,
            base,
            plain,
            slowmo,
        });
    }
    StudyTable {
        settings,
        comparisons,
        grid,
        runs,
    }
}

/// Checks the study's own flags and the training options it leaves to the
/// user; the options come back with the study's defaults filled in.
fn check_args(args: &PaperArgs) -> anyhow::Result<TrainOptions> {
    if args.models.is_empty() {
        bail!("--models needs at least one of mlp, cnn");
    }
    if args.bases.is_empty() {
        bail!("--bases needs at least one of local-sgd, sgp, osgp, ar-sgd, local-adam");
    }
    if args.betas.is_empty() {
        bail!("--betas needs at least one slow momentum in (0, 1)");
    }
    for &b in &args.betas {
        if !(b > 0.0 && b < 1.0) {
            bail!(
                "--betas {b}: a slow momentum of the grid must be in (0, 1) (the plain base, beta 0, always runs)"
            );
        }
    }
    for (i, b) in args.betas.iter().enumerate() {
        if args.betas[..i].contains(b) {
            bail!("--betas lists {b} twice");
        }
    }
    for (i, m) in args.models.iter().enumerate() {
        if args.models[..i].contains(m) {
            bail!("--models lists {m} twice");
        }
    }
    for (i, b) in args.bases.iter().enumerate() {
        if args.bases[..i].contains(b) {
            bail!("--bases lists {b} twice");
        }
    }
    if args.seeds < 1 {
        bail!("--seeds {}: needs at least 1 seed", args.seeds);
    }
    if args.seeds > 1000 {
        bail!("--seeds {}: at most 1000", args.seeds);
    }
    if args.validation < 1 {
        bail!(
            "--validation {}: the validation split needs at least 1 sample",
            args.validation
        );
    }
    if !(args.adam_lr.is_finite() && args.adam_lr > 0.0) {
        bail!("--adam-lr {}: must be a positive number", args.adam_lr);
    }
    let mut o = args.config.options()?;
    let set_by_study = [
        (
            "--preset",
            o.preset.is_some(),
            "the study runs each base's preset and SlowMo over it",
        ),
        ("--base", o.base.is_some(), "use --bases"),
        ("--beta", o.beta.is_some(), "use --betas"),
        (
            "--no-average",
            o.no_average.is_some(),
            "each base keeps its own averaging",
        ),
        (
            "--optimizer",
            o.optimizer.is_some(),
            "Local Adam is the Adam base (local-adam in --bases)",
        ),
        ("--model", o.model.is_some(), "use --models"),
        ("--seed", o.seed.is_some(), "use --seeds N (seeds 1..=N)"),
    ];
    for (flag, given, instead) in set_by_study {
        if given {
            bail!("{flag} (or its key in --config) is set by the study for each run; {instead}");
        }
    }
    o.dataset.get_or_insert(DatasetKind::FashionMnist);
    o.workers.get_or_insert(4);
    let steps = *o.steps.get_or_insert(600);
    o.eval_every.get_or_insert(steps.div_ceil(4));
    Ok(o)
}

/// The options of one run.
fn run_options(shared: &TrainOptions, v: &Variant, seed: u64, adam_lr: f32) -> TrainOptions {
    let mut o = shared.clone();
    o.model = Some(v.model);
    o.seed = Some(seed);
    match v.beta {
        None => {
            o.preset = Some(v.base.preset());
            // AR-SGD averages every step: a shared --tau is the outer
            // period of the others.
            if v.base == StudyBase::ArSgd {
                o.tau = None;
            }
        }
        Some(beta) => {
            o.preset = Some(Preset::Slowmo);
            o.base = Some(v.base.base());
            o.beta = Some(beta);
        }
    }
    if v.base == StudyBase::LocalAdam {
        o.optimizer = Some(OptimizerKind::Adam);
        o.lr = Some(adam_lr);
    }
    o
}

/// Holds `n` training samples out as a validation split, chosen by a
/// permutation drawn from `seed`: the dataset that remains (its training
/// split without them, in their order; the same test split) and the
/// validation split.
pub fn hold_out(dataset: &Dataset, n: usize, seed: u64) -> anyhow::Result<(Dataset, Split)> {
    let total = dataset.train.len();
    if n == 0 || n >= total {
        bail!(
            "--validation {n}: the training set holds {total} samples; the validation split needs at least 1 and must leave some to train on"
        );
    }
    let mut order: Vec<usize> = (0..total).collect();
    slowmo_optim::Rng::derive(seed, 0x5641_4c49).shuffle(&mut order); // "VALI"
    let mut held = vec![false; total];
    for &i in &order[..n] {
        held[i] = true;
    }
    let len = dataset.train.sample_len();
    let take = |keep: bool| {
        let mut s = Split::default();
        for i in (0..total).filter(|&i| held[i] != keep) {
            s.images
                .extend_from_slice(&dataset.train.images[i * len..(i + 1) * len]);
            s.labels.push(dataset.train.labels[i]);
        }
        s
    };
    let train = take(true);
    let validation = take(false);
    Ok((
        Dataset {
            train,
            ..dataset.clone()
        },
        validation,
    ))
}

/// Where run `key`'s files go.
fn run_dir(out: &Path, key: &str) -> PathBuf {
    out.join("runs").join(key)
}

/// The result of a finished run with these settings, if its folder holds one.
fn finished(
    dir: &Path,
    config: &RunConfig,
    validation: usize,
) -> anyhow::Result<Option<RunResult>> {
    let path = dir.join("result.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let r: RunResult = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a study result; remove its folder to run it again",
            path.display()
        )
    })?;
    if r.config_hash != config.hash() || r.validation_samples != validation {
        bail!(
            "{} holds a run of other settings (another --steps, --workers, --validation, ...); \
             use another --out or remove that folder",
            path.display()
        );
    }
    Ok(Some(r))
}

/// Runs one configuration in the simulator and writes its folder.
fn run_one(
    config: &RunConfig,
    v: &Variant,
    dataset: Arc<Dataset>,
    validation: &Split,
    dir: &Path,
) -> anyhow::Result<RunResult> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let writer = Mutex::new(crate::metrics::MetricsWriter::create(
        &dir.join("metrics.jsonl"),
    )?);
    let write_error = Mutex::new(None);
    let every = |worker: usize, r: &crate::train::StepRecord| {
        let mut w = writer.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = w.write_worker(worker, r) {
            write_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(e);
        }
    };
    let summary = simulate_dataset(
        config,
        dataset.clone(),
        &crate::checkpoint::CheckpointArgs::default(),
        None,
        None,
        &mut |_| {},
        Some(&every as EveryWorker<'_>),
    )?;
    if let Some(e) = write_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e.context(format!("writing {}", dir.join("metrics.jsonl").display())));
    }
    writer
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .finish()
        .with_context(|| format!("writing {}", dir.join("metrics.jsonl").display()))?;
    let mut model = build_model(config, &dataset, &candle_core::Device::Cpu)?;
    let val = model.evaluate(
        &summary.averaged_params,
        validation,
        dataset.sample_len(),
        500,
    )?;
    let json = serde_json::to_vec_pretty(&summary)?;
    write_atomically(&dir.join("summary.json"), &json)
        .with_context(|| format!("writing {}", dir.join("summary.json").display()))?;
    let result = RunResult {
        model: v.model,
        base: v.base,
        beta: v.beta,
        seed: config.seed,
        config_hash: config.hash(),
        validation_samples: validation.len(),
        validation_accuracy: val.accuracy,
        validation_loss: val.loss,
        test_accuracy: summary.test_accuracy,
        test_loss: summary.test_loss,
        final_train_loss: summary.final_train_loss,
        wall_seconds: summary.wall_seconds,
    };
    // the run's own page; a failure here costs the page, not the run
    if let Err(e) =
        crate::report::load(dir).and_then(|d| crate::report::write(&d, &dir.join("report.html")))
    {
        tracing::warn!("{}: no report page: {e:#}", dir.display());
    }
    // last: its presence marks the run as done
    write_atomically(
        &dir.join("result.json"),
        &serde_json::to_vec_pretty(&result)?,
    )
    .with_context(|| format!("writing {}", dir.join("result.json").display()))?;
    Ok(result)
}

/// The variants in the order they run: per model, per base, plain first.
pub fn variants(models: &[ModelKind], bases: &[StudyBase], betas: &[f32]) -> Vec<Variant> {
    let mut out = Vec::new();
    for &model in models {
        for &base in bases {
            out.push(Variant {
                model,
                base,
                beta: None,
            });
            for &b in betas {
                out.push(Variant {
                    model,
                    base,
                    beta: Some(b),
                });
            }
        }
    }
    out
}

/// `slowmo study paper`.
pub fn run_paper(args: PaperArgs) -> anyhow::Result<StudyTable> {
    let shared = check_args(&args)?;
    crate::outputs::check_all(&[("--out", Some(args.out.as_path()), OutputKind::Folder)])?;
    let validation = args.validation as usize;
    let seeds: Vec<u64> = (1..=args.seeds as u64).collect();
    let variants = variants(&args.models, &args.bases, &args.betas);
    // every run's settings first: a bad one fails before anything trains
    let mut plan = Vec::new();
    for v in &variants {
        for &seed in &seeds {
            let config = run_options(&shared, v, seed, args.adam_lr)
                .resolve()
                .with_context(|| format!("the settings of run {}", v.key(seed)))?;
            plan.push((*v, config));
        }
    }
    plan[0]
        .1
        .check_workers(&slowmo_runspec::Resources::of_this_machine())?;
    let mut loaded: HashMap<u64, Arc<Dataset>> = HashMap::new();
    let mut split_of: HashMap<u64, (Arc<Dataset>, Arc<Split>)> = HashMap::new();
    let mut runs = Vec::new();
    let mut sizes = (0, 0);
    let total = plan.len();
    for (i, (v, config)) in plan.iter().enumerate() {
        let key = v.key(config.seed);
        let dir = run_dir(&args.out, &key);
        if let Some(r) = finished(&dir, config, validation)? {
            if !args.quiet {
                println!("[{:>3}/{total}] {key}: done before, skipped", i + 1);
            }
            runs.push(r);
            continue;
        }
        // the files' data ignore the seed: load them once
        let data_key = if config.dataset == DatasetKind::Synthetic {
            config.seed
        } else {
            0
        };
        let all = match loaded.entry(data_key) {
            Entry::Occupied(e) => e.get().clone(),
            Entry::Vacant(e) => e.insert(load_dataset(config)?).clone(),
        };
        let (train, val) = match split_of.entry(config.seed) {
            Entry::Occupied(e) => e.get().clone(),
            Entry::Vacant(e) => {
                let (train, val) = hold_out(&all, validation, config.seed)?;
                e.insert((Arc::new(train), Arc::new(val))).clone()
            }
        };
        sizes = (train.train.len(), train.test.len());
        let r = run_one(config, v, train, &val, &dir).with_context(|| format!("run {key}"))?;
        if !args.quiet {
            println!(
                "[{:>3}/{total}] {key}: validation {:.4}  test {:.4}  train loss {:.4}  ({:.1} s)",
                i + 1,
                r.validation_accuracy,
                r.test_accuracy,
                r.final_train_loss,
                r.wall_seconds
            );
        }
        runs.push(r);
    }
    if sizes == (0, 0) {
        // every run was done before: the sizes from the data
        let ds = load_dataset(&plan[0].1)?;
        sizes = (
            ds.train.len() - validation.min(ds.train.len()),
            ds.test.len(),
        );
    }
    // SlowMo over Local SGD shows the shared settings (the first run may
    // be AR-SGD's tau 1 or Local Adam's learning rate)
    let reference = Variant {
        model: args.models[0],
        base: StudyBase::LocalSgd,
        beta: Some(args.betas[0]),
    };
    let c = &run_options(&shared, &reference, 1, args.adam_lr).resolve()?;
    let settings = Settings {
        dataset: c.dataset,
        workers: c.workers,
        steps: c.steps,
        batch_size: c.batch_size,
        tau: c.algorithm.slowmo.tau,
        sgd_lr: c.lr,
        sgd_momentum: c.optimizer.momentum,
        adam_lr: args.adam_lr,
        hidden: c.hidden.clone(),
        seeds: seeds.len() as u64,
        betas: args.betas.clone(),
        validation_samples: validation,
        train_samples: sizes.0,
        test_samples: sizes.1,
    };
    let table = tabulate(settings, &variants, runs);
    page::write_all(&table, &args.out)?;
    Ok(table)
}

/// `slowmo study`.
pub fn run(args: StudyArgs) -> anyhow::Result<()> {
    match args.command {
        StudyCommand::Paper(a) => {
            let out = a.out.clone();
            let table = run_paper(*a)?;
            println!("{}", page::markdown(&table));
            println!(
                "wrote {} ({{table.md, table.csv, study.json, report.html}} and runs/)",
                out.display()
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agg(beta: Option<f32>, val: f64, test: f64) -> Aggregate {
        Aggregate {
            model: ModelKind::Mlp,
            base: StudyBase::Sgp,
            beta,
            seeds: 3,
            validation_accuracy_mean: val,
            validation_accuracy_std: 0.0,
            test_accuracy_mean: test,
            test_accuracy_std: 0.0,
            train_loss_mean: 0.5,
            train_loss_std: 0.0,
            chosen: false,
        }
    }

    #[test]
    fn beta_is_chosen_by_validation_never_by_test() {
        // validation prefers 0.5, test prefers 0.8: the choice is 0.5
        let grid = [
            agg(Some(0.3), 0.80, 0.80),
            agg(Some(0.5), 0.85, 0.70),
            agg(Some(0.8), 0.82, 0.95),
        ];
        assert_eq!(choose_beta(&grid), Some(1));
        // equals: the first in grid order
        let tie = [agg(Some(0.3), 0.9, 0.1), agg(Some(0.5), 0.9, 0.9)];
        assert_eq!(choose_beta(&tie), Some(0));
        assert_eq!(choose_beta(&[agg(None, 0.9, 0.9)]), None);
    }

    #[test]
    fn sample_std_over_seeds() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0]);
        assert!((m - 2.0).abs() < 1e-12 && (s - 1.0).abs() < 1e-12);
        assert_eq!(mean_std(&[4.0]), (4.0, 0.0));
    }

    #[test]
    fn held_out_split_is_disjoint_deterministic_and_seeded() {
        let ds = crate::data::load(DatasetKind::Synthetic, None, 1).unwrap();
        let (rest, val) = hold_out(&ds, 500, 7).unwrap();
        assert_eq!(val.len(), 500);
        assert_eq!(rest.train.len() + 500, ds.train.len());
        assert_eq!(rest.test, ds.test);
        let (again, val_again) = hold_out(&ds, 500, 7).unwrap();
        assert_eq!((again.train, val_again.clone()), (rest.train.clone(), val));
        let (_, other) = hold_out(&ds, 500, 8).unwrap();
        assert_ne!(other, val_again);
        // no validation image is among the training images left
        let len = ds.sample_len();
        let train: std::collections::HashSet<Vec<u32>> = (0..rest.train.len())
            .map(|i| {
                rest.train
                    .image(i)
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect()
            })
            .collect();
        assert!((0..val_again.len()).all(|i| {
            !train.contains(
                &val_again.image(i).unwrap()[..len]
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>(),
            )
        }));
        let e = hold_out(&ds, ds.train.len(), 1).unwrap_err().to_string();
        assert!(e.contains("--validation"), "{e}");
    }

    #[test]
    fn plain_and_slowmo_runs_resolve_to_their_algorithms() {
        let shared = TrainOptions {
            tau: Some(6),
            ..TrainOptions::default()
        };
        let v = |base, beta| Variant {
            model: ModelKind::Mlp,
            base,
            beta,
        };
        let ar = run_options(&shared, &v(StudyBase::ArSgd, None), 1, 0.002)
            .resolve()
            .unwrap();
        assert_eq!(
            (ar.algorithm.slowmo.tau, ar.algorithm.slowmo.beta),
            (1, 0.0)
        );
        let sgp = run_options(&shared, &v(StudyBase::Sgp, None), 1, 0.002)
            .resolve()
            .unwrap();
        assert!(!sgp.algorithm.slowmo.average);
        let slow = run_options(&shared, &v(StudyBase::Osgp, Some(0.7)), 2, 0.002)
            .resolve()
            .unwrap();
        assert_eq!(slow.algorithm.base, Base::Osgp);
        assert_eq!(
            (slow.algorithm.slowmo.tau, slow.algorithm.slowmo.beta),
            (6, 0.7)
        );
        assert!(slow.algorithm.slowmo.average && slow.seed == 2);
        let adam = run_options(&shared, &v(StudyBase::LocalAdam, Some(0.5)), 1, 0.002)
            .resolve()
            .unwrap();
        assert_eq!(adam.lr, 0.002);
        assert_eq!(adam.algorithm.base, Base::LocalSgd);
    }
}
