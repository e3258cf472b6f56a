//! Architectures: GGUF metadata and tensors mapped onto the device-independent
//! [`ModelSpec`] of infer-compute.
//!
//! Each architecture is one file that states how its blocks differ from the
//! common pre-norm block (`layer.rs`); its hyper-parameters are read and
//! validated once (`hparams.rs`), the metadata's counts are checked against
//! the tensors, and every tensor against the shape the hyper-parameters give
//! (`tensors.rs`), before anything is allocated or computed from them. The
//! list of architectures is [`registry::Arch`].

pub mod gemma2;
pub mod gemma3;
pub mod hparams;
mod layer;
pub mod llama;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod registry;
mod tensors;

use infer_compute::pipeline::ModelSpec;
pub use registry::{Arch, ArchInfo, ChatFormat};

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// Builds the pipeline description of the model in `gguf`: hyper-parameters
/// validated, counts and every tensor's shape checked against them. (The
/// backend checks the whole description again in
/// [`infer_compute::ComputeBackend::prepare`]; [`ModelSpec::validate`] does
/// it without preparing.)
///
/// # Errors
/// [`Error::UnsupportedArch`] for other architectures; missing required
/// metadata keys ([`Error::MissingKey`]) or tensors ([`Error::MissingTensor`]);
/// hyper-parameters out of range ([`Error::HyperParameter`]); counts or
/// shapes that disagree with the tensors ([`Error::CountMismatch`],
/// [`Error::TensorShape`]); features the pipeline does not run
/// ([`Error::UnsupportedFeature`]).
pub fn load_spec(gguf: &GgufFile) -> Result<ModelSpec> {
    let name = gguf.get_str("general.architecture")?;
    let arch = Arch::from_gguf_name(name).ok_or_else(|| Error::UnsupportedArch(name.to_string()))?;
    (arch.info().load)(gguf)
}
