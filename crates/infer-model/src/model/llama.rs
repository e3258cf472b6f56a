//! Llama-family models (Llama 2/3, SmolLM, Mistral and compatible GGUFs;
//! llama.cpp `LLM_ARCH_LLAMA`): RMSNorm, RoPE with adjacent-pair layout,
//! SwiGLU FFN, GQA, optional q/k/v biases, untied or tied output.
//!
//! Mistral 7B / Nemo files are `llama` files: llama.cpp applies no sliding
//! window to this architecture, and neither does this loader (a
//! `llama.attention.sliding_window` key is read, validated and not used).

use infer_compute::pipeline::{ModelSpec, RopeType};

use super::hparams::{check_counts, Defaults, HParams};
use super::layer::{assemble, plain_block};
use crate::gguf::GgufFile;
use crate::Result;

/// Loads a Llama-family model's pipeline description.
///
/// Defaults: `layer_norm_rms_epsilon` 1e-5, `context_length` 4096,
/// `rope.freq_base` 10 000.
///
/// # Errors
/// Missing required keys or tensors; hyper-parameters out of range; shapes
/// that disagree with them.
pub fn load(g: &GgufFile) -> Result<ModelSpec> {
    let d = Defaults { eps: Some(1e-5), n_ctx_train: Some(4096), ..Defaults::common() };
    let hp = HParams::read(g, "llama", d)?;
    check_counts(g, &hp)?;
    assemble(g, &hp, 1.0, None, |_| plain_block(&hp, RopeType::Normal))
}
