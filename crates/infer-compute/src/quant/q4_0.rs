//! Q4_0: 4.5 bits per weight: one f16 scale and 32 4-bit values (offset 8).
//!
//! Block of 32 values `x[0..32]`: `qs[j]` holds the code of `x[j]` in its low
//! nibble and of `x[j + 16]` in its high nibble; `x ≈ (q - 8) · d`.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q4_0_ref`, `dequantize_row_q4_0`), `ggml-cpu/quants.c`
//! (`ggml_vec_dot_q4_0_q8_0_generic`).

use half::f16;

use super::float::{f16_to_f32, f32_to_f16, signed_absmax, trunc_i32};
use super::BlockFormat;
use super::{BlockQ8_0, VecDot, QK};
use crate::GgmlType;

/// One Q4_0 block (18 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == GgmlType::Q4_0.type_size());

impl BlockFormat for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;

    /// ggml `quantize_row_q4_0_ref`. Per block: `max` is the value of
    /// largest magnitude (sign kept, first on ties), `d = max / -8` (so an
    /// all-zero block stores `-0.0`); values are multiplied by `1/d` taken
    /// from the f32 `d` (0 when `d == 0`), offset by 8.5, truncated toward
    /// zero and capped at 15. `d` is stored rounded to f16 afterwards.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
            let d = signed_absmax(xb) / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            yb.d = f32_to_f16(d);
            for j in 0..QK / 2 {
                let lo = (trunc_i32(xb[j] * id + 8.5) as i8).min(15) as u8;
                let hi = (trunc_i32(xb[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
                yb.qs[j] = lo | (hi << 4);
            }
        }
    }

    /// ggml `dequantize_row_q4_0`: `(q - 8) · d` in f32.
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
            let d = f16_to_f32(xb.d);
            for (j, &q) in xb.qs.iter().enumerate() {
                yb[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
                yb[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
            }
        }
    }
}

/// ggml `ggml_vec_dot_q4_0_q8_0_generic`: exact integer dot per block, then
/// `sum += (sumi · d_w) · d_a` in f32, blocks in order.
impl VecDot for BlockQ4_0 {
    type Act = BlockQ8_0;
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (wb, ab) in w.iter().zip(a) {
            let mut sumi = 0i32;
            for (j, &q) in wb.qs.iter().enumerate() {
                sumi += ((q & 0x0f) as i32 - 8) * ab.qs[j] as i32;
                sumi += ((q >> 4) as i32 - 8) * ab.qs[j + QK / 2] as i32;
            }
            sumf += sumi as f32 * f16_to_f32(wb.d) * f16_to_f32(ab.d);
        }
        sumf
    }
}
