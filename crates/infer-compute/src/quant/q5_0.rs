//! Q5_0: 5.5 bits per weight: f16 scale, 32 5-bit values (offset 16), high bits packed in `qh`.
//!
//! Block of 32 values: `qs[j]` holds the low 4 bits of the codes of `x[j]`
//! (low nibble) and `x[j + 16]` (high nibble); bit `i` of the little-endian
//! u32 `qh` is the fifth bit of the code of `x[i]`; `x ≈ (q - 16) · d`.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q5_0_ref`, `dequantize_row_q5_0`), `ggml-cpu/quants.c`
//! (`ggml_vec_dot_q5_0_q8_0_generic`).

use half::f16;

use super::float::{f16_to_f32, f32_to_f16, signed_absmax, trunc_i32};
use super::BlockFormat;
use super::{BlockQ8_0, VecDot, QK};
use crate::GgmlType;

/// One Q5_0 block (22 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == GgmlType::Q5_0.type_size());

/// The 5-bit codes (0..32) of a Q5_0/Q5_1 block, in value order.
#[inline]
pub(crate) fn unpack5(qs: &[u8; 16], qh: [u8; 4]) -> [u8; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        q[j + QK / 2] = (qs[j] >> 4) | ((((qh >> (j + QK / 2)) & 1) as u8) << 4);
    }
    q
}

/// Packs 5-bit codes (only their low 5 bits are used) into `qs` and `qh`.
#[inline]
pub(crate) fn pack5(q: &[u8; QK], qs: &mut [u8; 16], qh: &mut [u8; 4]) {
    let mut h = 0u32;
    for j in 0..QK / 2 {
        let (lo, hi) = (q[j], q[j + QK / 2]);
        qs[j] = (lo & 0x0f) | ((hi & 0x0f) << 4);
        h |= (((lo & 0x10) >> 4) as u32) << j;
        h |= (((hi & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    *qh = h.to_le_bytes();
}

impl BlockFormat for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;

    /// ggml `quantize_row_q5_0_ref`. Per block: `d = max / -16` with `max`
    /// the value of largest magnitude (sign kept, first on ties); codes
    /// `x · (1/d) + 16.5` truncated toward zero and capped at 31, with `1/d`
    /// from the f32 `d` (0 when `d == 0`). `d` is stored rounded to f16.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
            let d = signed_absmax(xb) / -16.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            yb.d = f32_to_f16(d);
            let mut q = [0u8; QK];
            for (q, &v) in q.iter_mut().zip(xb) {
                *q = (trunc_i32(v * id + 16.5) as i8).min(31) as u8;
            }
            pack5(&q, &mut yb.qs, &mut yb.qh);
        }
    }

    /// ggml `dequantize_row_q5_0`: `(q - 16) · d` in f32.
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
            let d = f16_to_f32(xb.d);
            for (y, q) in yb.iter_mut().zip(unpack5(&xb.qs, xb.qh)) {
                *y = (q as i32 - 16) as f32 * d;
            }
        }
    }
}

/// ggml `ggml_vec_dot_q5_0_q8_0_generic`: exact integer dot per block, then
/// `sum += (d_w · d_a) · sumi` in f32.
impl VecDot for BlockQ5_0 {
    type Act = BlockQ8_0;
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (wb, ab) in w.iter().zip(a) {
            let mut sumi = 0i32;
            for (q, &qa) in unpack5(&wb.qs, wb.qh).iter().zip(&ab.qs) {
                sumi += (*q as i32 - 16) * qa as i32;
            }
            sumf += (f16_to_f32(wb.d) * f16_to_f32(ab.d)) * sumi as f32;
        }
        sumf
    }
}
