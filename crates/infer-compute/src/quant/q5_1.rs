//! Q5_1: 6 bits per weight: f16 scale and minimum, 32 5-bit values.
//!
//! Block of 32 values, packed as Q5_0 (low 4 bits in `qs`, fifth bits in the
//! little-endian u32 `qh`); `x ≈ q · d + m`.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q5_1_ref`, `dequantize_row_q5_1`), `ggml-cpu/quants.c`
//! (`ggml_vec_dot_q5_1_q8_1_generic`).

use half::f16;

use super::float::{f16_to_f32, f32_to_f16, trunc_i32};
use super::q4_1::min_max;
use super::q5_0::{pack5, unpack5};
use super::BlockFormat;
use super::{BlockQ8_1, VecDot, QK};
use crate::GgmlType;

/// One Q5_1 block (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == GgmlType::Q5_1.type_size());

impl BlockFormat for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;

    /// ggml `quantize_row_q5_1_ref`. Per block: `d = (max - min) / 31`,
    /// codes `(x - min) · (1/d) + 0.5` truncated toward zero (no cap: ggml
    /// relies on the range, and keeps only the low 5 bits), with `1/d` from
    /// the f32 `d` (0 when `d == 0`). `d` and `m = min` are stored rounded to
    /// f16; the codes use the unrounded values.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
            let (min, max) = min_max(xb);
            let d = (max - min) / 31.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            yb.d = f32_to_f16(d);
            yb.m = f32_to_f16(min);
            let mut q = [0u8; QK];
            for (q, &v) in q.iter_mut().zip(xb) {
                *q = trunc_i32((v - min) * id + 0.5) as u8;
            }
            pack5(&q, &mut yb.qs, &mut yb.qh);
        }
    }

    /// ggml `dequantize_row_q5_1`: `q · d + m` in f32 (two roundings).
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
            let d = f16_to_f32(xb.d);
            let m = f16_to_f32(xb.m);
            for (y, q) in yb.iter_mut().zip(unpack5(&xb.qs, xb.qh)) {
                *y = q as f32 * d + m;
            }
        }
    }
}

/// ggml `ggml_vec_dot_q5_1_q8_1_generic`: per block
/// `sum += (d_w · d_a) · sumi + m_w · s_a`, where `s_a` is the activation
/// block's stored f16 `d · Σq`.
impl VecDot for BlockQ5_1 {
    type Act = BlockQ8_1;
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (wb, ab) in w.iter().zip(a) {
            let mut sumi = 0i32;
            for (q, &qa) in unpack5(&wb.qs, wb.qh).iter().zip(&ab.qs) {
                sumi += *q as i32 * qa as i32;
            }
            sumf += (f16_to_f32(wb.d) * f16_to_f32(ab.d)) * sumi as f32 + f16_to_f32(wb.m) * f16_to_f32(ab.s);
        }
        sumf
    }
}
