//! Llama-family models (Llama 2/3, Mistral and compatible GGUFs; llama.cpp
//! `LLM_ARCH_LLAMA`): RMSNorm, RoPE with adjacent-pair layout, SwiGLU FFN,
//! GQA, untied or tied output.

use infer_compute::pipeline::{Activation, FfnType, LayerSpec, ModelSpec, RopeSpec, RopeType};

use super::{f32_or, opt_tensor, rms_norm, tensor, u32_or};
use crate::gguf::GgufFile;
use crate::Result;

/// Loads a Llama-family model's pipeline description.
///
/// # Errors
/// Missing required keys or tensors.
pub fn load(g: &GgufFile) -> Result<ModelSpec> {
    let a = "llama";
    let n_embd = g.get_u32(&format!("{a}.embedding_length"))? as usize;
    let n_layer = g.get_u32(&format!("{a}.block_count"))? as usize;
    let n_head = g.get_u32(&format!("{a}.attention.head_count"))? as usize;
    let n_head_kv = u32_or(g, &format!("{a}.attention.head_count_kv"), n_head as u32)? as usize;
    let head_dim = u32_or(g, &format!("{a}.attention.key_length"), (n_embd / n_head.max(1)) as u32)? as usize;
    let n_rot = u32_or(g, &format!("{a}.rope.dimension_count"), head_dim as u32)? as usize;
    let eps = f32_or(g, &format!("{a}.attention.layer_norm_rms_epsilon"), 1e-5)?;
    let n_ctx_train = u32_or(g, &format!("{a}.context_length"), 4096)? as usize;
    let base = f32_or(g, &format!("{a}.rope.freq_base"), 10_000.0)?;
    let scaling = f32_or(g, &format!("{a}.rope.scaling.factor"), 1.0)?;

    let token_embd = tensor(g, "token_embd.weight")?;
    let output = opt_tensor(g, "output.weight")?.unwrap_or_else(|| token_embd.clone());
    let mut layers = Vec::with_capacity(n_layer);
    for i in 0..n_layer {
        let t = |s: &str| format!("blk.{i}.{s}.weight");
        layers.push(LayerSpec {
            n_head,
            n_head_kv,
            head_dim,
            rope: RopeSpec {
                kind: RopeType::Normal,
                base,
                n_rot,
                freq_scale: if scaling > 0.0 { 1.0 / scaling } else { 1.0 },
            },
            sliding_window: None,
            attn_softcap: None,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            attn_norm: rms_norm(g, &t("attn_norm"), eps)?,
            wq: tensor(g, &t("attn_q"))?,
            wk: tensor(g, &t("attn_k"))?,
            wv: tensor(g, &t("attn_v"))?,
            wo: tensor(g, &t("attn_output"))?,
            bq: opt_tensor(g, &format!("blk.{i}.attn_q.bias"))?,
            bk: opt_tensor(g, &format!("blk.{i}.attn_k.bias"))?,
            bv: opt_tensor(g, &format!("blk.{i}.attn_v.bias"))?,
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            ffn_norm: rms_norm(g, &t("ffn_norm"), eps)?,
            ffn: FfnType::Gated,
            activation: Activation::Silu,
            ffn_gate: Some(tensor(g, &t("ffn_gate"))?),
            ffn_up: tensor(g, &t("ffn_up"))?,
            ffn_down: tensor(g, &t("ffn_down"))?,
            post_ffn_norm: None,
        });
    }
    Ok(ModelSpec {
        arch: a.into(),
        n_embd,
        n_vocab: token_embd.rows,
        n_ctx_train,
        embd_scale: 1.0,
        token_embd,
        layers,
        output_norm: rms_norm(g, "output_norm.weight", eps)?,
        output,
        final_logit_softcap: None,
    })
}
