//! Q8_0: 8.5 bits per weight: f16 scale and 32 signed 8-bit values.
//!
//! Block of 32 values, `x ≈ qs[j] · d`. Also the activation format paired
//! with Q4_0, Q5_0, Q8_0 and IQ4_NL.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q8_0_ref`, `dequantize_row_q8_0`), `ggml-cpu/quants.c`
//! (`ggml_vec_dot_q8_0_q8_0_generic`).

use half::f16;

use super::float::{absmax, f16_to_f32, f32_to_f16, trunc_i32};
use super::BlockFormat;
use super::{VecDot, QK};
use crate::GgmlType;

/// One Q8_0 block (34 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == GgmlType::Q8_0.type_size());

/// Quantizes one block of 32 values to `d = amax / 127` and codes
/// `round(x · (1/d))` (half away from zero, C `roundf`), with `1/d` from the
/// f32 `d` (0 when `d == 0`). Returns the f32 `d` (the caller stores it
/// rounded to f16).
#[inline]
pub(crate) fn quantize_block_q8(xb: &[f32], qs: &mut [i8; QK]) -> f32 {
    let d = absmax(xb) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(xb) {
        *q = trunc_i32((v * id).round()) as i8;
    }
    d
}

impl BlockFormat for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;

    /// ggml `quantize_row_q8_0_ref`: per block `d = amax / 127`, codes
    /// `roundf(x / d)` computed with the f32 reciprocal of the unrounded `d`;
    /// `d` stored rounded to f16.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
            let d = quantize_block_q8(xb, &mut yb.qs);
            yb.d = f32_to_f16(d);
        }
    }

    /// ggml `dequantize_row_q8_0`: `q · d` in f32.
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
            let d = f16_to_f32(xb.d);
            for (y, &q) in yb.iter_mut().zip(&xb.qs) {
                *y = q as f32 * d;
            }
        }
    }
}

/// ggml `ggml_vec_dot_q8_0_q8_0_generic`: exact integer dot per block, then
/// `sum += sumi · (d_w · d_a)` in f32.
impl VecDot for BlockQ8_0 {
    type Act = BlockQ8_0;
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (wb, ab) in w.iter().zip(a) {
            let sumi: i32 = wb.qs.iter().zip(&ab.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
            sumf += sumi as f32 * (f16_to_f32(wb.d) * f16_to_f32(ab.d));
        }
        sumf
    }
}
