//! Tensor lookup with shape checks: every tensor an architecture reads is
//! checked against the shape its hyper-parameters give before it is used,
//! and a mismatch names both the tensor and the metadata keys.

use infer_compute::pipeline::{Norm, NormType};
use infer_compute::QuantWeight;

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// Tensor `name`, which must have `expected` extents (ggml order: values
/// per row first); `because` names the metadata the shape comes from.
///
/// # Errors
/// [`Error::MissingTensor`]; [`Error::TensorShape`].
pub(crate) fn shaped(g: &GgufFile, name: &str, expected: &[usize], because: &str) -> Result<QuantWeight> {
    let t = g.tensor(name).ok_or_else(|| Error::MissingTensor(name.to_string()))?;
    let exp: Vec<u64> = expected.iter().map(|&d| d as u64).collect();
    if t.dims != exp {
        return Err(Error::TensorShape {
            tensor: name.to_string(),
            found: t.dims.clone(),
            expected: exp,
            because: because.to_string(),
        });
    }
    g.tensor_weight(t)
}

/// [`shaped`] for a tensor that may be absent.
pub(crate) fn opt_shaped(g: &GgufFile, name: &str, expected: &[usize], because: &str) -> Result<Option<QuantWeight>> {
    if g.tensor(name).is_some() {
        shaped(g, name, expected, because).map(Some)
    } else {
        Ok(None)
    }
}

/// A matrix of `rows` rows of `cols` values.
pub(crate) fn matrix(g: &GgufFile, name: &str, rows: usize, cols: usize, because: &str) -> Result<QuantWeight> {
    shaped(g, name, &[cols, rows], because)
}

/// An RMSNorm over a weight vector of `len` values.
pub(crate) fn rms_norm(g: &GgufFile, name: &str, len: usize, eps: f32, because: &str) -> Result<Norm> {
    Ok(Norm { kind: NormType::RmsNorm, eps, weight: shaped(g, name, &[len], because)?, bias: None })
}

/// An optional RMSNorm over a weight vector of `len` values.
pub(crate) fn opt_rms_norm(g: &GgufFile, name: &str, len: usize, eps: f32, because: &str) -> Result<Option<Norm>> {
    Ok(opt_shaped(g, name, &[len], because)?.map(|weight| Norm { kind: NormType::RmsNorm, eps, weight, bias: None }))
}

/// Refuses a file holding tensor `name`, which `arch` would need to run
/// correctly but the pipeline does not apply.
///
/// # Errors
/// [`Error::UnsupportedFeature`] naming the tensor.
pub(crate) fn refuse(g: &GgufFile, arch: &str, name: &str) -> Result<()> {
    if g.tensor(name).is_some() {
        return Err(Error::UnsupportedFeature { arch: arch.into(), feature: format!("tensor `{name}`") });
    }
    Ok(())
}
