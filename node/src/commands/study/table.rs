//! The study's figures: each run's result, their mean and spread over
//! seeds, the beta validation chooses, and the table they make.

use serde::{Deserialize, Serialize};
use slowmo_runspec::{DatasetKind, ModelKind};

use super::args::StudyBase;

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
    /// Held-out losses of the averaged model (the transformer's measure).
    pub validation_loss_mean: f64,
    pub validation_loss_std: f64,
    pub test_loss_mean: f64,
    pub test_loss_std: f64,
    /// For a beta of the grid: whether validation chose it.
    pub chosen: bool,
}

fn aggregate(variant: &Variant, runs: &[&RunResult]) -> Aggregate {
    let of =
        |f: fn(&RunResult) -> f32| -> Vec<f64> { runs.iter().map(|r| f64::from(f(r))).collect() };
    let (va, vs) = mean_std(&of(|r| r.validation_accuracy));
    let (ta, ts) = mean_std(&of(|r| r.test_accuracy));
    let (la, ls) = mean_std(&of(|r| r.final_train_loss));
    let (vla, vls) = mean_std(&of(|r| r.validation_loss));
    let (tla, tls) = mean_std(&of(|r| r.test_loss));
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
        validation_loss_mean: vla,
        validation_loss_std: vls,
        test_loss_mean: tla,
        test_loss_std: tls,
        chosen: false,
    }
}

/// What validation ranks a model's runs by: the language model by its
/// held-out loss (lower is better), the classifiers by accuracy.
pub fn choice_score(a: &Aggregate) -> f64 {
    match a.model {
        ModelKind::Transformer => -a.validation_loss_mean,
        _ => a.validation_accuracy_mean,
    }
}

/// The grid's beta with the best mean validation figure (accuracy, or
/// loss for the transformer: [`choice_score`]; the first of equals, in grid
/// order); no test figure is read.
pub fn choose_beta(grid: &[Aggregate]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, a) in grid.iter().enumerate() {
        if a.beta.is_none() || !choice_score(a).is_finite() {
            continue;
        }
        if best.is_none_or(|b| choice_score(a) > choice_score(&grid[b])) {
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
    /// The inner optimizer of every base but Local Adam (sgd unless
    /// `--optimizer` says otherwise), with `sgd_lr` as its learning rate.
    pub optimizer: String,
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
            validation_loss_mean: 1.0 - val,
            validation_loss_std: 0.0,
            test_loss_mean: 1.0 - test,
            test_loss_std: 0.0,
            chosen: false,
        }
    }

    #[test]
    fn the_language_model_is_chosen_by_validation_loss() {
        let mut grid = [agg(Some(0.3), 0.5, 0.5), agg(Some(0.5), 0.6, 0.5)];
        for a in &mut grid {
            a.model = ModelKind::Transformer;
        }
        // the higher accuracy has the higher loss here: loss decides
        grid[1].validation_loss_mean = 2.0;
        grid[0].validation_loss_mean = 1.5;
        assert_eq!(choose_beta(&grid), Some(0));
        grid[0].model = ModelKind::Mlp;
        grid[1].model = ModelKind::Mlp;
        assert_eq!(choose_beta(&grid), Some(1));
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
}
