//! Architectures: GGUF metadata and tensors mapped onto the device-independent
//! [`ModelSpec`] of infer-compute.
//!
//! Each architecture is one file that reads its hyper-parameters (with the
//! defaults llama.cpp documents for keys older files lack) and names its
//! tensors; everything else (running it) belongs to the backends.

pub mod gemma3;
pub mod llama;

use infer_compute::pipeline::{ModelSpec, Norm, NormType};
use infer_compute::QuantWeight;

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// Architectures this crate can load (`general.architecture` values).
pub const SUPPORTED_ARCHS: &[&str] = &["gemma3", "llama"];

/// Builds the pipeline description of the model in `gguf`. The shapes are
/// checked once, by [`infer_compute::ComputeBackend::prepare`]; call
/// [`ModelSpec::validate`] to check them without preparing.
///
/// # Errors
/// [`Error::UnsupportedArch`] for other architectures; missing required
/// metadata keys ([`Error::MissingKey`]) or tensors ([`Error::MissingTensor`]);
/// shapes that disagree with the metadata.
pub fn load_spec(gguf: &GgufFile) -> Result<ModelSpec> {
    let arch = gguf.get_str("general.architecture")?;
    match arch {
        "gemma3" => gemma3::load(gguf),
        "llama" => llama::load(gguf),
        other => Err(Error::UnsupportedArch(other.to_string())),
    }
}

/// `key` as u32, or `default` when absent.
pub(crate) fn u32_or(gguf: &GgufFile, key: &str, default: u32) -> Result<u32> {
    match gguf.get(key) {
        None => Ok(default),
        Some(_) => gguf.get_u32(key),
    }
}

/// `key` as f32, or `default` when absent.
pub(crate) fn f32_or(gguf: &GgufFile, key: &str, default: f32) -> Result<f32> {
    match gguf.get(key) {
        None => Ok(default),
        Some(_) => gguf.get_f32(key),
    }
}

/// A tensor that must exist.
pub(crate) fn tensor(gguf: &GgufFile, name: &str) -> Result<QuantWeight> {
    gguf.weight(name)
}

/// A tensor that may be absent.
pub(crate) fn opt_tensor(gguf: &GgufFile, name: &str) -> Result<Option<QuantWeight>> {
    if gguf.tensor(name).is_some() {
        gguf.weight(name).map(Some)
    } else {
        Ok(None)
    }
}

/// An RMSNorm over tensor `name`.
pub(crate) fn rms_norm(gguf: &GgufFile, name: &str, eps: f32) -> Result<Norm> {
    Ok(Norm { kind: NormType::RmsNorm, eps, weight: tensor(gguf, name)?, bias: None })
}

/// An optional RMSNorm over tensor `name`.
pub(crate) fn opt_rms_norm(gguf: &GgufFile, name: &str, eps: f32) -> Result<Option<Norm>> {
    Ok(opt_tensor(gguf, name)?.map(|weight| Norm { kind: NormType::RmsNorm, eps, weight, bias: None }))
}
