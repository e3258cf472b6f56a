//! Writing a synthetic file: metadata, then each tensor generated and
//! streamed to disk in turn.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use infer_compute::GgmlType;

use super::plan::dequantized_plan;
use super::{fill_tensor, metadata, plan_tensors, summarize, SynthQuant, SynthShape, SynthVocab};
use crate::gguf::GgufWriter;
use crate::{Error, Result};

/// What to generate.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    /// Shapes of the model.
    pub shape: SynthShape,
    /// File type whose tensor type mix is copied.
    pub quant: SynthQuant,
    /// Seed of the random values.
    pub seed: u64,
    /// Generator threads (the output does not depend on it).
    pub threads: usize,
    /// Store the same weights as F32 (each matrix rounded through the type
    /// `quant` gives it, then dequantized; `general.file_type` 0): the
    /// exact forward pass of the quantized file.
    pub dequantized: bool,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct SynthSummary {
    /// Tensors in the file.
    pub n_tensors: usize,
    /// Values in all tensors (the parameter count).
    pub n_params: u64,
    /// Bytes of tensor data (llama-bench's "size").
    pub tensor_bytes: u64,
    /// Bytes of the file.
    pub file_bytes: u64,
    /// Per type: tensors and bytes, by type id.
    pub types: Vec<(GgmlType, usize, u64)>,
}

/// Writes a synthetic model to `path` (through a temporary file in the same
/// directory, renamed when complete). Tensors are generated one at a time
/// with [`fill_tensor`] and streamed to disk; `progress` receives the bytes
/// of tensor data completed so far, in increments.
///
/// # Errors
/// Invalid shape, tokenizer problems (see [`metadata`]), I/O errors naming
/// the path.
pub fn write_synthetic(
    path: &Path,
    opts: &SynthOptions,
    vocab: SynthVocab<'_>,
    progress: Arc<dyn Fn(u64) + Send + Sync>,
) -> Result<SynthSummary> {
    let mut plan = plan_tensors(&opts.shape, opts.quant)?;
    if opts.dequantized {
        plan = dequantized_plan(plan);
    }
    let mut summary = summarize(&plan)?;
    let mut w = GgufWriter::new();
    for (k, mut v) in metadata(&opts.shape, opts.quant, opts.seed, vocab)? {
        if opts.dequantized && k == "general.file_type" {
            v = crate::gguf::Value::U32(0);
        }
        w.add_metadata(k, v)?;
    }
    let done = Arc::new(AtomicUsize::new(0));
    for t in plan {
        let (seed, threads, progress, done) = (opts.seed, opts.threads, progress.clone(), done.clone());
        let (name, dims, ty) = (t.name.clone(), t.dims.clone(), t.ty);
        w.add_tensor_with(name, &dims, ty, move |buf| {
            let report = |n: u64| {
                let total = done.fetch_add(n as usize, Ordering::Relaxed) as u64 + n;
                progress(total);
            };
            fill_tensor(&t, seed, threads, buf, &report)
        })?;
    }
    w.write_to_path(path)?;
    summary.file_bytes =
        std::fs::metadata(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?.len();
    Ok(summary)
}
