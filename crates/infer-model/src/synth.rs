//! Synthetic GGUF models: random weights with the shapes, metadata and
//! tensor-type mix of real models, so that speed can be measured (by us and
//! by llama.cpp, on the same file) on model sizes we do not download.
//!
//! A synthetic file is a valid model of its architecture: every tensor a
//! loader requires is present with the real shape, the hyper-parameter keys
//! are those of the real model's GGUF, and the tokenizer metadata is either
//! copied from a real file (Gemma 3: the default model's vocabulary) or a
//! small generated SentencePiece vocabulary padded to the real size
//! (Llama). The weights are random, so the text it generates is noise.
//!
//! - **Shapes**: [`SynthShape::preset`] (Gemma 3 270M/1B/4B/12B, Llama 3.2
//!   1B, Llama 3 8B, and a `tiny` shape of each architecture for tests).
//! - **Types**: [`tensor_type`] reproduces llama.cpp's choice for the file
//!   types Q4_K_M, Q8_0 and Q4_0 (`llama_tensor_get_type_impl` and
//!   `tensor_type_fallback` in llama.cpp's `src/llama-quant.cpp`): Q4_K_M
//!   quantizes most matrices to Q4_K, promotes `attn_v` and `ffn_down` to
//!   Q6_K in the layers [`use_more_bits`] selects, writes the output matrix
//!   (and the embeddings when they are tied to it) as Q6_K, and falls back
//!   to Q5_0 / Q8_0 for rows that are not whole 256-value super-blocks.
//!   Applied to Gemma 3 270M this gives exactly the types of the published
//!   Q4_K_M file.
//! - **Values**: each matrix row is drawn from a seeded generator
//!   (approximately normal, standard deviation `1/sqrt(cols)`, so that a
//!   mat-vec of a normalized activation stays of order one) and quantized
//!   with ggml's reference quantizer ([`infer_compute::quant::quantize_row`]);
//!   the block scales are therefore finite and small. Norm weights are
//!   `1 ± 0.1`. The file is a pure function of the shape, the file type and
//!   the seed, whatever the number of threads.
//! - **Writing** ([`write_synthetic`]) streams: one tensor is generated at a
//!   time (in parallel over row chunks) and written before the next, so a
//!   7 GB file needs only its largest tensor in memory.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use infer_compute::GgmlType;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::gguf::{GgufFile, GgufWriter, Value};
use crate::{Error, Result};

/// An architecture `infer synth` can generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SynthArch {
    /// Gemma 3 (`general.architecture = "gemma3"`).
    Gemma3,
    /// Llama 3 family (`general.architecture = "llama"`).
    Llama,
}

impl SynthArch {
    /// Every architecture.
    pub const ALL: [SynthArch; 2] = [SynthArch::Gemma3, SynthArch::Llama];

    /// The GGUF architecture name (`"gemma3"`, `"llama"`).
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Gemma3 => "gemma3",
            SynthArch::Llama => "llama",
        }
    }

    /// Parses a GGUF architecture name (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name().eq_ignore_ascii_case(s))
    }

    /// The preset sizes of this architecture, as accepted by
    /// [`SynthShape::preset`].
    pub fn sizes(self) -> &'static [&'static str] {
        match self {
            SynthArch::Gemma3 => &["270m", "1b", "4b", "12b", "tiny"],
            SynthArch::Llama => &["1b", "8b", "tiny"],
        }
    }
}

impl std::fmt::Display for SynthArch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

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
    /// | llama 1b (Llama 3.2 1B) | 2048 | 16 | 32 / 8 | 64 | 8192 | 128256 | RoPE base 500 000, tied output |
    /// | llama 8b (Llama 3 8B) | 4096 | 32 | 32 / 8 | 128 | 14336 | 128256 | RoPE base 500 000 |
    /// | tiny | 320 / 256 | 6 / 2 | 2 / 1, 4 / 2 | 64 | 512 | 1024 | a few MB, for tests only |
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
        let gemma = |name: &str, label: &str, e, l, h, kv, ff, ctx, window, scaling| SynthShape {
            arch,
            model_name: name.to_string(),
            size_label: label.to_string(),
            n_embd: e,
            n_layer: l,
            n_head: h,
            n_head_kv: kv,
            head_dim: 256,
            n_ff: ff,
            n_vocab: 262_144,
            n_ctx_train: ctx,
            rope_base: 1_000_000.0,
            rope_scaling: scaling,
            sliding_window: Some(window),
            tied_embeddings: true,
            rms_eps: 1e-6,
        };
        let llama = |name: &str, label: &str, e, l, ff, ctx, tied| SynthShape {
            arch,
            model_name: name.to_string(),
            size_label: label.to_string(),
            n_embd: e,
            n_layer: l,
            n_head: 32,
            n_head_kv: 8,
            head_dim: e / 32,
            n_ff: ff,
            n_vocab: 128_256,
            n_ctx_train: ctx,
            rope_base: 500_000.0,
            rope_scaling: None,
            sliding_window: None,
            tied_embeddings: tied,
            rms_eps: 1e-5,
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
                n_vocab: 1024,
                ..gemma("tiny Gemma 3", "tiny", 320, 6, 2, 1, 512, 4096, 16, None)
            },
            (SynthArch::Llama, "1b") => llama("Llama 3.2 1B", "1B", 2048, 16, 8192, 131_072, true),
            (SynthArch::Llama, "8b") => llama("Llama 3 8B", "8B", 4096, 32, 14_336, 8192, false),
            (SynthArch::Llama, "tiny") => SynthShape {
                n_head: 4,
                n_head_kv: 2,
                head_dim: 64,
                n_vocab: 1024,
                ..llama("tiny Llama", "tiny", 256, 2, 512, 4096, false)
            },
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
            if v % 32 != 0 {
                return bad(format!("{name} = {v} is not a multiple of 32"));
            }
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even (RoPE)", self.head_dim));
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

/// The file type (llama.cpp's `--ftype` of `llama-quantize`) whose tensor
/// type mix a synthetic file copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SynthQuant {
    /// `Q4_K_M` (`LLAMA_FTYPE_MOSTLY_Q4_K_M`, file type 15).
    Q4KM,
    /// `Q8_0` (file type 7).
    Q8_0,
    /// `Q4_0` (file type 2).
    Q4_0,
}

impl SynthQuant {
    /// Every supported file type.
    pub const ALL: [SynthQuant; 3] = [SynthQuant::Q4KM, SynthQuant::Q8_0, SynthQuant::Q4_0];

    /// The name used on the command line (`"q4_k_m"`).
    pub fn name(self) -> &'static str {
        match self {
            SynthQuant::Q4KM => "q4_k_m",
            SynthQuant::Q8_0 => "q8_0",
            SynthQuant::Q4_0 => "q4_0",
        }
    }

    /// Parses [`SynthQuant::name`] (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|q| q.name().eq_ignore_ascii_case(s))
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            SynthQuant::Q4KM => 15,
            SynthQuant::Q8_0 => 7,
            SynthQuant::Q4_0 => 2,
        }
    }

    /// The default type of a layer matrix before llama.cpp's adjustments.
    fn base_type(self) -> GgmlType {
        match self {
            SynthQuant::Q4KM => GgmlType::Q4_K,
            SynthQuant::Q8_0 => GgmlType::Q8_0,
            SynthQuant::Q4_0 => GgmlType::Q4_0,
        }
    }
}

/// The name llama.cpp gives a `general.file_type` value (as `llama-bench`
/// prints it in its model column); `None` for values not listed here.
pub fn file_type_name(file_type: u32) -> Option<&'static str> {
    Some(match file_type {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        25 => "IQ4_NL - 4.5 bpw",
        32 => "BF16",
        _ => return None,
    })
}

/// What a tensor is, for choosing its type and initial values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorRole {
    /// Token embeddings, n_vocab rows of n_embd.
    TokenEmbd,
    /// Output projection (untied models).
    Output,
    /// Final norm before the output projection.
    OutputNorm,
    /// Pre-attention norm.
    AttnNorm,
    /// Query projection.
    AttnQ,
    /// Key projection.
    AttnK,
    /// Value projection.
    AttnV,
    /// Attention output projection.
    AttnOutput,
    /// Per-head query norm (Gemma 3).
    AttnQNorm,
    /// Per-head key norm (Gemma 3).
    AttnKNorm,
    /// Norm of the attention output (Gemma 3).
    PostAttnNorm,
    /// Pre-FFN norm.
    FfnNorm,
    /// FFN gate projection.
    FfnGate,
    /// FFN up projection.
    FfnUp,
    /// FFN down projection.
    FfnDown,
    /// Norm of the FFN output (Gemma 3).
    PostFfnNorm,
}

impl TensorRole {
    /// Whether the tensor is a norm weight (1-D, F32, values near 1).
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            TensorRole::OutputNorm
                | TensorRole::AttnNorm
                | TensorRole::AttnQNorm
                | TensorRole::AttnKNorm
                | TensorRole::PostAttnNorm
                | TensorRole::FfnNorm
                | TensorRole::PostFfnNorm
        )
    }
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)`: the first and last
/// eighth of the layers, and every third layer in between, get more bits
/// (`attn_v` and `ffn_down` become Q6_K in a Q4_K_M file).
pub fn use_more_bits(i_layer: usize, n_layers: usize) -> bool {
    let (i, n) = (i_layer as i64, n_layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// llama.cpp's `tensor_type_fallback`: a type whose block does not divide
/// the row length `cols` is replaced by a 32-block type (Q4_K → Q5_0,
/// Q5_K → Q5_1, Q6_K → Q8_0, Q2_K/Q3_K → Q4_0), or by F16 when even that
/// does not divide it.
pub fn fallback_type(ty: GgmlType, cols: usize) -> GgmlType {
    if cols.is_multiple_of(ty.block_size()) {
        return ty;
    }
    let t = match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        other => other,
    };
    if cols.is_multiple_of(t.block_size()) {
        t
    } else {
        GgmlType::F16
    }
}

/// The type llama.cpp's quantizer gives a tensor of `role` in layer `layer`
/// of `n_layer` with rows of `cols` values, for file type `quant`, in a
/// dense model; `tied` says whether the embeddings double as the output
/// matrix. Norm weights stay F32.
///
/// The rules (llama.cpp `llama_tensor_get_type_impl`, non-MoE paths):
/// - output matrix, and the embeddings when tied: Q8_0 when `cols` is not a
///   multiple of the default type's block, else Q6_K (unless the file type
///   is Q8_0, which keeps Q8_0);
/// - untied embeddings: the default type;
/// - Q4_K_M: `attn_v` and `ffn_down` are Q6_K where [`use_more_bits`];
/// - every other matrix: the default type;
/// - then [`fallback_type`] for rows that the chosen block does not divide.
pub fn tensor_type(
    quant: SynthQuant,
    role: TensorRole,
    layer: usize,
    n_layer: usize,
    cols: usize,
    tied: bool,
) -> GgmlType {
    if role.is_norm() {
        return GgmlType::F32;
    }
    let base = quant.base_type();
    let ty = match role {
        TensorRole::Output | TensorRole::TokenEmbd if role == TensorRole::Output || tied => {
            if !cols.is_multiple_of(base.block_size()) {
                GgmlType::Q8_0
            } else if base != GgmlType::Q8_0 {
                GgmlType::Q6_K
            } else {
                GgmlType::Q8_0
            }
        }
        TensorRole::AttnV | TensorRole::FfnDown if quant == SynthQuant::Q4KM && use_more_bits(layer, n_layer) => {
            GgmlType::Q6_K
        }
        _ => base,
    };
    fallback_type(ty, cols)
}

/// One tensor of a synthetic file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    /// GGUF name (`"blk.3.attn_v.weight"`).
    pub name: String,
    /// What the tensor is.
    pub role: TensorRole,
    /// Layer index for `blk.*` tensors.
    pub layer: Option<usize>,
    /// Extents in ggml order (`dims[0]` values per row).
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
}

impl TensorPlan {
    /// Values per row.
    pub fn cols(&self) -> usize {
        self.dims[0] as usize
    }

    /// Number of rows (1 for 1-D tensors).
    pub fn rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }

    /// Number of values.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes of the tensor's data.
    ///
    /// # Errors
    /// Rows that are not whole blocks (never for planned tensors).
    pub fn n_bytes(&self) -> Result<usize> {
        Ok(self.ty.row_bytes(self.cols())? * self.rows())
    }
}

/// Every tensor of a synthetic model, in file order: `token_embd`, then each
/// layer's tensors in the order they run, then `output_norm` and `output`
/// (absent when tied), with their types from [`tensor_type`].
///
/// # Errors
/// An invalid shape ([`SynthShape::validate`]).
pub fn plan_tensors(shape: &SynthShape, quant: SynthQuant) -> Result<Vec<TensorPlan>> {
    shape.validate()?;
    let s = shape;
    let (e, q, kv) = (s.n_embd as u64, (s.n_head * s.head_dim) as u64, (s.n_head_kv * s.head_dim) as u64);
    let gemma = s.arch == SynthArch::Gemma3;
    let mut out = Vec::new();
    let mut push = |name: String, role: TensorRole, layer: Option<usize>, dims: Vec<u64>| {
        let ty = tensor_type(quant, role, layer.unwrap_or(0), s.n_layer, dims[0] as usize, s.tied_embeddings);
        out.push(TensorPlan { name, role, layer, dims, ty });
    };
    push("token_embd.weight".into(), TensorRole::TokenEmbd, None, vec![e, s.n_vocab as u64]);
    for i in 0..s.n_layer {
        let n = |t: &str| format!("blk.{i}.{t}.weight");
        let l = Some(i);
        push(n("attn_norm"), TensorRole::AttnNorm, l, vec![e]);
        push(n("attn_q"), TensorRole::AttnQ, l, vec![e, q]);
        push(n("attn_k"), TensorRole::AttnK, l, vec![e, kv]);
        push(n("attn_v"), TensorRole::AttnV, l, vec![e, kv]);
        if gemma {
            push(n("attn_q_norm"), TensorRole::AttnQNorm, l, vec![s.head_dim as u64]);
            push(n("attn_k_norm"), TensorRole::AttnKNorm, l, vec![s.head_dim as u64]);
        }
        push(n("attn_output"), TensorRole::AttnOutput, l, vec![q, e]);
        if gemma {
            push(n("post_attention_norm"), TensorRole::PostAttnNorm, l, vec![e]);
        }
        push(n("ffn_norm"), TensorRole::FfnNorm, l, vec![e]);
        push(n("ffn_gate"), TensorRole::FfnGate, l, vec![e, s.n_ff as u64]);
        push(n("ffn_up"), TensorRole::FfnUp, l, vec![e, s.n_ff as u64]);
        push(n("ffn_down"), TensorRole::FfnDown, l, vec![s.n_ff as u64, e]);
        if gemma {
            push(n("post_ffw_norm"), TensorRole::PostFfnNorm, l, vec![e]);
        }
    }
    push("output_norm.weight".into(), TensorRole::OutputNorm, None, vec![e]);
    if !s.tied_embeddings {
        push("output.weight".into(), TensorRole::Output, None, vec![e, s.n_vocab as u64]);
    }
    Ok(out)
}

/// Where the tokenizer metadata of a synthetic file comes from.
#[derive(Clone, Copy)]
pub enum SynthVocab<'a> {
    /// Every `tokenizer.*` key of a real model file, copied as is; its
    /// vocabulary must have exactly the shape's `n_vocab` tokens.
    CopyFrom(&'a GgufFile),
    /// A small SentencePiece vocabulary (see [`generated_vocab`]).
    Generated,
}

impl std::fmt::Debug for SynthVocab<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SynthVocab::CopyFrom(_) => f.write_str("CopyFrom(..)"),
            SynthVocab::Generated => f.write_str("Generated"),
        }
    }
}

/// GGUF token types (`tokenizer.ggml.token_type`).
const TT_NORMAL: i32 = 1;
const TT_UNKNOWN: i32 = 2;
const TT_CONTROL: i32 = 3;
const TT_UNUSED: i32 = 5;
const TT_BYTE: i32 = 6;

/// A generated SentencePiece (`tokenizer.ggml.model = "llama"`) vocabulary
/// of exactly `n_vocab` tokens, as `tokenizer.ggml.*` metadata entries:
/// `<unk>` (0), `<s>` (1, BOS), `</s>` (2, EOS), the 256 byte tokens
/// `<0x00>`..`<0xFF>` (so that any text encodes by byte fallback, and
/// llama.cpp finds its newline token), printable ASCII characters with and
/// without the `▁` space marker, lower-case letter pairs with and without
/// it, then `<unused_N>` slots up to `n_vocab`. Scores favour longer pieces.
///
/// # Errors
/// [`Error::Tokenizer`] when `n_vocab` is smaller than the 259 tokens that
/// must be there.
pub fn generated_vocab(n_vocab: usize) -> Result<Vec<(String, Value)>> {
    const FIXED: usize = 3 + 256;
    if n_vocab < FIXED {
        return Err(Error::Tokenizer(format!(
            "a generated vocabulary needs at least {FIXED} tokens, asked for {n_vocab}"
        )));
    }
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut scores = vec![0f32; 3];
    let mut types = vec![TT_UNKNOWN, TT_CONTROL, TT_CONTROL];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(TT_BYTE);
    }
    let mut pieces: Vec<String> = vec!["\u{2581}".into()];
    for c in (0x21u8..=0x7e).map(char::from) {
        pieces.push(c.to_string());
        pieces.push(format!("\u{2581}{c}"));
    }
    for a in 'a'..='z' {
        for b in 'a'..='z' {
            pieces.push(format!("{a}{b}"));
            pieces.push(format!("\u{2581}{a}{b}"));
        }
    }
    for p in pieces.into_iter().take(n_vocab - FIXED) {
        // Longer pieces merge first; ties keep their order.
        scores.push(-1000.0 + p.chars().count() as f32 * 100.0 - tokens.len() as f32 * 1e-3);
        tokens.push(p);
        types.push(TT_NORMAL);
    }
    let mut unused = 0usize;
    while tokens.len() < n_vocab {
        tokens.push(format!("<unused_{unused}>"));
        scores.push(-1e9);
        types.push(TT_UNUSED);
        unused += 1;
    }
    let p = |k: &str| format!("tokenizer.ggml.{k}");
    Ok(vec![
        (p("model"), Value::from("llama")),
        (p("pre"), Value::from("default")),
        (p("tokens"), Value::from(tokens)),
        (p("scores"), Value::from(scores)),
        (p("token_type"), Value::from(types)),
        (p("bos_token_id"), Value::U32(1)),
        (p("eos_token_id"), Value::U32(2)),
        (p("unknown_token_id"), Value::U32(0)),
        (p("add_bos_token"), Value::Bool(true)),
        (p("add_eos_token"), Value::Bool(false)),
    ])
}

/// Every `tokenizer.*` entry of `file`, checked to hold `n_vocab` tokens.
fn copied_vocab(file: &GgufFile, n_vocab: usize) -> Result<Vec<(String, Value)>> {
    let n = file.get_array("tokenizer.ggml.tokens")?.len();
    if n != n_vocab {
        return Err(Error::Tokenizer(format!(
            "the tokenizer to copy has {n} tokens, the synthetic model needs {n_vocab}"
        )));
    }
    Ok(file.metadata().iter().filter(|(k, _)| k.starts_with("tokenizer.")).cloned().collect())
}

/// The metadata of a synthetic file, in file order: `general.*`, the
/// architecture's hyper-parameter keys (named as llama.cpp's converter
/// writes them for the real model), then the tokenizer. `general.name`
/// and `general.description` say that the weights are random;
/// `infer.synth.seed` records the seed.
///
/// # Errors
/// An invalid shape; a tokenizer to copy whose size differs from `n_vocab`;
/// a vocabulary too small to generate.
pub fn metadata(
    shape: &SynthShape,
    quant: SynthQuant,
    seed: u64,
    vocab: SynthVocab<'_>,
) -> Result<Vec<(String, Value)>> {
    shape.validate()?;
    let s = shape;
    let a = s.arch.name();
    let u = |v: usize| Value::U32(v as u32);
    let mut m: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::from(a)),
        ("general.type".into(), Value::from("model")),
        ("general.name".into(), Value::from(format!("{} (synthetic, random weights)", s.model_name))),
        (
            "general.description".into(),
            Value::from(format!(
                "Random weights with the shapes and {} tensor types of {}, written by `infer synth` with seed {seed}. \
                 Not a trained model: for speed measurements only.",
                quant.name().to_uppercase(),
                s.model_name
            )),
        ),
        ("general.size_label".into(), Value::from(s.size_label.as_str())),
        ("general.file_type".into(), Value::U32(quant.file_type())),
        ("general.quantization_version".into(), Value::U32(2)),
        ("infer.synth.seed".into(), Value::U64(seed)),
    ];
    let k = |key: &str| format!("{a}.{key}");
    m.push((k("context_length"), u(s.n_ctx_train)));
    m.push((k("embedding_length"), u(s.n_embd)));
    m.push((k("block_count"), u(s.n_layer)));
    m.push((k("feed_forward_length"), u(s.n_ff)));
    m.push((k("attention.head_count"), u(s.n_head)));
    m.push((k("attention.head_count_kv"), u(s.n_head_kv)));
    m.push((k("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps)));
    m.push((k("attention.key_length"), u(s.head_dim)));
    m.push((k("attention.value_length"), u(s.head_dim)));
    m.push((k("rope.freq_base"), Value::F32(s.rope_base)));
    if let Some(w) = s.sliding_window {
        m.push((k("attention.sliding_window"), u(w)));
    }
    if let Some(f) = s.rope_scaling {
        m.push((k("rope.scaling.type"), Value::from("linear")));
        m.push((k("rope.scaling.factor"), Value::F32(f)));
    }
    if s.arch == SynthArch::Llama {
        m.push((k("rope.dimension_count"), u(s.head_dim)));
        m.push((k("vocab_size"), u(s.n_vocab)));
    }
    m.extend(match vocab {
        SynthVocab::CopyFrom(file) => copied_vocab(file, s.n_vocab)?,
        SynthVocab::Generated => generated_vocab(s.n_vocab)?,
    });
    Ok(m)
}

/// SplitMix64: a well-mixed 64-bit function of its input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of one tensor: the file's seed mixed with the tensor's name.
fn tensor_seed(seed: u64, name: &str) -> u64 {
    // FNV-1a of the name.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    mix(seed ^ mix(h))
}

/// Values per generation chunk (rows are grouped up to about this many);
/// part of the file format of a seed, so it must not change.
const CHUNK_VALUES: usize = 1 << 16;

/// An approximately normal value with mean 0 and variance 1: the sum of
/// four uniform 16-bit numbers, centred and scaled (Irwin–Hall, n = 4),
/// from one 64-bit draw.
fn approx_normal(r: u64) -> f32 {
    let s = (r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48);
    // Mean 4·32767.5, variance 4·(65536² − 1)/12.
    const MEAN: f64 = 131_070.0;
    const INV_STD: f64 = 2.642_943_055e-5; // 1 / sqrt(4 * (65536^2 - 1) / 12)
    ((s as f64 - MEAN) * INV_STD) as f32
}

/// A byte buffer aligned to 16 bytes, so that any block type can be viewed
/// in it.
#[derive(Default)]
struct Aligned {
    words: Vec<u128>,
    len: usize,
}

impl Aligned {
    fn bytes_mut(&mut self, n: usize) -> &mut [u8] {
        self.words.resize(n.div_ceil(16), 0);
        self.len = n;
        &mut bytemuck::cast_slice_mut(&mut self.words)[..n]
    }
}

/// Fills `out` (exactly the tensor's bytes) with the tensor's random
/// values: norm weights `1 + u`, `u` uniform in ±0.1; matrices rows of
/// approximately normal values with standard deviation `1/sqrt(cols)`,
/// quantized to the tensor's type with ggml's reference quantizer. The
/// rows are generated in fixed chunks, each from its own generator, on
/// `threads` threads; the bytes depend on `seed` and the tensor's name and
/// shape only. `progress` is called with the number of bytes of each chunk
/// as it completes.
///
/// # Errors
/// `out` of the wrong length; quantizer errors.
pub fn fill_tensor(
    plan: &TensorPlan,
    seed: u64,
    threads: usize,
    out: &mut [u8],
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let need = plan.n_bytes()?;
    if out.len() != need {
        return Err(Error::Gguf(format!("tensor `{}`: buffer of {} bytes, needs {need}", plan.name, out.len())));
    }
    let (rows, cols) = (plan.rows(), plan.cols());
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let row_bytes = plan.ty.row_bytes(cols)?;
    let rows_per_chunk = (CHUNK_VALUES / cols).max(1);
    let chunk_bytes = rows_per_chunk * row_bytes;
    let tseed = tensor_seed(seed, &plan.name);
    let norm = plan.role.is_norm();
    let std = 1.0 / (cols as f32).sqrt();
    let work = Mutex::new(out.chunks_mut(chunk_bytes).enumerate());
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    let n_threads = threads.clamp(1, rows.div_ceil(rows_per_chunk));
    let worker = || {
        let mut vals: Vec<f32> = Vec::new();
        let mut q = Aligned::default();
        loop {
            let next = match work.lock() {
                Ok(mut it) => it.next(),
                Err(_) => None,
            };
            let Some((ci, dst)) = next else { break };
            let n_rows = dst.len() / row_bytes;
            let mut rng = ChaCha8Rng::seed_from_u64(mix(tseed ^ mix(ci as u64)));
            vals.clear();
            vals.extend((0..n_rows * cols).map(|_| {
                let r = rng.next_u64();
                if norm {
                    // Uniform in [0.9, 1.1).
                    1.0 + ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
                } else {
                    approx_normal(r) * std
                }
            }));
            let buf = q.bytes_mut(dst.len());
            let res = vals
                .chunks_exact(cols)
                .zip(buf.chunks_exact_mut(row_bytes))
                .try_for_each(|(x, y)| infer_compute::quant::quantize_row(plan.ty, x, y));
            if let Err(e) = res {
                if let Ok(mut f) = failed.lock() {
                    f.get_or_insert(e.into());
                }
                break;
            }
            dst.copy_from_slice(buf);
            progress(dst.len() as u64);
        }
    };
    if n_threads == 1 {
        worker();
    } else {
        std::thread::scope(|s| {
            for _ in 0..n_threads {
                s.spawn(worker);
            }
        });
    }
    match failed.into_inner() {
        Ok(Some(e)) => Err(e),
        Ok(None) => Ok(()),
        Err(_) => Err(Error::Gguf(format!("tensor `{}`: a generator thread failed", plan.name))),
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    /// Shapes of the model.
    pub shape: SynthShape,
    /// File type whose tensor type mix is copied.
    pub quant: SynthQuant,
    /// Seed of the random values.
    pub seed: u64,
    /// Generator threads (the output does not depend on it).
    pub threads: usize,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct SynthSummary {
    /// Tensors in the file.
    pub n_tensors: usize,
    /// Values in all tensors (the parameter count).
    pub n_params: u64,
    /// Bytes of tensor data (llama-bench's "size").
    pub tensor_bytes: u64,
    /// Bytes of the file.
    pub file_bytes: u64,
    /// Per type: tensors and bytes, by type id.
    pub types: Vec<(GgmlType, usize, u64)>,
}

/// Tensor count, parameters, data bytes and the per-type breakdown of a
/// plan (what [`write_synthetic`] will write, except the file size).
///
/// # Errors
/// As [`TensorPlan::n_bytes`].
pub fn summarize(plan: &[TensorPlan]) -> Result<SynthSummary> {
    let mut types: Vec<(GgmlType, usize, u64)> = Vec::new();
    let (mut n_params, mut tensor_bytes) = (0u64, 0u64);
    for t in plan {
        let b = t.n_bytes()? as u64;
        n_params += t.n_elements();
        tensor_bytes += b;
        match types.iter_mut().find(|(ty, _, _)| *ty == t.ty) {
            Some(e) => {
                e.1 += 1;
                e.2 += b;
            }
            None => types.push((t.ty, 1, b)),
        }
    }
    types.sort_by_key(|(ty, _, _)| ty.id());
    Ok(SynthSummary { n_tensors: plan.len(), n_params, tensor_bytes, file_bytes: 0, types })
}

/// Writes a synthetic model to `path` (through a temporary file in the same
/// directory, renamed when complete). Tensors are generated one at a time
/// with [`fill_tensor`] and streamed to disk; `progress` receives the bytes
/// of tensor data completed so far, in increments.
///
/// # Errors
/// Invalid shape, tokenizer problems (see [`metadata`]), I/O errors naming
/// the path.
pub fn write_synthetic(
    path: &Path,
    opts: &SynthOptions,
    vocab: SynthVocab<'_>,
    progress: Arc<dyn Fn(u64) + Send + Sync>,
) -> Result<SynthSummary> {
    let plan = plan_tensors(&opts.shape, opts.quant)?;
    let mut summary = summarize(&plan)?;
    let mut w = GgufWriter::new();
    for (k, v) in metadata(&opts.shape, opts.quant, opts.seed, vocab)? {
        w.add_metadata(k, v)?;
    }
    let done = Arc::new(AtomicUsize::new(0));
    for t in plan {
        let (seed, threads, progress, done) = (opts.seed, opts.threads, progress.clone(), done.clone());
        let (name, dims, ty) = (t.name.clone(), t.dims.clone(), t.ty);
        w.add_tensor_with(name, &dims, ty, move |buf| {
            let report = |n: u64| {
                let total = done.fetch_add(n as usize, Ordering::Relaxed) as u64 + n;
                progress(total);
            };
            fill_tensor(&t, seed, threads, buf, &report)
        })?;
    }
    w.write_to_path(path)?;
    summary.file_bytes =
        std::fs::metadata(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?.len();
    Ok(summary)
}
