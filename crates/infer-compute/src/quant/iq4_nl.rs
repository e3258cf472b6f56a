//! IQ4_NL: 4.5 bits per weight: f16 scale and 32 4-bit indices into a fixed non-linear table.
//!
//! Block of 32 values: `qs[j]` holds the index of `x[j]` in its low nibble
//! and of `x[j + 16]` in its high nibble; `x ≈ d · KVALUES_IQ4NL[index]`.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block, `kvalues_iq4nl`),
//! `ggml-quants.c` (`quantize_row_iq4_nl_ref`, which runs
//! `quantize_row_iq4_nl_impl` on one 32-value block with no importance
//! weights and no scale search; `dequantize_row_iq4_nl`), `ggml-cpu/quants.c`
//! (`ggml_vec_dot_iq4_nl_q8_0_generic`).

use half::f16;

use super::float::{f16_to_f32, f32_to_f16};
use super::BlockFormat;
use super::{BlockQ8_0, VecDot, QK};
use crate::GgmlType;

/// One IQ4_NL block (18 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockIQ4NL>() == GgmlType::IQ4_NL.type_size());

/// The 16 reconstruction levels of IQ4_NL (and IQ4_XS), ascending
/// (ggml `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// Blocks whose largest magnitude is below this are stored with `d = 0`
/// (ggml `GROUP_MAX_EPS`).
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// Index of the level of the ascending table `values` nearest to `x`
/// (ggml `best_index_int8`): clamps to the ends, binary search for the
/// bracketing pair, then the lower level only when strictly nearer, so a
/// tie goes to the upper level. Distances are computed in f32.
#[inline]
pub fn best_index_int8(values: &[i8; 16], x: f32) -> usize {
    let n = values.len();
    if x <= values[0] as f32 {
        return 0;
    }
    if x >= values[n - 1] as f32 {
        return n - 1;
    }
    let (mut lo, mut hi) = (0usize, n - 1);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < values[mid] as f32 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - (values[hi - 1] as f32) < (values[hi] as f32) - x {
        hi - 1
    } else {
        hi
    }
}

impl BlockFormat for BlockIQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;

    /// ggml `quantize_row_iq4_nl_ref`. Per block, with weights `w = x²`:
    /// `max` is the value of largest magnitude (sign kept, first on ties);
    /// indices are the nearest levels to `x · (1/d₀)`, `d₀ = max / -127`;
    /// then `d = Σ w·q·x / Σ w·q²` (f32 sums in index order, `w·q` formed
    /// first), stored rounded to f16. The indices are not recomputed for
    /// the final `d`.
    ///
    /// A block whose largest magnitude is below [`GROUP_MAX_EPS`] stores
    /// `d = 0` and all-zero indices. (ggml leaves those indices to whatever
    /// its scratch buffer held; with `d = 0` they dequantize to ±0 either
    /// way.)
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        let values = &KVALUES_IQ4NL;
        for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
            let mut amax = 0.0f32;
            let mut max = 0.0f32;
            for &v in xb {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            yb.qs = [0; 16];
            if amax < GROUP_MAX_EPS {
                yb.d = f32_to_f16(0.0);
                continue;
            }
            let d0 = max / values[0] as f32;
            let id = 1.0 / d0;
            let mut idx = [0u8; QK];
            let mut sumqx = 0.0f32;
            let mut sumq2 = 0.0f32;
            for (l, &v) in idx.iter_mut().zip(xb) {
                let i = best_index_int8(values, id * v);
                *l = i as u8;
                let q = values[i] as f32;
                let w = v * v;
                sumqx += w * q * v;
                sumq2 += w * q * q;
            }
            let d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
            yb.d = f32_to_f16(d);
            for j in 0..QK / 2 {
                yb.qs[j] = idx[j] | (idx[j + QK / 2] << 4);
            }
        }
    }

    /// ggml `dequantize_row_iq4_nl`: `d · KVALUES_IQ4NL[index]` in f32.
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
            let d = f16_to_f32(xb.d);
            for (j, &q) in xb.qs.iter().enumerate() {
                yb[j] = d * KVALUES_IQ4NL[(q & 0x0f) as usize] as f32;
                yb[j + QK / 2] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
            }
        }
    }
}

/// ggml `ggml_vec_dot_iq4_nl_q8_0_generic`: exact integer dot of the levels
/// with the activation codes per block, then `sum += (d_a · d_w) · sumi` in
/// f32.
impl VecDot for BlockIQ4NL {
    type Act = BlockQ8_0;
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (wb, ab) in w.iter().zip(a) {
            let d = f16_to_f32(ab.d) * f16_to_f32(wb.d);
            let mut sumi = 0i32;
            for (j, &q) in wb.qs.iter().enumerate() {
                sumi += ab.qs[j] as i32 * KVALUES_IQ4NL[(q & 0x0f) as usize] as i32;
                sumi += ab.qs[j + QK / 2] as i32 * KVALUES_IQ4NL[(q >> 4) as usize] as i32;
            }
            sumf += d * sumi as f32;
        }
        sumf
    }
}
