//! Activations quantized and split for the packed products.

use super::format::layout;
use crate::cpu::kernels::{AlignedBytes, Kernels};
use crate::error::{shape_err, Error, Result};
use crate::quant::{self, BlockQ8K, BlockQ8_0, QK, QK_K};
use crate::GgmlType;

/// Activations quantized for the packed products: `n_tokens` rows of `cols`
/// values, quantized exactly as the row-dot path quantizes them (Q8_0 for
/// the 32-wide formats, Q8_1 for Q4_1 and Q5_1, Q8_K for the k-quants) and
/// split into the arrays the kernels read. Buffers are reused between calls.
#[derive(Default)]
pub struct PackedActs {
    /// `Q8_0`, `Q8_1` or `Q8_K`.
    pub(crate) kind: Option<GgmlType>,
    pub(crate) n_tokens: usize,
    pub(crate) cols: usize,
    /// `[n_tokens][cols]` codes.
    pub(crate) qs: Vec<i8>,
    /// `[n_tokens][blocks]` scales.
    pub(crate) d: Vec<f32>,
    /// Q8_0, Q8_1: `[n_tokens][blocks]` block sums `Σ a`; Q8_K:
    /// `[n_tokens][blocks][AUX_K]` (see [`AUX_K`](super::format::AUX_K)).
    pub(crate) aux: Vec<i32>,
}

impl PackedActs {
    /// Quantizes `x` (`n_tokens × cols`, row-major) for products with
    /// weights of type `ty`.
    ///
    /// # Errors
    /// `x.len()` not `n_tokens · cols`; `cols` not a multiple of the block;
    /// a type without a packed layout.
    pub fn quantize(
        &mut self,
        k: &Kernels,
        ty: GgmlType,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
        scratch: &mut AlignedBytes,
    ) -> Result<()> {
        let kind = ty
            .vec_dot_type()
            .filter(|_| layout(ty).is_some())
            .ok_or(Error::Unsupported { op: "packed product", ty })?;
        self.kind = None;
        self.n_tokens = 0;
        self.qs.clear();
        self.d.clear();
        self.aux.clear();
        if n_tokens.checked_mul(cols) != Some(x.len()) {
            return Err(shape_err("packed activations", format!("{} values for {n_tokens} x {cols}", x.len())));
        }
        // A block with a NaN input gets a NaN scale, so that its products are
        // NaN on every level (the quantizers turn NaN into arbitrary codes,
        // such as -128, on which the kernels need not agree).
        // A Q8_0 block whose scale overflowed f16 (finite inputs above
        // about 8.3e6, `crate::quant::overflow`) keeps its scale in f32,
        // `amax / 127` as the quantizer computed it before rounding: the
        // codes were made with that scale, and this buffer holds f32 scales.
        let scale = |d: f32, xb: &[f32]| {
            if xb.iter().any(|v| v.is_nan()) {
                f32::NAN
            } else if d.is_infinite() && xb.iter().all(|v| v.is_finite()) {
                xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0
            } else {
                d
            }
        };
        // Q8_1's codes and scale are Q8_0's (ggml's `quantize_row_q8_1_ref`
        // quantizes each block as Q8_0 does, then adds `s`, unused here), so
        // Q8_1 activations come from the Q8_0 quantizer, which has SIMD.
        let quantize_as = if kind == GgmlType::Q8_1 { GgmlType::Q8_0 } else { ty };
        for row in x.chunks_exact(cols.max(1)).take(n_tokens) {
            k.quantize_activation(quantize_as, row, scratch)?;
            if kind != GgmlType::Q8_K {
                for (b, xb) in quant::blocks::<BlockQ8_0>(scratch.as_bytes())?.iter().zip(row.chunks_exact(QK)) {
                    self.qs.extend_from_slice(&b.qs);
                    self.d.push(scale(b.d.to_f32(), xb));
                    self.aux.push(b.qs.iter().map(|&q| q as i32).sum());
                }
            } else {
                for (b, xb) in quant::blocks::<BlockQ8K>(scratch.as_bytes())?.iter().zip(row.chunks_exact(QK_K)) {
                    self.qs.extend_from_slice(&b.qs);
                    self.d.push(scale(b.d, xb));
                    self.aux.extend(b.bsums.iter().map(|&v| v as i32));
                    let s32: [i32; 8] = std::array::from_fn(|i| b.bsums[2 * i] as i32 + b.bsums[2 * i + 1] as i32);
                    self.aux
                        .extend(s32.chunks_exact(2).map(|p| (p[0] as u16 as u32 | (p[1] as u16 as u32) << 16) as i32));
                }
            }
        }
        (self.kind, self.n_tokens, self.cols) = (Some(kind), n_tokens, cols);
        Ok(())
    }

    /// The activation type these were quantized to, if any.
    pub fn kind(&self) -> Option<GgmlType> {
        self.kind
    }
}
