//! A weight matrix as the CPU pipeline holds it, and its products.
//!
//! Formats with a packed layout (`packed`) are repacked once when the model
//! is prepared, on processors with AVX-512 VNNI or AVX2; every other matrix keeps
//! its GGUF rows (borrowed from the memory map) and goes through the
//! row-dot kernels. Either way decode and prefill run the same kernel per
//! (row, token), so their results are bit-identical.

use super::kernels::{AlignedBytes, Kernels};
use super::matvec;
use super::packed::{self, PackedActs, PackedWeight};
use super::team::Par;
use crate::error::{shape_err, Error, Result};
use crate::weight::QuantWeight;
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

    /// Bytes a product reads from the weights.
    pub fn bytes(&self) -> usize {
        match self {
            CpuWeight::Rows(w) => w.data.as_bytes().len(),
            CpuWeight::Packed(w) => w.bytes(),
        }
    }

    /// The type and layout, as profiles print them (`Q4_K packed`).
    pub fn label(&self) -> String {
        match self {
            CpuWeight::Rows(w) => w.ty.name().to_string(),
            CpuWeight::Packed(w) => format!("{} packed", w.ty().name()),
        }
    }
}

/// Matrices that read the same input (q/k/v; gate/up), prepared as one
/// product: the rows of `parts` stacked into one packed matrix when they
/// all have one type and width and the kernels pack that type, otherwise
/// each prepared on its own. One product instead of several saves the
/// fork/join of each. Per (row, token) the arithmetic is that of the parts,
/// so the results are bit-identical either way.
pub struct Stacked {
    /// One stacked matrix, or the parts.
    mats: Vec<CpuWeight>,
    /// Rows of each part.
    rows: Vec<usize>,
}

impl Stacked {
    /// Prepares `parts` (at least one).
    ///
    /// # Errors
    /// Inconsistent weight bytes; [`Error::OutOfMemory`] for the stacked copy.
    pub fn prepare(k: &Kernels, parts: Vec<QuantWeight>) -> Result<Self> {
        let rows: Vec<usize> = parts.iter().map(|w| w.rows).collect();
        let first = parts.first().ok_or_else(|| shape_err("stacked weights", "no parts"))?;
        let (ty, cols) = (first.ty, first.cols);
        let stack = parts.len() > 1 && packed::supported(k, ty) && parts.iter().all(|w| w.ty == ty && w.cols == cols);
        if !stack {
            let mats = parts.into_iter().map(|w| CpuWeight::prepare(k, w)).collect::<Result<_>>()?;
            return Ok(Stacked { mats, rows });
        }
        let mut bytes = Vec::new();
        for w in &parts {
            w.check()?;
            let b = w.data.as_bytes();
            bytes
                .try_reserve(b.len())
                .map_err(|_| Error::OutOfMemory { what: format!("stacked {ty} weights"), bytes: b.len() as u64 })?;
            bytes.extend_from_slice(b);
        }
        let all = QuantWeight::new(ty, rows.iter().sum(), cols, bytes.into())?;
        Ok(Stacked { mats: vec![CpuWeight::prepare(k, all)?], rows })
    }

    /// The prepared matrices (one when stacked).
    pub fn mats(&self) -> &[CpuWeight] {
        &self.mats
    }

    /// Rows of part `i`.
    pub fn rows(&self, i: usize) -> usize {
        self.rows[i]
    }

    /// The number of parts.
    pub fn parts(&self) -> usize {
        self.rows.len()
    }

    /// `Y_i = X·W_iᵀ` for every part: `x` is `n_tokens × cols`, `outs[i]`
    /// is `n_tokens × rows(i)`. A stacked product goes through `tmp` and is
    /// split per token.
    ///
    /// # Errors
    /// As [`products`]; `outs` not one per part.
    #[allow(clippy::too_many_arguments)]
    pub fn products(
        &self,
        k: &Kernels,
        par: Par<'_>,
        outs: &mut [&mut [f32]],
        x: &[f32],
        n_tokens: usize,
        s: &mut ProductScratch,
        tmp: &mut Vec<f32>,
    ) -> Result<()> {
        if outs.len() != self.rows.len() {
            return Err(shape_err("stacked product", format!("{} outputs for {} parts", outs.len(), self.rows.len())));
        }
        if self.mats.len() == outs.len() {
            let mut pairs: Vec<(&CpuWeight, &mut [f32])> =
                self.mats.iter().zip(outs.iter_mut()).map(|(w, y)| (w, &mut **y)).collect();
            return products(k, par, &mut pairs, x, n_tokens, s);
        }
        let total: usize = self.rows.iter().sum();
        for (y, &r) in outs.iter().zip(&self.rows) {
            if n_tokens.checked_mul(r) != Some(y.len()) {
                return Err(shape_err("stacked product", format!("an output of {} for {n_tokens}x{r}", y.len())));
            }
        }
        let len = n_tokens.checked_mul(total).ok_or(Error::Overflow("stacked product size"))?;
        crate::memory::resize(tmp, len, 0.0, "a stacked product")?;
        products(k, par, &mut [(&self.mats[0], &mut tmp[..len])], x, n_tokens, s)?;
        for (t, row) in tmp[..len].chunks_exact(total.max(1)).enumerate() {
            let mut at = 0;
            for (y, &r) in outs.iter_mut().zip(&self.rows) {
                y[t * r..(t + 1) * r].copy_from_slice(&row[at..at + r]);
                at += r;
            }
        }
        Ok(())
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
/// Shape mismatches (checked for every weight before any output is
/// written); types without a product; inconsistent row weights.
pub fn products(
    k: &Kernels,
    par: Par<'_>,
    outs: &mut [(&CpuWeight, &mut [f32])],
    x: &[f32],
    n_tokens: usize,
    s: &mut ProductScratch,
) -> Result<()> {
    // Everything is checked before any output is written.
    for (w, y) in outs.iter() {
        if n_tokens.checked_mul(w.cols()) != Some(x.len()) || n_tokens.checked_mul(w.rows()) != Some(y.len()) {
            return Err(shape_err(
                "product",
                format!(
                    "W is {}x{}, x has {} values, y has {}, n_tokens {n_tokens}",
                    w.rows(),
                    w.cols(),
                    x.len(),
                    y.len()
                ),
            ));
        }
        if w.ty().vec_dot_type().is_none() {
            return Err(Error::Unsupported { op: "product", ty: w.ty() });
        }
        if let CpuWeight::Rows(q) = w {
            q.check()?;
        }
    }
    if n_tokens == 0 {
        return Ok(());
    }
    let mut rows_for: Option<GgmlType> = None;
    let mut packed_for: Option<(GgmlType, usize)> = None;
    for (w, y) in outs.iter_mut() {
        let act = w.ty().vec_dot_type();
        match w {
            CpuWeight::Packed(p) => {
                if packed_for != act.map(|a| (a, p.cols())) {
                    s.packed.quantize(k, p.ty(), x, n_tokens, p.cols(), &mut s.tmp)?;
                    packed_for = act.map(|a| (a, p.cols()));
                }
                packed::matmul_on(k, par, p, &s.packed, y)?;
            }
            CpuWeight::Rows(q) if n_tokens == 1 => {
                if rows_for != act {
                    k.quantize_activation(q.ty, x, &mut s.rows)?;
                    rows_for = act;
                }
                matvec::matvec_checked(k, par, q, x, &s.rows, y)?;
            }
            CpuWeight::Rows(q) => matvec::matmul_quant_on(k, par, q, x, n_tokens, y, &mut s.rows)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q8_0(rows: usize, cols: usize) -> QuantWeight {
        let x: Vec<f32> = (0..rows * cols).map(|i| (i % 7) as f32 - 3.0).collect();
        let rb = GgmlType::Q8_0.row_bytes(cols).unwrap();
        let mut bytes = vec![0u8; rows * rb];
        for r in 0..rows {
            crate::quant::quantize_row(GgmlType::Q8_0, &x[r * cols..(r + 1) * cols], &mut bytes[r * rb..(r + 1) * rb])
                .unwrap();
        }
        QuantWeight::new(GgmlType::Q8_0, rows, cols, bytes.into()).unwrap()
    }

    #[test]
    fn bad_products_are_errors_and_write_nothing() {
        let k = Kernels::detect();
        let mut s = ProductScratch::default();
        let w = CpuWeight::prepare(&k, q8_0(5, 64)).unwrap();
        // Sizes whose products wrap around usize.
        assert!(products(&k, Par::Rayon, &mut [(&w, &mut [][..])], &[], 1 << 59, &mut s).is_err());
        let mut a = PackedActs::default();
        assert!(a.quantize(&k, GgmlType::Q8_0, &[], 1 << 59, 32, &mut s.tmp).is_err());
        // A type without a product, one token or two.
        let q8k =
            QuantWeight::new(GgmlType::Q8_K, 2, 256, vec![0u8; 2 * GgmlType::Q8_K.row_bytes(256).unwrap()].into())
                .unwrap();
        let c = CpuWeight::Rows(q8k);
        for n in [1, 2] {
            let mut y = vec![0f32; 2 * n];
            assert!(matches!(
                products(&k, Par::Rayon, &mut [(&c, &mut y[..])], &vec![0.5; 256 * n], n, &mut s),
                Err(Error::Unsupported { .. })
            ));
        }
        // Inconsistent row weights (public fields edited) are errors, not panics.
        let mut bad = q8_0(5, 64);
        bad.rows = 6;
        let bad = CpuWeight::Rows(bad);
        assert!(products(&k, Par::Rayon, &mut [(&bad, &mut [0.0; 6][..])], &[0.5; 64], 1, &mut s).is_err());
        // A bad second output leaves the first untouched.
        let mut y1 = [7.0f32; 5];
        assert!(
            products(&k, Par::Rayon, &mut [(&w, &mut y1[..]), (&w, &mut [0.0; 4][..])], &[0.5; 64], 1, &mut s).is_err()
        );
        assert_eq!(y1, [7.0; 5]);
    }

    #[test]
    fn stacked_products_equal_the_parts_bit_for_bit() {
        let k = Kernels::detect();
        let x: Vec<f32> = (0..3 * 64).map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0).collect();
        let weight = |rows: usize, seed: usize| {
            let w = q8_0(rows, 64);
            let mut b = w.data.as_bytes().to_vec();
            // Different rows per part (scales stay finite: only codes change).
            for (i, v) in b.iter_mut().enumerate().filter(|(i, _)| i % 34 >= 2) {
                *v = v.wrapping_add((i * seed) as u8 % 7);
            }
            QuantWeight::new(GgmlType::Q8_0, rows, 64, b.into()).unwrap()
        };
        // Stacked (when Q8_0 is packed here), split by type, and f32 (never stacked).
        let f32w = |rows: usize| to_f32(&weight(rows, 5));
        for (parts, n_mats) in [
            (
                vec![weight(20, 1), weight(5, 2), weight(7, 3)],
                if packed::supported(&k, GgmlType::Q8_0) { 1 } else { 3 },
            ),
            (vec![weight(20, 1), f32w(5)], 2),
            (vec![f32w(3), f32w(4)], 2),
        ] {
            let st = Stacked::prepare(&k, parts.clone()).unwrap();
            assert_eq!(st.mats().len(), n_mats);
            for n in [1, 3] {
                let mut s = ProductScratch::default();
                let mut tmp = Vec::new();
                let mut ys: Vec<Vec<f32>> = parts.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
                let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[..]).collect();
                st.products(&k, Par::Rayon, &mut outs, &x[..n * 64], n, &mut s, &mut tmp).unwrap();
                for (w, y) in parts.iter().zip(&ys) {
                    let one = CpuWeight::prepare(&k, w.clone()).unwrap();
                    let mut want = vec![0f32; n * w.rows];
                    products(&k, Par::Rayon, &mut [(&one, &mut want[..])], &x[..n * 64], n, &mut s).unwrap();
                    assert_eq!(
                        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                    );
                }
            }
            let mut short = [0f32; 1];
            assert!(st
                .products(&k, Par::Rayon, &mut [&mut short[..]], &x[..64], 1, &mut Default::default(), &mut Vec::new())
                .is_err());
        }
    }

    fn to_f32(w: &QuantWeight) -> QuantWeight {
        let v = w.to_f32().unwrap();
        QuantWeight::new(GgmlType::F32, w.rows, w.cols, bytemuck::cast_slice::<f32, u8>(&v).to_vec().into()).unwrap()
    }

    #[test]
    fn shared_activations_follow_the_input_width() {
        // Two packed weights of different widths in one call (n_tokens = 0
        // and 1): each gets activations of its own width.
        let k = Kernels::detect();
        let mut s = ProductScratch::default();
        let (a, b) = (CpuWeight::prepare(&k, q8_0(3, 64)).unwrap(), CpuWeight::prepare(&k, q8_0(3, 32)).unwrap());
        assert!(products(&k, Par::Rayon, &mut [(&a, &mut [][..]), (&b, &mut [][..])], &[], 0, &mut s).is_ok());
        assert!(
            products(&k, Par::Rayon, &mut [(&a, &mut [0.0; 3][..]), (&b, &mut [0.0; 3][..])], &[0.5; 64], 1, &mut s)
                .is_err(),
            "x fits only one"
        );
    }
}
