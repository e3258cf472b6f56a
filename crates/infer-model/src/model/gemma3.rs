//! Gemma 3 (Gemma Team, "Gemma 3 Technical Report", 2025; llama.cpp
//! `LLM_ARCH_GEMMA3`).
//!
//! - embeddings scaled by sqrt(n_embd); output projection tied to them;
//! - per layer: RMSNorm → attention with per-head q/k RMSNorm → RMSNorm
//!   (`post_attention_norm`) → residual; RMSNorm → GELU-tanh gated FFN →
//!   RMSNorm (`post_ffw_norm`) → residual ("sandwich" norms);
//! - interleaved attention: five sliding-window layers (window
//!   `gemma3.attention.sliding_window`, RoPE base 10 000) then one global
//!   layer (RoPE base `gemma3.rope.freq_base`, linear scaling
//!   `gemma3.rope.scaling.factor` when present), NeoX RoPE layout;
//! - attention scale 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim for
//!   every size but 27B, whose scale is 1/sqrt(n_embd / n_head)).
//!
//! GGUF norm weights already include Gemma's `1 + w` offset (the converter
//! adds it), so they are used as plain RMSNorm weights.

use infer_compute::pipeline::{Activation, ModelSpec, RopeSpec, RopeType};

use super::hparams::{bad, check_counts, positive_f32, Defaults, HParams};
use super::layer::{block, embeddings_and_output, BlockOptions};
use crate::gguf::{GgufFile, Value};
use crate::Result;

/// Layers per sliding-window period: layer `i` is global when
/// `i % PATTERN == PATTERN - 1`.
pub const SWA_PATTERN: usize = 6;
/// RoPE base of the sliding-window layers.
pub const ROPE_BASE_LOCAL: f32 = 10_000.0;

/// Which layers use the sliding window, as llama.cpp's `load_swa_pattern`
/// decides: `arch.attention.sliding_window_pattern` is either a period `p`
/// (layer `i` slides when `i % p < p - 1`; 0: every layer) or one bool per
/// layer; absent, the architecture's `default_period`.
///
/// # Errors
/// A per-layer array whose length is not the layer count; a value of
/// another type.
pub(crate) fn swa_layers(g: &GgufFile, hp: &HParams, default_period: usize) -> Result<Vec<bool>> {
    let key = hp.key("attention.sliding_window_pattern");
    let period = match g.get(&key) {
        None => default_period,
        Some(Value::Array(a)) => {
            if a.len() != hp.n_layer {
                return Err(crate::Error::CountMismatch {
                    key,
                    value: a.len() as u64,
                    detail: format!("one entry per layer expected, and block_count is {}", hp.n_layer),
                });
            }
            return (0..a.len())
                .map(|i| match a.get(i) {
                    Some(Value::Bool(b)) => Ok(b),
                    _ => Err(bad(&key, format!("array of {}", a.elem_type_name()), "entries must be bools")),
                })
                .collect();
        }
        Some(_) => g.get_u32(&key)? as usize,
    };
    Ok((0..hp.n_layer).map(|i| period == 0 || i % period < period - 1).collect())
}

/// Loads a Gemma 3 model's pipeline description.
///
/// Required keys (as llama.cpp requires them): `gemma3.embedding_length`,
/// `block_count`, `attention.head_count`, `context_length`,
/// `attention.sliding_window`. Optional keys and their defaults (the model
/// card's configuration): `attention.head_count_kv` = head_count,
/// `attention.key_length` = n_embd / n_head, `layer_norm_rms_epsilon` =
/// 1e-6, `rope.freq_base` = 1 000 000, `rope.freq_base_swa` = 10 000,
/// `rope.scaling.factor` = 1 (none), `attention.sliding_window_pattern` = 6.
///
/// # Errors
/// [`crate::Error::MissingKey`] naming a missing required key;
/// [`crate::Error::HyperParameter`] for a value out of range;
/// [`crate::Error::MissingTensor`] / [`crate::Error::TensorShape`] naming a
/// tensor.
pub fn load(g: &GgufFile) -> Result<ModelSpec> {
    let d = Defaults { eps: Some(1e-6), rope_base: 1_000_000.0, window_required: true, ..Defaults::common() };
    let hp = HParams::read(g, "gemma3", d)?;
    check_counts(g, &hp)?;
    let rope_local = positive_f32(g, &hp.key("rope.freq_base_swa"), Some(ROPE_BASE_LOCAL))?;
    let attn_scale = if hp.n_layer == 62 {
        // 27B: query_pre_attn_scalar = n_embd / n_head.
        1.0 / ((hp.n_embd / hp.n_head) as f32).sqrt()
    } else {
        1.0 / (hp.head_dim as f32).sqrt()
    };
    let swa = swa_layers(g, &hp, SWA_PATTERN)?;
    let (token_embd, output_norm, output) = embeddings_and_output(g, &hp)?;
    let layers = (0..hp.n_layer)
        .map(|i| {
            let local = swa[i];
            let o = BlockOptions {
                rope: RopeSpec {
                    kind: RopeType::NeoX,
                    base: if local { rope_local } else { hp.rope_base },
                    n_rot: hp.n_rot,
                    freq_scale: if local { 1.0 } else { hp.rope_freq_scale },
                },
                sliding_window: if local { hp.sliding_window } else { None },
                attn_scale,
                attn_softcap: None,
                qk_norm: Some(false),
                sandwich: Some(false),
                activation: Activation::GeluTanh,
                fused_gate_up: false,
            };
            block(g, i, &hp, &o)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ModelSpec {
        arch: "gemma3".into(),
        n_embd: hp.n_embd,
        n_vocab: token_embd.rows,
        n_ctx_train: hp.n_ctx_train,
        embd_scale: (hp.n_embd as f32).sqrt(),
        token_embd,
        layers,
        output_norm,
        output,
        final_logit_softcap: None,
    })
}
