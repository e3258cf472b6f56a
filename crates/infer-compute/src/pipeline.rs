//! Device-independent description of a decoder-only transformer: per-layer
//! hyper-parameters and weights ([`LayerSpec`]) and the whole model
//! ([`ModelSpec`]). Architectures (Gemma 3, Llama, ...) map their GGUF
//! tensors onto this; backends run it.
//!
//! Weights are [`QuantWeight`]s sharing the caller's bytes (the memory map
//! on the CPU); norm weights are 1-row F32 tensors.

use crate::error::{Error, Result};
use crate::weight::QuantWeight;

/// Normalization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormType {
    /// `x / sqrt(mean(x²) + eps) · w` (Zhang & Sennrich 2019).
    RmsNorm,
    /// `(x - mean) / sqrt(var + eps) · w (+ b)` (Ba et al. 2016).
    LayerNorm,
}

/// Activation of the feed-forward network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x · sigmoid(x)` (SwiGLU when gated).
    Silu,
    /// GELU, tanh approximation (GEGLU when gated; Gemma).
    GeluTanh,
}

/// Feed-forward shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnType {
    /// `down(act(gate(x)) · up(x))`.
    Gated,
    /// `down(act(up(x)))`.
    Plain,
}

/// Pairing of rotated dimensions in RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeType {
    /// Adjacent pairs (2i, 2i+1): ggml's `LLAMA_ROPE_TYPE_NORM`.
    Normal,
    /// Halves (i, i + n_rot/2): GPT-NeoX layout, used by Gemma, Qwen2 GGUFs.
    NeoX,
}

/// Rotary position embedding of one layer (Su et al. 2021, "RoFormer").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSpec {
    pub kind: RopeType,
    /// Frequency base θ (10 000 for Gemma 3 local layers, 1 000 000 global).
    pub base: f32,
    /// Rotated dimensions per head (the first `n_rot` of `head_dim`).
    pub n_rot: usize,
    /// Linear position scaling: positions are multiplied by this (1.0 = none).
    pub freq_scale: f32,
}

/// A normalization with its weights (`weight` and optional `bias`: 1 × n).
#[derive(Clone, Debug)]
pub struct Norm {
    pub kind: NormType,
    pub eps: f32,
    pub weight: QuantWeight,
    pub bias: Option<QuantWeight>,
}

/// One transformer block.
#[derive(Clone, Debug)]
pub struct LayerSpec {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope: RopeSpec,
    /// Attend only to the last `window` positions (the current one
    /// included); `None` for global attention.
    pub sliding_window: Option<usize>,
    /// `c · tanh(logit / c)` applied to attention logits (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Multiplier of q·k (usually 1/sqrt(head_dim); Gemma: query_pre_attn_scalar^-1/2).
    pub attn_scale: f32,

    /// Pre-attention norm.
    pub attn_norm: Norm,
    /// Query projection, (n_head·head_dim) × n_embd.
    pub wq: QuantWeight,
    /// Key projection, (n_head_kv·head_dim) × n_embd.
    pub wk: QuantWeight,
    /// Value projection, (n_head_kv·head_dim) × n_embd.
    pub wv: QuantWeight,
    /// Output projection, n_embd × (n_head·head_dim).
    pub wo: QuantWeight,
    /// Optional biases of q, k, v (Qwen2).
    pub bq: Option<QuantWeight>,
    pub bk: Option<QuantWeight>,
    pub bv: Option<QuantWeight>,
    /// Per-head RMSNorm of q and k over head_dim (Gemma 3, Qwen3).
    pub q_norm: Option<Norm>,
    pub k_norm: Option<Norm>,
    /// Norm of the attention output before the residual add (Gemma sandwich).
    pub post_attn_norm: Option<Norm>,

    /// Pre-FFN norm.
    pub ffn_norm: Norm,
    pub ffn: FfnType,
    pub activation: Activation,
    /// Gate projection, n_ff × n_embd (gated FFN only).
    pub ffn_gate: Option<QuantWeight>,
    /// Up projection, n_ff × n_embd.
    pub ffn_up: QuantWeight,
    /// Down projection, n_embd × n_ff.
    pub ffn_down: QuantWeight,
    /// Norm of the FFN output before the residual add (Gemma sandwich).
    pub post_ffn_norm: Option<Norm>,
}

impl LayerSpec {
    /// The layer's projection matrices, the one list every backend and
    /// tool counts or converts: q, k, v, output, then the FFN's gate (when
    /// gated), up and down. Biases and norms are vectors, not in it.
    pub fn matrices(&self) -> impl Iterator<Item = &QuantWeight> {
        [&self.wq, &self.wk, &self.wv, &self.wo]
            .into_iter()
            .chain(self.ffn_gate.as_ref())
            .chain([&self.ffn_up, &self.ffn_down])
    }
}

/// A whole decoder-only model.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    /// Architecture name (for messages).
    pub arch: String,
    pub n_embd: usize,
    pub n_vocab: usize,
    /// Training context length (upper bound for KV caches).
    pub n_ctx_train: usize,
    /// Token embeddings, n_vocab × n_embd.
    pub token_embd: QuantWeight,
    /// Multiplier of the looked-up embedding (sqrt(n_embd) for Gemma, else 1).
    pub embd_scale: f32,
    pub layers: Vec<LayerSpec>,
    pub output_norm: Norm,
    /// Output projection, n_vocab × n_embd (the embeddings when tied).
    pub output: QuantWeight,
    /// `c · tanh(logit / c)` on the final logits (Gemma 2).
    pub final_logit_softcap: Option<f32>,
}

impl ModelSpec {
    /// Checks that every shape agrees with the hyper-parameters.
    ///
    /// # Errors
    /// [`Error::InvalidModel`] naming the first inconsistent tensor.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidModel(what));
        let e = self.n_embd;
        let check = |name: &str, w: &QuantWeight, rows: usize, cols: usize| -> Result<()> {
            w.check().map_err(|e| Error::InvalidModel(format!("{name}: {e}")))?;
            if w.rows != rows || w.cols != cols {
                return Err(Error::InvalidModel(format!(
                    "{name}: expected {rows}x{cols}, found {}x{}",
                    w.rows, w.cols
                )));
            }
            Ok(())
        };
        let check_norm = |name: &str, n: &Norm, len: usize| -> Result<()> {
            check(name, &n.weight, 1, len)?;
            if let Some(b) = &n.bias {
                check(name, b, 1, len)?;
            }
            Ok(())
        };
        if e == 0 || self.n_vocab == 0 || self.layers.is_empty() {
            return bad("n_embd, n_vocab and the layer count must be positive".into());
        }
        check("token_embd", &self.token_embd, self.n_vocab, e)?;
        check("output", &self.output, self.n_vocab, e)?;
        check_norm("output_norm", &self.output_norm, e)?;
        for (i, l) in self.layers.iter().enumerate() {
            let p = |s: &str| format!("blk.{i}.{s}");
            if l.n_head == 0 || l.n_head_kv == 0 || l.head_dim == 0 || l.n_head % l.n_head_kv != 0 {
                return bad(format!(
                    "blk.{i}: n_head {} must be a positive multiple of n_head_kv {}",
                    l.n_head, l.n_head_kv
                ));
            }
            if l.rope.n_rot > l.head_dim || l.rope.n_rot % 2 != 0 {
                return bad(format!(
                    "blk.{i}: n_rot {} must be even and at most head_dim {}",
                    l.rope.n_rot, l.head_dim
                ));
            }
            if l.sliding_window == Some(0) {
                return bad(format!("blk.{i}: sliding window of 0"));
            }
            let (q, kv) = (l.n_head * l.head_dim, l.n_head_kv * l.head_dim);
            check_norm(&p("attn_norm"), &l.attn_norm, e)?;
            check(&p("attn_q"), &l.wq, q, e)?;
            check(&p("attn_k"), &l.wk, kv, e)?;
            check(&p("attn_v"), &l.wv, kv, e)?;
            check(&p("attn_output"), &l.wo, e, q)?;
            for (name, b, n) in [("attn_q.bias", &l.bq, q), ("attn_k.bias", &l.bk, kv), ("attn_v.bias", &l.bv, kv)] {
                if let Some(b) = b {
                    check(&p(name), b, 1, n)?;
                }
            }
            for (name, n) in [("attn_q_norm", &l.q_norm), ("attn_k_norm", &l.k_norm)] {
                if let Some(n) = n {
                    check_norm(&p(name), n, l.head_dim)?;
                }
            }
            for (name, n) in [("post_attention_norm", &l.post_attn_norm), ("post_ffw_norm", &l.post_ffn_norm)] {
                if let Some(n) = n {
                    check_norm(&p(name), n, e)?;
                }
            }
            check_norm(&p("ffn_norm"), &l.ffn_norm, e)?;
            let n_ff = l.ffn_up.rows;
            check(&p("ffn_up"), &l.ffn_up, n_ff, e)?;
            check(&p("ffn_down"), &l.ffn_down, e, n_ff)?;
            match (l.ffn, &l.ffn_gate) {
                (FfnType::Gated, Some(g)) => check(&p("ffn_gate"), g, n_ff, e)?,
                (FfnType::Gated, None) => return bad(format!("blk.{i}: gated FFN without ffn_gate")),
                (FfnType::Plain, _) => {}
            }
        }
        Ok(())
    }
}
