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

use infer_compute::pipeline::{Activation, FfnType, LayerSpec, ModelSpec, RopeSpec, RopeType};

use super::{f32_or, opt_rms_norm, opt_tensor, rms_norm, tensor, u32_or};
use crate::gguf::GgufFile;
use crate::Result;

/// Layers per sliding-window period: layer `i` is global when
/// `i % PATTERN == PATTERN - 1`.
pub const SWA_PATTERN: usize = 6;
/// RoPE base of the sliding-window layers.
pub const ROPE_BASE_LOCAL: f32 = 10_000.0;

/// Loads a Gemma 3 model's pipeline description.
///
/// Required keys (as llama.cpp requires them): `gemma3.embedding_length`,
/// `block_count`, `attention.head_count`, `context_length`,
/// `attention.sliding_window`. Optional keys and their defaults (the model
/// card's configuration): `attention.head_count_kv` = head_count,
/// `attention.key_length` = n_embd / n_head, `layer_norm_rms_epsilon` =
/// 1e-6, `rope.freq_base` = 1 000 000, `rope.freq_base_swa` = 10 000,
/// `rope.scaling.factor` = 1 (none).
///
/// # Errors
/// [`crate::Error::MissingKey`] naming a missing required key;
/// [`crate::Error::MissingTensor`] naming a missing tensor.
pub fn load(g: &GgufFile) -> Result<ModelSpec> {
    let a = "gemma3";
    let n_embd = g.get_u32(&format!("{a}.embedding_length"))? as usize;
    let n_layer = g.get_u32(&format!("{a}.block_count"))? as usize;
    let n_head = g.get_u32(&format!("{a}.attention.head_count"))? as usize;
    let n_head_kv = u32_or(g, &format!("{a}.attention.head_count_kv"), n_head as u32)? as usize;
    let head_dim = u32_or(g, &format!("{a}.attention.key_length"), (n_embd / n_head.max(1)) as u32)? as usize;
    let eps = f32_or(g, &format!("{a}.attention.layer_norm_rms_epsilon"), 1e-6)?;
    let n_ctx_train = g.get_u32(&format!("{a}.context_length"))? as usize;
    let window = g.get_u32(&format!("{a}.attention.sliding_window"))? as usize;
    let rope_global = f32_or(g, &format!("{a}.rope.freq_base"), 1_000_000.0)?;
    let rope_local = f32_or(g, &format!("{a}.rope.freq_base_swa"), ROPE_BASE_LOCAL)?;
    let scaling = f32_or(g, &format!("{a}.rope.scaling.factor"), 1.0)?;
    let freq_scale_global = if scaling > 0.0 { 1.0 / scaling } else { 1.0 };
    let attn_scale = if n_layer == 62 {
        // 27B: query_pre_attn_scalar = n_embd / n_head.
        1.0 / ((n_embd / n_head) as f32).sqrt()
    } else {
        1.0 / (head_dim as f32).sqrt()
    };

    let token_embd = tensor(g, "token_embd.weight")?;
    let output = opt_tensor(g, "output.weight")?.unwrap_or_else(|| token_embd.clone());
    let mut layers = Vec::with_capacity(n_layer);
    for i in 0..n_layer {
        let t = |s: &str| format!("blk.{i}.{s}.weight");
        let global = i % SWA_PATTERN == SWA_PATTERN - 1;
        layers.push(LayerSpec {
            n_head,
            n_head_kv,
            head_dim,
            rope: RopeSpec {
                kind: RopeType::NeoX,
                base: if global { rope_global } else { rope_local },
                n_rot: head_dim,
                freq_scale: if global { freq_scale_global } else { 1.0 },
            },
            sliding_window: if global { None } else { Some(window) },
            attn_softcap: None,
            attn_scale,
            attn_norm: rms_norm(g, &t("attn_norm"), eps)?,
            wq: tensor(g, &t("attn_q"))?,
            wk: tensor(g, &t("attn_k"))?,
            wv: tensor(g, &t("attn_v"))?,
            wo: tensor(g, &t("attn_output"))?,
            bq: None,
            bk: None,
            bv: None,
            q_norm: opt_rms_norm(g, &t("attn_q_norm"), eps)?,
            k_norm: opt_rms_norm(g, &t("attn_k_norm"), eps)?,
            post_attn_norm: opt_rms_norm(g, &t("post_attention_norm"), eps)?,
            ffn_norm: rms_norm(g, &t("ffn_norm"), eps)?,
            ffn: FfnType::Gated,
            activation: Activation::GeluTanh,
            ffn_gate: Some(tensor(g, &t("ffn_gate"))?),
            ffn_up: tensor(g, &t("ffn_up"))?,
            ffn_down: tensor(g, &t("ffn_down"))?,
            post_ffn_norm: opt_rms_norm(g, &t("post_ffw_norm"), eps)?,
        });
    }
    Ok(ModelSpec {
        arch: a.into(),
        n_embd,
        n_vocab: token_embd.rows,
        n_ctx_train,
        embd_scale: (n_embd as f32).sqrt(),
        token_embd,
        layers,
        output_norm: rms_norm(g, "output_norm.weight", eps)?,
        output,
        final_logit_softcap: None,
    })
}
