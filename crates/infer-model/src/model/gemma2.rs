//! Gemma 2 (Gemma Team, "Gemma 2: Improving Open Language Models at a
//! Practical Size", 2024; llama.cpp `LLM_ARCH_GEMMA2`).
//!
//! - embeddings scaled by sqrt(n_embd); output projection tied to them;
//! - sandwich norms as Gemma 3 (RMSNorm before and after attention and FFN),
//!   no q/k norms, GELU-tanh gated FFN, NeoX RoPE;
//! - attention logits soft-capped: `c · tanh(s·q·k / c)` with c =
//!   `gemma2.attn_logit_softcapping` (default 50), final logits likewise with
//!   `gemma2.final_logit_softcapping` (default 30);
//! - alternating attention: even layers use a sliding window
//!   (`gemma2.attention.sliding_window`, default 4096), odd layers are
//!   global (llama.cpp's swa pattern 2, overridable by
//!   `attention.sliding_window_pattern`); both use `rope.freq_base` unless
//!   `rope.freq_base_swa` is given;
//! - attention scale 1/sqrt(head_dim), 1/sqrt(n_embd / n_head) for the 27B
//!   (46 layers), as llama.cpp decides it from the layer count.

use infer_compute::pipeline::{Activation, ModelSpec, RopeSpec, RopeType};

use super::gemma3::swa_layers;
use super::hparams::{check_counts, positive_f32, Defaults, HParams};
use super::layer::{block, embeddings_and_output, BlockOptions};
use crate::gguf::GgufFile;
use crate::Result;

/// Sliding window when the file gives none (Gemma 2's configuration).
pub const DEFAULT_WINDOW: usize = 4096;
/// Default attention logit soft-cap.
pub const ATTN_SOFTCAP: f32 = 50.0;
/// Default final logit soft-cap.
pub const FINAL_SOFTCAP: f32 = 30.0;

/// Loads a Gemma 2 model's pipeline description.
///
/// Required keys: `gemma2.embedding_length`, `block_count`,
/// `attention.head_count`, `context_length`,
/// `attention.layer_norm_rms_epsilon`. Optional, with defaults:
/// `attention.head_count_kv`, `attention.key_length` (n_embd / n_head),
/// `rope.freq_base` (10 000), `attention.sliding_window` (4096),
/// `attn_logit_softcapping` (50), `final_logit_softcapping` (30).
///
/// # Errors
/// As [`super::gemma3::load`].
pub fn load(g: &GgufFile) -> Result<ModelSpec> {
    let hp = HParams::read(g, "gemma2", Defaults::common())?;
    check_counts(g, &hp)?;
    let window = hp.sliding_window.unwrap_or(DEFAULT_WINDOW);
    let attn_softcap = positive_f32(g, &hp.key("attn_logit_softcapping"), Some(ATTN_SOFTCAP))?;
    let final_softcap = positive_f32(g, &hp.key("final_logit_softcapping"), Some(FINAL_SOFTCAP))?;
    let rope_swa = positive_f32(g, &hp.key("rope.freq_base_swa"), Some(hp.rope_base))?;
    let attn_scale = if hp.n_layer == 46 {
        1.0 / ((hp.n_embd / hp.n_head) as f32).sqrt()
    } else {
        1.0 / (hp.head_dim as f32).sqrt()
    };
    let swa = swa_layers(g, &hp, 2)?;
    let (token_embd, output_norm, output) = embeddings_and_output(g, &hp)?;
    let layers = (0..hp.n_layer)
        .map(|i| {
            let o = BlockOptions {
                rope: RopeSpec {
                    kind: RopeType::NeoX,
                    base: if swa[i] { rope_swa } else { hp.rope_base },
                    n_rot: hp.n_rot,
                    freq_scale: hp.rope_freq_scale,
                },
                sliding_window: swa[i].then_some(window),
                attn_scale,
                attn_softcap: Some(attn_softcap),
                qk_norm: None,
                sandwich: Some(true),
                activation: Activation::GeluTanh,
                fused_gate_up: false,
            };
            block(g, i, &hp, &o)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ModelSpec {
        arch: "gemma2".into(),
        n_embd: hp.n_embd,
        n_vocab: token_embd.rows,
        n_ctx_train: hp.n_ctx_train,
        embd_scale: (hp.n_embd as f32).sqrt(),
        token_embd,
        layers,
        output_norm,
        output,
        final_logit_softcap: Some(final_softcap),
    })
}
