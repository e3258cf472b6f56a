//! Plain float "blocks" of one value: F32, F16 and BF16.
//!
//! Conversions follow ggml exactly:
//! - f32→f16 ([`f32_to_f16`]): IEEE round-to-nearest-even, overflow to ±inf,
//!   gradual underflow to subnormals; every NaN becomes the quiet NaN
//!   `sign | 0x7e00` (ggml `ggml_compute_fp32_to_fp16`, and F16C's
//!   `vcvtps2ph` agrees on every non-NaN input).
//! - f32→bf16 ([`f32_to_bf16`]): round-to-nearest-even on the upper 16 bits;
//!   a NaN keeps its upper 16 bits and gets the quiet bit (0x0040) forced
//!   (ggml `ggml_compute_fp32_to_bf16`). No flush of subnormals.
//! - f16→f32 and bf16→f32 are exact widenings.
//!
//! Dot products follow ggml's generic `ggml_vec_dot_f16` / `ggml_vec_dot_bf16`:
//! each product is formed in f32 from the widened operands, the products are
//! summed in f64 (`ggml_float`) in index order, and the sum is rounded to f32
//! once at the end.

use half::{bf16, f16};

use super::{BlockFormat, VecDot};
use crate::GgmlType;

/// Converts one f32 to f16 as ggml's `GGML_FP32_TO_FP16` does: round to
/// nearest, ties to even; values past the f16 range become ±inf; every NaN
/// becomes the canonical quiet NaN with the input's sign (`0x7e00`/`0xfe00`).
#[inline]
pub fn f32_to_f16(x: f32) -> f16 {
    if x.is_nan() {
        let sign = ((x.to_bits() >> 16) & 0x8000) as u16;
        return f16::from_bits(sign | 0x7e00);
    }
    f16::from_f32(x)
}

/// Converts one f32 to bf16 as ggml's `ggml_compute_fp32_to_bf16` does:
/// round to nearest, ties to even, on the raw bits (so values within half a
/// bf16 ulp of the f32 maximum round to ±inf); a NaN keeps its sign and top
/// payload bits and has the quiet bit forced.
#[inline]
pub fn f32_to_bf16(x: f32) -> bf16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return bf16::from_bits(((u >> 16) as u16) | 0x0040);
    }
    let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16;
    bf16::from_bits(rounded as u16)
}

/// Widens one f16 to f32 (exact).
#[inline]
pub fn f16_to_f32(x: f16) -> f32 {
    x.to_f32()
}

/// Widens one bf16 to f32 (exact: the bits shifted into the upper half).
#[inline]
pub fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// C's float→int conversion as ggml's x86 builds perform it (`cvttss2si`):
/// truncation toward zero; NaN and values outside the i32 range give
/// `i32::MIN`. The legacy quantizers narrow the result further (`as i8`,
/// `as u8`), which wraps like C's narrowing conversion on these targets.
#[inline]
pub(crate) fn trunc_i32(x: f32) -> i32 {
    if x.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

/// The value of largest magnitude in `x`, sign kept; the first one on ties,
/// 0.0 for an empty or all-zero slice (ggml's `if (amax < fabsf(v))` scan).
#[inline]
pub(crate) fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// The largest magnitude in `x` as ggml's `MAX(amax, fabsf(v))` macro scan
/// computes it (`a > b ? a : b`, so a NaN propagates only until the next
/// value).
#[inline]
pub(crate) fn absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    amax
}

impl BlockFormat for f32 {
    const TYPE: GgmlType = GgmlType::F32;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        y.copy_from_slice(x);
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        y.copy_from_slice(x);
    }
}

impl VecDot for f32 {
    type Act = f32;
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        w.iter().zip(a).map(|(w, a)| w * a).sum()
    }
}

/// F16: IEEE binary16, 16 bits per value. Quantization is ggml's
/// `ggml_fp32_to_fp16_row` (round to nearest even), dequantization
/// `ggml_fp16_to_fp32_row`.
impl BlockFormat for f16 {
    const TYPE: GgmlType = GgmlType::F16;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y = f32_to_f16(x);
        }
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y = f16_to_f32(x);
        }
    }
}

/// ggml's generic `ggml_vec_dot_f16`: f32 products summed in f64.
impl VecDot for f16 {
    type Act = f16;
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sum = 0.0f64;
        for (&w, &a) in w.iter().zip(a) {
            sum += f64::from(f16_to_f32(w) * f16_to_f32(a));
        }
        sum as f32
    }
}

/// BF16: bfloat16 (the upper half of an f32), 16 bits per value.
/// Quantization is ggml's `ggml_fp32_to_bf16_row_ref`, dequantization
/// `ggml_bf16_to_fp32_row`.
impl BlockFormat for bf16 {
    const TYPE: GgmlType = GgmlType::BF16;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y = f32_to_bf16(x);
        }
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y = bf16_to_f32(x);
        }
    }
}

/// ggml's generic `ggml_vec_dot_bf16`: f32 products summed in f64.
impl VecDot for bf16 {
    type Act = bf16;
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sum = 0.0f64;
        for (&w, &a) in w.iter().zip(a) {
            sum += f64::from(bf16_to_f32(w) * bf16_to_f32(a));
        }
        sum as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 is exactly halfway between 1 and 1 + 2^-10: ties to even (1).
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)).to_bits(), 0x3c00);
        // 1 + 3·2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: ties to even (up).
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)).to_bits(), 0x3c02);
        assert_eq!(f32_to_f16(65504.0).to_bits(), 0x7bff);
        assert_eq!(f32_to_f16(65520.0).to_bits(), 0x7c00);
        assert_eq!(f32_to_f16(-1e10).to_bits(), 0xfc00);
        // Smallest subnormal and half of it (ties to even: zero).
        assert_eq!(f32_to_f16(f32::powi(2.0, -24)).to_bits(), 0x0001);
        assert_eq!(f32_to_f16(f32::powi(2.0, -25)).to_bits(), 0x0000);
        assert_eq!(f32_to_f16(-0.0).to_bits(), 0x8000);
    }

    #[test]
    fn f16_nan_is_canonical() {
        assert_eq!(f32_to_f16(f32::from_bits(0x7f80_0001)).to_bits(), 0x7e00);
        assert_eq!(f32_to_f16(f32::from_bits(0xffc1_2345)).to_bits(), 0xfe00);
    }

    #[test]
    fn bf16_rounding_and_nan() {
        assert_eq!(f32_to_bf16(1.0).to_bits(), 0x3f80);
        // Halfway cases: ties to even.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)).to_bits(), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)).to_bits(), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)).to_bits(), 0x3f81);
        // Signalling NaN is quieted, payload's top bits kept.
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f81_0000)).to_bits(), 0x7fc1);
        assert_eq!(f32_to_bf16(f32::from_bits(0xff80_0001)).to_bits(), 0xffc0);
        // Subnormals are rounded, not flushed.
        assert_eq!(f32_to_bf16(f32::from_bits(0x0000_8000)).to_bits(), 0x0000);
        assert_eq!(f32_to_bf16(f32::from_bits(0x0001_8000)).to_bits(), 0x0002);
        // Rounding past the largest finite value gives infinity.
        assert_eq!(f32_to_bf16(f32::MAX).to_bits(), 0x7f80);
    }

    #[test]
    fn float_dots_sum_in_f64() {
        let w: Vec<f16> = [1.0f32, 1e-4, -1.0].iter().map(|&v| f32_to_f16(v)).collect();
        let a: Vec<f16> = [1.0f32; 3].iter().map(|&v| f32_to_f16(v)).collect();
        let expect = (f64::from(f16_to_f32(w[0])) + f64::from(f16_to_f32(w[1])) - 1.0) as f32;
        assert_eq!(f16::vec_dot_ref(&w, &a), expect);
        let wb: Vec<bf16> = [2.0f32, -0.5].iter().map(|&v| f32_to_bf16(v)).collect();
        let ab: Vec<bf16> = [3.0f32, 4.0].iter().map(|&v| f32_to_bf16(v)).collect();
        assert_eq!(bf16::vec_dot_ref(&wb, &ab), 4.0);
    }
}
