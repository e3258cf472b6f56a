//! Q3_K: 3.4375 bits per weight: 256 3-bit values in 16 groups of 16 with 6-bit scales.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q3_K_ref`, `dequantize_row_q3_K`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).
//!
//! A super-block of 256 values is 16 groups of 16; group `g` decodes as
//! `d · (s_g - 32) · q` with the 6-bit scale `s_g` and `q` in `-4..=3`.
//! `q + 4` is split into a low 2-bit part (packed in `qs` as in Q2_K: value
//! `i` in byte `32·(i / 128) + i % 32` at bits `2·((i % 128) / 32)`) and a
//! high bit (bit `i / 32` of `hmask[i % 32]`). Scale `s_g`: low nibble in
//! `scales[g % 8]` (low half for `g < 8`, high half otherwise), top 2 bits
//! at bits `2·(g / 4)` of `scales[8 + g % 4]`.

use half::f16;

use super::k_common::{make_q3_quants, nearest_int, pack_2bit, scaled_dot_i32};
use super::BlockFormat;
use super::{BlockQ8K, VecDot, QK_K};
use crate::GgmlType;

/// One Q3_K block (110 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ3K {
    /// High bit of each quant: bit `i / 32` of byte `i % 32`.
    pub hmask: [u8; 32],
    /// Low 2 bits of each quant, four per byte.
    pub qs: [u8; 64],
    /// 16 6-bit scales, packed.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == GgmlType::Q3_K.type_size());

/// The signed scale (`s_g - 32`, in `-32..=31`) of group `g` (0..16).
#[inline]
fn group_scale(scales: &[u8; 12], g: usize) -> i8 {
    let low = if g < 8 { scales[g] & 0xF } else { scales[g - 8] >> 4 };
    let high = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

/// All 256 quants of a block, in `-4..=3`.
fn quants(b: &BlockQ3K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (i, v) in q.iter_mut().enumerate() {
        let (h, s, k) = (i / 128, (i % 128) / 32, i % 32);
        let low = ((b.qs[32 * h + k] >> (2 * s)) & 3) as i8;
        let high = b.hmask[k] & (1 << (i / 32)) != 0;
        *v = low - if high { 0 } else { 4 };
    }
    q
}

impl BlockFormat for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;

    /// ggml `quantize_row_q3_K_ref`: per group of 16, [`make_q3_quants`]
    /// (`nmax = 4`, with the `x²`-weighted refinement); the group scale of
    /// largest magnitude (signed) maps to -32 (`d = max / -32`), the others
    /// are rounded to 6 bits, and the values are re-rounded against the
    /// f16-rounded effective scales.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
            let mut l = [0i8; QK_K];
            let mut scales = [0f32; 16];
            let mut max_scale = 0f32;
            let mut amax = 0f32;
            for (j, s) in scales.iter_mut().enumerate() {
                *s = make_q3_quants(4, &xb[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16], true);
                let a = s.abs();
                if a > amax {
                    amax = a;
                    max_scale = *s;
                }
            }

            yb.scales = [0; 12];
            if max_scale != 0.0 {
                let iscale = -32.0f32 / max_scale;
                for (j, &s) in scales.iter().enumerate() {
                    let q = nearest_int(iscale * s) as i8;
                    let q = ((q as i32).clamp(-32, 31) + 32) as u8;
                    if j < 8 {
                        yb.scales[j] = q & 0xF;
                    } else {
                        yb.scales[j - 8] |= (q & 0xF) << 4;
                    }
                    yb.scales[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
                }
                yb.d = f16::from_f32(1.0 / iscale);
            } else {
                yb.d = f16::from_f32(0.0);
            }

            let d_all = yb.d.to_f32();
            for j in 0..16 {
                let d = d_all * group_scale(&yb.scales, j) as f32;
                if d == 0.0 {
                    continue;
                }
                for ii in 0..16 {
                    let q = nearest_int(xb[16 * j + ii] / d).clamp(-4, 3);
                    l[16 * j + ii] = (q + 4) as i8;
                }
            }

            yb.hmask = [0; 32];
            let mut low = [0u8; QK_K];
            for (i, (&q, lo)) in l.iter().zip(low.iter_mut()).enumerate() {
                let mut q = q as u8;
                if q > 3 {
                    yb.hmask[i % 32] |= 1 << (i / 32);
                    q -= 4;
                }
                *lo = q;
            }
            pack_2bit(&low, &mut yb.qs);
        }
    }

    /// ggml `dequantize_row_q3_K`: `y = (d·(s_g - 32))·q`.
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
            let d_all = xb.d.to_f32();
            let q = quants(xb);
            for (g, (yg, qg)) in yb.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
                let dl = d_all * group_scale(&xb.scales, g) as f32;
                for (v, &qv) in yg.iter_mut().zip(qg) {
                    *v = dl * qv as f32;
                }
            }
        }
    }
}

impl VecDot for BlockQ3K {
    type Act = BlockQ8K;

    /// ggml `ggml_vec_dot_q3_K_q8_K` (generic): per block,
    /// `d·d8·Σ_g (s_g - 32)·Σ q·q8` with integer sums inside.
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0f32;
        for (xb, yb) in w.iter().zip(a) {
            let q = quants(xb);
            let isum = scaled_dot_i32::<16>(&q, &yb.qs, |g| group_scale(&xb.scales, g) as i32);
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
    fn golden_q3_k() {
        golden::check_weight_format::<BlockQ3K>("q3_K");
    }

    #[test]
    fn stress_inputs_do_not_panic() {
        for x in golden::stress_rows() {
            let mut q = vec![BlockQ3K::zeroed(); x.len() / QK_K];
            BlockQ3K::quantize_row_ref(&x, &mut q);
            let mut y = vec![0f32; x.len()];
            BlockQ3K::dequantize_row(&q, &mut y);
            let a = crate::quant::quantize_activation::<BlockQ3K>(&x).unwrap();
            let _ = BlockQ3K::vec_dot_ref(&q, &a);
        }
    }
}
