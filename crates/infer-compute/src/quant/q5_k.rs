//! Q5_K: 5.5 bits per weight: 256 5-bit values in 8 groups of 32 with 6-bit scales and mins.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q5_K_ref`, `dequantize_row_q5_K`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).
//!
//! A super-block of 256 values is 8 groups of 32; group `g` decodes as
//! `d · s_g · q - dmin · m_g` with 6-bit `s_g`, `m_g` (packed as described
//! at [`get_scale_min_k4`]) and `q` in `0..=31`. The low 4 bits of value `i`
//! are stored as in Q4_K (chunk `c = i / 64`: low nibble of `qs[32·c + i % 32]`
//! when `i % 64 < 32`, else the high nibble); the fifth bit is bit `i / 32`
//! of `qh[i % 32]`.

use half::f16;

use super::k_common::{dot_block_scale_min_k4, get_scale_min_k4, quantize_superblock_qkx2, Qkx2Params};
use super::BlockFormat;
use super::{BlockQ8K, VecDot, QK_K};
use crate::GgmlType;

/// One Q5_K block (176 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale of the 6-bit group scales.
    pub d: f16,
    /// Super-block scale of the 6-bit group mins.
    pub dmin: f16,
    /// 8 6-bit scales and 8 6-bit mins, packed (see [`get_scale_min_k4`]).
    pub scales: [u8; 12],
    /// Fifth bit of each quant: bit `i / 32` of byte `i % 32`.
    pub qh: [u8; 32],
    /// Low 4 bits of each quant, two per byte.
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == GgmlType::Q5_K.type_size());

/// All 256 quants of a block, in `0..=31`.
fn quants(b: &BlockQ5K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (i, v) in q.iter_mut().enumerate() {
        let byte = b.qs[32 * (i / 64) + i % 32];
        let low = if i % 64 < 32 { byte & 0xF } else { byte >> 4 };
        let high = if b.qh[i % 32] & (1 << (i / 32)) != 0 { 16 } else { 0 };
        *v = (low + high) as i8;
    }
    q
}

impl BlockFormat for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;

    /// ggml `quantize_row_q5_K_ref`: per group of 32, [`make_qkx2_quants`](super::k_common::make_qkx2_quants)
    /// with weights `sqrt(mean(x²)) + |x|`, 31 levels and search `(-0.5, 0.1, 15)`
    /// minimising the weighted squared error; group scales and mins are
    /// rounded to 6 bits against their maxima (`d = max_scale / 63`,
    /// `dmin = max_min / 63`) and the values are re-rounded against the
    /// f16-rounded effective scale and min.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        let params = Qkx2Params { rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: false };
        for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
            let (scales, d, dmin, l) = quantize_superblock_qkx2(xb, 31, params);
            yb.scales = scales;
            yb.d = d;
            yb.dmin = dmin;

            yb.qh = [0; 32];
            for c in 0..4 {
                for k in 0..32 {
                    let (mut l1, mut l2) = (l[64 * c + k], l[64 * c + k + 32]);
                    if l1 > 15 {
                        l1 -= 16;
                        yb.qh[k] |= 1 << (2 * c);
                    }
                    if l2 > 15 {
                        l2 -= 16;
                        yb.qh[k] |= 2 << (2 * c);
                    }
                    yb.qs[32 * c + k] = l1 | (l2 << 4);
                }
            }
        }
    }

    /// ggml `dequantize_row_q5_K`: `y = (d·s_g)·q - dmin·m_g`.
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
            let d = xb.d.to_f32();
            let min = xb.dmin.to_f32();
            let q = quants(xb);
            for (g, (yg, qg)) in yb.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
                let (sc, m) = get_scale_min_k4(g, &xb.scales);
                let dl = d * sc as f32;
                let ml = min * m as f32;
                for (v, &qv) in yg.iter_mut().zip(qg) {
                    *v = dl * qv as f32 - ml;
                }
            }
        }
    }
}

impl VecDot for BlockQ5K {
    type Act = BlockQ8K;

    /// ggml `ggml_vec_dot_q5_K_q8_K` (generic): per block,
    /// `d·d8·Σ_g s_g·Σ q·q8 - dmin·d8·Σ_g m_g·(bsum_2g + bsum_2g+1)` with
    /// integer sums inside.
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0f32;
        for (xb, yb) in w.iter().zip(a) {
            sumf += dot_block_scale_min_k4(&quants(xb), &xb.scales, xb.d, xb.dmin, yb);
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
    fn golden_q5_k() {
        golden::check_weight_format::<BlockQ5K>("q5_K");
    }

    #[test]
    fn stress_inputs_do_not_panic() {
        for x in golden::stress_rows() {
            let mut q = vec![BlockQ5K::zeroed(); x.len() / QK_K];
            BlockQ5K::quantize_row_ref(&x, &mut q);
            let mut y = vec![0f32; x.len()];
            BlockQ5K::dequantize_row(&q, &mut y);
            let a = crate::quant::quantize_activation::<BlockQ5K>(&x).unwrap();
            let _ = BlockQ5K::vec_dot_ref(&q, &a);
        }
    }
}
