//! The CUDA sources, the modules compiled from them, the names of their
//! kernels as typed constants, and the Rust mirrors of the by-value
//! argument structs declared in `kernels/common.cuh` (same field order,
//! sizes asserted on both sides).

use cudarc::driver::DeviceRepr;

use crate::GgmlType;

/// The sources every module begins with, in this order (NVRTC gets no
/// include path: the header comes first instead): the shared definitions
/// and the products' templates, which instantiate nothing.
pub(crate) const PRODUCT_SOURCES: [(&str, &str); 6] = [
    ("common.cuh", include_str!("kernels/common.cuh")),
    ("quant.cuh", include_str!("kernels/quant.cuh")),
    ("matvec.cu", include_str!("kernels/matvec.cu")),
    ("norm.cu", include_str!("kernels/norm.cu")),
    ("matvec_norm.cu", include_str!("kernels/matvec_norm.cu")),
    ("matmul_quant.cu", include_str!("kernels/matmul_quant.cu")),
];

/// The rest of [`Module::Common`], after [`PRODUCT_SOURCES`].
pub(crate) const COMMON_SOURCES: [(&str, &str); 12] = [
    ("kv_cache.cuh", include_str!("kernels/kv_cache.cuh")),
    ("tq_cache.cuh", include_str!("kernels/tq_cache.cuh")),
    ("rope.cu", include_str!("kernels/rope.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("tq_cache.cu", include_str!("kernels/tq_cache.cu")),
    ("tq_decode.cu", include_str!("kernels/tq_decode.cu")),
    ("attention_decode.cu", include_str!("kernels/attention_decode.cu")),
    ("attention_decode_flat.cu", include_str!("kernels/attention_decode_flat.cu")),
    ("attention_prefill.cu", include_str!("kernels/attention_prefill.cu")),
    ("elementwise.cu", include_str!("kernels/elementwise.cu")),
    ("matvec_float.cu", include_str!("kernels/matvec_float.cu")),
    ("topk.cu", include_str!("kernels/topk.cu")),
];

/// A module: one NVRTC program, compiled and cached on its own
/// (`compile.rs`), so that a process compiles only what its models use.
/// Instantiating the products of all 16 quantized layouts is two thirds of
/// the whole compile (16.3 s for everything, 5.1 s for the common module,
/// 0.8 s per layout: NVRTC 13.5 for sm_90 on a 2-core Xeon, 2026-12-04).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Module {
    /// Every kernel but the quantized products: norms, RoPE, attention,
    /// elementwise, embedding, dequantization, the float products. Loaded
    /// when the backend starts.
    Common,
    /// The quantized products of `PRODUCTS[i]` (and the mixed-norm kernels
    /// whose first product is of that layout). Loaded when a model with
    /// such a matrix is prepared, or at a product's first launch.
    Products(u8),
}

impl Module {
    /// Its name in messages and cache files: `common`, or the layout's
    /// (`q4_k`, `q4_kr` for the repacked layout).
    pub(crate) fn label(self) -> &'static str {
        match self {
            Module::Common => "common",
            Module::Products(i) => PRODUCTS[i as usize].name,
        }
    }

    /// The program's source text.
    pub(crate) fn source(self) -> String {
        let mut src: String = PRODUCT_SOURCES.iter().map(|(_, s)| format!("{s}\n")).collect();
        match self {
            Module::Common => src.extend(COMMON_SOURCES.iter().map(|(_, s)| format!("{s}\n"))),
            Module::Products(i) => {
                let p = &PRODUCTS[i as usize];
                src += &format!(
                    "MV_KERNELS({}, {}, {})\nMVN_KERNEL({}, {})\nMMQ_KERNEL({}, {})\n",
                    p.name, p.block, p.t1_bounds, p.name, p.block, p.name, p.block
                );
                for (a, b, k) in MIXED_NORM_KERNELS.iter().filter(|m| m.2.module == self) {
                    let (a, b) = (product(*a).map_or("?", |p| p.block), product(*b).map_or("?", |p| p.block));
                    src += &format!("MVN2_KERNEL({}, {a}, {b})\n", k.name.trim_start_matches("mvn2_"));
                }
            }
        }
        src
    }

    /// Every kernel the module defines.
    pub(crate) fn kernels(self) -> Vec<KernelName> {
        match self {
            Module::Common => names::ALL
                .into_iter()
                .chain(names::ATTN_DECODE_FLAT)
                .chain(FLOAT_PRODUCTS.iter().flat_map(|k| [k.t1, k.t8]))
                .collect(),
            Module::Products(i) => PRODUCTS[i as usize]
                .kernels
                .all()
                .chain(MIXED_NORM_KERNELS.iter().map(|m| m.2).filter(|k| k.module == self))
                .collect(),
        }
    }
}

/// A kernel: its `extern "C"` name and the module that defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KernelName {
    pub name: &'static str,
    pub module: Module,
}

impl KernelName {
    /// A kernel of [`Module::Common`].
    pub const fn common(name: &'static str) -> Self {
        KernelName { name, module: Module::Common }
    }
}

/// Kernels other than the mat-vecs.
pub(crate) mod names {
    use super::KernelName;
    pub const QUANTIZE_Q8: KernelName = KernelName::common("quantize_q8");
    pub const RESIDUAL_NORM: KernelName = KernelName::common("residual_norm");
    pub const QKV_POST: KernelName = KernelName::common("qkv_post");
    pub const ATTN_SPLIT: KernelName = KernelName::common("attn_split");
    pub const ATTN_SPLIT_GRP: KernelName = KernelName::common("attn_split_grp");
    pub const ATTN_SPLIT_QKV: KernelName = KernelName::common("attn_split_qkv");
    pub const ATTN_SPLIT_QKV_GRP: KernelName = KernelName::common("attn_split_qkv_grp");
    pub const ATTN_COMBINE: KernelName = KernelName::common("attn_combine");
    pub const ATTN_DECODE_HD64: KernelName = KernelName::common("attn_decode_hd64");
    pub const ATTN_DECODE_HD128: KernelName = KernelName::common("attn_decode_hd128");
    pub const ATTN_DECODE_HD256: KernelName = KernelName::common("attn_decode_hd256");
    pub const ATTN_DECODE_BATCH_HD64: KernelName = KernelName::common("attn_decode_batch_hd64");
    pub const ATTN_DECODE_BATCH_HD128: KernelName = KernelName::common("attn_decode_batch_hd128");
    pub const ATTN_DECODE_BATCH_HD256: KernelName = KernelName::common("attn_decode_batch_hd256");
    pub const ATTN_DECODE_Q_HD64: KernelName = KernelName::common("attn_decode_q_hd64");
    pub const ATTN_DECODE_Q_HD128: KernelName = KernelName::common("attn_decode_q_hd128");
    pub const ATTN_DECODE_Q_HD256: KernelName = KernelName::common("attn_decode_q_hd256");
    pub const ATTN_DECODE_BATCH_Q_HD64: KernelName = KernelName::common("attn_decode_batch_q_hd64");
    pub const ATTN_DECODE_BATCH_Q_HD128: KernelName = KernelName::common("attn_decode_batch_q_hd128");
    pub const ATTN_DECODE_BATCH_Q_HD256: KernelName = KernelName::common("attn_decode_batch_q_hd256");
    /// `attn_decode_flat*` (attention_decode_flat.cu), `[batch][quantized][hd
    /// 64, 128, 256]`.
    pub const ATTN_DECODE_FLAT: [KernelName; 12] = [
        KernelName::common("attn_decode_flat_hd64"),
        KernelName::common("attn_decode_flat_hd128"),
        KernelName::common("attn_decode_flat_hd256"),
        KernelName::common("attn_decode_flat_q_hd64"),
        KernelName::common("attn_decode_flat_q_hd128"),
        KernelName::common("attn_decode_flat_q_hd256"),
        KernelName::common("attn_decode_flat_batch_hd64"),
        KernelName::common("attn_decode_flat_batch_hd128"),
        KernelName::common("attn_decode_flat_batch_hd256"),
        KernelName::common("attn_decode_flat_batch_q_hd64"),
        KernelName::common("attn_decode_flat_batch_q_hd128"),
        KernelName::common("attn_decode_flat_batch_q_hd256"),
    ];
    pub const ATTN_UNROTATE: KernelName = KernelName::common("attn_unrotate");
    pub const EMBED_ROWS: KernelName = KernelName::common("embed_rows");
    pub const GATHER_ROWS: KernelName = KernelName::common("gather_rows");
    pub const GLU: KernelName = KernelName::common("glu");
    pub const ACT_INPLACE: KernelName = KernelName::common("act_inplace");
    pub const SOFTCAP_INPLACE: KernelName = KernelName::common("softcap_inplace");
    pub const DEQUANT_MATRIX: KernelName = KernelName::common("dequant_matrix");
    pub const TO_BF16: KernelName = KernelName::common("to_bf16");
    pub const MMQ_REDUCE: KernelName = KernelName::common("mmq_reduce");
    pub const ARGMAX_LOGITS: KernelName = KernelName::common("argmax_logits");
    pub const TOPK_ROWS: KernelName = KernelName::common("topk_rows");
    pub const ATTN_PREFILL_HD64: KernelName = KernelName::common("attn_prefill_hd64");
    pub const ATTN_PREFILL_HD96: KernelName = KernelName::common("attn_prefill_hd96");
    pub const ATTN_PREFILL_HD128: KernelName = KernelName::common("attn_prefill_hd128");
    pub const ATTN_PREFILL_HD256: KernelName = KernelName::common("attn_prefill_hd256");
    pub const TQ_CENTRE: KernelName = KernelName::common("tq_centre");
    pub const TQ_ENCODE: KernelName = KernelName::common("tq_encode");
    pub const TQ_KEEP: KernelName = KernelName::common("tq_keep");
    pub const TQ_RING_COPY: KernelName = KernelName::common("tq_ring_copy");
    pub const ATTN_SPLIT_TQ: KernelName = KernelName::common("attn_split_tq");
    pub const ATTN_SPLIT_TQ_G8: KernelName = KernelName::common("attn_split_tq_g8");
    pub const ATTN_DECODE_TQ: KernelName = KernelName::common("attn_decode_tq");
    pub const ATTN_DECODE_TQ_G8: KernelName = KernelName::common("attn_decode_tq_g8");
    pub const TQ_UNROTATE: KernelName = KernelName::common("tq_unrotate");

    /// Every non-mat-vec kernel (loaded when the backend starts).
    pub const ALL: [KernelName; 44] = [
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
        ATTN_DECODE_Q_HD64,
        ATTN_DECODE_Q_HD128,
        ATTN_DECODE_Q_HD256,
        ATTN_DECODE_BATCH_Q_HD64,
        ATTN_DECODE_BATCH_Q_HD128,
        ATTN_DECODE_BATCH_Q_HD256,
        ATTN_UNROTATE,
        EMBED_ROWS,
        GATHER_ROWS,
        GLU,
        ACT_INPLACE,
        SOFTCAP_INPLACE,
        DEQUANT_MATRIX,
        TO_BF16,
        MMQ_REDUCE,
        ARGMAX_LOGITS,
        TOPK_ROWS,
        ATTN_PREFILL_HD64,
        ATTN_PREFILL_HD96,
        ATTN_PREFILL_HD128,
        ATTN_PREFILL_HD256,
        TQ_CENTRE,
        TQ_ENCODE,
        TQ_KEEP,
        TQ_RING_COPY,
        ATTN_SPLIT_TQ,
        ATTN_SPLIT_TQ_G8,
        ATTN_DECODE_TQ,
        ATTN_DECODE_TQ_G8,
        TQ_UNROTATE,
    ];
}

/// The mat-vec kernels of one weight type: for one token (`t1`), for one
/// token with the input's residual add and norm done first by every block
/// (`tn`, matvec_norm.cu; quantized types), and for up to 8 tokens per warp
/// pass (`t8`: one row per warp; `tr`: quantized types, several rows per
/// warp).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatvecKernels {
    pub t1: KernelName,
    pub tn: Option<KernelName>,
    /// One token, GLU, the output also written as q8 (`mv_*_t1q`).
    pub t1q: Option<KernelName>,
    /// One token, long rows over 2 or 4 warps each (`mv_*_t1s`).
    pub t1s: Option<KernelName>,
    pub t8: KernelName,
    /// Up to 8 tokens per pass, [`MV_TR_ROWS`] rows per warp (`mv_*_tr`;
    /// not for gate/up pairs).
    pub tr: Option<KernelName>,
    /// Quantized weights times bf16 activations on the tensor cores
    /// (`mmq_*`, matmul_quant.cu), for batches of
    /// `CudaOptions::mmq_min_tokens` tokens up to the cuBLAS GEMMs.
    pub mmq: Option<KernelName>,
    /// The same in the narrow tile (`mmq_*_n`: [`MMQ_NARROW_ROWS`] ×
    /// [`MMQ_NARROW_TOK`]).
    pub mmq_n: Option<KernelName>,
    /// Whether the kernel takes the q8 activation (else the f32 one).
    pub quantized: bool,
}

impl MatvecKernels {
    /// Every kernel of the set.
    pub(crate) fn all(self) -> impl Iterator<Item = KernelName> {
        [Some(self.t1), self.tn, self.t1q, self.t1s, Some(self.t8), self.tr, self.mmq, self.mmq_n].into_iter().flatten()
    }
}

/// Tokens handled per warp pass by the `t8` mat-vec kernels.
pub(crate) const MV_TOKENS: usize = 8;
/// Warps (output rows) per mat-vec block (`MV_WARPS` in matvec.cu).
pub(crate) const MV_WARPS: u32 = 4;
/// Output rows per warp of the `tr` kernels (`MV_TR_ROWS` in matvec.cu).
pub(crate) const MV_TR_ROWS: usize = 4;
/// Positions per attention split (`ATTN_SPLIT` in common.cuh).
pub(crate) const ATTN_SPLIT: usize = 32;
/// Splits per block of the one-token TurboQuant decode attention
/// (`TQ_DECODE_SPLITS` in tq_decode.cu).
pub(crate) const TQ_DECODE_SPLITS: usize = 8;
/// Query heads per attention block (`ATTN_MAX_G`).
pub(crate) const ATTN_MAX_G: usize = 8;
/// Largest head dimension of the q/k/v kernel (`QKV_MAX_HD` in rope.cu).
pub(crate) const QKV_MAX_HD: usize = 1024;

/// A quantized weight layout with products of its own, in module
/// [`Module::Products`]`(index)`: `MV_KERNELS(name, block, t1_bounds)` and
/// `MVN_KERNEL(name, block)` (matvec.cu, matvec_norm.cu).
pub(crate) struct Product {
    pub layout: Layout,
    /// In the kernel names: `mv_<name>_t1`, `mvn_<name>`, ...
    pub name: &'static str,
    /// The block type's name in quant.cuh (`TQ4_K`).
    pub block: &'static str,
    /// Launch bounds of `mv_<name>_t1` (a macro of matvec.cu).
    pub t1_bounds: &'static str,
    pub kernels: MatvecKernels,
}

/// A [`Product`] at index `$i` of [`PRODUCTS`].
macro_rules! product {
    ($i:literal, $ty:ident, $repacked:literal, $n:literal, $block:literal, $bounds:literal) => {{
        const M: Module = Module::Products($i);
        const fn k(name: &'static str) -> KernelName {
            KernelName { name, module: M }
        }
        Product {
            layout: (GgmlType::$ty, $repacked),
            name: $n,
            block: $block,
            t1_bounds: $bounds,
            kernels: MatvecKernels {
                t1: k(concat!("mv_", $n, "_t1")),
                tn: Some(k(concat!("mvn_", $n))),
                t1q: Some(k(concat!("mv_", $n, "_t1q"))),
                t1s: Some(k(concat!("mv_", $n, "_t1s"))),
                t8: k(concat!("mv_", $n, "_t8")),
                tr: Some(k(concat!("mv_", $n, "_tr"))),
                mmq: Some(k(concat!("mmq_", $n))),
                mmq_n: Some(k(concat!("mmq_", $n, "_n"))),
                quantized: true,
            },
        }
    }};
}

/// Every quantized layout with products: GGUF rows of each quantized
/// weight type, then the repacked layouts of `repack.rs`. Entry `i` is
/// module `Products(i)` (a test checks the indices).
pub(crate) const PRODUCTS: [Product; 16] = [
    product!(0, Q4_0, false, "q4_0", "TQ4_0", "MV_T1_BOUNDS"),
    product!(1, Q4_1, false, "q4_1", "TQ4_1", "MV_T1_BOUNDS"),
    product!(2, Q5_0, false, "q5_0", "TQ5_0", "MV_T1_BOUNDS"),
    product!(3, Q5_1, false, "q5_1", "TQ5_1", "MV_T1_BOUNDS"),
    product!(4, Q8_0, false, "q8_0", "TQ8_0", "MV_T1_BOUNDS"),
    product!(5, IQ4_NL, false, "iq4_nl", "TIQ4_NL", "MV_T1_BOUNDS"),
    product!(6, Q2_K, false, "q2_k", "TQ2_K", "MV_T1_BOUNDS"),
    product!(7, Q3_K, false, "q3_k", "TQ3_K", "MV_T1_BOUNDS"),
    product!(8, Q4_K, false, "q4_k", "TQ4_K", "MV_T1_BOUNDS"),
    product!(9, Q5_K, false, "q5_k", "TQ5_K", "MV_T1_BOUNDS"),
    product!(10, Q6_K, false, "q6_k", "TQ6_K", "MV_T1_BOUNDS"),
    product!(11, Q8_0, true, "q8_0r", "TQ8_0R", "MV_T1_BOUNDS"),
    product!(12, Q4_0, true, "q4_0r", "TQ4_0R", "MV_T1_BOUNDS"),
    product!(13, Q5_0, true, "q5_0r", "TQ5_0R", "MV_T1_BOUNDS"),
    product!(14, Q4_K, true, "q4_kr", "TQ4_KR", "MV_T1_BOUNDS"),
    product!(15, Q6_K, true, "q6_kr", "TQ6_KR", "MV_Q6KR_T1_BOUNDS"),
];

/// The [`PRODUCTS`] entry of `layout`.
pub(crate) fn product(layout: Layout) -> Option<&'static Product> {
    PRODUCTS.iter().find(|p| p.layout == layout)
}

/// The float products (matvec_float.cu, in [`Module::Common`]): F32, F16,
/// BF16.
const FLOAT_PRODUCTS: [MatvecKernels; 3] = {
    const fn f(t1: &'static str, t8: &'static str) -> MatvecKernels {
        MatvecKernels {
            t1: KernelName::common(t1),
            tn: None,
            t1q: None,
            t1s: None,
            t8: KernelName::common(t8),
            tr: None,
            mmq: None,
            mmq_n: None,
            quantized: false,
        }
    }
    [f("mv_f32_t1", "mv_f32_t8"), f("mv_f16_t1", "mv_f16_t8"), f("mv_bf16_t1", "mv_bf16_t8")]
};

/// The mat-vec kernels for weight type `ty`, or `None` where there is none
/// (the activation-only types Q8_1 and Q8_K).
pub(crate) fn matvec_kernels(ty: GgmlType) -> Option<MatvecKernels> {
    match ty {
        GgmlType::F32 => Some(FLOAT_PRODUCTS[0]),
        GgmlType::F16 => Some(FLOAT_PRODUCTS[1]),
        GgmlType::BF16 => Some(FLOAT_PRODUCTS[2]),
        _ => product((ty, false)).map(|p| p.kernels),
    }
}

/// The mat-vec kernels of the repacked layout of `ty` (see `repack.rs`).
pub(crate) fn repacked_matvec_kernels(ty: GgmlType) -> Option<MatvecKernels> {
    product((ty, true)).map(|p| p.kernels)
}

/// The one-token kernels that run a fused-norm product of type `a` and then
/// a product of type `b` against the same normalized input in one launch
/// (`mvn2_<a>_<b>`, matvec_norm.cu; in the module of `a`), for the pairs
/// of a layer's q/k/v launch that K-quant mixes produce (attn_v Q6_K
/// beside Q4_K or Q5_K q and k, or their fallbacks Q8_0 and Q5_0; in the
/// repacked layouts where there is one).
pub(crate) const MIXED_NORM_KERNELS: [(Layout, Layout, KernelName); 3] = [
    (
        (GgmlType::Q4_K, true),
        (GgmlType::Q6_K, true),
        KernelName { name: "mvn2_q4_kr_q6_kr", module: Module::Products(14) },
    ),
    (
        (GgmlType::Q5_K, false),
        (GgmlType::Q6_K, true),
        KernelName { name: "mvn2_q5_k_q6_kr", module: Module::Products(9) },
    ),
    // Q4_K_M files whose rows (n_embd values) are not a multiple of 256
    // (Gemma 3 270M and 1B): q and k fall back to Q5_0, v in the
    // use_more_bits layers to Q8_0.
    (
        (GgmlType::Q5_0, true),
        (GgmlType::Q8_0, true),
        KernelName { name: "mvn2_q5_0r_q8_0r", module: Module::Products(13) },
    ),
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

/// Mirror of `MmqArgs` (matmul_quant.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MmqArgs {
    pub w: DevPtr,
    pub x: DevPtr,
    pub y: DevPtr,
    pub part: DevPtr,
    pub rows: i32,
    pub row_bytes: i32,
    pub cols: i32,
    pub n_tok: i32,
    pub ld_y: i32,
    pub k_split: i32,
    pub split: i32,
    pub pad: i32,
}
const _: () = assert!(std::mem::size_of::<MmqArgs>() == 64);

/// Weight rows, tokens and values per K-step of an `mmq_*` block
/// (`MMQ_ROWS`, `MMQ_TOK`, `MMQ_K` in matmul_quant.cu), and its threads.
pub(crate) const MMQ_ROWS: usize = 128;
pub(crate) const MMQ_TOK: usize = 64;
pub(crate) const MMQ_K: usize = 64;
pub(crate) const MMQ_THREADS: u32 = 256;
/// Weight rows and tokens of an `mmq_*_n` block (the narrow tile).
pub(crate) const MMQ_NARROW_ROWS: usize = 2 * MMQ_ROWS;
pub(crate) const MMQ_NARROW_TOK: usize = MMQ_TOK / 2;

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
    pub kt: i32,
    pub vt: i32,
    pub k_row: i32,
    pub v_row: i32,
    pub k_rot: i32,
    pub v_rot: i32,
}
const _: () = assert!(std::mem::size_of::<QkvArgs>() == 152);

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
    pub kt: i32,
    pub vt: i32,
    pub k_row: i32,
    pub v_row: i32,
    pub v_rot: i32,
    pub pad_: i32,
}
const _: () = assert!(std::mem::size_of::<AttnArgs>() == 128);

/// Mirror of `AttnQkvArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AttnQkvArgs {
    pub at: AttnArgs,
    pub qk: QkvArgs,
    pub count: DevPtr,
    pub slot: DevPtr,
    pub k_stride: i64,
    pub v_stride: i64,
}
const _: () = assert!(std::mem::size_of::<AttnQkvArgs>() == 312);

/// Mirror of `TqArgs` (tq_cache.cu): one span's TurboQuant caches (layer
/// buffers, or the slot's cache of another type) and its rows of k and v.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TqArgs {
    pub kc: DevPtr,
    pub vc: DevPtr,
    pub k: DevPtr,
    pub v: DevPtr,
    pub pos0: DevPtr,
    pub kt: i32,
    pub vt: i32,
    pub slot: i32,
    pub n_tok: i32,
}
const _: () = assert!(std::mem::size_of::<TqArgs>() == 56);

/// Mirror of `TqAttnArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TqAttnArgs {
    pub at: AttnArgs,
    pub tq: TqArgs,
}
const _: () = assert!(std::mem::size_of::<TqAttnArgs>() == 184);

/// Mirror of `TqDecodeArgs`: a one-token step's attention over two
/// TurboQuant caches and the tickets of its blocks (`n_kv · n_gc` zeroed
/// counters).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TqDecodeArgs {
    pub at: AttnArgs,
    pub tq: TqArgs,
    pub count: DevPtr,
}
const _: () = assert!(std::mem::size_of::<TqDecodeArgs>() == 192);

/// Mirror of `TqCopyArgs`: a layer's TurboQuant buffer, the slots and the
/// positions whose ring entries `tq_ring_copy` copies.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TqCopyArgs {
    pub c: DevPtr,
    pub src: i32,
    pub dst: i32,
    pub n: i32,
    pub pad_: i32,
}
const _: () = assert!(std::mem::size_of::<TqCopyArgs>() == 24);

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
unsafe impl DeviceRepr for MmqArgs {}
unsafe impl DeviceRepr for TqArgs {}
unsafe impl DeviceRepr for TqAttnArgs {}
unsafe impl DeviceRepr for TqDecodeArgs {}
unsafe impl DeviceRepr for TqCopyArgs {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn product_modules_are_indexed_as_their_table() {
        for (i, p) in PRODUCTS.iter().enumerate() {
            let m = Module::Products(i as u8);
            let k = p.kernels;
            for name in k.all() {
                assert_eq!(name.module, m, "{}", name.name);
                assert!(name.name.contains(p.name), "{} in module {}", name.name, p.name);
            }
            let found = if p.layout.1 { repacked_matvec_kernels(p.layout.0) } else { matvec_kernels(p.layout.0) };
            assert_eq!(found.map(|k| k.t1), Some(k.t1), "{}", p.name);
            assert!(m.source().contains(&format!("MV_KERNELS({}, {}, ", p.name, p.block)));
        }
        for (a, b, k) in MIXED_NORM_KERNELS {
            assert_eq!(
                Some(k.module),
                product(a).map(|_| Module::Products(PRODUCTS.iter().position(|p| p.layout == a).unwrap() as u8))
            );
            assert!(product(b).is_some(), "{}", k.name);
            let (pa, pb) = (product(a).unwrap(), product(b).unwrap());
            let line = format!("MVN2_KERNEL({}, {}, {})", k.name.trim_start_matches("mvn2_"), pa.block, pb.block);
            assert!(k.module.source().contains(&line), "{line}");
        }
    }

    #[test]
    fn every_kernel_is_in_exactly_one_module() {
        let mut seen = std::collections::HashMap::new();
        let modules = std::iter::once(Module::Common).chain((0..PRODUCTS.len() as u8).map(Module::Products));
        // (That each is defined where it is looked up, the GPU tests check:
        // a module's kernels are looked up when it loads.)
        for m in modules {
            for k in m.kernels() {
                assert_eq!(k.module, m, "{}", k.name);
                assert!(seen.insert(k.name, m).is_none(), "{} defined twice", k.name);
            }
        }
        // The float and common kernels are not instantiated again in a
        // products module, nor the quantized products in the common one.
        let common = Module::Common.source();
        assert!(!common.contains("\nMV_KERNELS(") && !common.contains("\nMVN_KERNEL("));
        assert!(!Module::Products(0).source().contains("MVF_KERNELS(f32"));
    }
}
