//! Quantized matrix-vector (GEMV) and matrix-matrix (prefill) products on
//! the CPU.
//!
//! As in ggml, the f32 activation is quantized once per call to the weight
//! type's `vec_dot_type`, and each output is an integer-domain dot product of
//! a weight row with it. Rows are split across the thread pool in chunks
//! large enough to amortize scheduling.

use super::kernels::{AlignedBytes, Kernels};
use super::team::Par;
use crate::error::{shape_err, Result};
use crate::quant::overflow;
use crate::weight::QuantWeight;

/// Rows per parallel task: big enough to keep a core busy for a few µs.
fn rows_per_task(rows: usize, row_bytes: usize) -> usize {
    let target_bytes = 64 * 1024;
    (target_bytes / row_bytes.max(1)).clamp(1, rows.max(1))
}

/// `y = W·act` for an activation already quantized into `act` (one row of
/// `w.cols` values in the pair type). `y.len() == w.rows`.
pub fn matvec_quantized(k: &Kernels, w: &QuantWeight, act: &[u8], y: &mut [f32]) {
    matvec_quantized_on(k, Par::Rayon, w, act, y)
}

/// [`matvec_quantized`] with its tasks run on `par`.
pub fn matvec_quantized_on(k: &Kernels, par: Par<'_>, w: &QuantWeight, act: &[u8], y: &mut [f32]) {
    let dot = k.dot(w.ty);
    let rb = w.row_bytes();
    let data = w.data.as_bytes();
    // Large matrices: a few big tasks per thread, each reading STREAMS
    // sub-ranges in turn, so that every core keeps several sequential
    // streams in flight (one stream per core does not saturate DRAM).
    let big = rows_per_task(w.rows, rb).max(w.rows / (par.threads() * 8).max(1));
    let chunk = big.max(1);
    par.for_each_chunk_mut(y, chunk, |c, ys| {
        let r0 = c * chunk;
        let n = ys.len();
        if n < 4 * STREAMS {
            for (i, yi) in ys.iter_mut().enumerate() {
                let r = r0 + i;
                *yi = dot(&data[r * rb..(r + 1) * rb], act);
            }
            return;
        }
        let part = n.div_ceil(STREAMS);
        for i in 0..part {
            for s in 0..STREAMS {
                let j = s * part + i;
                if j < n {
                    let r = r0 + j;
                    ys[j] = dot(&data[r * rb..(r + 1) * rb], act);
                }
            }
        }
    });
}

/// Sequential read streams per task in [`matvec_quantized`].
const STREAMS: usize = 4;

/// `y = W·x`: quantizes `x` into `scratch`, then [`matvec_quantized`].
///
/// # Errors
/// Length mismatches; types without a dot product.
pub fn matvec(k: &Kernels, w: &QuantWeight, x: &[f32], y: &mut [f32], scratch: &mut AlignedBytes) -> Result<()> {
    w.check()?;
    if x.len() != w.cols || y.len() != w.rows {
        return Err(shape_err("matvec", format!("W is {}x{}, x has {}, y has {}", w.rows, w.cols, x.len(), y.len())));
    }
    k.quantize_activation(w.ty, x, scratch)?;
    matvec_checked(k, Par::Rayon, w, x, scratch, y)
}

/// [`matvec_quantized`] of `act` (quantized from `x`) with the exact
/// fallback for activation blocks whose f16 scale overflowed
/// ([`crate::quant::overflow`]): the product runs on a copy of `act` with
/// those blocks zeroed, and their f32 products are added to every output.
/// `act` itself is left as it is, so it can serve further weights. Tasks
/// run on `par`.
///
/// # Errors
/// `act` not the quantized form of `x` for `w`.
pub fn matvec_checked(
    k: &Kernels,
    par: Par<'_>,
    w: &QuantWeight,
    x: &[f32],
    act: &AlignedBytes,
    y: &mut [f32],
) -> Result<()> {
    let act_ty = w.ty.vec_dot_type().ok_or(crate::Error::Unsupported { op: "matvec", ty: w.ty })?;
    let over = overflow::overflowed_blocks(act_ty, act.as_bytes(), x)?;
    if over.is_empty() {
        matvec_quantized_on(k, par, w, act.as_bytes(), y);
        return Ok(());
    }
    let mut fixed = AlignedBytes::default();
    fixed.try_resize(act.as_bytes().len())?;
    fixed.as_bytes_mut().copy_from_slice(act.as_bytes());
    overflow::zero_blocks(act_ty, fixed.as_bytes_mut(), &over)?;
    matvec_quantized_on(k, par, w, fixed.as_bytes(), y);
    overflow::add_block_products(w.ty, w.data.as_bytes(), w.row_bytes(), &over, x, y)
}

/// `Y = X·Wᵀ` for prefill: `x` is `n_tokens × w.cols` (row-major), `y` is
/// `n_tokens × w.rows`. Each weight row is loaded once and dotted with every
/// token's activation while it is in cache.
///
/// # Errors
/// Length mismatches; types without a dot product.
pub fn matmul_quant(
    k: &Kernels,
    w: &QuantWeight,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    scratch: &mut AlignedBytes,
) -> Result<()> {
    matmul_quant_on(k, Par::Rayon, w, x, n_tokens, y, scratch)
}

/// [`matmul_quant`] with its tasks run on `par`.
///
/// # Errors
/// As [`matmul_quant`].
pub fn matmul_quant_on(
    k: &Kernels,
    par: Par<'_>,
    w: &QuantWeight,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    scratch: &mut AlignedBytes,
) -> Result<()> {
    w.check()?;
    if n_tokens.checked_mul(w.cols) != Some(x.len()) || n_tokens.checked_mul(w.rows) != Some(y.len()) {
        return Err(shape_err(
            "matmul_quant",
            format!("W is {}x{}, x has {} values, y has {}, n_tokens {n_tokens}", w.rows, w.cols, x.len(), y.len()),
        ));
    }
    if n_tokens == 0 {
        return Ok(());
    }
    if n_tokens == 1 {
        k.quantize_activation(w.ty, x, scratch)?;
        return matvec_checked(k, par, w, x, scratch, y);
    }
    let act_ty = w.ty.vec_dot_type().ok_or(crate::Error::Unsupported { op: "matmul_quant", ty: w.ty })?;
    let arb = act_ty.row_bytes(w.cols)?;
    // Quantize every token's activation once, into one aligned buffer.
    scratch.try_resize(arb.checked_mul(n_tokens).ok_or(crate::Error::Overflow("activation size"))?)?;
    // Activation blocks whose f16 scale overflowed, per token: zeroed here,
    // their exact products added at the end (`crate::quant::overflow`).
    let mut over: Vec<(usize, Vec<usize>)> = Vec::new();
    {
        let mut one = AlignedBytes::default();
        for t in 0..n_tokens {
            let xt = &x[t * w.cols..(t + 1) * w.cols];
            k.quantize_activation(w.ty, xt, &mut one)?;
            let blocks = overflow::overflowed_blocks(act_ty, one.as_bytes(), xt)?;
            overflow::zero_blocks(act_ty, one.as_bytes_mut(), &blocks)?;
            if !blocks.is_empty() {
                over.push((t, blocks));
            }
            scratch.as_bytes_mut()[t * arb..(t + 1) * arb].copy_from_slice(one.as_bytes());
        }
    }
    let acts = scratch.as_bytes();
    let dot = k.dot(w.ty);
    let rb = w.row_bytes();
    let data = w.data.as_bytes();
    // Tiles of rows; outputs land transposed per tile, then are scattered.
    let tile = rows_per_task(w.rows, rb).min(64);
    let mut tiles = crate::memory::zeroed(w.rows * n_tokens, "the product tiles")?;
    par.for_each_chunk_mut(&mut tiles, tile * n_tokens, |c, out| {
        let r0 = c * tile;
        for (i, outr) in out.chunks_exact_mut(n_tokens).enumerate() {
            let wr = &data[(r0 + i) * rb..(r0 + i + 1) * rb];
            for (t, o) in outr.iter_mut().enumerate() {
                *o = dot(wr, &acts[t * arb..(t + 1) * arb]);
            }
        }
    });
    for (c, out) in tiles.chunks(tile * n_tokens).enumerate() {
        let r0 = c * tile;
        let nr = out.len() / n_tokens;
        for i in 0..nr {
            for t in 0..n_tokens {
                y[t * w.rows + r0 + i] = out[i * n_tokens + t];
            }
        }
    }
    for (t, blocks) in &over {
        let (xt, yt) = (&x[t * w.cols..(t + 1) * w.cols], &mut y[t * w.rows..(t + 1) * w.rows]);
        overflow::add_block_products(w.ty, data, rb, blocks, xt, yt)?;
    }
    Ok(())
}
