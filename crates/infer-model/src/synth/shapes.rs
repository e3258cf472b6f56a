//! Shapes of synthetic models: the hyper-parameters of real models of every
//! registered architecture, and a `tiny` shape of each for tests.

use super::SynthArch;
use crate::{Error, Result};

/// A size that [`SynthShape::preset`] does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPreset {
    /// The architecture asked for.
    pub arch: SynthArch,
    /// The size that is not one of [`SynthArch::sizes`].
    pub size: String,
}

impl std::fmt::Display for UnknownPreset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no {} preset of size `{}` (sizes: {})", self.arch, self.size, self.arch.sizes().join(", "))
    }
}

impl std::error::Error for UnknownPreset {}

/// The hyper-parameters of a synthetic model.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthShape {
    /// Architecture.
    pub arch: SynthArch,
    /// The real model these shapes are copied from (`"Gemma 3 1B"`).
    pub model_name: String,
    /// `general.size_label` (`"1B"`).
    pub size_label: String,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Hidden width of the feed-forward network.
    pub n_ff: usize,
    /// Vocabulary size (rows of the embedding table).
    pub n_vocab: usize,
    /// `<arch>.context_length`.
    pub n_ctx_train: usize,
    /// `<arch>.rope.freq_base` (Gemma 3: the global layers' base).
    pub rope_base: f32,
    /// Linear RoPE scaling factor (`<arch>.rope.scaling.factor`; Gemma 3
    /// applies it on the global layers only), `None` for no scaling.
    pub rope_scaling: Option<f32>,
    /// Sliding-window size of the local layers (Gemma 3).
    pub sliding_window: Option<usize>,
    /// Whether the output projection is the token embedding matrix (no
    /// `output.weight` tensor).
    pub tied_embeddings: bool,
    /// `<arch>.attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
    /// Rotated dimensions per head (`<arch>.rope.dimension_count`).
    pub n_rot: usize,
    /// Attention logit soft-cap (Gemma 2's `attn_logit_softcapping`).
    pub attn_softcap: Option<f32>,
    /// Final logit soft-cap (Gemma 2's `final_logit_softcapping`).
    pub final_softcap: Option<f32>,
}

impl SynthShape {
    /// The shapes of a real model: `arch` with `size` one of
    /// [`SynthArch::sizes`] (case-insensitive).
    ///
    /// | arch, size | n_embd | layers | heads / kv | head_dim | n_ff | vocab | notes |
    /// | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |
    /// | gemma3 270m | 640 | 18 | 4 / 1 | 256 | 2048 | 262144 | window 512 (the default model) |
    /// | gemma3 1b | 1152 | 26 | 4 / 1 | 256 | 6912 | 262144 | window 512 |
    /// | gemma3 4b | 2560 | 34 | 8 / 4 | 256 | 10240 | 262144 | window 1024, RoPE ×1/8 on global layers |
    /// | gemma3 12b | 3840 | 48 | 16 / 8 | 256 | 15360 | 262144 | window 1024, RoPE ×1/8 on global layers |
    /// | gemma2 2b | 2304 | 26 | 8 / 4 | 256 | 9216 | 256000 | window 4096, soft-caps 50 / 30 |
    /// | llama 1b (Llama 3.2 1B) | 2048 | 16 | 32 / 8 | 64 | 8192 | 128256 | RoPE base 500 000, tied output |
    /// | llama 8b (Llama 3 8B) | 4096 | 32 | 32 / 8 | 128 | 14336 | 128256 | RoPE base 500 000 |
    /// | llama mistral-7b (Mistral 7B v0.3) | 4096 | 32 | 32 / 8 | 128 | 14336 | 32768 | RoPE base 1 000 000 |
    /// | qwen2 0.5b (Qwen2.5 0.5B) | 896 | 24 | 14 / 2 | 64 | 4864 | 151936 | q/k/v biases, tied |
    /// | qwen3 0.6b | 1024 | 28 | 16 / 8 | 128 | 3072 | 151936 | q/k norms, tied |
    /// | phi3 mini (Phi-3 mini 4k) | 3072 | 32 | 32 / 32 | 96 | 8192 | 32064 | fused qkv and gate‖up |
    /// | tiny (each) | 256 or 320 | 2 to 6 | 4 / 2 or 2 / 1 | 64 or 128 | 512 | 1024 | a few MB, for tests only |
    ///
    /// The tiny shapes keep each architecture's structure at a size where
    /// it matters: GQA, a sliding window (8 or 16) shorter than a test
    /// prompt, soft-caps (Gemma 2: 2.5 / 5) that bend the logits, a head
    /// width other than n_embd / n_head (Qwen 3), partial RoPE (Phi-3: 48
    /// of 64 dimensions).
    ///
    /// Gemma 3's text models have 262 144 tokens in GGUF (llama.cpp's
    /// converter drops the vision tokens of the 4B/12B embeddings). Llama
    /// 3.2 1B's "llama3" RoPE frequency factors (`rope_freqs.weight`) are
    /// not written: they change no shape or cost.
    ///
    /// # Errors
    /// [`UnknownPreset`] (its message names the valid sizes) when `size` is
    /// not one.
    pub fn preset(arch: SynthArch, size: &str) -> std::result::Result<Self, UnknownPreset> {
        let size_lc = size.to_ascii_lowercase();
        #[allow(clippy::too_many_arguments)]
        let base = |name: &str, label: &str, e, l, h, kv, hd, ff, vocab, ctx, rope_base, tied, eps| SynthShape {
            arch,
            model_name: name.to_string(),
            size_label: label.to_string(),
            n_embd: e,
            n_layer: l,
            n_head: h,
            n_head_kv: kv,
            head_dim: hd,
            n_ff: ff,
            n_vocab: vocab,
            n_ctx_train: ctx,
            rope_base,
            rope_scaling: None,
            sliding_window: None,
            tied_embeddings: tied,
            rms_eps: eps,
            n_rot: hd,
            attn_softcap: None,
            final_softcap: None,
        };
        let gemma = |name: &str, label: &str, e, l, h, kv, ff, ctx, window, scaling| SynthShape {
            rope_scaling: scaling,
            sliding_window: Some(window),
            ..base(name, label, e, l, h, kv, 256, ff, 262_144, ctx, 1_000_000.0, true, 1e-6)
        };
        let llama = |name: &str, label: &str, e, l, ff, ctx, tied| {
            base(name, label, e, l, 32, 8, e / 32, ff, 128_256, ctx, 500_000.0, tied, 1e-5)
        };
        let tiny = |name: &str, l, h, kv, hd, tied| {
            base(name, "tiny", 256, l, h, kv, hd, 512, 1024, 4096, 10_000.0, tied, 1e-6)
        };
        let shape = match (arch, size_lc.as_str()) {
            (SynthArch::Gemma3, "270m") => gemma("Gemma 3 270M", "270M", 640, 18, 4, 1, 2048, 32_768, 512, None),
            (SynthArch::Gemma3, "1b") => gemma("Gemma 3 1B", "1B", 1152, 26, 4, 1, 6912, 32_768, 512, None),
            (SynthArch::Gemma3, "4b") => gemma("Gemma 3 4B", "4B", 2560, 34, 8, 4, 10_240, 131_072, 1024, Some(8.0)),
            (SynthArch::Gemma3, "12b") => {
                gemma("Gemma 3 12B", "12B", 3840, 48, 16, 8, 15_360, 131_072, 1024, Some(8.0))
            }
            (SynthArch::Gemma3, "tiny") => SynthShape {
                head_dim: 64,
                n_rot: 64,
                n_vocab: 1024,
                ..gemma("tiny Gemma 3", "tiny", 320, 6, 2, 1, 512, 4096, 16, None)
            },
            (SynthArch::Gemma2, "2b") => SynthShape {
                sliding_window: Some(4096),
                attn_softcap: Some(50.0),
                final_softcap: Some(30.0),
                ..base("Gemma 2 2B", "2B", 2304, 26, 8, 4, 256, 9216, 256_000, 8192, 10_000.0, true, 1e-6)
            },
            (SynthArch::Gemma2, "tiny") => SynthShape {
                sliding_window: Some(8),
                attn_softcap: Some(2.5),
                final_softcap: Some(5.0),
                ..tiny("tiny Gemma 2", 4, 4, 2, 64, true)
            },
            (SynthArch::Llama, "1b") => llama("Llama 3.2 1B", "1B", 2048, 16, 8192, 131_072, true),
            (SynthArch::Llama, "8b") => llama("Llama 3 8B", "8B", 4096, 32, 14_336, 8192, false),
            (SynthArch::Llama, "mistral-7b") => {
                base("Mistral 7B v0.3", "7B", 4096, 32, 32, 8, 128, 14_336, 32_768, 32_768, 1_000_000.0, false, 1e-5)
            }
            (SynthArch::Llama, "tiny") => SynthShape {
                n_head: 4,
                n_head_kv: 2,
                head_dim: 64,
                n_rot: 64,
                n_vocab: 1024,
                ..llama("tiny Llama", "tiny", 256, 2, 512, 4096, false)
            },
            (SynthArch::Qwen2, "0.5b") => {
                base("Qwen2.5 0.5B", "0.5B", 896, 24, 14, 2, 64, 4864, 151_936, 32_768, 1_000_000.0, true, 1e-6)
            }
            (SynthArch::Qwen2, "tiny") => tiny("tiny Qwen 2", 3, 4, 2, 64, true),
            (SynthArch::Qwen3, "0.6b") => {
                base("Qwen3 0.6B", "0.6B", 1024, 28, 16, 8, 128, 3072, 151_936, 40_960, 1_000_000.0, true, 1e-6)
            }
            (SynthArch::Qwen3, "tiny") => tiny("tiny Qwen 3", 3, 4, 2, 128, true),
            // "Phi 3", not "Phi-3": llama.cpp gives special tokens of the real
            // vocabulary (`<|endoftext|>`) attributes when general.name
            // contains "phi-3", and fails on a generated vocabulary without them.
            (SynthArch::Phi3, "mini") => {
                base("Phi 3 mini 4k", "3.8B", 3072, 32, 32, 32, 96, 8192, 32_064, 4096, 10_000.0, false, 1e-5)
            }
            (SynthArch::Phi3, "tiny") => SynthShape { n_rot: 48, ..tiny("tiny Phi 3", 3, 4, 2, 64, false) },
            _ => return Err(UnknownPreset { arch, size: size.to_string() }),
        };
        Ok(shape)
    }

    /// Checks that the shape can be written: positive sizes, whole heads,
    /// rows that are whole 32-value blocks.
    ///
    /// # Errors
    /// [`Error::Gguf`] describing the first problem.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Gguf(format!("synthetic shape: {m}")));
        let dims = [
            ("n_embd", self.n_embd),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_head_kv", self.n_head_kv),
            ("head_dim", self.head_dim),
            ("n_ff", self.n_ff),
            ("n_vocab", self.n_vocab),
            ("n_ctx_train", self.n_ctx_train),
        ];
        if let Some((name, _)) = dims.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{name} must be positive"));
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!("n_head {} is not a multiple of n_head_kv {}", self.n_head, self.n_head_kv));
        }
        for (name, v) in
            [("n_embd", self.n_embd), ("n_ff", self.n_ff), ("n_head·head_dim", self.n_head * self.head_dim)]
        {
            if !v.is_multiple_of(32) {
                return bad(format!("{name} = {v} is not a multiple of 32"));
            }
        }
        if self.n_rot == 0 || self.n_rot > self.head_dim || !self.n_rot.is_multiple_of(2) {
            return bad(format!("n_rot {} must be even and in 2..=head_dim {} (RoPE)", self.n_rot, self.head_dim));
        }
        if matches!(self.arch, SynthArch::Qwen2 | SynthArch::Phi3) && self.n_head * self.head_dim != self.n_embd {
            return bad(format!("{} needs n_head · head_dim = n_embd", self.arch));
        }
        if [self.attn_softcap, self.final_softcap].iter().flatten().any(|c| !(c.is_finite() && *c > 0.0)) {
            return bad("soft-caps must be positive".into());
        }
        if u32::try_from(self.n_vocab).is_err() || u32::try_from(self.n_ctx_train).is_err() {
            return bad("n_vocab and n_ctx_train must fit in 32 bits".into());
        }
        if self.sliding_window == Some(0) {
            return bad("sliding window of 0".into());
        }
        Ok(())
    }
}
