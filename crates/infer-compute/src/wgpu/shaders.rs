//! The WGSL kernels (`shaders/`, one file per op family, one per weight
//! type under `shaders/types/`, one per KV cache type under `shaders/kv/`)
//! and how a module is composed from them: `reduction + [weight access +
//! the type's load4 | the KV cache files] + kernel`, the products' kernel
//! files preceded by `product.wgsl` (their parameters, bindings and
//! activation reads). What a module is composed for is a [`Variant`];
//! kernels are named by [`Kernel`], never by strings.
//!
//! The KV cache files ([`Kernel::kv_typed`] kernels): `kv/rotation.wgsl`
//! (the staged head and its Hadamard rotation), for a kernel that writes
//! the cache `kv/quantize.wgsl` (ggml's quantizer arithmetic, exact), then
//! K's type and V's type, each its layout and reads (`kv/<type>.wgsl`,
//! followed by `kv/plain.wgsl` for the types read as stored; the
//! TurboQuant types share `kv/tq.wgsl`, preceded by their index bits) and,
//! when written, its store (`kv/<type>_store.wgsl`). A type's files are
//! composed once per role, their `KV_` prefix replaced by `k_` or `v_`
//! (`role_source`), so keys and values of two types meet in one kernel.
//! The kernels over one TurboQuant cache ([`Kernel::tq_typed`],
//! `tq_cache.wgsl`) take its files under the role `c_`.
//!
//! The reductions (`wg_sum`, `wg_max`, and the `Lanes` builtins struct) come
//! in two interchangeable files: `reduce_subgroup.wgsl` (subgroup
//! operations, where the adapter has them) and `reduce_shared.wgsl`
//! (workgroup memory). [`all_modules`] lists every composition, for the
//! naga test that validates each and translates it to MSL and HLSL.

use crate::error::{Error, Result};
use crate::{GgmlType, KvCacheType, KvTypes};

const REDUCE_SUBGROUP: &str = include_str!("shaders/reduce_subgroup.wgsl");
const REDUCE_SHARED: &str = include_str!("shaders/reduce_shared.wgsl");
const WEIGHTS: &str = include_str!("shaders/weights.wgsl");
const K_SCALE: &str = include_str!("shaders/types/k_scale.wgsl");

/// Weight types with a `load4` here (the product, embedding and
/// dequantization kernels take them).
pub const WEIGHT_TYPES: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// KV cache types with files here (`shaders/kv/`), for the kernels that
/// write or read the cache ([`Kernel::kv_typed`]): every type.
pub const KV_TYPES: [KvCacheType; 6] = KvCacheType::ALL;

/// The TurboQuant types, for the kernels over one such cache
/// ([`Kernel::tq_typed`]).
pub const TQ_TYPES: [KvCacheType; 2] = [KvCacheType::Tq3, KvCacheType::Tq4];

/// What a module is composed for besides its kernel and reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// A kernel of no type.
    Plain,
    /// A kernel that reads weights ([`Kernel::typed`]), for their type.
    Weight(GgmlType),
    /// A kernel that writes or reads the KV cache ([`Kernel::kv_typed`]),
    /// for its K and V types.
    Kv(KvTypes),
    /// A kernel over one TurboQuant cache ([`Kernel::tq_typed`]), for its
    /// type.
    Tq(KvCacheType),
}

impl Variant {
    /// The variant's part of a module name: `_<weight type>`,
    /// `_k<type>_v<type>`, `_<tq type>`, or nothing.
    pub fn suffix(self) -> String {
        match self {
            Variant::Plain => String::new(),
            Variant::Weight(t) => format!("_{}", t.name()),
            Variant::Kv(t) => format!("_k{}_v{}", t.k, t.v),
            Variant::Tq(t) => format!("_{t}"),
        }
    }
}

/// The identifier prefix of a KV cache file that [`role_source`] replaces.
const ROLE_PREFIX: &str = "KV_";

/// The layout and reads of a KV cache of `ty` (`kv/<type>.wgsl` with
/// `kv/plain.wgsl`, or `kv/tq.wgsl` after its index bits), and its store
/// (`kv/<type>_store.wgsl`), both with the role prefix `KV_`.
fn kv_sources(ty: KvCacheType) -> (String, &'static str) {
    const PLAIN: &str = include_str!("shaders/kv/plain.wgsl");
    let plain = |layout: &str, store| (format!("{layout}{PLAIN}"), store);
    match ty {
        KvCacheType::F32 => plain(include_str!("shaders/kv/f32.wgsl"), include_str!("shaders/kv/f32_store.wgsl")),
        KvCacheType::F16 => plain(include_str!("shaders/kv/f16.wgsl"), include_str!("shaders/kv/f16_store.wgsl")),
        KvCacheType::Q8_0 => plain(include_str!("shaders/kv/q8_0.wgsl"), include_str!("shaders/kv/q8_0_store.wgsl")),
        KvCacheType::Q4_0 => plain(include_str!("shaders/kv/q4_0.wgsl"), include_str!("shaders/kv/q4_0_store.wgsl")),
        KvCacheType::Tq3 | KvCacheType::Tq4 => (
            format!(
                "const KV_BITS: u32 = {}u;\n{}",
                ty.turboquant_bits().unwrap_or(4),
                include_str!("shaders/kv/tq.wgsl")
            ),
            include_str!("shaders/kv/tq_store.wgsl"),
        ),
    }
}

/// A KV cache file for one role: its `KV_` identifiers (the kernel's
/// binding `KV_cache`, the file's functions, constants and workgroup
/// variables) renamed with `prefix`: `k_` for the keys, `v_` for the
/// values, `c_` for the one cache of a [`Kernel::tq_typed`] kernel.
fn role_source(src: &str, prefix: &str) -> String {
    src.replace(ROLE_PREFIX, prefix)
}

/// The `load4` source of `ty`.
///
/// # Errors
/// [`Error::Unsupported`] for a type without one.
fn type_source(ty: GgmlType) -> Result<String> {
    let s = match ty {
        GgmlType::F32 => include_str!("shaders/types/f32.wgsl"),
        GgmlType::F16 => include_str!("shaders/types/f16.wgsl"),
        GgmlType::Q4_0 => include_str!("shaders/types/q4_0.wgsl"),
        GgmlType::Q4_1 => include_str!("shaders/types/q4_1.wgsl"),
        GgmlType::Q5_0 => include_str!("shaders/types/q5_0.wgsl"),
        GgmlType::BF16 => include_str!("shaders/types/bf16.wgsl"),
        GgmlType::Q5_1 => include_str!("shaders/types/q5_1.wgsl"),
        GgmlType::Q8_0 => include_str!("shaders/types/q8_0.wgsl"),
        GgmlType::IQ4_NL => include_str!("shaders/types/iq4_nl.wgsl"),
        GgmlType::Q2_K => include_str!("shaders/types/q2_k.wgsl"),
        GgmlType::Q3_K => include_str!("shaders/types/q3_k.wgsl"),
        GgmlType::Q4_K => return Ok(format!("{K_SCALE}\n{}", include_str!("shaders/types/q4_k.wgsl"))),
        GgmlType::Q5_K => return Ok(format!("{K_SCALE}\n{}", include_str!("shaders/types/q5_k.wgsl"))),
        GgmlType::Q6_K => include_str!("shaders/types/q6_k.wgsl"),
        ty => return Err(Error::Unsupported { op: "wgpu kernel", ty }),
    };
    Ok(s.to_string())
}

/// Every kernel: a file and an entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Quantized product of rows and token tiles of 4 (`matvec.wgsl`
    /// `main`), per weight type.
    Matvec,
    /// Prefill product of 16 rows × 16 tokens per workgroup (`matvec.wgsl`
    /// `main_tiled`), per weight type.
    MatvecTiled,
    /// `Matvec` over a stacked gate/up matrix with the gated activation
    /// applied (`matvec.wgsl` `main_glu`), per weight type.
    MatvecGlu,
    /// Register-tiled prefill GEMM of 64 rows × 64 tokens per workgroup
    /// (`matmul_quant.wgsl`), per weight type.
    MatmulQuant,
    /// Embedding lookup (`embed.wgsl`), per weight type.
    Embed,
    /// Dense f32 GEMM (`gemm.wgsl`).
    Gemm,
    /// Residual add + norm (`norm.wgsl`).
    ResidualNorm,
    /// Bias, q/k norm, RoPE and KV append (`rope.wgsl`).
    Rope,
    /// Attention over the KV cache (`attention.wgsl`).
    Attention,
    /// A TurboQuant cache's centres (`tq_cache.wgsl` `centre`).
    TqCentre,
    /// A TurboQuant cache's codes (`tq_cache.wgsl` `encode`).
    TqEncode,
    /// A TurboQuant cache's recent rows (`tq_cache.wgsl` `keep`).
    TqKeep,
    /// A TurboQuant cache's recent rows copied between slots
    /// (`tq_cache.wgsl` `ring_copy`).
    TqRingCopy,
    /// Gated activation (`elementwise.wgsl`).
    Glu,
    /// Activation in place (`elementwise.wgsl`).
    Act,
    /// Row gather (`elementwise.wgsl`).
    Gather,
}

/// Every kernel, for [`all_modules`].
pub const KERNELS: [Kernel; 16] = [
    Kernel::Matvec,
    Kernel::MatvecTiled,
    Kernel::MatvecGlu,
    Kernel::MatmulQuant,
    Kernel::Embed,
    Kernel::Gemm,
    Kernel::ResidualNorm,
    Kernel::Rope,
    Kernel::Attention,
    Kernel::TqCentre,
    Kernel::TqEncode,
    Kernel::TqKeep,
    Kernel::TqRingCopy,
    Kernel::Glu,
    Kernel::Act,
    Kernel::Gather,
];

impl Kernel {
    /// The kernel's name (pipeline labels, messages).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Matvec => "matvec",
            Kernel::MatvecTiled => "matvec_tiled",
            Kernel::MatvecGlu => "matvec_glu",
            Kernel::MatmulQuant => "matmul_quant",
            Kernel::Embed => "embed",
            Kernel::Gemm => "gemm",
            Kernel::ResidualNorm => "residual_norm",
            Kernel::Rope => "rope",
            Kernel::Attention => "attention",
            Kernel::TqCentre => "tq_centre",
            Kernel::TqEncode => "tq_encode",
            Kernel::TqKeep => "tq_keep",
            Kernel::TqRingCopy => "tq_ring_copy",
            Kernel::Glu => "glu",
            Kernel::Act => "act",
            Kernel::Gather => "gather",
        }
    }

    /// The entry point in its file.
    pub fn entry(self) -> &'static str {
        match self {
            Kernel::MatvecTiled => "main_tiled",
            Kernel::MatvecGlu => "main_glu",
            Kernel::Glu => "glu",
            Kernel::Act => "act_inplace",
            Kernel::Gather => "gather",
            Kernel::TqCentre => "centre",
            Kernel::TqEncode => "encode",
            Kernel::TqKeep => "keep",
            Kernel::TqRingCopy => "ring_copy",
            _ => "main",
        }
    }

    /// Whether the kernel writes or reads the KV cache (composed per pair
    /// of K and V types of [`KV_TYPES`]).
    pub fn kv_typed(self) -> bool {
        matches!(self, Kernel::Rope | Kernel::Attention)
    }

    /// Whether the kernel writes the KV cache (composed with the types'
    /// stores).
    fn writes_kv(self) -> bool {
        self == Kernel::Rope
    }

    /// Whether the kernel works on one TurboQuant cache (composed per
    /// type of [`TQ_TYPES`]).
    pub fn tq_typed(self) -> bool {
        matches!(self, Kernel::TqCentre | Kernel::TqEncode | Kernel::TqKeep | Kernel::TqRingCopy)
    }

    /// The variants a module of the kernel is composed for: each weight
    /// type, each pair of KV cache types, or the plain one.
    fn variants(self) -> Vec<Variant> {
        if self.typed() {
            WEIGHT_TYPES.iter().map(|&t| Variant::Weight(t)).collect()
        } else if self.kv_typed() {
            KV_TYPES.iter().flat_map(|&k| KV_TYPES.map(|v| Variant::Kv(KvTypes { k, v }))).collect()
        } else if self.tq_typed() {
            TQ_TYPES.iter().map(|&t| Variant::Tq(t)).collect()
        } else {
            vec![Variant::Plain]
        }
    }

    /// Whether the kernel reads weight blocks (composed per type).
    pub fn typed(self) -> bool {
        matches!(self, Kernel::Matvec | Kernel::MatvecTiled | Kernel::MatvecGlu | Kernel::MatmulQuant | Kernel::Embed)
    }

    fn source(self) -> &'static str {
        match self {
            Kernel::Matvec | Kernel::MatvecTiled | Kernel::MatvecGlu => {
                concat!(include_str!("shaders/product.wgsl"), include_str!("shaders/matvec.wgsl"))
            }
            Kernel::MatmulQuant => {
                concat!(include_str!("shaders/product.wgsl"), include_str!("shaders/matmul_quant.wgsl"))
            }
            Kernel::Embed => include_str!("shaders/embed.wgsl"),
            Kernel::Gemm => include_str!("shaders/gemm.wgsl"),
            Kernel::ResidualNorm => include_str!("shaders/norm.wgsl"),
            Kernel::Rope => include_str!("shaders/rope.wgsl"),
            Kernel::Attention => include_str!("shaders/attention.wgsl"),
            Kernel::TqCentre | Kernel::TqEncode | Kernel::TqKeep | Kernel::TqRingCopy => {
                include_str!("shaders/tq_cache.wgsl")
            }
            Kernel::Glu | Kernel::Act | Kernel::Gather => include_str!("shaders/elementwise.wgsl"),
        }
    }
}

/// The WGSL module of `kernel` for `variant` (a weight type when the
/// kernel is typed, K and V types when it is KV-typed, a TurboQuant type
/// when it is TurboQuant-typed, plain otherwise), with subgroup or
/// workgroup-memory reductions.
///
/// # Errors
/// [`Error::Unsupported`] for a variant the kernel is not composed for or
/// a weight type without a `load4`; [`Error::UnsupportedKvCache`] for a
/// TurboQuant kernel of another cache type.
pub fn compose(kernel: Kernel, variant: Variant, subgroups: bool) -> Result<String> {
    // naga takes subgroup operations without WGSL's `enable subgroups;`
    // (which it refuses as not yet implemented); the device feature
    // `SUBGROUP` is what allows them.
    let mut s = String::new();
    s.push_str(if subgroups { REDUCE_SUBGROUP } else { REDUCE_SHARED });
    match variant {
        Variant::Weight(ty) if kernel.typed() => {
            s.push_str(WEIGHTS);
            s.push_str(&type_source(ty)?);
        }
        Variant::Kv(types) if kernel.kv_typed() => {
            s.push_str(include_str!("shaders/kv/rotation.wgsl"));
            if kernel.writes_kv() {
                s.push_str(include_str!("shaders/kv/quantize.wgsl"));
            }
            for (ty, prefix) in [(types.k, "k_"), (types.v, "v_")] {
                let (layout, store) = kv_sources(ty);
                s.push_str(&role_source(&layout, prefix));
                if kernel.writes_kv() {
                    s.push_str(&role_source(store, prefix));
                }
            }
        }
        Variant::Tq(ty) if kernel.tq_typed() => {
            if ty.turboquant_bits().is_none() {
                return Err(Error::UnsupportedKvCache { ty, reason: "not a TurboQuant type".into() });
            }
            s.push_str(include_str!("shaders/kv/rotation.wgsl"));
            s.push_str(include_str!("shaders/kv/quantize.wgsl"));
            s.push_str(&role_source(&kv_sources(ty).0, "c_"));
        }
        Variant::Plain if !kernel.typed() && !kernel.kv_typed() && !kernel.tq_typed() => {}
        _ => return Err(Error::Unsupported { op: "a wgpu kernel composed for another variant", ty: GgmlType::F32 }),
    }
    s.push_str(kernel.source());
    Ok(s)
}

/// Every module the backend can build: each kernel for each of its
/// variants (every weight type of [`WEIGHT_TYPES`], every pair of
/// [`KV_TYPES`], every type of [`TQ_TYPES`]), with each reduction, named
/// `kernel[_type | _k<type>_v<type>]_(subgroup|shared)`.
///
/// # Errors
/// As [`compose`] (never for the listed variants).
pub fn all_modules() -> Result<Vec<(String, Kernel, String)>> {
    let mut v = Vec::new();
    for k in KERNELS {
        for variant in k.variants() {
            for sg in [true, false] {
                let name = format!("{}{}_{}", k.name(), variant.suffix(), if sg { "subgroup" } else { "shared" });
                v.push((name, k, compose(k, variant, sg)?));
            }
        }
    }
    Ok(v)
}
