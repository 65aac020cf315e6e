//! What every run builds from its configuration before training, shared by
//! the simulator and `slowmo node`: the dataset and the model, together a
//! [`Workload`], the configuration's built-in one or the caller's own.

use std::sync::Arc;

use anyhow::Context;
use candle_core::Device;

use crate::config::RunConfig;
use crate::data::{self, Dataset, TrainData};
use crate::model::{Learner, Model};

/// Builds a run's model on a device (each worker builds its own).
pub type ModelFactory = dyn Fn(&Device) -> anyhow::Result<Box<dyn Learner>> + Send + Sync;

/// What a run trains: a dataset and the model for it.
///
/// [`Workload::from_config`] is what `slowmo simulate` and `slowmo node`
/// train (`--model`, `--dataset`); [`Workload::custom`] takes a model and
/// data from the caller, for [`crate::engine::simulate::Simulation::workload`]
/// and [`crate::commands::node::run_with`] (see
/// `node/examples/custom_model.rs`).
#[derive(Clone)]
pub struct Workload {
    /// The training and evaluation splits.
    pub dataset: Arc<dyn TrainData>,
    model: Arc<ModelFactory>,
}

impl Workload {
    /// The configuration's dataset and built-in model.
    pub fn from_config(config: &RunConfig) -> anyhow::Result<Self> {
        Ok(Self::configured(config, load_dataset(config)?))
    }

    /// The configuration's built-in model over `dataset` (the study trains
    /// on a training split with a validation part held out of it).
    pub fn configured(config: &RunConfig, dataset: Arc<Dataset>) -> Self {
        let config = config.clone();
        let ds = dataset.clone();
        Self {
            dataset,
            model: Arc::new(move |device| {
                Ok(Box::new(build_model(&config, &ds, device)?) as Box<dyn Learner>)
            }),
        }
    }

    /// A caller's own model, built by `model` on the run's device, over its
    /// own data (a [`Dataset`] of its samples or any [`TrainData`]).
    pub fn custom(
        dataset: impl TrainData + 'static,
        model: impl Fn(&Device) -> anyhow::Result<Box<dyn Learner>> + Send + Sync + 'static,
    ) -> Self {
        Self {
            dataset: Arc::new(dataset),
            model: Arc::new(model),
        }
    }

    /// The model on `device`, checked against the dataset: it must read
    /// samples of the dataset's length and have parameters.
    pub fn build(&self, device: &Device) -> anyhow::Result<Box<dyn Learner>> {
        let model = (self.model)(device)?;
        let (reads, holds) = (model.sample_len(), self.dataset.sample_len());
        if reads != holds {
            anyhow::bail!(
                "the model reads samples of {reads} values; dataset {} holds samples of {holds}",
                self.dataset.name()
            );
        }
        if model.num_params() == 0 {
            anyhow::bail!("the model has no parameters");
        }
        let mut end = 0;
        for spec in model.layout() {
            if spec.offset != end {
                anyhow::bail!(
                    "the model's layout puts {} at offset {}; the tensors before it end at {end}",
                    spec.name,
                    spec.offset
                );
            }
            end += spec.numel();
        }
        Ok(model)
    }
}

/// Loads the dataset a configuration names.
pub fn load_dataset(config: &RunConfig) -> anyhow::Result<Arc<Dataset>> {
    let ds = match (
        config.dataset,
        config.transformer,
        config.data_dir.as_deref(),
    ) {
        (data::DatasetKind::Text, Some(shape), Some(path)) => data::text::load(path, shape.context),
        _ => data::load(config.dataset, config.data_dir.as_deref(), config.seed),
    }
    .with_context(|| format!("loading dataset {}", config.dataset))?;
    Ok(Arc::new(ds))
}

/// Builds the model of a configuration for a dataset's samples and classes.
pub fn build_model(
    config: &RunConfig,
    ds: &Dataset,
    device: &candle_core::Device,
) -> anyhow::Result<Model> {
    if let Some(shape) = config.transformer {
        if ds.sample_len() != shape.context + 1 {
            anyhow::bail!(
                "dataset {} has samples of {} tokens, the transformer of context {} reads {}",
                ds.name,
                ds.sample_len(),
                shape.context,
                shape.context + 1
            );
        }
        return Ok(Model::transformer(shape, ds.classes, device)?);
    }
    Ok(Model::new(
        config.model,
        &config.hidden,
        ds.channels,
        ds.height,
        ds.width,
        ds.classes,
        device,
    )?)
}
