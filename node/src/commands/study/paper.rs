//! `slowmo study paper`: plans the runs, runs what is not finished yet,
//! and writes the table and its page.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use slowmo_optim::{OptimizerKind, Preset};
use slowmo_runspec::{DatasetKind, ModelKind, RunConfig, TrainOptions};

use crate::data::{Dataset, Split};
use crate::engine::setup::{build_model, load_dataset};
use crate::engine::simulate::{EveryWorker, Simulation};
use crate::io::outputs::{OutputKind, write_atomically};

use super::args::{PaperArgs, StudyArgs, StudyBase, StudyCommand};
use super::page;
use super::table::{RunResult, Settings, StudyTable, Variant, tabulate};

/// Checks the study's own flags and the training options it leaves to the
/// user; the options come back with the study's defaults filled in.
fn check_args(args: &PaperArgs) -> anyhow::Result<TrainOptions> {
    if args.models.is_empty() {
        bail!("--models needs at least one of mlp, cnn, transformer");
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
        ("--model", o.model.is_some(), "use --models"),
        ("--seed", o.seed.is_some(), "use --seeds N (seeds 1..=N)"),
    ];
    for (flag, given, instead) in set_by_study {
        if given {
            bail!("{flag} (or its key in --config) is set by the study for each run; {instead}");
        }
    }
    // --optimizer sets every base's inner optimizer (the transformer
    // trains with Adam); Local Adam is that already
    if o.optimizer.is_some() && args.bases.contains(&StudyBase::LocalAdam) {
        bail!(
            "--optimizer sets the inner optimizer of every base; local-adam in --bases is Local SGD with Adam already: leave one out"
        );
    }
    o.dataset.get_or_insert(DatasetKind::FashionMnist.into());
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
    let take = |keep: bool| {
        let held = &held;
        dataset
            .train
            .select((0..total).filter(move |&i| held[i] != keep))
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
    let writer = Mutex::new(crate::io::metrics::MetricsWriter::create(
        &dir.join("metrics.jsonl"),
    )?);
    let write_error = Mutex::new(None);
    let every = |worker: usize, r: &crate::engine::train::StepRecord| {
        let mut w = writer.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = w.write_worker(worker, r) {
            write_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(e);
        }
    };
    let summary = Simulation::new(config)
        .dataset(dataset.clone())
        .every_worker(&every as EveryWorker<'_>)
        .run()?;
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
    if let Err(e) = crate::io::report::load(dir)
        .and_then(|d| crate::io::report::write(&d, &dir.join("report.html")))
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
    crate::io::outputs::check_all(&[("--out", Some(args.out.as_path()), OutputKind::Folder)])?;
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
        optimizer: c.optimizer.kind.to_string(),
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
    use slowmo_optim::Base;

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
