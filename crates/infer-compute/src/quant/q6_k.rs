//! Q6_K: 6.5625 bits per weight: 256 6-bit values in 16 groups of 16 with 8-bit scales.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q6_K_ref`, `dequantize_row_q6_K`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).
//!
//! A super-block of 256 values is 16 groups of 16; group `g` decodes as
//! `d · scales[g] · q` with signed 8-bit scales and `q` in `-32..=31`, stored
//! as `q + 32` split into 4 low and 2 high bits. For value `i`, with half
//! `h = i / 128`, `s = (i % 128) / 32`, `k = i % 32`: the low bits are the
//! low (`s < 2`) or high (`s >= 2`) nibble of `ql[64·h + 32·(s % 2) + k]`,
//! the high bits are bits `2s, 2s+1` of `qh[32·h + k]`.

use half::f16;

use super::k_common::{make_qx_quants, nearest_int, scaled_dot_i32, QxMode, QxWeights, GROUP_MAX_EPS};
use super::BlockFormat;
use super::{BlockQ8K, VecDot, QK_K};
use crate::GgmlType;

/// One Q6_K block (210 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits.
    pub ql: [u8; 128],
    /// High 2 bits.
    pub qh: [u8; 64],
    /// Signed 8-bit scale per group of 16.
    pub scales: [i8; 16],
    /// Super-block scale.
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == GgmlType::Q6_K.type_size());

/// All 256 quants of a block, in `-32..=31`.
pub(crate) fn quants(b: &BlockQ6K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (i, v) in q.iter_mut().enumerate() {
        let (h, s, k) = (i / 128, (i % 128) / 32, i % 32);
        let byte = b.ql[64 * h + 32 * (s % 2) + k];
        let low = if s < 2 { byte & 0xF } else { byte >> 4 };
        let high = (b.qh[32 * h + k] >> (2 * s)) & 3;
        *v = (low | (high << 4)) as i8 - 32;
    }
    q
}

impl BlockFormat for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;

    /// ggml `quantize_row_q6_K_ref`: per group of 16, [`make_qx_quants`]
    /// (`nmax = 32`, `x²` weights, scale search); the group scale of largest
    /// magnitude (signed) maps to -128 (`d = max / -128`), the others are
    /// rounded to 8 bits (at most 127), and the values are re-rounded against
    /// the f16-rounded effective scales. A block whose scales are all below
    /// ggml's `GROUP_MAX_EPS` is stored as zeros.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
            let mut l = [0i8; QK_K];
            let mut scales = [0f32; 16];
            let mut max_scale = 0f32;
            let mut max_abs_scale = 0f32;
            for (ib, s) in scales.iter_mut().enumerate() {
                *s = make_qx_quants(
                    32,
                    &xb[16 * ib..16 * ib + 16],
                    &mut l[16 * ib..16 * ib + 16],
                    QxMode::Search,
                    QxWeights::Square,
                );
                let a = s.abs();
                if a > max_abs_scale {
                    max_abs_scale = a;
                    max_scale = *s;
                }
            }

            if max_abs_scale < GROUP_MAX_EPS {
                *yb = bytemuck::Zeroable::zeroed();
                continue;
            }

            let iscale = -128.0f32 / max_scale;
            yb.d = f16::from_f32(1.0 / iscale);
            for (sc, &s) in yb.scales.iter_mut().zip(&scales) {
                *sc = nearest_int(iscale * s).min(127) as i8;
            }

            let d_all = yb.d.to_f32();
            for j in 0..16 {
                let d = d_all * yb.scales[j] as f32;
                if d == 0.0 {
                    continue;
                }
                for ii in 0..16 {
                    let q = nearest_int(xb[16 * j + ii] / d).clamp(-32, 31);
                    l[16 * j + ii] = (q + 32) as i8;
                }
            }

            for h in 0..2 {
                for k in 0..32 {
                    let base = 128 * h + k;
                    let q = [l[base] as u8, l[base + 32] as u8, l[base + 64] as u8, l[base + 96] as u8];
                    yb.ql[64 * h + k] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
                    yb.ql[64 * h + k + 32] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
                    yb.qh[32 * h + k] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
                }
            }
        }
    }

    /// ggml `dequantize_row_q6_K`: `y = (d·scale_g)·q`.
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
            let d = xb.d.to_f32();
            let q = quants(xb);
            for (g, (yg, qg)) in yb.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
                let dl = d * xb.scales[g] as f32;
                for (v, &qv) in yg.iter_mut().zip(qg) {
                    *v = dl * qv as f32;
                }
            }
        }
    }
}

impl VecDot for BlockQ6K {
    type Act = BlockQ8K;

    /// ggml `ggml_vec_dot_q6_K_q8_K` (generic): per block,
    /// `d·d8·Σ_g scale_g·Σ q·q8` with integer sums inside.
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0f32;
        for (xb, yb) in w.iter().zip(a) {
            let q = quants(xb);
            let isum = scaled_dot_i32::<16>(&q, &yb.qs, |g| xb.scales[g] as i32);
            sumf += xb.d.to_f32() * yb.d * isum as f32;
        }
        sumf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::k_common::golden;
    use bytemuck::Zeroable;

    #[test]
    fn golden_q6_k() {
        golden::check_weight_format::<BlockQ6K>("q6_K");
    }

    #[test]
    fn stress_inputs_do_not_panic() {
        for x in golden::stress_rows() {
            let mut q = vec![BlockQ6K::zeroed(); x.len() / QK_K];
            BlockQ6K::quantize_row_ref(&x, &mut q);
            let mut y = vec![0f32; x.len()];
            BlockQ6K::dequantize_row(&q, &mut y);
            let a = crate::quant::quantize_activation::<BlockQ6K>(&x).unwrap();
            let _ = BlockQ6K::vec_dot_ref(&q, &a);
        }
    }
}
