//! Q8_K: 9.125 bits per value: activation type paired with the k-quants.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q8_K_ref`, `dequantize_row_q8_K`). ggml's CPU backend
//! quantizes activations with the same algorithm (`quantize_row_q8_K`).
//!
//! Value `i` decodes as `d · qs[i]`; `bsums[g]` is `Σ qs[16g .. 16g + 16]`,
//! which the weight formats with mins use to apply them without touching
//! the individual quants.

use super::k_common::nearest_int;
use super::{BlockFormat, QK_K};
use crate::GgmlType;

/// One Q8_K block (292 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8K {
    /// Scale (f32, unlike the weight formats).
    pub d: f32,
    /// Signed 8-bit quants in `-127..=127`.
    pub qs: [i8; 256],
    /// Sums of each group of 16 `qs`.
    pub bsums: [i16; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == GgmlType::Q8_K.type_size());

impl BlockFormat for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8_K;

    /// ggml `quantize_row_q8_K_ref`: the scale comes from the *signed* value
    /// of largest magnitude (first one on ties), `iscale = -127 / max`,
    /// `qs = min(127, nearest_int(iscale·x))`, `d = 1 / iscale`, so the
    /// extreme value maps to -127 exactly.
    ///
    /// For an all-zero block ggml writes `d = 0` and zero quants but leaves
    /// `bsums` unwritten; here they are set to 0, their consistent value.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
            let mut max = 0f32;
            let mut amax = 0f32;
            for &v in xb {
                let ax = v.abs();
                if ax > amax {
                    amax = ax;
                    max = v;
                }
            }
            if amax == 0.0 {
                yb.d = 0.0;
                yb.qs = [0; QK_K];
                yb.bsums = [0; 16];
                continue;
            }
            let iscale = -127.0f32 / max;
            for (q, &v) in yb.qs.iter_mut().zip(xb) {
                *q = nearest_int(iscale * v).min(127) as i8;
            }
            for (s, g) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
                *s = g.iter().map(|&q| q as i32).sum::<i32>() as i16;
            }
            yb.d = 1.0 / iscale;
        }
    }

    /// ggml `dequantize_row_q8_K`: `y = d · qs`.
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
            for (v, &q) in yb.iter_mut().zip(&xb.qs) {
                *v = xb.d * q as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::k_common::golden;
    use bytemuck::Zeroable;

    /// Quantization is bit-exact with ggml, except `bsums` of all-zero
    /// blocks, which ggml leaves unwritten (stale bytes in the reference).
    #[test]
    fn golden_q8_k() {
        for c in golden::cases("q8_K") {
            let nb = c.cols / QK_K;
            for r in 0..c.rows {
                let x = &c.input[r * c.cols..(r + 1) * c.cols];
                let mut q = vec![BlockQ8K::zeroed(); nb];
                BlockQ8K::quantize_row_ref(x, &mut q);
                let want: Vec<BlockQ8K> = bytemuck::pod_collect_to_vec(&c.quant[r * nb * 292..(r + 1) * nb * 292]);
                for (b, (g, w)) in q.iter().zip(&want).enumerate() {
                    assert_eq!(g.d.to_bits(), w.d.to_bits(), "{} row {r} block {b}: d", c.name);
                    assert_eq!(g.qs, w.qs, "{} row {r} block {b}: qs", c.name);
                    if w.d != 0.0 {
                        assert_eq!(g.bsums, w.bsums, "{} row {r} block {b}: bsums", c.name);
                    } else {
                        assert_eq!(g.bsums, [0; 16]);
                    }
                }
                // Round trip: every value within half a step of the input.
                let mut y = vec![0f32; c.cols];
                BlockQ8K::dequantize_row(&q, &mut y);
                for (b, (xb, yb)) in x.chunks_exact(QK_K).zip(y.chunks_exact(QK_K)).enumerate() {
                    let step = q[b].d.abs();
                    for (&a, &v) in xb.iter().zip(yb) {
                        assert!((a - v).abs() <= 0.5001 * step + f32::MIN_POSITIVE, "{}: {a} vs {v}", c.name);
                    }
                }
            }
        }
    }

    #[test]
    fn stress_inputs_do_not_panic() {
        for x in golden::stress_rows() {
            let mut q = vec![BlockQ8K::zeroed(); x.len() / QK_K];
            BlockQ8K::quantize_row_ref(&x, &mut q);
            let mut y = vec![0f32; x.len()];
            BlockQ8K::dequantize_row(&q, &mut y);
        }
    }
}
