//! The WGSL kernels (`shaders/`, one file per op family, one per weight
//! type under `shaders/types/`) and how a module is composed from them:
//! `reduction + [weight access + the type's load4 | the KV cache's
//! element type] + kernel`, the products' kernel files preceded by
//! `product.wgsl` (their parameters, bindings and activation reads).
//! Kernels are named by [`Kernel`], never by strings.
//!
//! The reductions (`wg_sum`, `wg_max`, and the `Lanes` builtins struct) come
//! in two interchangeable files: `reduce_subgroup.wgsl` (subgroup
//! operations, where the adapter has them) and `reduce_shared.wgsl`
//! (workgroup memory). [`all_modules`] lists every composition, for the
//! naga test that validates each and translates it to MSL and HLSL.

use crate::error::{Error, Result};
use crate::GgmlType;

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

/// Element types of the KV cache (`shaders/kv/`), for the kernels that
/// write or read it ([`Kernel::kv_typed`]).
pub const KV_TYPES: [GgmlType; 2] = [GgmlType::F32, GgmlType::F16];

/// The `KvPair` source of a cache of `ty`.
///
/// # Errors
/// [`Error::Unsupported`] for a type other than F32 and F16.
fn kv_source(ty: GgmlType) -> Result<&'static str> {
    match ty {
        GgmlType::F32 => Ok(include_str!("shaders/kv/f32.wgsl")),
        GgmlType::F16 => Ok(include_str!("shaders/kv/f16.wgsl")),
        ty => Err(Error::Unsupported { op: "wgpu KV cache", ty }),
    }
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
    /// Gated activation (`elementwise.wgsl`).
    Glu,
    /// Activation in place (`elementwise.wgsl`).
    Act,
    /// Row gather (`elementwise.wgsl`).
    Gather,
}

/// Every kernel, for [`all_modules`].
pub const KERNELS: [Kernel; 12] = [
    Kernel::Matvec,
    Kernel::MatvecTiled,
    Kernel::MatvecGlu,
    Kernel::MatmulQuant,
    Kernel::Embed,
    Kernel::Gemm,
    Kernel::ResidualNorm,
    Kernel::Rope,
    Kernel::Attention,
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
            _ => "main",
        }
    }

    /// Whether the kernel writes or reads the KV cache (composed per
    /// element type of [`KV_TYPES`]).
    pub fn kv_typed(self) -> bool {
        matches!(self, Kernel::Rope | Kernel::Attention)
    }

    /// The types a module of the kernel is composed for: weight types,
    /// KV cache types, or none.
    fn types(self) -> Vec<Option<GgmlType>> {
        if self.typed() {
            WEIGHT_TYPES.iter().map(|&t| Some(t)).collect()
        } else if self.kv_typed() {
            KV_TYPES.iter().map(|&t| Some(t)).collect()
        } else {
            vec![None]
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
            Kernel::Glu | Kernel::Act | Kernel::Gather => include_str!("shaders/elementwise.wgsl"),
        }
    }
}

/// The WGSL module of `kernel` (for weight type `ty` when the kernel is
/// typed, for the KV cache's element type `ty` when it is KV-typed), with
/// subgroup or workgroup-memory reductions.
///
/// # Errors
/// [`Error::Unsupported`] for a typed or KV-typed kernel without `ty` or
/// with a type it has no source for.
pub fn compose(kernel: Kernel, ty: Option<GgmlType>, subgroups: bool) -> Result<String> {
    // naga takes subgroup operations without WGSL's `enable subgroups;`
    // (which it refuses as not yet implemented); the device feature
    // `SUBGROUP` is what allows them.
    let mut s = String::new();
    s.push_str(if subgroups { REDUCE_SUBGROUP } else { REDUCE_SHARED });
    if kernel.typed() {
        let ty = ty.ok_or(Error::Unsupported { op: "wgpu kernel without a weight type", ty: GgmlType::F32 })?;
        s.push_str(WEIGHTS);
        s.push_str(&type_source(ty)?);
    } else if kernel.kv_typed() {
        let ty = ty.ok_or(Error::Unsupported { op: "wgpu kernel without a KV cache type", ty: GgmlType::F32 })?;
        s.push_str(kv_source(ty)?);
    }
    s.push_str(kernel.source());
    Ok(s)
}

/// Every module the backend can build: each kernel (each typed one for
/// every type of [`WEIGHT_TYPES`], each KV-typed one for every type of
/// [`KV_TYPES`]), with each reduction, named
/// `kernel[_type]_(subgroup|shared)`.
///
/// # Errors
/// As [`compose`] (never for the listed types).
pub fn all_modules() -> Result<Vec<(String, Kernel, String)>> {
    let mut v = Vec::new();
    for k in KERNELS {
        for ty in k.types() {
            for sg in [true, false] {
                let name = format!(
                    "{}{}_{}",
                    k.name(),
                    ty.map_or(String::new(), |t| format!("_{}", t.name())),
                    if sg { "subgroup" } else { "shared" }
                );
                v.push((name, k, compose(k, ty, sg)?));
            }
        }
    }
    Ok(v)
}
