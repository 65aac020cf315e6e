//! What every run builds from its configuration before training, shared by
//! the simulator and `slowmo node`: the dataset and the model.

use std::sync::Arc;

use anyhow::Context;

use crate::config::RunConfig;
use crate::data::{self, Dataset};
use crate::model::Model;

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
