//! The CUDA sources, the names of their kernels as typed constants, and the
//! Rust mirrors of the by-value argument structs declared in
//! `kernels/common.cuh` (same field order, sizes asserted on both sides).

use cudarc::driver::DeviceRepr;

use crate::GgmlType;

/// The `.cu` sources, concatenated in this order into one NVRTC program
/// (NVRTC gets no include path: the header comes first instead).
pub(crate) const SOURCES: [(&str, &str); 10] = [
    ("common.cuh", include_str!("kernels/common.cuh")),
    ("quant.cuh", include_str!("kernels/quant.cuh")),
    ("matvec.cu", include_str!("kernels/matvec.cu")),
    ("norm.cu", include_str!("kernels/norm.cu")),
    ("matvec_norm.cu", include_str!("kernels/matvec_norm.cu")),
    ("rope.cu", include_str!("kernels/rope.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("attention_decode.cu", include_str!("kernels/attention_decode.cu")),
    ("attention_prefill.cu", include_str!("kernels/attention_prefill.cu")),
    ("elementwise.cu", include_str!("kernels/elementwise.cu")),
];

/// A kernel of the module, by its `extern "C"` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KernelName(pub &'static str);

/// Kernels other than the mat-vecs.
pub(crate) mod names {
    use super::KernelName;
    pub const QUANTIZE_Q8: KernelName = KernelName("quantize_q8");
    pub const RESIDUAL_NORM: KernelName = KernelName("residual_norm");
    pub const QKV_POST: KernelName = KernelName("qkv_post");
    pub const ATTN_SPLIT: KernelName = KernelName("attn_split");
    pub const ATTN_SPLIT_GRP: KernelName = KernelName("attn_split_grp");
    pub const ATTN_SPLIT_QKV: KernelName = KernelName("attn_split_qkv");
    pub const ATTN_SPLIT_QKV_GRP: KernelName = KernelName("attn_split_qkv_grp");
    pub const ATTN_COMBINE: KernelName = KernelName("attn_combine");
    pub const ATTN_DECODE_HD64: KernelName = KernelName("attn_decode_hd64");
    pub const ATTN_DECODE_HD128: KernelName = KernelName("attn_decode_hd128");
    pub const ATTN_DECODE_HD256: KernelName = KernelName("attn_decode_hd256");
    pub const ATTN_DECODE_BATCH_HD64: KernelName = KernelName("attn_decode_batch_hd64");
    pub const ATTN_DECODE_BATCH_HD128: KernelName = KernelName("attn_decode_batch_hd128");
    pub const ATTN_DECODE_BATCH_HD256: KernelName = KernelName("attn_decode_batch_hd256");
    pub const EMBED_ROWS: KernelName = KernelName("embed_rows");
    pub const GATHER_ROWS: KernelName = KernelName("gather_rows");
    pub const GLU: KernelName = KernelName("glu");
    pub const ACT_INPLACE: KernelName = KernelName("act_inplace");
    pub const SOFTCAP_INPLACE: KernelName = KernelName("softcap_inplace");
    pub const DEQUANT_MATRIX: KernelName = KernelName("dequant_matrix");
    pub const TO_BF16: KernelName = KernelName("to_bf16");
    pub const ARGMAX_LOGITS: KernelName = KernelName("argmax_logits");
    pub const ATTN_PREFILL_HD64: KernelName = KernelName("attn_prefill_hd64");
    pub const ATTN_PREFILL_HD96: KernelName = KernelName("attn_prefill_hd96");
    pub const ATTN_PREFILL_HD128: KernelName = KernelName("attn_prefill_hd128");
    pub const ATTN_PREFILL_HD256: KernelName = KernelName("attn_prefill_hd256");

    /// Every non-mat-vec kernel (loaded when the backend starts).
    pub const ALL: [KernelName; 26] = [
        QUANTIZE_Q8,
        RESIDUAL_NORM,
        QKV_POST,
        ATTN_SPLIT,
        ATTN_SPLIT_GRP,
        ATTN_SPLIT_QKV,
        ATTN_SPLIT_QKV_GRP,
        ATTN_COMBINE,
        ATTN_DECODE_HD64,
        ATTN_DECODE_HD128,
        ATTN_DECODE_HD256,
        ATTN_DECODE_BATCH_HD64,
        ATTN_DECODE_BATCH_HD128,
        ATTN_DECODE_BATCH_HD256,
        EMBED_ROWS,
        GATHER_ROWS,
        GLU,
        ACT_INPLACE,
        SOFTCAP_INPLACE,
        DEQUANT_MATRIX,
        TO_BF16,
        ARGMAX_LOGITS,
        ATTN_PREFILL_HD64,
        ATTN_PREFILL_HD96,
        ATTN_PREFILL_HD128,
        ATTN_PREFILL_HD256,
    ];
}

/// The mat-vec kernels of one weight type: for one token (`t1`), for one
/// token with the input's residual add and norm done first by every block
/// (`tn`, matvec_norm.cu; quantized types), and for up to 8 tokens per warp
/// pass (`t8`, prefill).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatvecKernels {
    pub t1: KernelName,
    pub tn: Option<KernelName>,
    /// One token, GLU, the output also written as q8 (`mv_*_t1q`).
    pub t1q: Option<KernelName>,
    /// One token, long rows over 2 or 4 warps each (`mv_*_t1s`).
    pub t1s: Option<KernelName>,
    pub t8: KernelName,
    /// Whether the kernel takes the q8 activation (else the f32 one).
    pub quantized: bool,
}

/// Tokens handled per warp pass by the `t8` mat-vec kernels.
pub(crate) const MV_TOKENS: usize = 8;
/// Warps (output rows) per mat-vec block (`MV_WARPS` in matvec.cu).
pub(crate) const MV_WARPS: u32 = 4;
/// Positions per attention split (`ATTN_SPLIT` in common.cuh).
pub(crate) const ATTN_SPLIT: usize = 32;
/// Query heads per attention block (`ATTN_MAX_G`).
pub(crate) const ATTN_MAX_G: usize = 8;
/// Largest head dimension of the q/k/v kernel (`QKV_MAX_HD` in rope.cu).
pub(crate) const QKV_MAX_HD: usize = 1024;

/// The kernels of a quantized type named `$n` in the sources
/// (`MV_KERNELS` / `MVN_KERNEL`: `mv_$n_t1`, `mvn_$n`, `mv_$n_t1q`, `mv_$n_t1s`, `mv_$n_t8`).
macro_rules! quantized_kernels {
    ($n:literal) => {
        Some(MatvecKernels {
            t1: KernelName(concat!("mv_", $n, "_t1")),
            tn: Some(KernelName(concat!("mvn_", $n))),
            t1q: Some(KernelName(concat!("mv_", $n, "_t1q"))),
            t1s: Some(KernelName(concat!("mv_", $n, "_t1s"))),
            t8: KernelName(concat!("mv_", $n, "_t8")),
            quantized: true,
        })
    };
}

/// The mat-vec kernels for weight type `ty`, or `None` where there is none
/// (the activation-only types Q8_1 and Q8_K).
pub(crate) fn matvec_kernels(ty: GgmlType) -> Option<MatvecKernels> {
    use quantized_kernels as q;
    let f = |t1, t8| {
        Some(MatvecKernels { t1: KernelName(t1), tn: None, t1q: None, t1s: None, t8: KernelName(t8), quantized: false })
    };
    match ty {
        GgmlType::F32 => f("mv_f32_t1", "mv_f32_t8"),
        GgmlType::F16 => f("mv_f16_t1", "mv_f16_t8"),
        GgmlType::BF16 => f("mv_bf16_t1", "mv_bf16_t8"),
        GgmlType::Q4_0 => q!("q4_0"),
        GgmlType::Q4_1 => q!("q4_1"),
        GgmlType::Q5_0 => q!("q5_0"),
        GgmlType::Q5_1 => q!("q5_1"),
        GgmlType::Q8_0 => q!("q8_0"),
        GgmlType::IQ4_NL => q!("iq4_nl"),
        GgmlType::Q2_K => q!("q2_k"),
        GgmlType::Q3_K => q!("q3_k"),
        GgmlType::Q4_K => q!("q4_k"),
        GgmlType::Q5_K => q!("q5_k"),
        GgmlType::Q6_K => q!("q6_k"),
        GgmlType::Q8_1 | GgmlType::Q8_K => None,
    }
}

/// The mat-vec kernels of the repacked layout of `ty` (see `repack.rs`).
pub(crate) fn repacked_matvec_kernels(ty: GgmlType) -> Option<MatvecKernels> {
    use quantized_kernels as r;
    match ty {
        GgmlType::Q8_0 => r!("q8_0r"),
        GgmlType::Q4_0 => r!("q4_0r"),
        GgmlType::Q5_0 => r!("q5_0r"),
        GgmlType::Q4_K => r!("q4_kr"),
        GgmlType::Q6_K => r!("q6_kr"),
        _ => None,
    }
}

/// The one-token kernels that run a fused-norm product of type `a` and then
/// a product of type `b` against the same normalized input in one launch
/// (`mvn2_<a>_<b>`, matvec_norm.cu), for the pairs of a layer's q/k/v
/// launch that K-quant mixes produce (attn_v Q6_K beside Q4_K or Q5_K
/// q and k, or their fallbacks Q8_0 and Q5_0; in the repacked layouts
/// where there is one).
pub(crate) const MIXED_NORM_KERNELS: [(Layout, Layout, KernelName); 3] = [
    ((GgmlType::Q4_K, true), (GgmlType::Q6_K, true), KernelName("mvn2_q4_kr_q6_kr")),
    ((GgmlType::Q5_K, false), (GgmlType::Q6_K, true), KernelName("mvn2_q5_k_q6_kr")),
    // Q4_K_M files whose rows (n_embd values) are not a multiple of 256
    // (Gemma 3 270M and 1B): q and k fall back to Q5_0, v in the
    // use_more_bits layers to Q8_0.
    ((GgmlType::Q5_0, true), (GgmlType::Q8_0, true), KernelName("mvn2_q5_0r_q8_0r")),
];

/// A weight type and whether its rows are repacked (`repack.rs`).
pub(crate) type Layout = (GgmlType, bool);

/// The [`MIXED_NORM_KERNELS`] entry for products of types `a` then `b`.
pub(crate) fn mixed_norm_kernel(a: Layout, b: Layout) -> Option<KernelName> {
    MIXED_NORM_KERNELS.iter().find(|k| k.0 == a && k.1 == b).map(|k| k.2)
}

/// Epilogue of a mat-vec launch (`MV_*` in common.cuh).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum MvMode {
    Store = 0,
    GluGelu = 1,
    GluSilu = 2,
    Softcap = 3,
}

/// A device address as kernels take it (0 = null).
pub(crate) type DevPtr = u64;

/// Mirror of `MatvecArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MatvecArgs {
    pub w: [DevPtr; 3],
    pub y: [DevPtr; 3],
    pub aq: DevPtr,
    pub ad: DevPtr,
    pub ax: DevPtr,
    pub rows: [i32; 3],
    pub row_bytes: i32,
    pub cols: i32,
    pub n_tok: i32,
    pub mode: i32,
    pub cap: f32,
    pub prefetch: i32,
    /// `mv_*_t1s`: warps per row, 2 or 4 (the other kernels ignore it).
    pub wpr: i32,
}
const _: () = assert!(std::mem::size_of::<MatvecArgs>() == 112);

/// Mirror of `NormArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NormArgs {
    pub x: DevPtr,
    pub add: DevPtr,
    pub add_w: DevPtr,
    pub w: DevPtr,
    pub b: DevPtr,
    pub out: DevPtr,
    pub q: DevPtr,
    pub ds: DevPtr,
    pub n: i32,
    pub kind: i32,
    pub eps: f32,
    pub add_eps: f32,
}
const _: () = assert!(std::mem::size_of::<NormArgs>() == 80);

/// Mirror of `MvNormArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MvNormArgs {
    pub mv: MatvecArgs,
    pub norm: NormArgs,
    pub x_out: DevPtr,
}
const _: () = assert!(std::mem::size_of::<MvNormArgs>() == 200);

/// Mirror of `MvNorm2Args`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MvNorm2Args {
    pub p: MvNormArgs,
    pub b: MatvecArgs,
}
const _: () = assert!(std::mem::size_of::<MvNorm2Args>() == 312);

/// Mirror of `MvQuantArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct MvQuantArgs {
    pub mv: MatvecArgs,
    pub oq: DevPtr,
    pub ods: DevPtr,
    pub count: DevPtr,
}
const _: () = assert!(std::mem::size_of::<MvQuantArgs>() == 136);

/// Mirror of `QkvArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QkvArgs {
    pub q: DevPtr,
    pub k: DevPtr,
    pub v: DevPtr,
    pub bq: DevPtr,
    pub bk: DevPtr,
    pub bv: DevPtr,
    pub qn_w: DevPtr,
    pub kn_w: DevPtr,
    pub kc: DevPtr,
    pub vc: DevPtr,
    pub pos0: DevPtr,
    pub n_head: i32,
    pub n_kv: i32,
    pub hd: i32,
    pub n_rot: i32,
    pub neox: i32,
    pub n_tok: i32,
    pub theta_scale: f32,
    pub freq_scale: f32,
    pub qn_eps: f32,
    pub kn_eps: f32,
}
const _: () = assert!(std::mem::size_of::<QkvArgs>() == 128);

/// Mirror of `AttnArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AttnArgs {
    pub q: DevPtr,
    pub kc: DevPtr,
    pub vc: DevPtr,
    pub part_o: DevPtr,
    pub part_ml: DevPtr,
    pub out: DevPtr,
    pub oq: DevPtr,
    pub ods: DevPtr,
    pub pos0: DevPtr,
    pub n_head: i32,
    pub n_kv: i32,
    pub hd: i32,
    pub n_split: i32,
    pub window: i32,
    pub n_tok: i32,
    pub scale: f32,
    pub softcap: f32,
}
const _: () = assert!(std::mem::size_of::<AttnArgs>() == 104);

/// Mirror of `AttnQkvArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AttnQkvArgs {
    pub at: AttnArgs,
    pub qk: QkvArgs,
    pub count: DevPtr,
    pub slot: DevPtr,
    pub slot_stride: i64,
}
const _: () = assert!(std::mem::size_of::<AttnQkvArgs>() == 256);

// SAFETY: plain #[repr(C)] structs of integers and floats whose layout
// matches the CUDA declarations (sizes asserted on both sides); kernels
// take them by value.
unsafe impl DeviceRepr for MatvecArgs {}
unsafe impl DeviceRepr for NormArgs {}
unsafe impl DeviceRepr for QkvArgs {}
unsafe impl DeviceRepr for AttnArgs {}
unsafe impl DeviceRepr for AttnQkvArgs {}
unsafe impl DeviceRepr for MvNormArgs {}
unsafe impl DeviceRepr for MvNorm2Args {}
unsafe impl DeviceRepr for MvQuantArgs {}
