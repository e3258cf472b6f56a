//! Qwen 2 and Qwen 2.5 (Qwen Team, "Qwen2 Technical Report", 2024;
//! llama.cpp `LLM_ARCH_QWEN2`): the Llama block with biases on the q, k and
//! v projections and the NeoX RoPE layout; `n_head · head_dim = n_embd`
//! (llama.cpp's loader sizes `attn_output` n_embd × n_embd). The HF
//! configuration's sliding window is not applied (llama.cpp does not), and
//! the small models tie the output to the embeddings.

use infer_compute::pipeline::{ModelSpec, RopeType};

use super::hparams::{check_counts, Defaults, HParams};
use super::layer::{assemble, plain_block};
use crate::gguf::GgufFile;
use crate::Result;

/// Loads a Qwen 2 model's pipeline description.
///
/// Required keys: `qwen2.embedding_length`, `block_count`,
/// `attention.head_count`, `context_length`,
/// `attention.layer_norm_rms_epsilon`; `rope.freq_base` defaults to 10 000.
///
/// # Errors
/// As [`super::llama::load`].
pub fn load(g: &GgufFile) -> Result<ModelSpec> {
    let d = Defaults { q_width_is_n_embd: true, ..Defaults::common() };
    let hp = HParams::read(g, "qwen2", d)?;
    check_counts(g, &hp)?;
    assemble(g, &hp, 1.0, None, |_| plain_block(&hp, RopeType::NeoX))
}
