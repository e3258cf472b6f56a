//! SIMD row-dot kernels for the quantized mat-vec.
//!
//! Each submodule implements one [`SimdLevel`] and lists its kernels
//! (`dots`), which `cpu::kernels::Kernels` puts in its table; types it
//! does not cover keep the scalar reference
//! (`quant::VecDot::vec_dot_ref`), which is the specification every kernel
//! here is tested against (`tests/simd_matvec.rs`).
//!
//! - [`avx2`] (+ `avx2_kquants`): x86-64 AVX2 + FMA + F16C, every weight
//!   type.
//! - [`avx512`]: x86-64 AVX-512 F/BW/VL + VNNI (`vpdpbusd`, `vpdpwssd`) for
//!   the types that dominate decoding (Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_K, Q5_K,
//!   Q6_K, F32); the level's other types use the AVX2 kernels. 512-bit
//!   vectors only where they measured faster (Q6_K, F32): on this
//!   generation they close one of the three vector ports.
//! - `neon`: aarch64 NEON with the dot-product extension (`sdot`, emitted
//!   with `asm!` because `vdotq_s32` is not stable), every weight type.
//! - `avx2_quantize`: the activation quantizers (Q8_0, Q8_K), bit-exact
//!   with the reference, behind [`quantize_activation_row`].
//!
//! Imports point one way. At the bottom, `level.rs` ([`SimdLevel`],
//! [`DotFn`]) and `blocks.rs` (the block `layout`, the unaligned reads,
//! the k-quants' scale unpacking) serve every level; above them
//! `x86_common.rs` holds what the x86 kernels share (prefetch, horizontal
//! sums, f16 scales, the `safe_dot!` wrapper and the `q8_0_row!` and
//! `k4_row!` row loops); the kernel files read those and not each other's
//! helpers (`avx2.rs` lists the kernels of `avx2_kquants.rs` in its table);
//! this file, at the top, picks a level's kernels (`dots`).
//!
//! The AVX-512 intrinsics need Rust 1.89 or later.
//!
//! How the kernels work: the weights' codes are unpacked to bytes and
//! multiplied with the activation's `i8` quants in integer lanes
//! (`u8 × i8` pair products, or VNNI's 4-way dot); offsets such as Q4_0's
//! `-8` or Q6_K's `-32` are applied through the activation sums (computed
//! alongside, or taken from Q8_K's `bsums`); block scales are applied in f32
//! once per block (legacy formats) or once per super-block after the
//! integer sub-block scales (k-quants). The integer parts are exact, so a
//! kernel differs from the reference only in the order of the f32 sums.
//!
//! Every kernel is a safe [`DotFn`] wrapping an `unsafe`
//! `#[target_feature]` function; the wrappers are listed only for the
//! level asked for, which `Kernels::for_level` has checked against the
//! processor. Kernels read only whole blocks inside both
//! slices, whatever their lengths, so they are memory-safe on any input.

use crate::GgmlType;

mod level;
pub(crate) use level::{env_allows_x86, env_level};
pub use level::{DotFn, SimdLevel};

mod blocks;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_common;

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_kquants;
#[cfg(target_arch = "x86_64")]
mod avx2_quantize;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "aarch64")]
pub mod neon;

#[cfg(test)]
mod tests;

/// The kernels of `level` for the types it covers, in the order they
/// apply (AVX-512 VNNI's own after the AVX2 ones it keeps for the rest).
/// The caller has checked `level` against the processor.
pub(crate) fn dots(level: SimdLevel) -> Vec<(GgmlType, DotFn)> {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => avx2::dots().to_vec(),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => {
            // Every AVX-512 processor has AVX2, which both kernel sets also
            // use; the check keeps their `# Safety` promise even on an odd
            // virtual CPU (the level's detection does not test AVX2).
            if std::is_x86_feature_detected!("avx2") {
                avx2::dots().into_iter().chain(avx512::dots()).collect()
            } else {
                Vec::new()
            }
        }
        #[cfg(target_arch = "aarch64")]
        SimdLevel::NeonDotprod => neon::dots().to_vec(),
        _ => Vec::new(),
    }
}

/// Quantizes the activation row `x` to `act` (Q8_0 or Q8_K, the
/// `vec_dot_type`s of the quantized weight types) into `out` with the
/// instructions of `k`'s level, byte for byte as the reference quantizer
/// (`quant::BlockFormat::quantize_row_ref`) does, and several times faster
/// (the reference rounds through a library call per value).
///
/// Returns `false`, writing nothing, when the level has no fast quantizer
/// for `act` (scalar, NEON, other types) or when `x` is not a whole number
/// of blocks or `out` not exactly their size; the caller then uses the
/// reference.
pub fn quantize_activation_row(level: SimdLevel, act: GgmlType, x: &[f32], out: &mut [u8]) -> bool {
    if act.row_bytes(x.len()).ok() != Some(out.len()) {
        return false;
    }
    match (level, act) {
        #[cfg(target_arch = "x86_64")]
        (SimdLevel::Avx2 | SimdLevel::Avx512Vnni, GgmlType::Q8_0) => {
            // SAFETY: both levels include AVX2, FMA and F16C, and the caller
            // checked `level` against the CPU (`Kernels::for_level`).
            unsafe { avx2_quantize::quantize_q8_0(x, out) };
            true
        }
        #[cfg(target_arch = "x86_64")]
        (SimdLevel::Avx2 | SimdLevel::Avx512Vnni, GgmlType::Q8_K) => {
            // SAFETY: as above.
            unsafe { avx2_quantize::quantize_q8_k(x, out) };
            true
        }
        _ => false,
    }
}
