//! Phi-3 / Phi-3.5 / Phi-4-mini (Abdin et al., "Phi-3 Technical Report",
//! 2024; llama.cpp `LLM_ARCH_PHI3`): the Llama block with
//!
//! - one fused `attn_qkv` projection (q rows, then k, then v), split here
//!   into three weights that share the file's bytes (separate `attn_q/k/v`
//!   are accepted too, as llama.cpp does);
//! - one fused `ffn_up` of 2·n_ff rows, gate then up: `silu(gate·x) ·
//!   (up·x)` (ggml's `swiglu` on the concatenation);
//! - NeoX RoPE over `rope.dimension_count` dimensions, `n_head · head_dim =
//!   n_embd`.
//!
//! The sliding window some Phi-3 files declare is not applied: llama.cpp
//! disables it for this architecture, and so does this loader. The 128k
//! variants' LongRoPE factors (`rope_factors_long/short`) are refused.

use infer_compute::pipeline::{ModelSpec, RopeType};

use super::hparams::{check_counts, Defaults, HParams};
use super::layer::{assemble, plain_block, BlockOptions};
use super::tensors::refuse;
use crate::gguf::GgufFile;
use crate::Result;

/// Loads a Phi-3 model's pipeline description.
///
/// Required keys: `phi3.embedding_length`, `block_count`,
/// `attention.head_count`, `context_length`,
/// `attention.layer_norm_rms_epsilon`; `rope.dimension_count` defaults to
/// head_dim.
///
/// # Errors
/// As [`super::llama::load`]; LongRoPE factor tensors.
pub fn load(g: &GgufFile) -> Result<ModelSpec> {
    let d = Defaults { q_width_is_n_embd: true, ..Defaults::common() };
    let hp = HParams::read(g, "phi3", d)?;
    check_counts(g, &hp)?;
    for name in ["rope_factors_long.weight", "rope_factors_short.weight", "blk.0.rope_factors_long.weight"] {
        refuse(g, "phi3", name)?;
    }
    assemble(g, &hp, 1.0, None, |_| BlockOptions { fused_gate_up: true, ..plain_block(&hp, RopeType::NeoX) })
}
