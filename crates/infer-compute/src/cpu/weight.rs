//! A weight matrix as the CPU pipeline holds it, and its products.
//!
//! Formats with a packed layout (`packed`) are repacked once when the model
//! is prepared, on processors with AVX-512 VNNI; every other matrix keeps
//! its GGUF rows (borrowed from the memory map) and goes through the
//! row-dot kernels. Either way decode and prefill run the same kernel per
//! (row, token), so their results are bit-identical.

use super::kernels::{AlignedBytes, Kernels};
use super::matvec;
use super::packed::{self, PackedActs, PackedWeight};
use crate::backend::QuantWeight;
use crate::error::{shape_err, Result};
use crate::GgmlType;

/// A prepared weight matrix: `rows × cols`, `y = W·x`.
pub enum CpuWeight {
    /// GGUF row layout, row-dot kernels.
    Rows(QuantWeight),
    /// Interleaved layout of `packed`.
    Packed(PackedWeight),
}

impl CpuWeight {
    /// Packs `w` when the kernels `k` have a packed product for its type;
    /// otherwise keeps the rows.
    ///
    /// # Errors
    /// Inconsistent weight bytes.
    pub fn prepare(k: &Kernels, w: QuantWeight) -> Result<Self> {
        if packed::supported(k, w.ty) {
            Ok(CpuWeight::Packed(PackedWeight::new(&w)?))
        } else {
            w.check()?;
            Ok(CpuWeight::Rows(w))
        }
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        match self {
            CpuWeight::Rows(w) => w.rows,
            CpuWeight::Packed(w) => w.rows(),
        }
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        match self {
            CpuWeight::Rows(w) => w.cols,
            CpuWeight::Packed(w) => w.cols(),
        }
    }

    /// The GGUF type of the weights.
    pub fn ty(&self) -> GgmlType {
        match self {
            CpuWeight::Rows(w) => w.ty,
            CpuWeight::Packed(w) => w.ty(),
        }
    }
}

/// Scratch for [`products`]: quantized activations, kept between calls.
#[derive(Default)]
pub struct ProductScratch {
    rows: AlignedBytes,
    packed: PackedActs,
    tmp: AlignedBytes,
}

/// `Y_i = X·W_iᵀ` for several weights reading the same input `x`
/// (`n_tokens × cols`); each `Y_i` is `n_tokens × W_i.rows`. The input is
/// quantized once per activation type and shared (q/k/v, gate/up).
///
/// # Errors
/// Shape mismatches; types without a product.
pub fn products(k: &Kernels, outs: &mut [(&CpuWeight, &mut [f32])], x: &[f32], n_tokens: usize, s: &mut ProductScratch) -> Result<()> {
    let mut rows_for: Option<GgmlType> = None;
    let mut packed_for: Option<GgmlType> = None;
    for (w, y) in outs.iter_mut() {
        if x.len() != n_tokens * w.cols() || y.len() != n_tokens * w.rows() {
            return Err(shape_err(
                "product",
                format!("W is {}x{}, x has {} values, y has {}, n_tokens {n_tokens}", w.rows(), w.cols(), x.len(), y.len()),
            ));
        }
        let act = w.ty().vec_dot_type();
        match w {
            CpuWeight::Packed(p) => {
                if packed_for != act {
                    s.packed.quantize(k, p.ty(), x, n_tokens, p.cols(), &mut s.tmp)?;
                    packed_for = act;
                }
                packed::matmul(k, p, &s.packed, y)?;
            }
            CpuWeight::Rows(q) if n_tokens == 1 => {
                if rows_for != act {
                    k.quantize_activation(q.ty, x, &mut s.rows)?;
                    rows_for = act;
                }
                matvec::matvec_quantized(k, q, s.rows.as_bytes(), y);
            }
            CpuWeight::Rows(q) => matvec::matmul_quant(k, q, x, n_tokens, y, &mut s.rows)?,
        }
    }
    Ok(())
}
