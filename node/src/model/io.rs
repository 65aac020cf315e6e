//! Parameters as safetensors: one little-endian f32 tensor per layout entry,
//! so the file opens in PyTorch (`safetensors.torch.load_file`) as a
//! `state_dict` of the same architecture.

use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::{ModelError, ParamSpec};

fn file_err(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::File {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

pub(super) fn save(
    layout: &[ParamSpec],
    params: &[f32],
    path: &Path,
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<(), ModelError> {
    let bytes: Vec<Vec<u8>> = layout
        .iter()
        .map(|s| {
            params[s.range()]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        })
        .collect();
    let views = layout
        .iter()
        .zip(&bytes)
        .map(|(s, b)| {
            Ok((
                s.name.clone(),
                TensorView::new(Dtype::F32, s.shape.clone(), b)?,
            ))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()
        .map_err(|e| file_err(path, e.to_string()))?;
    let bytes = safetensors::serialize(views, metadata)
        .map_err(|e| file_err(path, format!("encoding safetensors failed: {e}")))?;
    crate::io::outputs::write_atomically(path, &bytes)
        .map_err(|e| file_err(path, format!("writing failed: {e}")))
}

pub(super) fn load(
    layout: &[ParamSpec],
    num_params: usize,
    path: &Path,
) -> Result<Vec<f32>, ModelError> {
    let bytes = std::fs::read(path).map_err(|e| file_err(path, format!("cannot read: {e}")))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| file_err(path, format!("not a valid safetensors file: {e}")))?;
    if let Some(extra) = file
        .names()
        .into_iter()
        .find(|n| !layout.iter().any(|s| s.name == *n))
    {
        return Err(file_err(
            path,
            format!("unexpected tensor {extra:?}: this model has no parameter of that name"),
        ));
    }
    let mut params = vec![0.0f32; num_params];
    for spec in layout {
        let view = file
            .tensor(&spec.name)
            .map_err(|_| file_err(path, format!("missing tensor {:?}", spec.name)))?;
        if view.dtype() != Dtype::F32 {
            return Err(file_err(
                path,
                format!(
                    "tensor {:?} has dtype {:?}, expected F32",
                    spec.name,
                    view.dtype()
                ),
            ));
        }
        if view.shape() != spec.shape.as_slice() {
            return Err(file_err(
                path,
                format!(
                    "tensor {:?} has shape {:?}, expected {:?}",
                    spec.name,
                    view.shape(),
                    spec.shape
                ),
            ));
        }
        for (p, chunk) in params[spec.range()]
            .iter_mut()
            .zip(view.data().chunks_exact(4))
        {
            *p = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
    }
    Ok(params)
}
