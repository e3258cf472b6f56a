//! f16 overflow of activation block scales, and the exact fallback.
//!
//! ggml quantizes an activation block of 32 values to Q8_0 with the scale
//! `d = amax / 127` stored as f16, and to Q8_1 with `d` and `s = d · Σq`
//! both as f16 (`quantize_row_q8_0_ref`, `quantize_row_q8_1_ref`). An f16
//! holds at most 65504, so a block with `amax` above about 8.3 · 10⁶ has an
//! infinite `d`, and a Q8_1 block whose `d · Σq` passes 65504 (32 values of
//! 3000.0 give 96 000) an infinite `s`. ggml's dot products then return
//! infinities or NaN (`0 · ∞`), even for a row of zero weights; its fix is
//! still open.
//!
//! We detect such a block after quantizing (its stored scale is infinite
//! while its 32 inputs are finite), zero it in the quantized activation so
//! that the integer kernels add nothing for it, and add the block's exact
//! product `Σ w[i] · x[i]` in f32 (the weight block dequantized) to every
//! output ([`add_block_products`]). Rows without an overflowing block are
//! untouched, so they stay bit-exact with ggml. The CPU's repacked weights
//! (`cpu::packed`) hold activation scales in f32 already; there an
//! overflowing Q8_0 block keeps its unrounded scale `amax / 127`, with
//! which its codes were made. Q8_K keeps its scale in f32
//! and its block sums in i16 (at most 16 · 127), so it cannot overflow for
//! finite inputs.
//!
//! F16 weights take their activation as F16 (ggml's `vec_dot_type`), so a
//! value past 65504 becomes infinite there. The same fallback applies with
//! "block" meaning 32 consecutive values (the last one shorter when the row
//! is not a multiple of 32): a block holding such a value is zeroed and its
//! product added exactly in f32.

use half::f16;

use super::{blocks, blocks_mut, BlockQ8_0, BlockQ8_1, QK};
use crate::error::{Error, Result};
use crate::GgmlType;

/// Values `b·32 ..` of the block `b` of a row of `n` values (32 per block,
/// the last block shorter when 32 does not divide `n`).
fn block_range(b: usize, n: usize) -> std::ops::Range<usize> {
    (b * QK).min(n)..((b + 1) * QK).min(n)
}

/// Indices of the blocks of the activation `act` (of type `act_ty`,
/// quantized from `x`) whose f16 scale (for F16: one of whose values)
/// overflowed although their inputs are finite. Empty (no allocation) in
/// the common case; always empty for types other than Q8_0, Q8_1 and F16.
///
/// # Errors
/// `act` not a whole number of blocks, or not as many blocks as `x` has.
pub fn overflowed_blocks(act_ty: GgmlType, act: &[u8], x: &[f32]) -> Result<Vec<usize>> {
    let over = |s: f16| s.is_infinite();
    let finite = |b: usize| x[block_range(b, x.len())].iter().all(|v| v.is_finite());
    let flags: Vec<bool> = match act_ty {
        GgmlType::F16 => {
            let a = blocks::<f16>(act)?;
            if a.len() != x.len() {
                return Err(crate::error::shape_err(
                    "activation overflow check",
                    format!("{} values for {}", a.len(), x.len()),
                ));
            }
            if !a.iter().any(|&v| over(v)) {
                return Ok(Vec::new());
            }
            a.chunks(QK).map(|c| c.iter().any(|&v| over(v))).collect()
        }
        GgmlType::Q8_0 => {
            let bl = blocks::<BlockQ8_0>(act)?;
            check_len(bl.len(), x)?;
            if !bl.iter().any(|b| over(b.d)) {
                return Ok(Vec::new());
            }
            bl.iter().map(|b| over(b.d)).collect()
        }
        GgmlType::Q8_1 => {
            let bl = blocks::<BlockQ8_1>(act)?;
            check_len(bl.len(), x)?;
            if !bl.iter().any(|b| over(b.d) || over(b.s)) {
                return Ok(Vec::new());
            }
            bl.iter().map(|b| over(b.d) || over(b.s)).collect()
        }
        _ => return Ok(Vec::new()),
    };
    Ok(flags.iter().enumerate().filter(|&(b, &f)| f && finite(b)).map(|(b, _)| b).collect())
}

fn check_len(n_blocks: usize, x: &[f32]) -> Result<()> {
    if n_blocks * QK != x.len() {
        return Err(crate::error::shape_err(
            "activation overflow check",
            format!("{n_blocks} blocks for {} values", x.len()),
        ));
    }
    Ok(())
}

/// Zeroes the listed blocks of the activation `act` (scale, sum and codes),
/// so that an integer dot product adds exactly zero for them.
///
/// # Errors
/// `act` not a whole number of blocks of `act_ty`; a block index past the
/// end.
pub fn zero_blocks(act_ty: GgmlType, act: &mut [u8], which: &[usize]) -> Result<()> {
    let bad = |b: usize| crate::error::shape_err("zero_blocks", format!("block {b} past the end"));
    match act_ty {
        GgmlType::Q8_0 => {
            let bl = blocks_mut::<BlockQ8_0>(act)?;
            for &b in which {
                *bl.get_mut(b).ok_or_else(|| bad(b))? = bytemuck::Zeroable::zeroed();
            }
        }
        GgmlType::Q8_1 => {
            let bl = blocks_mut::<BlockQ8_1>(act)?;
            for &b in which {
                *bl.get_mut(b).ok_or_else(|| bad(b))? = bytemuck::Zeroable::zeroed();
            }
        }
        GgmlType::F16 => {
            let a = blocks_mut::<f16>(act)?;
            for &b in which {
                let r = block_range(b, a.len());
                if r.is_empty() {
                    return Err(bad(b));
                }
                a[r].fill(f16::ZERO);
            }
        }
        _ if which.is_empty() => {}
        ty => return Err(Error::Unsupported { op: "activation overflow fallback", ty }),
    }
    Ok(())
}

/// The exact product of block `b` of a weight row of type `w_ty` with the
/// same values of `x`: the weight block dequantized to f32, multiplied and
/// summed in f32, in order. A block is one ggml block of 32 values, or for
/// F16 weights (one value per ggml block) the values `32·b ..` up to 32 of
/// them (the last block shorter when 32 does not divide the row).
///
/// # Errors
/// A weight type whose block is neither 32 values nor F16; bytes too short.
pub fn block_product(w_ty: GgmlType, w_row: &[u8], b: usize, x: &[f32]) -> Result<f32> {
    let past_end = || crate::error::shape_err("block_product", format!("block {b} past the end of the row"));
    let (wb, xb) = match w_ty.block_size() {
        QK => {
            let tb = w_ty.type_size();
            (w_row.get(b * tb..(b + 1) * tb), x.get(b * QK..(b + 1) * QK))
        }
        1 if w_ty == GgmlType::F16 => {
            let r = block_range(b, x.len());
            (w_row.get(2 * r.start..2 * r.end), x.get(r))
        }
        _ => return Err(Error::Unsupported { op: "activation overflow fallback", ty: w_ty }),
    };
    let (Some(wb), Some(xb)) = (wb, xb) else { return Err(past_end()) };
    if xb.is_empty() {
        return Err(past_end());
    }
    let mut w = [0f32; QK];
    super::dequantize_row(w_ty, wb, &mut w[..xb.len()])?;
    Ok(w.iter().zip(xb).fold(0f32, |acc, (&w, &x)| acc + w * x))
}

/// Adds the exact products of the listed activation blocks to `y`: for
/// every row `r` of `w_rows` (each `row_bytes` long, of type `w_ty`),
/// `y[r] += Σ_b block_product(row r, b, x)`.
///
/// # Errors
/// As [`block_product`]; `y` shorter than the rows.
pub fn add_block_products(
    w_ty: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    which: &[usize],
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    if which.is_empty() {
        return Ok(());
    }
    for (row, yr) in w_rows.chunks_exact(row_bytes.max(1)).zip(y.iter_mut()) {
        let mut extra = 0f32;
        for &b in which {
            extra += block_product(w_ty, row, b, x)?;
        }
        *yr += extra;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::cpu::kernels::{Kernels, SimdLevel};
    use crate::cpu::weight::{products, CpuWeight, ProductScratch};
    use crate::{quant, GgmlType, QuantWeight};

    fn weight(ty: GgmlType, rows: usize, cols: usize) -> QuantWeight {
        let rb = ty.row_bytes(cols).unwrap();
        let mut bytes = vec![0u8; rows * rb];
        for r in 0..rows {
            let x: Vec<f32> = (0..cols).map(|c| ((r * 5 + c) % 13) as f32 * 0.05 - 0.3).collect();
            quant::quantize_row(ty, &x, &mut bytes[r * rb..(r + 1) * rb]).unwrap();
        }
        QuantWeight::new(ty, rows, cols, bytes.into()).unwrap()
    }

    /// The prepared products the CPU model runs (repacked weights on
    /// AVX2/AVX-512, row kernels elsewhere), one and two tokens, with an
    /// overflowing block in each token: finite and close to the exact
    /// product (repacked: the 8-bit codes' error; rows: f32 rounding).
    #[test]
    fn prepared_products_of_overflowing_blocks_are_finite_on_every_level() {
        let cols = 96;
        let x: Vec<f32> = (0..2 * cols)
            .map(|i| if (32..64).contains(&(i % cols)) { 1e7 * ((i % 7) as f32 - 3.0) / 3.0 } else { 0.5 })
            .collect();
        let x3000: Vec<f32> =
            (0..2 * cols).map(|i| if (32..64).contains(&(i % cols)) { 3000.0 } else { 0.25 }).collect();
        let mut n_packed = 0;
        for level in SimdLevel::all_available() {
            let k = Kernels::for_level(level);
            for (ty, x) in [
                (GgmlType::Q4_0, &x),
                (GgmlType::Q8_0, &x),
                (GgmlType::Q5_0, &x),
                (GgmlType::IQ4_NL, &x),
                (GgmlType::Q4_1, &x3000),
                (GgmlType::Q5_1, &x3000),
                (GgmlType::F16, &x),
            ] {
                let w = weight(ty, 20, cols);
                let wf = w.to_f32().unwrap();
                let pw = CpuWeight::prepare(&k, w).unwrap();
                let packed = matches!(pw, CpuWeight::Packed(_));
                n_packed += usize::from(packed);
                let tol = if packed { 2e-2 } else { 1e-5 };
                let mut s = ProductScratch::default();
                for n in [1, 2] {
                    let mut y = vec![f32::NAN; n * 20];
                    products(&k, crate::cpu::team::Par::Rayon, &mut [(&pw, &mut y[..])], &x[..n * cols], n, &mut s)
                        .unwrap();
                    for t in 0..n {
                        for (r, row) in wf.chunks_exact(cols).enumerate() {
                            let p = row.iter().zip(&x[t * cols..(t + 1) * cols]).map(|(&a, &b)| a as f64 * b as f64);
                            let (e, scale) = (p.clone().sum::<f64>(), p.map(f64::abs).sum::<f64>());
                            let got = y[t * 20 + r];
                            assert!(
                                got.is_finite() && (got as f64 - e).abs() <= tol * scale,
                                "{ty} on {level:?}, {n} token(s), token {t} row {r}: {got} vs {e}"
                            );
                        }
                    }
                }
            }
        }
        println!("{n_packed} repacked case(s)");
    }
}
