//! Qwen 3, dense models (Qwen Team, "Qwen3 Technical Report", 2025;
//! llama.cpp `LLM_ARCH_QWEN3`): the Llama block with per-head RMSNorm of q
//! and k before RoPE (`attn_q_norm`, `attn_k_norm`, required), no biases,
//! NeoX RoPE; `attention.key_length` is independent of n_embd / n_head
//! (Qwen3 0.6B: 16 heads of 128 over n_embd 1024).

use infer_compute::pipeline::{ModelSpec, RopeType};

use super::hparams::{check_counts, Defaults, HParams};
use super::layer::{assemble, plain_block, BlockOptions};
use crate::gguf::GgufFile;
use crate::Result;

/// Loads a Qwen 3 model's pipeline description.
///
/// Required keys: `qwen3.embedding_length`, `block_count`,
/// `attention.head_count`, `context_length`,
/// `attention.layer_norm_rms_epsilon`.
///
/// # Errors
/// As [`super::llama::load`]; a missing q/k norm tensor.
pub fn load(g: &GgufFile) -> Result<ModelSpec> {
    let hp = HParams::read(g, "qwen3", Defaults::common())?;
    check_counts(g, &hp)?;
    assemble(g, &hp, 1.0, None, |_| BlockOptions { qk_norm: Some(true), ..plain_block(&hp, RopeType::NeoX) })
}
