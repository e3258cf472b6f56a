//! Tensor types: llama.cpp's choice of type per tensor for a file type.

use infer_compute::GgmlType;

/// The file type (llama.cpp's `--ftype` of `llama-quantize`) whose tensor
/// type mix a synthetic file copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SynthQuant {
    /// `Q4_K_M` (`LLAMA_FTYPE_MOSTLY_Q4_K_M`, file type 15).
    Q4KM,
    /// `Q5_K_M` (`LLAMA_FTYPE_MOSTLY_Q5_K_M`, file type 17).
    Q5KM,
    /// `Q8_0` (file type 7).
    Q8_0,
    /// `Q4_0` (file type 2).
    Q4_0,
}

impl SynthQuant {
    /// Every supported file type.
    pub const ALL: [SynthQuant; 4] = [SynthQuant::Q4KM, SynthQuant::Q5KM, SynthQuant::Q8_0, SynthQuant::Q4_0];

    /// The name used on the command line (`"q4_k_m"`).
    pub fn name(self) -> &'static str {
        match self {
            SynthQuant::Q4KM => "q4_k_m",
            SynthQuant::Q5KM => "q5_k_m",
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
            SynthQuant::Q5KM => 17,
            SynthQuant::Q8_0 => 7,
            SynthQuant::Q4_0 => 2,
        }
    }

    /// The default type of a layer matrix before llama.cpp's adjustments.
    fn base_type(self) -> GgmlType {
        match self {
            SynthQuant::Q4KM => GgmlType::Q4_K,
            SynthQuant::Q5KM => GgmlType::Q5_K,
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
    /// Fused q‖k‖v projection (Phi-3).
    AttnQkv,
    /// Query bias (Qwen 2).
    AttnQBias,
    /// Key bias (Qwen 2).
    AttnKBias,
    /// Value bias (Qwen 2).
    AttnVBias,
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
    /// FFN up projection (Phi-3: gate‖up, 2·n_ff rows).
    FfnUp,
    /// FFN down projection.
    FfnDown,
    /// Norm of the FFN output (Gemma 3).
    PostFfnNorm,
}

impl TensorRole {
    /// Whether the tensor is a bias (1-D, F32, values of order 0.5).
    pub fn is_bias(self) -> bool {
        matches!(self, TensorRole::AttnQBias | TensorRole::AttnKBias | TensorRole::AttnVBias)
    }

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
/// matrix. Norm weights and biases stay F32.
///
/// The rules (llama.cpp `llama_tensor_get_type_impl`, non-MoE paths):
/// - output matrix, and the embeddings when tied: Q8_0 when `cols` is not a
///   multiple of the default type's block, else Q6_K (unless the file type
///   is Q8_0, which keeps Q8_0);
/// - untied embeddings: the default type;
/// - Q4_K_M and Q5_K_M: `attn_v` and `ffn_down` are Q6_K where
///   [`use_more_bits`], and a fused `attn_qkv` is Q5_K (Q4_K_M) or Q6_K
///   (Q5_K_M);
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
    if role.is_norm() || role.is_bias() {
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
        TensorRole::AttnV | TensorRole::FfnDown
            if matches!(quant, SynthQuant::Q4KM | SynthQuant::Q5KM) && use_more_bits(layer, n_layer) =>
        {
            GgmlType::Q6_K
        }
        TensorRole::AttnQkv if quant == SynthQuant::Q4KM => GgmlType::Q5_K,
        TensorRole::AttnQkv if quant == SynthQuant::Q5KM => GgmlType::Q6_K,
        _ => base,
    };
    fallback_type(ty, cols)
}
