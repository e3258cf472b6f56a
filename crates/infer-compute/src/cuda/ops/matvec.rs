//! Quantized and float mat-vec launches (one token and small batches),
//! with the fused residual norm and the q8 activation they read.

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::{to_i32, to_u32};
use crate::cuda::device::Device;
use crate::cuda::kernels::{
    self, names, DevPtr, MatvecArgs, MvMode, MvNormArgs, NormArgs, MV_TOKENS, MV_TR_ROWS, MV_WARPS,
};
use crate::error::{Error, Result};
use crate::GgmlType;

/// Quantizes `n_chunks` chunks of 32 f32 values at `x` to q8 (`q`: int8
/// quants, `ds`: (d, d·sum) per chunk).
pub(crate) fn quantize_q8(dev: &Device, x: DevPtr, q: DevPtr, ds: DevPtr, n_chunks: usize) -> Result<()> {
    if n_chunks == 0 {
        return Ok(());
    }
    let n = to_i32(n_chunks, "chunks")?;
    let cfg = LaunchConfig {
        grid_dim: (to_u32(n_chunks.div_ceil(8), "grid")?, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: x holds n_chunks·32 floats, q n_chunks·32 bytes, ds n_chunks
    // float2 (callers size them so).
    unsafe {
        dev.launch_with(names::QUANTIZE_Q8, cfg, |b| {
            b.arg(&x).arg(&q).arg(&ds).arg(&n);
        })
    }
}

/// One mat-vec launch: up to three weight matrices of one type and width.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Matvec {
    pub ty: GgmlType,
    pub w: [DevPtr; 3],
    pub y: [DevPtr; 3],
    pub rows: [usize; 3],
    pub cols: usize,
    /// f32 activation `[n_tok][cols]` (float weight types).
    pub x: DevPtr,
    /// q8 activation (quantized weight types).
    pub aq: DevPtr,
    pub ad: DevPtr,
    pub n_tok: usize,
    pub mode: MvMode,
    pub cap: f32,
    /// Rows are in the repacked layout with this stride in bytes (0: GGUF
    /// rows of `ty.row_bytes(cols)`).
    pub repacked_stride: usize,
}

impl Matvec {
    /// Output rows of the launch: the gate/up pair's rows, or the sum of
    /// the segments' rows.
    pub fn total_rows(&self) -> usize {
        match self.mode {
            MvMode::GluGelu | MvMode::GluSilu => self.rows[0],
            _ => self.rows.iter().sum(),
        }
    }

    /// A single-matrix launch with the store epilogue.
    pub fn single(ty: GgmlType, w: DevPtr, rows: usize, cols: usize, y: DevPtr) -> Self {
        Matvec {
            ty,
            w: [w, 0, 0],
            y: [y, 0, 0],
            rows: [rows, 0, 0],
            cols,
            x: 0,
            aq: 0,
            ad: 0,
            n_tok: 1,
            mode: MvMode::Store,
            cap: 0.0,
            repacked_stride: 0,
        }
    }
}

/// Warps per row of a one-token product of `rows` rows of `cols` values
/// (`mv_*_t1s` above 1, matvec.cu). A long row (`LONG_ROW` values or more,
/// e.g. ffn_down's n_ff) read by one warp leaves too few loads in flight
/// on a product of few rows: ffn_down of Llama 1B (2048 rows) has 2048
/// warps for 132 SMs of 64 warps each. It is split over 2 or 4 warps, the
/// most that keeps every warp of the launch resident at once (rows × wpr ≤
/// multiprocessors × warps per multiprocessor). On the H200 (tg128): gemma3 4B (2560 rows of
/// 10240) +1% at 2 against 1, −0.6% at 4 against 2; Llama 1B (2048 of
/// 8192) and gemma3 1B (1152 of 6912) +2–3% at 4 against 1 (the 1B −1% at
/// 2). Rows shorter than `LONG_ROW` stay whole: `mv_*_t1` keeps the short
/// loop that every other product runs. `CudaOptions::mv_warps_per_row`
/// forces a count and `mv_long_row` the threshold (to compare and to
/// test).
fn warps_per_row(dev: &Device, cols: usize, rows: usize) -> usize {
    let (forced, long) = (forced_warps_per_row(dev), dev.opts.mv_long_row);
    if cols < long {
        return 1;
    }
    let warps_per_sm = (dev.info.max_threads_per_multiprocessor / 32).max(1) as usize;
    let resident = dev.info.multiprocessors.max(1) as usize * warps_per_sm;
    forced.unwrap_or_else(|| [4, 2].into_iter().find(|&w| rows * w <= resident).unwrap_or(1))
}

/// Whether weight type `ty` reads the q8 activation (else the f32 one).
///
/// # Errors
/// [`Error::Unsupported`] for types without a mat-vec kernel.
pub(crate) fn wants_q8(ty: GgmlType) -> Result<bool> {
    kernels::matvec_kernels(ty).map(|k| k.quantized).ok_or(Error::Unsupported { op: "cuda matvec", ty })
}

fn kernels_of(m: &Matvec) -> Result<kernels::MatvecKernels> {
    if m.repacked_stride > 0 { kernels::repacked_matvec_kernels(m.ty) } else { kernels::matvec_kernels(m.ty) }
        .ok_or(Error::Unsupported { op: "cuda matvec", ty: m.ty })
}

/// Launches a mat-vec (see matvec.cu).
pub(crate) fn matvec(dev: &Device, m: &Matvec) -> Result<()> {
    let k = kernels_of(m)?;
    let total = m.total_rows();
    if total == 0 || m.n_tok == 0 {
        return Ok(());
    }
    if k.quantized && !m.cols.is_multiple_of(32) {
        return Err(Error::RowNotBlockMultiple { ty: m.ty, cols: m.cols, block_size: 32 });
    }
    let mut args = matvec_args(dev, m)?;
    let glu = matches!(m.mode, MvMode::GluGelu | MvMode::GluSilu);
    let gy = m.n_tok.div_ceil(MV_TOKENS);
    let tiled = k.tr.filter(|_| {
        m.n_tok >= 2
            && (!glu || dev.opts.mv_rows_glu_min_tokens.is_some_and(|min| m.n_tok >= min))
            && dev.opts.mv_rows_min_tokens.is_some_and(|min| m.n_tok >= min || total >= MV_TR_MANY_ROWS)
    });
    // The kernel, warps per row (group) and output rows per block.
    let (name, wpr, rows_per_block) = match (m.n_tok, k.t1s, tiled) {
        (_, _, Some(tiled)) => {
            // A GLU group is MV_TR_ROWS / 2 gate/up pairs.
            let per_group = if glu { MV_TR_ROWS / 2 } else { MV_TR_ROWS };
            let wpr = tiled_warps_per_group(dev, m.cols);
            (tiled, wpr, MV_WARPS as usize / wpr * per_group)
        }
        (1, Some(split), _) => match warps_per_row(dev, m.cols, total) {
            1 => (k.t1, 1, MV_WARPS as usize),
            wpr => (split, wpr, MV_WARPS as usize / wpr),
        },
        (1, None, _) => (k.t1, 1, MV_WARPS as usize),
        _ => (k.t8, 1, MV_WARPS as usize),
    };
    args.wpr = wpr as i32;
    let gx = total.div_ceil(rows_per_block);
    dev.launch(name, (to_u32(gx, "grid")?, to_u32(gy, "grid")?, 1), MV_WARPS * 32, 0, &args)
}

/// Rows from which a product of 2+ tokens runs [`MV_TR_ROWS`] rows per
/// warp below `CudaOptions::mv_rows_min_tokens`: the vocabulary product
/// (128 256 rows on Llama 3) still has warps enough at a quarter of them,
/// and one row per warp loads each activation chunk once per row (at 4
/// tokens its Q6_K product ran at 0.98 TB/s against 2.8 at one token; H200,
/// `--profile`).
const MV_TR_MANY_ROWS: usize = 32768;

/// Warps per group of [`MV_TR_ROWS`] rows of a `tr` product over rows of
/// `cols` values: 2 where each lane still has a chunk of its own (64
/// chunks or more), else 1. With one warp per group, Llama 1B's 2048 × 2048
/// products at 16 tokens ran 8 warps per multiprocessor, 12% occupancy
/// (ncu, H200). At 12, 16 and 23 tokens (H200; BENCHMARKS.md) splitting
/// every such product over 2 warps was 3–9% faster than splitting (over 4
/// or 2) only while the launch stays resident, and 4 warps everywhere 1–5%
/// slower than 2 on gemma3 4B. `CudaOptions::mv_warps_per_row` forces a
/// count.
fn tiled_warps_per_group(dev: &Device, cols: usize) -> usize {
    forced_warps_per_row(dev).unwrap_or(if cols / 32 >= 2 * 32 { 2 } else { 1 })
}

/// `CudaOptions::mv_warps_per_row` where it is a count the kernels divide
/// their block by (1, 2 or 4); other values are ignored.
fn forced_warps_per_row(dev: &Device) -> Option<usize> {
    dev.opts.mv_warps_per_row.filter(|w| matches!(w, 1 | 2 | 4))
}

/// Whether [`matvec_glu_q8`] can run the one-token product `m`
/// (`CudaOptions::glu_q8` off says never, to compare): a GLU product of a
/// quantized type whose rows fill whole q8 chunks.
pub(crate) fn can_glu_q8(dev: &Device, m: &Matvec) -> bool {
    dev.opts.glu_q8
        && m.n_tok == 1
        && matches!(m.mode, MvMode::GluGelu | MvMode::GluSilu)
        && m.total_rows() > 0
        && m.total_rows().is_multiple_of(32)
        && m.cols.is_multiple_of(32)
        && kernels_of(m).is_ok_and(|k| k.t1q.is_some())
}

/// Launches the one-token GLU product `m`, which also writes its output
/// (`m.y[0]`, `m.rows[0]` values) as the q8 activation `oq` / `ods` of the
/// product after it, as [`quantize_q8`] would (`mv_*_t1q`, matvec.cu).
/// `count` is `m.rows[0] / 32` zeroed i32, left zeroed. Check
/// [`can_glu_q8`] first.
pub(crate) fn matvec_glu_q8(dev: &Device, m: &Matvec, oq: DevPtr, ods: DevPtr, count: DevPtr) -> Result<()> {
    let k = kernels_of(m)?;
    let name = k.t1q.filter(|_| can_glu_q8(dev, m) && oq != 0 && ods != 0 && count != 0).ok_or_else(|| {
        Error::Device(format!("no quantizing GLU product for {} rows of {} values", m.ty.name(), m.cols))
    })?;
    let args = kernels::MvQuantArgs { mv: matvec_args(dev, m)?, oq, ods, count };
    let gx = m.total_rows().div_ceil(MV_WARPS as usize);
    dev.launch(name, (to_u32(gx, "grid")?, 1, 1), MV_WARPS * 32, 0, &args)
}

/// The kernel arguments of `m` (shapes checked against the kernels'
/// 32-bit indices).
fn matvec_args(dev: &Device, m: &Matvec) -> Result<MatvecArgs> {
    Ok(MatvecArgs {
        w: m.w,
        y: m.y,
        aq: m.aq,
        ad: m.ad,
        ax: m.x,
        rows: [to_i32(m.rows[0], "rows")?, to_i32(m.rows[1], "rows")?, to_i32(m.rows[2], "rows")?],
        row_bytes: to_i32(
            if m.repacked_stride > 0 { m.repacked_stride } else { m.ty.row_bytes(m.cols)? },
            "row bytes",
        )?,
        cols: to_i32(m.cols, "cols")?,
        n_tok: to_i32(m.n_tok, "tokens")?,
        mode: m.mode as i32,
        cap: m.cap,
        // Read by the one-token and the `tr` kernels.
        prefetch: i32::from(dev.opts.prefetch),
        wpr: 1,
    })
}

/// Threads of a `residual_norm` block and of an `mvn_*` block
/// (`NORM_THREADS` in norm.cu, `MVN_THREADS` in matvec_norm.cu, asserted
/// equal there): the same block size gives the fused norm the same
/// reduction order, so the same bits.
const NORM_THREADS: usize = 1024;
/// Values per thread of the norm's whole-row path (`NORM_REG` in norm.cu).
const NORM_REG: usize = 4;

/// Whether [`matvec_norm`] can run the one-token product `m` with its
/// input's norm (`CudaOptions::fuse_norm` off says never, to compare): a
/// quantized type, at least one row, and an input row of a multiple of 32
/// values that the norm holds in registers.
pub(crate) fn can_fuse_norm(dev: &Device, m: &Matvec) -> bool {
    // A launch of no rows would skip the norm it carries.
    dev.opts.fuse_norm
        && m.n_tok == 1
        && m.total_rows() > 0
        && m.cols.is_multiple_of(32)
        && m.cols <= NORM_THREADS * NORM_REG
        && kernels_of(m).is_ok_and(|k| k.tn.is_some())
}

/// Launches the one-token product `m` with the residual add and norm of
/// its input done first, in every block (`mvn_*`, matvec_norm.cu): `norm`
/// as [`residual_norm`] would run it on one row (its `x` read, not
/// written; its `out`, `q`, `ds` written by one block), the updated
/// residual going to `x_out` (needed when `norm.add` is set). `m.aq` and
/// `m.ad` are not read. Check [`can_fuse_norm`] first.
pub(crate) fn matvec_norm(dev: &Device, m: &Matvec, norm: &NormArgs, x_out: DevPtr) -> Result<()> {
    let k = kernels_of(m)?;
    let name = k
        .tn
        .filter(|_| can_fuse_norm(dev, m))
        .ok_or_else(|| Error::Device(format!("no fused-norm product for {} rows of {} values", m.ty.name(), m.cols)))?;
    let args = MvNormArgs { mv: fused_product_args(dev, m)?, norm: *norm, x_out };
    launch_fused_norm(dev, name, norm, x_out, m.cols, m.total_rows(), &args)
}

/// The arguments of a product whose activation comes from a fused norm,
/// not from `m.aq` / `m.ad` / `m.x`.
fn fused_product_args(dev: &Device, m: &Matvec) -> Result<MatvecArgs> {
    Ok(MatvecArgs { aq: 0, ad: 0, ax: 0, ..matvec_args(dev, m)? })
}

/// Launches a fused-norm kernel (`mvn_*`, `mvn2_*`) over `total` rows of
/// `cols` values, after checking `norm` and `x_out` against them.
fn launch_fused_norm<A: DeviceRepr>(
    dev: &Device,
    name: kernels::KernelName,
    norm: &NormArgs,
    x_out: DevPtr,
    cols: usize,
    total: usize,
    args: &A,
) -> Result<()> {
    if norm.n as usize != cols || norm.q != 0 && norm.ds == 0 || norm.add != 0 && x_out == 0 {
        return Err(Error::Device("fused norm arguments do not match the product".into()));
    }
    // The kernel counts the rows in an int.
    to_i32(total, "rows")?;
    // One block per SM at most (1024 threads, up to 64 registers each).
    let grid = total.div_ceil(NORM_THREADS / 32).min(dev.info.multiprocessors.max(1) as usize);
    let smem = cols + cols / 32 * 8;
    dev.launch(name, (to_u32(grid, "grid")?, 1, 1), NORM_THREADS as u32, to_u32(smem, "shared memory")?, args)
}

/// The kernel that runs the fused-norm product `a` and then the product
/// `b` against the same normalized input in one launch ([`matvec_norm2`]),
/// if there is one: both one-token, non-GLU and of the same width, `a` as
/// [`can_fuse_norm`] wants it, their types a pair of
/// [`kernels::MIXED_NORM_KERNELS`]. `CudaOptions::mixed_qkv` off says
/// never, to compare.
pub(crate) fn mixed_norm_kernel(dev: &Device, a: &Matvec, b: &Matvec) -> Option<kernels::KernelName> {
    let store = |m: &Matvec| m.mode == MvMode::Store && m.n_tok == 1 && m.total_rows() > 0;
    if !(dev.opts.mixed_qkv && store(a) && store(b) && b.cols == a.cols && can_fuse_norm(dev, a)) {
        return None;
    }
    kernels::mixed_norm_kernel((a.ty, a.repacked_stride > 0), (b.ty, b.repacked_stride > 0))
}

/// [`matvec_norm`] for `a`, then `b` (of another weight type) against the
/// same normalized input, in one launch (`mvn2_*`, matvec_norm.cu): a
/// layer's q/k/v when v's type differs from q's and k's. Check
/// [`mixed_norm_kernel`] first.
pub(crate) fn matvec_norm2(dev: &Device, a: &Matvec, b: &Matvec, norm: &NormArgs, x_out: DevPtr) -> Result<()> {
    let name = mixed_norm_kernel(dev, a, b).ok_or_else(|| {
        Error::Device(format!("no fused-norm product for {} rows then {} rows", a.ty.name(), b.ty.name()))
    })?;
    let p = MvNormArgs { mv: fused_product_args(dev, a)?, norm: *norm, x_out };
    let args = kernels::MvNorm2Args { p, b: fused_product_args(dev, b)? };
    launch_fused_norm(dev, name, norm, x_out, a.cols, a.total_rows() + b.total_rows(), &args)
}

/// Launches the fused residual add + norm (+ quantize) over `n_tok` rows.
pub(crate) fn residual_norm(dev: &Device, args: &NormArgs, n_tok: usize) -> Result<()> {
    if args.q != 0 && args.n % 32 != 0 {
        return Err(Error::Device(format!("q8 output of a norm needs a multiple of 32 values, not {}", args.n)));
    }
    // NORM_THREADS threads: rows up to NORM_THREADS * NORM_REG values are
    // held in registers, every load issued before the first use.
    dev.launch(names::RESIDUAL_NORM, (to_u32(n_tok, "tokens")?, 1, 1), NORM_THREADS as u32, 0, args)
}
