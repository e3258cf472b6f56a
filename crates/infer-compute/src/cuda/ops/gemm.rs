//! Batched products on the tensor cores: the `mmq_*` kernels over
//! quantized blocks and cuBLAS GEMMs over bf16 or f32 operands.

use cudarc::driver::PushKernelArg;

use super::{elementwise_cfg, to_i32, to_u32};
use crate::cuda::device::Device;
use crate::cuda::kernels::{self, names, DevPtr};
use crate::cuda::options::GemmPrecision;
use crate::error::{Error, Result};
use crate::GgmlType;

/// Most split-K ranges of one `mmq_*` launch.
const MMQ_MAX_SPLIT: usize = 16;

/// The `mmq_*` kernel of `ty` (in the repacked layout when `repacked`),
/// or `None` for float types and the activation-only ones.
pub(crate) fn mmq_kernel(ty: GgmlType, repacked: bool) -> Option<kernels::KernelName> {
    kernels::product((ty, repacked)).and_then(|p| p.kernels.mmq)
}

/// Whether a pass of `n` tokens runs its quantized projections as `mmq_*`
/// (`CudaOptions::mmq_min_tokens` up to `gemm_min_tokens`).
pub(crate) fn mmq_tokens(dev: &Device, n: usize) -> bool {
    dev.opts.mmq_min_tokens.is_some_and(|min| n >= min) && n < dev.opts.gemm_min_tokens
}

/// Floats of split-K partial sums that [`mmq`] launches over up to
/// `n_tok` tokens may need: one per token and row of at most two blocks per
/// multiprocessor, twice over (the split's rounding).
pub(crate) fn mmq_part_len(dev: &Device, n_tok: usize) -> usize {
    let sms = dev.info.multiprocessors.max(1) as usize;
    n_tok.min(kernels::MMQ_TOK) * (4 * sms + MMQ_MAX_SPLIT) * kernels::MMQ_ROWS
}

/// The tile of an `mmq_*` launch over `n_tok` tokens, as (weight rows,
/// tokens): the narrow one (`mmq_*_n`) for at most [`kernels::MMQ_NARROW_TOK`]
/// tokens when `CudaOptions::mmq_narrow` is on, else the wide one.
fn mmq_tile(dev: &Device, n_tok: usize) -> (usize, usize) {
    if dev.opts.mmq_narrow && n_tok <= kernels::MMQ_NARROW_TOK {
        (kernels::MMQ_NARROW_ROWS, kernels::MMQ_NARROW_TOK)
    } else {
        (kernels::MMQ_ROWS, kernels::MMQ_TOK)
    }
}

/// Split-K ranges of an `mmq_*` launch of `rows × cols` over `n_tok`
/// tokens in tiles of `tile` (rows, tokens), and values per range (a
/// multiple of `MMQ_K`): enough blocks for two per multiprocessor where the
/// rows alone do not give them, every range at least two K-steps, the
/// partial sums within `part_len` floats.
fn mmq_split(
    dev: &Device,
    (rows, cols): (usize, usize),
    n_tok: usize,
    tile: (usize, usize),
    part_len: usize,
) -> (usize, usize) {
    let blocks = rows.div_ceil(tile.0) * n_tok.div_ceil(tile.1);
    let steps = cols.div_ceil(kernels::MMQ_K);
    let sms = dev.info.multiprocessors.max(1) as usize;
    let mut split = (2 * sms).div_ceil(blocks).clamp(1, (steps / 2).clamp(1, MMQ_MAX_SPLIT));
    while split > 1 && split * n_tok * rows > part_len {
        split -= 1;
    }
    let k_split = steps.div_ceil(split) * kernels::MMQ_K;
    (cols.div_ceil(k_split), k_split)
}

/// `Y = X·Wᵀ` for a quantized `rows × cols` matrix `w` (`stride` bytes per
/// row, repacked when `repacked`) and `n_tok` bf16 activation rows `x`
/// (`cols` values each), into `y` (`n_tok` rows of `ld_y ≥ rows` floats)
/// on the tensor cores (matmul_quant.cu); `part` holds `part_len` floats
/// of split-K partial sums, added by `mmq_reduce`.
///
/// # Errors
/// [`Error::Unsupported`] for a layout without the kernel, rows not of
/// whole 32-value chunks, and launch errors.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mmq(
    dev: &Device,
    (ty, repacked): kernels::Layout,
    w: DevPtr,
    stride: usize,
    (rows, cols): (usize, usize),
    x: DevPtr,
    n_tok: usize,
    (y, ld_y): (DevPtr, usize),
    (part, part_len): (DevPtr, usize),
) -> Result<()> {
    let tile = mmq_tile(dev, n_tok);
    let set = kernels::product((ty, repacked)).map(|p| p.kernels);
    let name = set
        .and_then(|k| if tile.1 == kernels::MMQ_TOK { k.mmq } else { k.mmq_n })
        .ok_or(Error::Unsupported { op: "cuda mmq", ty })?;
    if rows == 0 || n_tok == 0 {
        return Ok(());
    }
    if !cols.is_multiple_of(32) {
        return Err(Error::RowNotBlockMultiple { ty, cols, block_size: 32 });
    }
    if ld_y < rows {
        return Err(Error::Device(format!("mmq output stride {ld_y} below its {rows} rows")));
    }
    let (split, k_split) = mmq_split(dev, (rows, cols), n_tok, tile, part_len);
    let args = kernels::MmqArgs {
        w,
        x,
        y,
        part,
        rows: to_i32(rows, "rows")?,
        row_bytes: to_i32(stride, "row stride")?,
        cols: to_i32(cols, "row length")?,
        n_tok: to_i32(n_tok, "tokens")?,
        ld_y: to_i32(ld_y, "output stride")?,
        k_split: to_i32(k_split, "split length")?,
        split: to_i32(split, "splits")?,
        pad: 0,
    };
    let grid =
        (to_u32(rows.div_ceil(tile.0), "grid")?, to_u32(n_tok.div_ceil(tile.1), "grid")?, to_u32(split, "grid")?);
    dev.launch(name, grid, kernels::MMQ_THREADS, 0, &args)?;
    if split == 1 {
        return Ok(());
    }
    let (ri, ni, ldi, si) = (args.rows, args.n_tok, args.ld_y, args.split);
    let cfg = elementwise_cfg(rows * n_tok)?;
    // SAFETY: part holds split·n_tok·rows floats (mmq_split keeps it within
    // part_len), y n_tok rows of ld_y floats (callers size them so).
    unsafe {
        dev.launch_with(names::MMQ_REDUCE, cfg, |b| {
            b.arg(&part).arg(&y).arg(&ri).arg(&ni).arg(&ldi).arg(&si);
        })
    }
}

/// Converts `n` f32 values at `x` to bf16 at `out`.
pub(crate) fn to_bf16(dev: &Device, x: DevPtr, out: DevPtr, n: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let ni = to_i32(n, "length")?;
    let cfg = elementwise_cfg(n)?;
    // SAFETY: x holds n floats, out n bf16 values.
    unsafe {
        dev.launch_with(names::TO_BF16, cfg, |b| {
            b.arg(&x).arg(&out).arg(&ni);
        })
    }
}

/// `Y = X·Wᵀ` on the tensor cores with f32 accumulation: `w` is
/// `rows × cols`, `x` is `n_tok × cols` (both row-major, in `prec`'s
/// operand type), `y` is `n_tok × rows` row-major f32 with rows `ld_y`
/// floats apart (`ld_y ≥ rows`: a column block of a wider output), on the
/// device's stream.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    dev: &Device,
    prec: GemmPrecision,
    w: DevPtr,
    x: DevPtr,
    y: DevPtr,
    rows: usize,
    cols: usize,
    n_tok: usize,
    ld_y: usize,
) -> Result<()> {
    use cudarc::cublas::sys::{self as cb, cublasOperation_t};
    if rows == 0 || cols == 0 || n_tok == 0 {
        return Ok(());
    }
    if ld_y < rows {
        return Err(Error::Device(format!("GEMM output stride {ld_y} below its {rows} rows")));
    }
    let (m, n, k) = (to_i32(rows, "rows")?, to_i32(n_tok, "tokens")?, to_i32(cols, "columns")?);
    let ldc = to_i32(ld_y, "output stride")?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (ab_type, compute, name) = match prec {
        GemmPrecision::Tf32 => {
            (cb::cudaDataType::CUDA_R_32F, cb::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32, "cublas_gemm_tf32")
        }
        GemmPrecision::Bf16 => {
            (cb::cudaDataType::CUDA_R_16BF, cb::cublasComputeType_t::CUBLAS_COMPUTE_32F, "cublas_gemm_bf16")
        }
    };
    // Column-major view: Y (rows × n_tok, ld `ld_y`) = Wᵀ-view (W is
    // cols × rows column-major, transposed) · X-view (cols × n_tok).
    dev.timed(name, || {
        // SAFETY: the handle is the device's, bound to its stream; the
        // pointers hold rows·cols and n_tok·cols operand values and
        // n_tok·rows floats (callers size them so); alpha and beta live
        // across the call.
        let status = unsafe {
            cb::cublasGemmEx(
                *dev.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m,
                n,
                k,
                &alpha as *const f32 as *const _,
                w as usize as *const std::ffi::c_void,
                ab_type,
                k,
                x as usize as *const std::ffi::c_void,
                ab_type,
                k,
                &beta as *const f32 as *const _,
                y as usize as *mut std::ffi::c_void,
                cb::cudaDataType::CUDA_R_32F,
                ldc,
                compute,
                cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if status != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(Error::Device(format!("cuBLAS GemmEx ({prec:?}): {status:?}")));
        }
        Ok(())
    })
}
