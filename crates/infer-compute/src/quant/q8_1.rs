//! Q8_1: 9 bits per value: activation type paired with Q4_1/Q5_1.
//!
//! Block of 32 values, `x ≈ qs[j] · d`, plus `s = d · Σqs` (f16) so that a
//! weight format with a minimum (`q · d_w + m_w`) can add `m_w · s` instead
//! of summing the activation.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q8_1_ref`). ggml has no Q8_1 dequantizer; ours is the
//! obvious `q · d`.

use half::f16;

use super::float::{f16_to_f32, f32_to_f16};
use super::q8_0::quantize_block_q8;
use super::{BlockFormat, QK};
use crate::GgmlType;

/// One Q8_1 block (36 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8_1 {
    pub d: f16,
    /// `d * sum(qs)`, rounded to f16.
    pub s: f16,
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == GgmlType::Q8_1.type_size());

impl BlockFormat for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;

    /// ggml `quantize_row_q8_1_ref`: codes and `d` exactly as Q8_0
    /// (`d = amax / 127`, `roundf(x · (1/d))`); `s` is the integer sum of the
    /// codes times the f32 (unrounded) `d`, rounded to f16.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
            let d = quantize_block_q8(xb, &mut yb.qs);
            let sum: i32 = yb.qs.iter().map(|&q| q as i32).sum();
            yb.d = f32_to_f16(d);
            yb.s = f32_to_f16(sum as f32 * d);
        }
    }

    /// `q · d` in f32 (the stored `s` is not used).
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
            let d = f16_to_f32(xb.d);
            for (y, &q) in yb.iter_mut().zip(&xb.qs) {
                *y = q as f32 * d;
            }
        }
    }
}
