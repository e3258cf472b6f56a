//! Hyper-parameters read from GGUF metadata and validated before any
//! arithmetic or allocation uses them.
//!
//! Every value is checked on its own (non-zero, below a sanity bound,
//! finite) and against the others (`n_head % n_head_kv == 0`, `n_rot` even
//! and at most `head_dim`, `n_head · head_dim = n_embd` where the
//! architecture's tensors require it); the counts are then checked against
//! the tensors they describe ([`check_counts`]). Each failure is a typed
//! [`Error`] naming the key. The defaults for absent keys are llama.cpp's
//! (`llama_hparams` and each architecture's `load_arch_hparams`).

use crate::gguf::{GgufFile, Value};
use crate::{Error, Result};

/// Upper bounds that no real model reaches and that keep every product of
/// them far from overflow: a larger value is treated as a corrupt file.
pub const MAX_LAYERS: usize = 4096;
/// Largest accepted `embedding_length`, `feed_forward_length` or
/// `n_head · head_dim`.
pub const MAX_WIDTH: usize = 1 << 20;
/// Largest accepted head count.
pub const MAX_HEADS: usize = 4096;
/// Largest accepted `key_length` (head_dim).
pub const MAX_HEAD_DIM: usize = 4096;

/// Validated hyper-parameters of a transformer (ggml names).
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// The architecture prefix of the keys (`"qwen2"`).
    pub arch: &'static str,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Values per head (`attention.key_length`, default `n_embd / n_head`).
    pub head_dim: usize,
    /// Rotated dimensions per head (`rope.dimension_count`, default head_dim).
    pub n_rot: usize,
    pub n_ctx_train: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE base θ (`rope.freq_base`).
    pub rope_base: f32,
    /// RoPE position multiplier, 1 / `rope.scaling.factor` (1 when absent or 0).
    pub rope_freq_scale: f32,
    /// `attention.sliding_window`, when present.
    pub sliding_window: Option<usize>,
    /// `feed_forward_length`, when present (checked against the FFN tensors).
    pub n_ff: Option<usize>,
}

/// What an architecture requires and defaults to.
#[derive(Clone, Copy, Debug)]
pub struct Defaults {
    /// `attention.layer_norm_rms_epsilon` when absent (`None`: required).
    pub eps: Option<f32>,
    /// `rope.freq_base` when absent.
    pub rope_base: f32,
    /// `context_length` when absent (`None`: required).
    pub n_ctx_train: Option<usize>,
    /// Whether `attention.sliding_window` is required.
    pub window_required: bool,
    /// Whether the tensors require `n_head · head_dim = n_embd` (the
    /// output projection is n_embd × n_embd in llama.cpp's loader).
    pub q_width_is_n_embd: bool,
}

impl Defaults {
    /// llama.cpp's defaults for most architectures: eps required,
    /// θ = 10 000, context length required.
    pub const fn common() -> Self {
        Defaults { eps: None, rope_base: 10_000.0, n_ctx_train: None, window_required: false, q_width_is_n_embd: false }
    }
}

/// A bad value of `key`.
pub(crate) fn bad(key: &str, value: impl std::fmt::Display, reason: impl Into<String>) -> Error {
    Error::HyperParameter { key: key.to_string(), value: value.to_string(), reason: reason.into() }
}

/// A required count in `1..=max`.
fn count(g: &GgufFile, key: &str, max: usize) -> Result<usize> {
    let v = g.get_u32(key)? as usize;
    check_count(key, v, max)
}

/// An optional count in `1..=max`, or `default`.
fn count_or(g: &GgufFile, key: &str, default: usize, max: usize) -> Result<usize> {
    match g.get(key) {
        None => Ok(default),
        Some(_) => count(g, key, max),
    }
}

fn check_count(key: &str, v: usize, max: usize) -> Result<usize> {
    if v == 0 {
        Err(bad(key, v, "must be at least 1"))
    } else if v > max {
        Err(bad(key, v, format!("larger than any model ({max} at most)")))
    } else {
        Ok(v)
    }
}

/// A positive finite f32, or `default` when absent.
pub(crate) fn positive_f32(g: &GgufFile, key: &str, default: Option<f32>) -> Result<f32> {
    let v = match (g.get(key), default) {
        (None, Some(d)) => return Ok(d),
        (None, None) => return Err(Error::MissingKey(key.to_string())),
        (Some(_), _) => g.get_f32(key)?,
    };
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(bad(key, v, "must be a positive finite number"))
    }
}

impl HParams {
    /// Reads and validates the hyper-parameters of architecture `arch`.
    ///
    /// Keys (under `arch.`): `embedding_length`, `block_count`,
    /// `attention.head_count` (required); `attention.head_count_kv`
    /// (default head_count), `attention.key_length` (default n_embd /
    /// n_head, which must then divide evenly), `attention.value_length`
    /// (must equal key_length), `rope.dimension_count` (default head_dim),
    /// `context_length`, `attention.layer_norm_rms_epsilon`,
    /// `rope.freq_base` (defaults per `d`), `rope.scaling.type` (`none` or
    /// `linear`) and `rope.scaling.factor`, `attention.sliding_window`,
    /// `feed_forward_length`, `expert_count` (must be 0: no mixture of
    /// experts).
    ///
    /// # Errors
    /// [`Error::MissingKey`], [`Error::KeyType`], [`Error::HyperParameter`]
    /// naming the key; [`Error::UnsupportedFeature`] for experts and other
    /// RoPE scalings.
    pub fn read(g: &GgufFile, arch: &'static str, d: Defaults) -> Result<Self> {
        let k = |s: &str| format!("{arch}.{s}");
        let n_embd = count(g, &k("embedding_length"), MAX_WIDTH)?;
        let n_layer = count(g, &k("block_count"), MAX_LAYERS)?;
        let n_head = count(g, &k("attention.head_count"), MAX_HEADS)?;
        let n_head_kv = count_or(g, &k("attention.head_count_kv"), n_head, MAX_HEADS)?;
        if !n_head.is_multiple_of(n_head_kv) {
            return Err(bad(
                &format!("{} / {}", k("attention.head_count"), k("attention.head_count_kv")),
                format!("{n_head} / {n_head_kv}"),
                "the query heads must be a multiple of the key/value heads (GQA)",
            ));
        }
        let head_dim = match g.get(&k("attention.key_length")) {
            Some(_) => count(g, &k("attention.key_length"), MAX_HEAD_DIM)?,
            None if n_embd.is_multiple_of(n_head) => {
                check_count(&k("attention.key_length"), n_embd / n_head, MAX_HEAD_DIM)?
            }
            None => {
                return Err(bad(
                    &k("attention.head_count"),
                    n_head,
                    format!("does not divide embedding_length {n_embd}, and attention.key_length is absent"),
                ))
            }
        };
        let value_len = count_or(g, &k("attention.value_length"), head_dim, MAX_HEAD_DIM)?;
        if value_len != head_dim {
            return Err(Error::UnsupportedFeature {
                arch: arch.into(),
                feature: format!("attention.value_length {value_len} different from key_length {head_dim}"),
            });
        }
        let q_width = n_head * head_dim; // both ≤ 4096: no overflow
        if q_width > MAX_WIDTH {
            return Err(bad(&k("attention.head_count"), n_head, format!("× head_dim {head_dim} is too wide")));
        }
        if d.q_width_is_n_embd && q_width != n_embd {
            return Err(bad(
                &format!("{} × {}", k("attention.head_count"), k("attention.key_length")),
                format!("{n_head} × {head_dim} = {q_width}"),
                format!("must equal embedding_length {n_embd} for {arch}"),
            ));
        }
        let n_rot = count_or(g, &k("rope.dimension_count"), head_dim, MAX_HEAD_DIM)?;
        if n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(bad(
                &k("rope.dimension_count"),
                n_rot,
                format!("must be even and at most head_dim {head_dim}"),
            ));
        }
        let n_ctx_train = match d.n_ctx_train {
            Some(def) => count_or(g, &k("context_length"), def, u32::MAX as usize)?,
            None => count(g, &k("context_length"), u32::MAX as usize)?,
        };
        let eps = positive_f32(g, &k("attention.layer_norm_rms_epsilon"), d.eps)?;
        if eps >= 1.0 {
            return Err(bad(&k("attention.layer_norm_rms_epsilon"), eps, "must be below 1"));
        }
        let rope_base = positive_f32(g, &k("rope.freq_base"), Some(d.rope_base))?;
        if let Some(Value::String(t)) = g.get(&k("rope.scaling.type")) {
            if t != "none" && t != "linear" {
                return Err(Error::UnsupportedFeature { arch: arch.into(), feature: format!("RoPE scaling `{t}`") });
            }
        }
        let rope_freq_scale = match g.get(&k("rope.scaling.factor")) {
            None => 1.0,
            Some(_) => {
                // llama.cpp: a factor of 0 means no scaling.
                let f = g.get_f32(&k("rope.scaling.factor"))?;
                if f == 0.0 {
                    1.0
                } else if f.is_finite() && f > 0.0 {
                    1.0 / f
                } else {
                    return Err(bad(&k("rope.scaling.factor"), f, "must be a positive finite number (or 0: none)"));
                }
            }
        };
        let sliding_window = match (g.get(&k("attention.sliding_window")), d.window_required) {
            (None, false) => None,
            _ => Some(count(g, &k("attention.sliding_window"), u32::MAX as usize)?),
        };
        let n_ff = match g.get(&k("feed_forward_length")) {
            None => None,
            Some(Value::Array(_)) => {
                return Err(Error::UnsupportedFeature {
                    arch: arch.into(),
                    feature: "per-layer feed_forward_length".into(),
                })
            }
            Some(_) => Some(count(g, &k("feed_forward_length"), MAX_WIDTH)?),
        };
        if let Some(v) = g.get(&k("expert_count")) {
            if !matches!(v, Value::U32(0) | Value::U64(0) | Value::I32(0)) {
                return Err(Error::UnsupportedFeature { arch: arch.into(), feature: "mixture of experts".into() });
            }
        }
        Ok(HParams {
            arch,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            n_ctx_train,
            eps,
            rope_base,
            rope_freq_scale,
            sliding_window,
            n_ff,
        })
    }

    /// `arch.KEY`.
    pub fn key(&self, s: &str) -> String {
        format!("{}.{s}", self.arch)
    }

    /// Rows of the query projection, `n_head · head_dim`.
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Rows of the key and value projections, `n_head_kv · head_dim`.
    pub fn kv_width(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// Checks the counts of `hp` against the file's tensors before anything is
/// built from them: `block_count` against the `blk.N` tensors present (no
/// layer missing, none beyond it), and the vocabulary (`token_embd`'s rows)
/// against `tokenizer.ggml.tokens` and `arch.vocab_size` when present.
///
/// # Errors
/// [`Error::CountMismatch`] naming the key and the tensors;
/// [`Error::MissingTensor`] for `token_embd.weight`.
pub fn check_counts(g: &GgufFile, hp: &HParams) -> Result<()> {
    let mut max_layer: Option<usize> = None;
    for t in g.tensors() {
        if let Some(i) = t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|n| n.parse().ok()) {
            max_layer = Some(max_layer.map_or(i, |m: usize| m.max(i)));
        }
    }
    let present = max_layer.map_or(0, |m| m + 1);
    if present != hp.n_layer {
        let key = hp.key("block_count");
        let detail = match max_layer {
            None => "the file has no blk.N tensors".to_string(),
            Some(m) => format!("the file has tensors for {present} layers (blk.0 … blk.{m})"),
        };
        return Err(Error::CountMismatch { key, value: hp.n_layer as u64, detail });
    }
    let embd = g.tensor("token_embd.weight").ok_or_else(|| Error::MissingTensor("token_embd.weight".into()))?;
    let n_vocab = embd.rows();
    if let Some(Value::Array(tokens)) = g.get("tokenizer.ggml.tokens") {
        if tokens.len() as u64 != n_vocab {
            return Err(Error::CountMismatch {
                key: "tokenizer.ggml.tokens".into(),
                value: tokens.len() as u64,
                detail: format!("token_embd.weight has {n_vocab} rows (one per token)"),
            });
        }
    }
    let vk = hp.key("vocab_size");
    if g.get(&vk).is_some() {
        let v = g.get_u64(&vk).or_else(|_| g.get_u32(&vk).map(u64::from))?;
        if v != n_vocab {
            return Err(Error::CountMismatch {
                key: vk,
                value: v,
                detail: format!("token_embd.weight has {n_vocab} rows"),
            });
        }
    }
    Ok(())
}
