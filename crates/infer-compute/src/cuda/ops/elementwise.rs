//! Row gathers, the embedding lookup, GLU, activations, soft-capping
//! and dequantization: one thread per value.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{to_i32, to_u32};
use crate::cuda::device::Device;
use crate::cuda::kernels::{self, names, DevPtr};
use crate::cuda::options::GemmPrecision;
use crate::error::{Error, Result};
use crate::GgmlType;

/// Copies rows `idx[r]` of `src` (rows of `row_bytes` bytes, a multiple of
/// 4) to consecutive rows `r < n_rows` of `dst`; `idx` is `n_rows` device
/// `i32` row indices inside `src`.
pub(crate) fn gather_rows(
    dev: &Device,
    src: DevPtr,
    dst: DevPtr,
    idx: DevPtr,
    n_rows: usize,
    row_bytes: usize,
) -> Result<()> {
    if n_rows == 0 || row_bytes == 0 {
        return Ok(());
    }
    if !row_bytes.is_multiple_of(4) {
        return Err(Error::Device(format!("gather of rows of {row_bytes} bytes (not whole words)")));
    }
    let words = to_i32(row_bytes / 4, "row words")?;
    let cfg = LaunchConfig { grid_dim: (to_u32(n_rows, "rows")?, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: src holds every row `idx` names, dst holds n_rows rows (the
    // caller's buffers); rows are whole words.
    unsafe {
        dev.launch_with(names::GATHER_ROWS, cfg, |b| {
            b.arg(&src).arg(&dst).arg(&idx).arg(&words);
        })
    }
}

/// Dequantizes rows `tokens[t]` of `table` (`ty`, `n` values per row) into
/// `x[t]`, times `scale`.
#[allow(clippy::too_many_arguments)] // the kernel's parameters, one by one
pub(crate) fn embed_rows(
    dev: &Device,
    table: DevPtr,
    ty: GgmlType,
    n: usize,
    tokens: DevPtr,
    n_tok: usize,
    scale: f32,
    x: DevPtr,
) -> Result<()> {
    if kernels::matvec_kernels(ty).is_none() {
        return Err(Error::Unsupported { op: "cuda dequantize", ty });
    }
    let tyi = ty.id() as i32;
    let rb = to_i32(ty.row_bytes(n)?, "row bytes")?;
    let ni = to_i32(n, "row length")?;
    let cfg = LaunchConfig { grid_dim: (to_u32(n_tok, "tokens")?, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: table holds rows of `rb` bytes for every id in `tokens`
    // (checked by the caller), x holds n_tok·n floats.
    unsafe {
        dev.launch_with(names::EMBED_ROWS, cfg, |b| {
            b.arg(&table).arg(&tyi).arg(&rb).arg(&ni).arg(&tokens).arg(&scale).arg(&x);
        })
    }
}

/// The launch of a kernel with one thread per value of `n` (blocks of 256).
pub(super) fn elementwise_cfg(n: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig { grid_dim: (to_u32(n.div_ceil(256), "grid")?, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 })
}

/// `out[i] = act(gate[i]) · up[i]` for `n` values (`gelu`: GELU-tanh, else SiLU).
pub(crate) fn glu(dev: &Device, gate: DevPtr, up: DevPtr, out: DevPtr, n: usize, gelu: bool) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (ni, act) = (to_i32(n, "length")?, if gelu { 0i32 } else { 1 });
    let cfg = elementwise_cfg(n)?;
    // SAFETY: all three buffers hold n floats.
    unsafe {
        dev.launch_with(names::GLU, cfg, |b| {
            b.arg(&gate).arg(&up).arg(&out).arg(&ni).arg(&act);
        })
    }
}

/// `x[i] = act(x[i])` for `n` values.
pub(crate) fn act_inplace(dev: &Device, x: DevPtr, n: usize, gelu: bool) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (ni, act) = (to_i32(n, "length")?, if gelu { 0i32 } else { 1 });
    let cfg = elementwise_cfg(n)?;
    // SAFETY: x holds n floats.
    unsafe {
        dev.launch_with(names::ACT_INPLACE, cfg, |b| {
            b.arg(&x).arg(&ni).arg(&act);
        })
    }
}

/// `x[i] = cap · tanh(x[i] / cap)` for `n` floats (the final logit
/// soft-cap of Gemma 2, after a GEMM).
pub(crate) fn softcap_inplace(dev: &Device, x: DevPtr, n: usize, cap: f32) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let ni = to_i32(n, "length")?;
    let cfg = elementwise_cfg(n)?;
    // SAFETY: x holds n floats.
    unsafe {
        dev.launch_with(names::SOFTCAP_INPLACE, cfg, |b| {
            b.arg(&x).arg(&ni).arg(&cap);
        })
    }
}

/// Whether [`dequant_matrix`] takes weights of `ty` (in the repacked layout
/// when `repacked`).
pub(crate) fn has_dequant(ty: GgmlType, repacked: bool) -> bool {
    kernels::matvec_kernels(ty).is_some() && (!repacked || crate::cuda::repack::has_repacked(ty))
}

/// Dequantizes a whole `rows × cols` matrix (`stride` bytes per row; GGUF
/// rows, or the layout of `repack.rs` when `repacked`) to `prec`'s operand
/// type (f32 or bf16) at `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dequant_matrix(
    dev: &Device,
    w: DevPtr,
    ty: GgmlType,
    stride: usize,
    rows: usize,
    cols: usize,
    repacked: bool,
    prec: GemmPrecision,
    out: DevPtr,
) -> Result<()> {
    if !has_dequant(ty, repacked) {
        return Err(Error::Unsupported { op: "cuda dequantize", ty });
    }
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let (tyi, st, n, rp) =
        (ty.id() as i32, to_i32(stride, "row stride")?, to_i32(cols, "row length")?, repacked as i32);
    let bf = (prec == GemmPrecision::Bf16) as i32;
    // 64 threads: DQ_THREADS in elementwise.cu.
    let cfg = LaunchConfig { grid_dim: (to_u32(rows, "rows")?, 1, 1), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: w holds `rows` rows of `stride` bytes in the stated layout,
    // out holds rows·cols values of the operand type (callers size them so).
    unsafe {
        dev.launch_with(names::DEQUANT_MATRIX, cfg, |b| {
            b.arg(&w).arg(&tyi).arg(&st).arg(&n).arg(&rp).arg(&bf).arg(&out);
        })
    }
}
