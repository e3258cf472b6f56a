//! Q4_1: 5 bits per weight: f16 scale and minimum, 32 4-bit values.
//!
//! Block of 32 values: `qs[j]` holds the code of `x[j]` in its low nibble
//! and of `x[j + 16]` in its high nibble; `x ≈ q · d + m`.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q4_1_ref`, `dequantize_row_q4_1`), `ggml-cpu/quants.c`
//! (`ggml_vec_dot_q4_1_q8_1_generic`).

use half::f16;

use super::float::{f16_to_f32, f32_to_f16, trunc_i32};
use super::BlockFormat;
use super::{BlockQ8_1, VecDot, QK};
use crate::GgmlType;

/// One Q4_1 block (20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == GgmlType::Q4_1.type_size());

/// The block's minimum and maximum as ggml scans them (`v < min`, `v > max`
/// from `±FLT_MAX`).
#[inline]
pub(crate) fn min_max(xb: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in xb {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

impl BlockFormat for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;

    /// ggml `quantize_row_q4_1_ref`. Per block: `d = (max - min) / 15`,
    /// codes `(x - min) · (1/d) + 0.5` truncated toward zero and capped at
    /// 15, with `1/d` from the f32 `d` (0 when `d == 0`). `d` and `m = min`
    /// are stored rounded to f16; the codes use the unrounded values.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
            let (min, max) = min_max(xb);
            let d = (max - min) / 15.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            yb.d = f32_to_f16(d);
            yb.m = f32_to_f16(min);
            for j in 0..QK / 2 {
                let lo = (trunc_i32((xb[j] - min) * id + 0.5) as i8).min(15) as u8;
                let hi = (trunc_i32((xb[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
                yb.qs[j] = lo | (hi << 4);
            }
        }
    }

    /// ggml `dequantize_row_q4_1`: `q · d + m` in f32 (two roundings, no
    /// fused multiply-add).
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
            let d = f16_to_f32(xb.d);
            let m = f16_to_f32(xb.m);
            for (j, &q) in xb.qs.iter().enumerate() {
                yb[j] = (q & 0x0f) as f32 * d + m;
                yb[j + QK / 2] = (q >> 4) as f32 * d + m;
            }
        }
    }
}

/// ggml `ggml_vec_dot_q4_1_q8_1_generic`: per block
/// `sum += (d_w · d_a) · sumi + m_w · s_a`, where `s_a` is the activation
/// block's stored f16 `d · Σq`.
impl VecDot for BlockQ4_1 {
    type Act = BlockQ8_1;
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (wb, ab) in w.iter().zip(a) {
            let mut sumi = 0i32;
            for (j, &q) in wb.qs.iter().enumerate() {
                sumi += (q & 0x0f) as i32 * ab.qs[j] as i32;
                sumi += (q >> 4) as i32 * ab.qs[j + QK / 2] as i32;
            }
            sumf += (f16_to_f32(wb.d) * f16_to_f32(ab.d)) * sumi as f32 + f16_to_f32(wb.m) * f16_to_f32(ab.s);
        }
        sumf
    }
}
