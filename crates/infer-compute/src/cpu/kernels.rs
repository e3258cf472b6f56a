//! Run-time selection of the CPU's quantized dot-product kernels.
//!
//! [`Kernels::detect`] looks at the processor once, when the backend is
//! created, and fills a table of row-dot functions per weight type. The
//! scalar reference (`quant::VecDot::vec_dot_ref`) is always compiled and is
//! selected for every type when `INFER_CPU_SIMD=scalar` is set, or for types
//! a SIMD level does not cover.

use crate::quant::{self, VecDot};
use crate::GgmlType;

use super::simd::env_level;
pub use super::simd::{DotFn, SimdLevel};

/// Table of row-dot kernels, one per weight type.
#[derive(Clone, Copy)]
pub struct Kernels {
    level: SimdLevel,
    dots: [DotFn; GgmlType::ALL.len()],
}

fn slot(ty: GgmlType) -> usize {
    GgmlType::ALL.iter().position(|t| *t == ty).unwrap_or(0)
}

/// The scalar reference row dot for weight format `W`.
pub fn scalar_dot<W: VecDot>(w: &[u8], act: &[u8]) -> f32 {
    match (quant::blocks::<W>(w), quant::blocks::<W::Act>(act)) {
        (Ok(w), Ok(a)) => W::vec_dot_ref(w, a),
        // Callers pass whole, aligned blocks; anything else is a bug upstream.
        _ => f32::NAN,
    }
}

fn unsupported_dot(_: &[u8], _: &[u8]) -> f32 {
    f32::NAN
}

impl Kernels {
    /// Kernels for the best level of this processor, unless the environment
    /// variable `INFER_CPU_SIMD` names another (`scalar`, `avx2`,
    /// `avx512-vnni`, `neon-dotprod`); a level the processor lacks is ignored
    /// and the best available one is used.
    pub fn detect() -> Self {
        Self::for_level(env_level().unwrap_or_else(SimdLevel::best_available))
    }

    /// Kernels for `level`, which must be one of [`SimdLevel::all_available`];
    /// otherwise the scalar table is returned.
    pub fn for_level(level: SimdLevel) -> Self {
        let mut dots = [unsupported_dot as DotFn; GgmlType::ALL.len()];
        for ty in GgmlType::ALL {
            dots[slot(ty)] = crate::with_weight_type!(ty, W => scalar_dot::<W> as DotFn, else unsupported_dot as DotFn);
        }
        let level = if SimdLevel::all_available().contains(&level) { level } else { SimdLevel::Scalar };
        let mut k = Kernels { level, dots };
        for (ty, f) in super::simd::dots(level) {
            k.dots[slot(ty)] = f;
        }
        k
    }

    /// The selected level.
    pub fn level(&self) -> SimdLevel {
        self.level
    }

    /// The row-dot kernel for weight type `ty`.
    pub fn dot(&self, ty: GgmlType) -> DotFn {
        self.dots[slot(ty)]
    }

    /// Quantizes an activation row `x` to the pair type of weight type `ty`
    /// into `out` (resized to fit), with this level's SIMD quantizer where
    /// one exists (byte-identical to the reference) and the reference
    /// otherwise.
    ///
    /// # Errors
    /// As [`quantize_activation`].
    pub fn quantize_activation(&self, ty: GgmlType, x: &[f32], out: &mut AlignedBytes) -> crate::Result<()> {
        let act = ty.vec_dot_type().ok_or(crate::Error::Unsupported { op: "matvec", ty })?;
        out.try_resize(act.row_bytes(x.len())?)?;
        if super::simd::quantize_activation_row(self.level, act, x, out.as_bytes_mut()) {
            return nan_scales(act, x, out);
        }
        quantize_activation(ty, x, out)
    }
}

/// A growable byte buffer aligned to 8 bytes, so that any block type can be
/// viewed in it (`Vec<u8>` promises only 1-byte alignment).
#[derive(Default, Clone)]
pub struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    /// Sets the length to `n` bytes (contents unspecified but initialized).
    ///
    /// # Panics
    /// When the allocator cannot provide `n` bytes; see
    /// [`AlignedBytes::try_resize`].
    pub fn resize(&mut self, n: usize) {
        self.words.resize(n.div_ceil(8), 0);
        self.len = n;
    }

    /// [`AlignedBytes::resize`] that reports a failed allocation.
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`]; the buffer is then unchanged.
    pub fn try_resize(&mut self, n: usize) -> crate::Result<()> {
        crate::memory::resize(&mut self.words, n.div_ceil(8), 0, "quantized activations")?;
        self.len = n;
        Ok(())
    }
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
    /// The bytes, mutable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

/// Quantizes an activation row `x` to the pair type of weight type `ty`
/// (its `vec_dot_type`) into `out`, resized to fit, with the scalar
/// reference quantizer ([`Kernels::quantize_activation`] uses SIMD).
///
/// # Errors
/// Types without a dot product; a row length not a multiple of the
/// activation block size.
pub fn quantize_activation(ty: GgmlType, x: &[f32], out: &mut AlignedBytes) -> crate::Result<()> {
    let act = ty.vec_dot_type().ok_or(crate::Error::Unsupported { op: "matvec", ty })?;
    out.try_resize(act.row_bytes(x.len())?)?;
    crate::with_block_type!(act, A => {
        A::quantize_row_ref(x, quant::blocks_mut::<A>(out.as_bytes_mut())?);
    });
    nan_scales(act, x, out)
}

/// Gives every block of the quantized activation `out` whose values in `x`
/// hold a NaN a NaN scale, so that its products are NaN. The quantizers
/// (as ggml's) take the largest magnitude with comparisons that skip NaN
/// and round NaN to an arbitrary code, so a block with a NaN would
/// otherwise multiply as finite values: a NaN in the activations would
/// vanish instead of reaching the logits, where it is reported.
fn nan_scales(act: GgmlType, x: &[f32], out: &mut AlignedBytes) -> crate::Result<()> {
    // One branch-free pass (it vectorizes); the blocks only when needed.
    if !x.iter().fold(false, |a, v| a | v.is_nan()) {
        return Ok(());
    }
    let bytes = out.as_bytes_mut();
    match act {
        GgmlType::Q8_0 => {
            for (b, xb) in quant::blocks_mut::<quant::BlockQ8_0>(bytes)?.iter_mut().zip(x.chunks_exact(quant::QK)) {
                if xb.iter().any(|v| v.is_nan()) {
                    b.d = half::f16::NAN;
                }
            }
        }
        GgmlType::Q8_K => {
            for (b, xb) in quant::blocks_mut::<quant::BlockQ8K>(bytes)?.iter_mut().zip(x.chunks_exact(quant::QK_K)) {
                if xb.iter().any(|v| v.is_nan()) {
                    b.d = f32::NAN;
                }
            }
        }
        _ => {}
    }
    Ok(())
}
