//! Q2_K: 2.625 bits per weight: 256 2-bit values in 16 groups of 16 with 4-bit scales and mins.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q2_K_ref`, `dequantize_row_q2_K`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).
//!
//! A super-block of 256 values is 16 groups of 16. Group `g` decodes as
//! `d · (scales[g] & 0xF) · q - dmin · (scales[g] >> 4)` with `q` in `0..=3`.
//! Quant `i` of half `h = i / 128` lives in byte `32·h + i % 32` of `qs`, at
//! bits `2·((i % 128) / 32)`.

use half::f16;

use super::k_common::{make_qkx2_quants, nearest_int, pack_2bit, scaled_dot_i32, Qkx2Params};
use super::BlockFormat;
use super::{BlockQ8K, VecDot, QK_K};
use crate::GgmlType;

/// One Q2_K block (84 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ2K {
    /// 4-bit scale (low) and 4-bit min (high) per 16 values.
    pub scales: [u8; 16],
    /// 2-bit quants, four per byte (see the module docs for the order).
    pub qs: [u8; 64],
    /// Super-block scale of the 4-bit group scales.
    pub d: f16,
    /// Super-block scale of the 4-bit group mins.
    pub dmin: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == GgmlType::Q2_K.type_size());

/// Decodes the 2-bit quant `i` (0..256) of a block.
#[inline]
fn quant(qs: &[u8; 64], i: usize) -> u8 {
    (qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3
}

impl BlockFormat for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;

    /// ggml `quantize_row_q2_K_ref`: per group of 16, [`make_qkx2_quants`]
    /// with weights `|x|`, 3 levels, search `(-0.5, 0.1, 15)` minimising the
    /// weighted absolute error; group scales and mins are quantized to 4 bits
    /// against their maxima (`d = max_scale / 15`, `dmin = max_min / 15`) and
    /// the values are then re-rounded against the f16-rounded scales.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        const Q4SCALE: f32 = 15.0;
        let params = Qkx2Params { rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: true };
        for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
            let mut l = [0u8; QK_K];
            let mut laux = [0u8; 16];
            let mut weights = [0f32; 16];
            let mut scales = [0f32; 16];
            let mut mins = [0f32; 16];
            let mut max_scale = 0f32;
            let mut max_min = 0f32;
            for j in 0..16 {
                let xg = &xb[16 * j..16 * j + 16];
                for (w, &v) in weights.iter_mut().zip(xg) {
                    *w = v.abs();
                }
                let (scale, min) = make_qkx2_quants(3, xg, &weights, &mut l[16 * j..16 * j + 16], &mut laux, params);
                scales[j] = scale;
                mins[j] = min;
                if scale > max_scale {
                    max_scale = scale;
                }
                if min > max_min {
                    max_min = min;
                }
            }

            if max_scale > 0.0 {
                let iscale = Q4SCALE / max_scale;
                for (s, &scale) in yb.scales.iter_mut().zip(&scales) {
                    *s = nearest_int(iscale * scale) as u8;
                }
                yb.d = f16::from_f32(max_scale / Q4SCALE);
            } else {
                yb.scales = [0; 16];
                yb.d = f16::from_f32(0.0);
            }
            if max_min > 0.0 {
                let iscale = Q4SCALE / max_min;
                for (s, &min) in yb.scales.iter_mut().zip(&mins) {
                    *s |= (nearest_int(iscale * min) << 4) as u8;
                }
                yb.dmin = f16::from_f32(max_min / Q4SCALE);
            } else {
                yb.dmin = f16::from_f32(0.0);
            }

            let d_all = yb.d.to_f32();
            let m_all = yb.dmin.to_f32();
            for j in 0..16 {
                let d = d_all * (yb.scales[j] & 0xF) as f32;
                if d == 0.0 {
                    continue;
                }
                let dm = m_all * (yb.scales[j] >> 4) as f32;
                for ii in 0..16 {
                    let q = nearest_int((xb[16 * j + ii] + dm) / d).clamp(0, 3);
                    l[16 * j + ii] = q as u8;
                }
            }
            pack_2bit(&l, &mut yb.qs);
        }
    }

    /// ggml `dequantize_row_q2_K`: `y = (d·sc)·q - dmin·m` per group.
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
            let d = xb.d.to_f32();
            let min = xb.dmin.to_f32();
            for (g, yg) in yb.chunks_exact_mut(16).enumerate() {
                let sc = xb.scales[g];
                let dl = d * (sc & 0xF) as f32;
                let ml = min * (sc >> 4) as f32;
                for (k, v) in yg.iter_mut().enumerate() {
                    *v = dl * quant(&xb.qs, 16 * g + k) as f32 - ml;
                }
            }
        }
    }
}

impl VecDot for BlockQ2K {
    type Act = BlockQ8K;

    /// ggml `ggml_vec_dot_q2_K_q8_K` (generic): per block,
    /// `d·d8·Σ_g sc_g·Σ q·q8 - dmin·d8·Σ_g m_g·bsum_g`, integer sums inside.
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0f32;
        for (xb, yb) in w.iter().zip(a) {
            let mut q = [0i8; QK_K];
            for (i, v) in q.iter_mut().enumerate() {
                *v = quant(&xb.qs, i) as i8;
            }
            let summs: i32 = xb.scales.iter().zip(&yb.bsums).map(|(&s, &b)| b as i32 * (s >> 4) as i32).sum();
            let isum = scaled_dot_i32::<16>(&q, &yb.qs, |g| (xb.scales[g] & 0xF) as i32);
            let dall = yb.d * xb.d.to_f32();
            let dmin = yb.d * xb.dmin.to_f32();
            sumf += dall * isum as f32 - dmin * summs as f32;
        }
        sumf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::k_common::golden;

    #[test]
    fn golden_q2_k() {
        golden::check_weight_format::<BlockQ2K>("q2_K");
    }

    #[test]
    fn stress_inputs_do_not_panic() {
        for x in golden::stress_rows() {
            let mut q = vec![BlockQ2K::zeroed(); x.len() / QK_K];
            BlockQ2K::quantize_row_ref(&x, &mut q);
            let mut y = vec![0f32; x.len()];
            BlockQ2K::dequantize_row(&q, &mut y);
            let a = crate::quant::quantize_activation::<BlockQ2K>(&x).unwrap();
            let _ = BlockQ2K::vec_dot_ref(&q, &a);
        }
    }

    use bytemuck::Zeroable;
}
