//! The instruction sets the CPU kernels target ([`SimdLevel`]), which one
//! this processor has and which `INFER_CPU_SIMD` allows, and the row-dot
//! signature every level implements ([`DotFn`]). The bottom of the CPU
//! backend: the SIMD kernels and the kernel table above them both read it.

/// Dot product of one weight row (raw blocks) with an activation row already
/// quantized to the weight type's `vec_dot_type` (raw blocks). Both slices
/// hold whole blocks and agree in length (checked by the caller).
pub type DotFn = fn(w: &[u8], act: &[u8]) -> f32;

/// The SIMD instruction set a kernel table targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdLevel {
    /// Portable scalar reference code.
    Scalar,
    /// x86-64 AVX2 + FMA (+ F16C).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL with VNNI.
    Avx512Vnni,
    /// aarch64 NEON with the dot-product extension.
    NeonDotprod,
}

impl SimdLevel {
    /// Name as shown by `infer info`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512Vnni => "avx512-vnni",
            SimdLevel::NeonDotprod => "neon-dotprod",
        }
    }

    /// The best level this processor supports (ignores the environment).
    pub fn best_available() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                return SimdLevel::Avx512Vnni;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
                return SimdLevel::Avx2;
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") && std::arch::is_aarch64_feature_detected!("dotprod") {
                return SimdLevel::NeonDotprod;
            }
        }
        SimdLevel::Scalar
    }

    /// Every level this processor supports, best first, scalar last.
    pub fn all_available() -> Vec<Self> {
        let best = Self::best_available();
        let mut v = vec![best];
        if best == SimdLevel::Avx512Vnni {
            v.push(SimdLevel::Avx2);
        }
        if best != SimdLevel::Scalar {
            v.push(SimdLevel::Scalar);
        }
        v
    }
}

/// The level `INFER_CPU_SIMD` names, if it names one this processor has
/// (read once per process).
pub(crate) fn env_level() -> Option<SimdLevel> {
    static LEVEL: std::sync::OnceLock<Option<SimdLevel>> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        let wanted = std::env::var("INFER_CPU_SIMD").ok()?;
        SimdLevel::all_available().into_iter().find(|l| l.name() == wanted)
    })
}

/// Whether code that picks its own instruction set from the processor (the
/// attention and activation loops) may use AVX2 (`wide = false`) or AVX-512
/// (`wide = true`), the processor permitting: `INFER_CPU_SIMD=scalar` allows
/// neither, `=avx2` no AVX-512. Their results have the same bits either way;
/// the cap keeps a scalar run scalar throughout.
pub(crate) fn env_allows_x86(wide: bool) -> bool {
    match env_level() {
        Some(SimdLevel::Scalar) => false,
        Some(SimdLevel::Avx2) => !wide,
        _ => true,
    }
}
