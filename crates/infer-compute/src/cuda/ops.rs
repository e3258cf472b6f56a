//! Launch wrappers: one function per kernel family, taking device
//! addresses and shapes, checking what the kernels assume, and choosing
//! grid and block sizes. Used by the decode pipeline ([`super::model`]) and
//! by the single-op entry points of [`super::CudaBackend`].

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::device::Device;
use super::kernels::{
    self, names, AttnArgs, AttnQkvArgs, DevPtr, MatvecArgs, MvMode, MvNormArgs, NormArgs, QkvArgs, TqArgs, TqAttnArgs,
    TqDecodeArgs, ATTN_MAX_G, ATTN_SPLIT, MV_TOKENS, MV_TR_ROWS, MV_WARPS,
};
pub(crate) use super::options::GemmPrecision;
use crate::backend::{RowStats, TopK};
use crate::error::{Error, Result};
use crate::GgmlType;

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Device(format!("{what} = {v} does not fit the kernels' 32-bit indices")))
}

fn to_u32(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Device(format!("{what} = {v} does not fit a launch dimension")))
}

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

/// Launches the q/k/v post-processing (bias, q/k norm, RoPE, KV append).
pub(crate) fn qkv_post(dev: &Device, args: &QkvArgs) -> Result<()> {
    check_qkv_shape(args)?;
    let blocks = to_u32((args.n_head + args.n_kv) as usize, "heads")?;
    // 128 threads: QKV_THREADS in rope.cu, which the kernel indexes by.
    dev.launch(names::QKV_POST, (blocks, to_u32(args.n_tok as usize, "tokens")?, 1), 128, 0, args)
}

/// The q/k/v post-processing ([`qkv_post`]) and then [`attention`].
///
/// One token whose head dimension is 64, 128 or 256, with at most
/// [`ATTN_MAX_G`] query heads per kv head, runs all of it as one kernel
/// (`attn_decode_hd*`, attention_decode.cu, or the flat
/// `attn_decode_flat_hd*` when `flat`: see [`decode_flat`]), which needs `count`: `n_kv`
/// zeroed ints that it leaves zeroed. `CudaOptions::attn_decode` off
/// turns it off (to compare). Otherwise, for one token with several kv heads, the
/// post-processing runs inside the split kernel (`attn_split_qkv`), then
/// the combine. With a single kv head that fusion redid the
/// post-processing of every query head serially in each of its few blocks,
/// where `qkv_post` spreads it over a block per head: on the H200 it was
/// 3% faster on Gemma 3 4B (4 kv heads), 1% on Llama 1B (8), and 1–2%
/// slower on Gemma 3 270M and 1B (1). `CudaOptions::fuse_qkv` `Some(false)`
/// keeps them apart, `Some(true)` fuses whenever the shape allows (to
/// compare). With values stored rotated (`attn.v_rot`) the output is
/// rotated back before it is written or quantized.
pub(crate) fn qkv_attention(dev: &Device, qkv: &QkvArgs, attn: &AttnArgs, count: DevPtr, flat: bool) -> Result<()> {
    let (n_head, n_kv, hd) = (attn.n_head as usize, attn.n_kv as usize, attn.hd as usize);
    let one = attn.n_tok == 1 && qkv.n_tok == 1 && n_kv > 0 && n_head / n_kv <= ATTN_MAX_G;
    if let Some(l) = DecodeLaunch::of(attn, false, flat).filter(|_| one && count != 0 && dev.opts.attn_decode) {
        check_qkv_shape(qkv)?;
        check_attn_shape(n_head, n_kv, hd)?;
        let grid = (to_u32(n_kv, "kv heads")?, l.blocks(dev, attn, 1)?, 1);
        let args = AttnQkvArgs { at: *attn, qk: *qkv, count, slot: 0, k_stride: 0, v_stride: 0 };
        return dev.launch(l.kernel, grid, l.threads, l.smem, &args);
    }
    // Values stored rotated: these paths leave the output rotated and
    // unquantized, and attn_unrotate finishes it.
    let mut plain = *attn;
    if attn.v_rot != 0 {
        plain.oq = 0;
        plain.ods = 0;
    }
    let fuse = one && dev.opts.fuse_qkv.unwrap_or(n_kv >= 2);
    if !fuse {
        qkv_post(dev, qkv)?;
        attention(dev, &plain)?;
    } else {
        check_qkv_shape(qkv)?;
        check_attn_shape(n_head, n_kv, hd)?;
        let smem = ((ATTN_MAX_G * hd + ATTN_MAX_G * ATTN_SPLIT + pv_reduce_len(hd).max(3 * hd)) * 4) as u32;
        let args = AttnQkvArgs { at: plain, qk: *qkv, count: 0, slot: 0, k_stride: 0, v_stride: 0 };
        let grid = (to_u32(n_kv, "kv heads")?, to_u32(attn.n_split as usize, "splits")?, 1);
        let k = if pv_reduce_len(hd) > 0 { names::ATTN_SPLIT_QKV_GRP } else { names::ATTN_SPLIT_QKV };
        dev.launch(k, grid, ATTN_THREADS as u32, smem, &args)?;
        combine(dev, &plain)?;
    }
    if attn.v_rot != 0 {
        attn_unrotate(dev, attn)?;
    }
    Ok(())
}

/// Whether the K or the V cache of `attn` (or both) is a TurboQuant one
/// (tq3, tq4): its spans run [`qkv_attention_tq`].
pub(crate) fn has_tq(attn: &AttnArgs) -> bool {
    [attn.kt, attn.vt].into_iter().any(is_tq)
}

/// Whether a cache type's code in the kernels is `KV_TQ3` or `KV_TQ4`
/// ([`super::kv_pool::CacheLayout::code`]).
fn is_tq(code: i32) -> bool {
    code == 3 || code == 4
}

/// The q/k/v post-processing and attention of one span (of slot `slot`)
/// over a layer whose K or V cache (or both) is TurboQuant (tq_cache.cu):
/// `qkv_post` rotates q, k and v into the caches' bases and leaves the
/// span's k and v rows in place; `tq_centre` and `tq_encode` code them;
/// `attn_split_tq` and the combine attend, reading each row from where
/// tq_cache.cuh says; the output is rotated back (`tq_unrotate` for
/// TurboQuant values, [`attn_unrotate`] for rotated quantized ones) and
/// quantized for the output projection; then `tq_keep` moves the span's
/// last rows into the ring. A one-token span over two TurboQuant caches
/// is two launches: `qkv_post`, then `attn_decode_tq` (tq_decode.cu),
/// which codes the token's rows, attends in blocks of 256 positions and
/// merges them (its last block, by the tickets in `count`: `n_kv ·
/// ⌈G / 8⌉` zeroed counters). Every span and token count takes this path:
/// no batched decode kernel reads these caches.
pub(crate) fn qkv_attention_tq(dev: &Device, qkv: &QkvArgs, attn: &AttnArgs, slot: usize, count: DevPtr) -> Result<()> {
    let (n_head, n_kv, hd) = (attn.n_head as usize, attn.n_kv as usize, attn.hd as usize);
    check_qkv_shape(qkv)?;
    check_attn_shape(n_head, n_kv, hd)?;
    let n_tok = to_u32(qkv.n_tok as usize, "tokens")?;
    let kv = to_u32(n_kv, "kv heads")?;
    let tq = TqArgs {
        kc: qkv.kc,
        vc: qkv.vc,
        k: qkv.k,
        v: qkv.v,
        pos0: qkv.pos0,
        kt: qkv.kt,
        vt: qkv.vt,
        slot: to_i32(slot, "slot")?,
        n_tok: qkv.n_tok,
    };
    qkv_post(dev, qkv)?;
    let n_gc = (n_head / n_kv).div_ceil(ATTN_MAX_G);
    // Up to 4 query heads per block: the kernels that hold 4 heads' q and
    // sums in registers, else those of 8.
    let four = n_head / n_kv <= 4;
    let one = n_tok == 1;
    if one && is_tq(attn.kt) && is_tq(attn.vt) && dev.opts.attn_decode {
        // sq and sacc [8][hd], the logits [8][256], q . centre, the coded
        // weights and (m, s) [8] each.
        let smem =
            ((2 * ATTN_MAX_G * hd + ATTN_MAX_G * kernels::TQ_DECODE_SPLITS * ATTN_SPLIT + 4 * ATTN_MAX_G) * 4) as u32;
        let n_blk = (attn.n_split as usize).div_ceil(kernels::TQ_DECODE_SPLITS);
        let grid = (to_u32(n_kv * n_gc, "grid")?, to_u32(2 + n_blk, "blocks")?, 1);
        let k = if four { names::ATTN_DECODE_TQ } else { names::ATTN_DECODE_TQ_G8 };
        return dev.launch(k, grid, ATTN_THREADS as u32, smem, &TqDecodeArgs { at: *attn, tq, count });
    }
    if !one {
        dev.launch(names::TQ_CENTRE, (1, 1, 2), 128, 0, &tq)?;
    }
    dev.launch(names::TQ_ENCODE, (kv, n_tok, 2), 128, 0, &tq)?;
    // Values stored rotated: the output is quantized after the rotation back.
    let mut plain = *attn;
    if attn.v_rot != 0 {
        plain.oq = 0;
        plain.ods = 0;
    }
    let smem = ((2 * ATTN_MAX_G * hd + ATTN_MAX_G * ATTN_SPLIT + 2 * ATTN_MAX_G) * 4) as u32;
    let grid = (to_u32(n_kv * n_gc, "grid")?, to_u32(attn.n_split as usize, "splits")?, n_tok);
    let k = if four { names::ATTN_SPLIT_TQ } else { names::ATTN_SPLIT_TQ_G8 };
    dev.launch(k, grid, ATTN_THREADS as u32, smem, &TqAttnArgs { at: plain, tq })?;
    combine(dev, &plain)?;
    if is_tq(attn.vt) {
        dev.launch(names::TQ_UNROTATE, (to_u32(n_head, "heads")?, n_tok, 1), 128, 0, &TqAttnArgs { at: *attn, tq })?;
    } else if attn.v_rot != 0 {
        attn_unrotate(dev, attn)?;
    }
    if !one {
        dev.launch(names::TQ_KEEP, (kv, n_tok, 2), 128, 0, &tq)?;
    }
    Ok(())
}

/// Most one-token steps of different sequences in one launch of the
/// batched decode attention ([`qkv_attention_batch`]): the partial sums and
/// tickets are sized for this many tokens.
pub(crate) const DECODE_BATCH_MAX: usize = 64;

/// Whether [`qkv_attention_batch`] runs the shape of `attn` (the kernel of
/// [`qkv_attention`]'s one-token path exists for it).
pub(crate) fn has_decode_batch(dev: &Device, attn: &AttnArgs) -> bool {
    let (n_head, n_kv) = (attn.n_head as usize, attn.n_kv as usize);
    DecodeLaunch::of(attn, true, false).is_some() && n_kv > 0 && n_head / n_kv <= ATTN_MAX_G && dev.opts.attn_decode
}

/// [`qkv_attention`] for `n_tok` one-token steps of different sequences in
/// one launch (`attn_decode_batch_hd*`, grid z over the tokens): `qkv` and
/// `attn` describe token 0 with `n_tok` = 1 (its rows, the caches of slot
/// 0, `pos0` the first of `n_tok` device positions); token `t` reads row
/// `t` of each activation, position `pos0[t]` and the caches at
/// `slot[t] · strides` bytes (K's, V's) from slot 0's. `count` holds `n_tok ·
/// n_kv` zeroed tickets, the partial sums room for `n_tok` tokens.
/// `flat` picks the flat kernel as in [`qkv_attention`].
///
/// # Errors
/// A shape without the kernel (check [`has_decode_batch`]), more than
/// [`DECODE_BATCH_MAX`] tokens, launch errors.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qkv_attention_batch(
    dev: &Device,
    qkv: &QkvArgs,
    attn: &AttnArgs,
    count: DevPtr,
    slot: DevPtr,
    strides: (usize, usize),
    n_tok: usize,
    flat: bool,
) -> Result<()> {
    let (n_kv, hd) = (attn.n_kv as usize, attn.hd as usize);
    let l = DecodeLaunch::of(attn, true, flat)
        .ok_or_else(|| Error::Device(format!("no batched decode attention for head_dim {hd}")))?;
    if !has_decode_batch(dev, attn) || n_tok == 0 || n_tok > DECODE_BATCH_MAX || count == 0 || slot == 0 {
        return Err(Error::Device(format!("batched decode attention of {n_tok} tokens does not apply here")));
    }
    check_qkv_shape(qkv)?;
    check_attn_shape(attn.n_head as usize, n_kv, hd)?;
    let grid = (to_u32(n_kv, "kv heads")?, l.blocks(dev, attn, n_tok)?, to_u32(n_tok, "tokens")?);
    let stride = |s: usize| i64::try_from(s).map_err(|_| Error::Overflow("KV pool slot stride"));
    let args =
        AttnQkvArgs { at: *attn, qk: *qkv, count, slot, k_stride: stride(strides.0)?, v_stride: stride(strides.1)? };
    dev.launch(l.kernel, grid, l.threads, l.smem, &args)
}

/// Query heads per kv head that the flat decode kernels take (`FLAT_G`
/// in attention_decode_flat.cu).
const FLAT_G: usize = 4;

/// Whether the one-launch decode attention of `attn` over `n_tok` one-token
/// steps (1 to [`DECODE_BATCH_MAX`]), the deepest at position `max_pos`,
/// runs the flat kernel: as `CudaOptions::attn_flat` says, and by default
/// for heads of 64 values where the staged kernel's blocks would each
/// stream two or more 32-position spans of the attended range (the last
/// `window` positions for a sliding-window layer). There the flat kernel,
/// which keeps its positions in registers without a barrier per span, was
/// faster (llama 1B); where a block takes one span the staged one was
/// (BENCHMARKS.md). Heads of 128 and 256 values (a position over 16 or 32
/// lanes) stay staged by default: not yet measured there.
pub(crate) fn decode_flat(dev: &Device, attn: &AttnArgs, n_tok: usize, max_pos: usize) -> bool {
    match dev.opts.attn_flat {
        Some(on) => on,
        None if attn.hd != 64 => false,
        None => {
            let Some(staged) = DecodeLaunch::of(attn, n_tok > 1, false) else { return false };
            let attended = match attn.window {
                w if w > 0 => (max_pos + 1).min(w as usize),
                _ => max_pos + 1,
            };
            staged.blocks(dev, attn, n_tok).is_ok_and(|b| attended.div_ceil(ATTN_SPLIT) > b as usize)
        }
    }
}

/// Threads of a flat decode block (`FLAT_THREADS`).
const FLAT_THREADS: usize = 256;

/// A one-launch decode attention kernel and its launch shape.
struct DecodeLaunch {
    kernel: kernels::KernelName,
    threads: u32,
    smem: u32,
    /// Threads of it that stay resident per multiprocessor (its registers).
    resident: usize,
}

impl DecodeLaunch {
    /// The kernel for `attn` (`batch`: the grid-z-over-tokens variant):
    /// the flat one (attention_decode_flat.cu) when `flat` (see
    /// [`decode_flat`]) and kv heads have at most [`FLAT_G`] query heads,
    /// else the staged one (attention_decode.cu); `None` for a head_dim
    /// without either (64, 128 and 256 have them).
    fn of(attn: &AttnArgs, batch: bool, flat: bool) -> Option<DecodeLaunch> {
        let hd = attn.hd as usize;
        let i = match hd {
            64 => 0,
            128 => 1,
            256 => 2,
            _ => return None,
        };
        let quant = quantized(attn);
        let g = (attn.n_head as usize).checked_div(attn.n_kv as usize).unwrap_or(usize::MAX);
        if flat && g <= FLAT_G {
            // attention_decode_flat.cu's smem: q [FLAT_G][hd], new k and v
            // [2][hd], rotation [hd], norm weights [2][hd], the block's and
            // the warps' (max, sum) [1 + warps][FLAT_G] as float2, the
            // warps' outputs [warps][FLAT_G][hd].
            let warps = FLAT_THREADS / 32;
            let floats = FLAT_G * hd + 5 * hd + 2 * (1 + warps) * FLAT_G + warps * FLAT_G * hd;
            return Some(DecodeLaunch {
                kernel: names::ATTN_DECODE_FLAT[(batch as usize * 2 + quant as usize) * 3 + i],
                threads: FLAT_THREADS as u32,
                smem: (floats * 4) as u32,
                // __launch_bounds__(FLAT_THREADS, 2).
                resident: 2 * FLAT_THREADS,
            });
        }
        let kernel = match (hd, quant, batch) {
            (64, false, false) => names::ATTN_DECODE_HD64,
            (128, false, false) => names::ATTN_DECODE_HD128,
            (256, false, false) => names::ATTN_DECODE_HD256,
            (64, true, false) => names::ATTN_DECODE_Q_HD64,
            (128, true, false) => names::ATTN_DECODE_Q_HD128,
            (256, true, false) => names::ATTN_DECODE_Q_HD256,
            (64, false, true) => names::ATTN_DECODE_BATCH_HD64,
            (128, false, true) => names::ATTN_DECODE_BATCH_HD128,
            (256, false, true) => names::ATTN_DECODE_BATCH_HD256,
            (64, true, true) => names::ATTN_DECODE_BATCH_Q_HD64,
            (128, true, true) => names::ATTN_DECODE_BATCH_Q_HD128,
            _ => names::ATTN_DECODE_BATCH_Q_HD256,
        };
        // attention_decode.cu's smem: q [G][hd], logits [G][span], new k
        // and v [2][hd], rotation [hd], (max, sum) [G] and rescale [G] of
        // the softmax, q and k norm weights [2][hd] as f32; values
        // [span][hd] as f16. Registers held to keep 1024 threads resident.
        let floats = ATTN_MAX_G * hd + ATTN_MAX_G * ATTN_SPLIT + 5 * hd + 3 * ATTN_MAX_G;
        Some(DecodeLaunch {
            kernel,
            threads: decode_threads(hd),
            smem: (floats * 4 + ATTN_SPLIT * hd * 2) as u32,
            resident: 1024,
        })
    }

    /// Blocks per kv head (and token): the spans of the cache's capacity,
    /// at most
    /// [`CudaOptions::attn_decode_blocks`](super::CudaOptions::attn_decode_blocks)
    /// or, by default, as many as stay resident over the whole device at
    /// once. Deeper than that many spans each block streams several
    /// (`decode_spans` in attention_decode.cu).
    fn blocks(&self, dev: &Device, attn: &AttnArgs, n_tok: usize) -> Result<u32> {
        let per_sm = (self.resident / self.threads as usize).max(1);
        let sms = dev.info.multiprocessors.max(1) as usize;
        let per_head = (attn.n_kv as usize * n_tok).max(1);
        let cap = dev.opts.attn_decode_blocks.unwrap_or_else(|| (per_sm * sms).div_ceil(per_head));
        to_u32(cap.clamp(1, (attn.n_split as usize).max(1)), "decode attention blocks")
    }
}

/// Whether the K or the V cache of `attn` is of a quantized type.
fn quantized(attn: &AttnArgs) -> bool {
    attn.kt != 0 || attn.vt != 0
}

/// Rotates the attention output of a value cache stored rotated back
/// (`args.v_rot`: `H/√n` on blocks of `n`, its own inverse) in place, rows
/// `args.out` of `n_head · hd` values for `args.n_tok` tokens, and writes
/// its q8 copy for the output projection when `args.oq` is set
/// (`attn_unrotate`, attention.cu): after the kernels of
/// [`qkv_attention`] that leave it rotated (the decode kernels rotate
/// their own output back).
pub(crate) fn attn_unrotate(dev: &Device, args: &AttnArgs) -> Result<()> {
    let hd = args.hd as usize;
    let n = args.v_rot as usize;
    if !n.is_power_of_two() || !hd.is_multiple_of(n) || !hd.is_multiple_of(32) || hd > kernels::QKV_MAX_HD {
        return Err(Error::Device(format!("no rotation of blocks of {n} in heads of {hd} values")));
    }
    let grid = (to_u32(args.n_head as usize, "heads")?, to_u32(args.n_tok as usize, "tokens")?, 1);
    dev.launch(names::ATTN_UNROTATE, grid, 128, 0, args)
}

/// Threads of an `attn_decode_hd*` block (`DECODE_THREADS` in
/// attention_decode.cu): four query heads' outputs at once.
fn decode_threads(hd: usize) -> u32 {
    (4 * hd).max(ATTN_THREADS) as u32
}

fn check_qkv_shape(args: &QkvArgs) -> Result<()> {
    if args.hd as usize > kernels::QKV_MAX_HD || args.n_rot > args.hd {
        return Err(Error::Device(format!(
            "head_dim {} (n_rot {}) exceeds the CUDA limit {}",
            args.hd,
            args.n_rot,
            kernels::QKV_MAX_HD
        )));
    }
    Ok(())
}

/// Threads of the split-K attention kernels (`ATTN_THREADS`).
const ATTN_THREADS: usize = 256;

/// Floats of the p·v reduction space of the split-K kernels for head
/// dimension `hd`: position groups of `hd` threads, one partial per group,
/// query head and dimension (attention.cu); 0 where the kernels without
/// groups (`attn_split`, `attn_split_qkv`) run, for `hd` ≥ 256.
fn pv_reduce_len(hd: usize) -> usize {
    let n_grp = if hd < ATTN_THREADS { ATTN_THREADS / hd } else { 1 };
    if n_grp > 1 {
        n_grp * ATTN_MAX_G * hd
    } else {
        0
    }
}

/// Splits needed for a cache of `n_ctx` positions.
pub(crate) fn attn_splits(n_ctx: usize) -> usize {
    n_ctx.div_ceil(ATTN_SPLIT).max(1)
}

/// Checks the attention kernels' shape assumptions.
pub(crate) fn check_attn_shape(n_head: usize, n_kv: usize, hd: usize) -> Result<()> {
    if !hd.is_multiple_of(8) || hd > kernels::QKV_MAX_HD || n_kv == 0 || !n_head.is_multiple_of(n_kv) {
        return Err(Error::UnsupportedModel(format!(
            "the CUDA attention needs head_dim a multiple of 8 and at most {} and n_head a multiple of n_head_kv (head_dim {hd}, heads {n_head}/{n_kv})",
            kernels::QKV_MAX_HD
        )));
    }
    Ok(())
}

/// Passes of at least this many tokens run attention as one tensor-core
/// kernel over tiles of queries (`attention_prefill.cu`) where the head
/// dimension has one (64, 96, 128, 256); shorter passes and other head
/// dimensions use the split-K kernels. `CudaOptions::flash` off turns the
/// tiled kernel off (to compare the two).
pub const FLASH_MIN_TOKENS: usize = 16;

/// Whether passes of [`FLASH_MIN_TOKENS`] or more tokens over heads of
/// `hd` values run the tiled kernel (and need no split-K partial sums).
pub(crate) fn has_flash(dev: &Device, hd: usize) -> bool {
    flash_kernel(hd).is_some() && dev.opts.flash
}

/// The tiled prefill kernel for head dimension `hd`, if there is one.
fn flash_kernel(hd: usize) -> Option<kernels::KernelName> {
    match hd {
        64 => Some(names::ATTN_PREFILL_HD64),
        96 => Some(names::ATTN_PREFILL_HD96),
        128 => Some(names::ATTN_PREFILL_HD128),
        256 => Some(names::ATTN_PREFILL_HD256),
        _ => None,
    }
}

/// Quantizes the attention output for the output projection (`args.oq`).
fn quantize_attn_out(dev: &Device, args: &AttnArgs) -> Result<()> {
    let q_dim = args.n_head as usize * args.hd as usize;
    if !q_dim.is_multiple_of(32) {
        return Err(Error::Device(format!("attention output of {q_dim} values cannot be quantized in chunks of 32")));
    }
    quantize_q8(dev, args.out, args.oq, args.ods, args.n_tok as usize * q_dim / 32)
}

/// Launches attention: the tiled tensor-core kernel for passes of at least
/// [`FLASH_MIN_TOKENS`] tokens, else split-K attention and the combine;
/// then the q8 quantization of the output when `args.oq` is set.
pub(crate) fn attention(dev: &Device, args: &AttnArgs) -> Result<()> {
    let (n_head, n_kv, hd) = (args.n_head as usize, args.n_kv as usize, args.hd as usize);
    check_attn_shape(n_head, n_kv, hd)?;
    let n_tok = args.n_tok as usize;
    if let Some(k) = flash_kernel(hd).filter(|_| n_tok >= FLASH_MIN_TOKENS && dev.opts.flash) {
        // 16 rows (token, head of the group) per warp; 4 warps per block
        // when that still gives about two blocks per SM, else 2.
        let rows = n_tok * (n_head / n_kv);
        let warps = if rows.div_ceil(64) * n_kv >= 256 { 4 } else { 2 };
        let grid = (to_u32(rows.div_ceil(16 * warps), "grid")?, to_u32(n_kv, "kv heads")?, 1);
        dev.launch(k, grid, 32 * warps as u32, 0, args)?;
        if args.oq != 0 {
            quantize_attn_out(dev, args)?;
        }
        return Ok(());
    }
    let g = n_head / n_kv;
    let n_gc = g.div_ceil(ATTN_MAX_G);
    let smem = ((ATTN_MAX_G * hd + ATTN_MAX_G * ATTN_SPLIT + pv_reduce_len(hd)) * 4) as u32;
    let n_tok = to_u32(n_tok, "tokens")?;
    dev.launch(
        if pv_reduce_len(hd) > 0 { names::ATTN_SPLIT_GRP } else { names::ATTN_SPLIT },
        (to_u32(n_kv * n_gc, "grid")?, to_u32(args.n_split as usize, "splits")?, n_tok),
        ATTN_THREADS as u32,
        smem,
        args,
    )?;
    combine(dev, args)
}

/// Merges the splits of [`attention`] (and quantizes the output when
/// `args.oq` is set).
fn combine(dev: &Device, args: &AttnArgs) -> Result<()> {
    let mut c = *args;
    if args.hd % 32 != 0 {
        c.oq = 0;
        c.ods = 0;
    }
    let grid = (to_u32(args.n_head as usize, "heads")?, to_u32(args.n_tok as usize, "tokens")?, 1);
    dev.launch(names::ATTN_COMBINE, grid, 128, 0, &c)?;
    if args.hd % 32 != 0 && args.oq != 0 {
        quantize_attn_out(dev, args)?;
    }
    Ok(())
}

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

/// Blocks of the device argmax (each reduces a grid stride of the logits).
pub(crate) const ARGMAX_BLOCKS: usize = 128;

/// Writes the greedy token's key of the `n` logits at `x` to `out` (one
/// u64: the order-preserving bits of the largest logit, any NaN counting as
/// the largest, in the high half; the complement of its lowest index in the
/// low half; see [`argmax_token`]). `part` holds [`ARGMAX_BLOCKS`] u64,
/// `count` one u32 that must be 0 (the kernel leaves it 0).
pub(crate) fn argmax(dev: &Device, x: DevPtr, n: usize, part: DevPtr, count: DevPtr, out: DevPtr) -> Result<()> {
    let ni = to_i32(n, "logits")?;
    let blocks = n.div_ceil(256).clamp(1, ARGMAX_BLOCKS);
    let cfg = LaunchConfig { grid_dim: (to_u32(blocks, "grid")?, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: x holds n floats, part ARGMAX_BLOCKS u64 (blocks ≤ that),
    // count one u32, out one u64.
    unsafe {
        dev.launch_with(names::ARGMAX_LOGITS, cfg, |b| {
            b.arg(&x).arg(&ni).arg(&part).arg(&count).arg(&out);
        })
    }
}

/// The token of a key written by [`argmax`]; an error when the largest
/// logit was NaN.
pub(crate) fn argmax_token(key: u64) -> Result<u32> {
    if (key >> 32) as u32 == u32::MAX {
        return Err(Error::NonFinite("the logits"));
    }
    Ok(!(key as u32))
}

/// Threads of a `topk_rows` block.
const TOPK_THREADS: u32 = 256;

/// Blocks a [`top_k`] launch aims at: about two per SM of an H100 or H200,
/// so that one row of a decode step is selected by the whole device.
const TOPK_BLOCKS: usize = 256;

/// The fewest logits a [`top_k`] block takes while a row has more.
const TOPK_CHUNK_MIN: usize = 4096;

/// u32 words of one row of [`top_k`]'s output: `k` ids, `k` logits' bits,
/// then the row's max's bits, `ln Σ exp(x - max)`'s bits and its first
/// NaN's index (`u32::MAX` when none).
pub(crate) fn top_k_stride(k: usize) -> usize {
    2 * k + 3
}

/// How [`top_k`] splits rows of `n` logits when it selects over `rows` of
/// them: `(chunks, chunk)`, each chunk `chunk` logits (a multiple of 4, for
/// 16-byte loads) but the last.
fn top_k_chunks(n: usize, rows: usize) -> (usize, usize) {
    let want = TOPK_BLOCKS.div_ceil(rows.max(1)).min(n.div_ceil(TOPK_CHUNK_MIN)).max(1);
    let chunk = n.div_ceil(want).next_multiple_of(4);
    (n.div_ceil(chunk), chunk)
}

/// u32 words of the scratch buffer [`top_k`] needs for up to `max_rows`
/// rows of any `k`: a ticket per row, then every chunk's candidate list.
/// The buffer must be zeroed once when allocated (the tickets; each launch
/// leaves them zeroed).
pub(crate) fn top_k_scratch_words(max_rows: usize) -> usize {
    // rows · ⌈TOPK_BLOCKS / rows⌉ < rows + TOPK_BLOCKS chunks in all.
    max_rows + (max_rows + TOPK_BLOCKS) * top_k_stride(crate::backend::TOP_K_MAX)
}

/// Writes, for each of the `rows` rows of `n` logits at `x`, its `k` most
/// likely tokens (by logit descending, the lower id first on a tie; see
/// `kernels/topk.cu`) and its statistics to `out`, [`top_k_stride`]`(k)`
/// u32 words per row. `k` is 1 to `min(n, TOP_K_MAX)`; `scratch` holds
/// [`top_k_scratch_words`]`(max_rows)` words, `rows ≤ max_rows`, its
/// tickets zeroed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn top_k(
    dev: &Device,
    x: DevPtr,
    n: usize,
    rows: usize,
    k: usize,
    scratch: DevPtr,
    max_rows: usize,
    out: DevPtr,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    if k == 0 || k > n || k > crate::backend::TOP_K_MAX || rows > max_rows {
        return Err(Error::Device(format!("top-k of {k} over {rows} rows of {n} (scratch for {max_rows})")));
    }
    let (ni, ki) = (to_i32(n, "logits")?, to_i32(k, "k")?);
    to_i32(rows * n, "logits")?;
    let (chunks, chunk) = top_k_chunks(n, rows);
    let chunk_i = to_i32(chunk, "top-k chunk")?;
    let count = scratch;
    let part = scratch + 4 * max_rows as u64;
    let cfg = LaunchConfig {
        grid_dim: (to_u32(chunks, "chunks")?, to_u32(rows, "rows")?, 1),
        block_dim: (TOPK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: x holds rows·n floats, out rows·top_k_stride(k) u32 (the
    // caller's buffers); scratch holds top_k_scratch_words(max_rows) words:
    // rows ≤ max_rows tickets, then rows·chunks < rows + TOPK_BLOCKS lists
    // of top_k_stride(k) ≤ top_k_stride(TOP_K_MAX) words; k ≤ TOPK_MAX,
    // the kernel's shared arrays.
    unsafe {
        dev.launch_with(names::TOPK_ROWS, cfg, |b| {
            b.arg(&x).arg(&ni).arg(&ki).arg(&chunk_i).arg(&part).arg(&count).arg(&out);
        })
    }
}

/// Fills `out` with `rows` rows of `k` candidates from [`top_k`]'s output
/// words (`rows × top_k_stride(k)` of them).
pub(crate) fn unpack_top_k(words: &[u32], rows: usize, k: usize, out: &mut TopK) {
    let stride = top_k_stride(k);
    out.reset(rows, k);
    let (ids, logits, stats) = out.parts_mut();
    for (r, w) in words.chunks_exact(stride).take(rows).enumerate() {
        ids[r * k..(r + 1) * k].copy_from_slice(&w[..k]);
        for (dst, &bits) in logits[r * k..(r + 1) * k].iter_mut().zip(&w[k..2 * k]) {
            *dst = f32::from_bits(bits);
        }
        let nan = w[2 * k + 2];
        stats[r] = RowStats {
            max: f32::from_bits(w[2 * k]),
            log_sum_exp: f32::from_bits(w[2 * k + 1]),
            first_nan: (nan != u32::MAX).then_some(nan),
        };
    }
}

/// The launch of a kernel with one thread per value of `n` (blocks of 256).
fn elementwise_cfg(n: usize) -> Result<LaunchConfig> {
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
    kernels::matvec_kernels(ty).is_some() && (!repacked || super::repack::has_repacked(ty))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every split of `top_k`: chunks of a multiple of 4 that cover the row
    /// with none empty, and within the scratch that `top_k_scratch_words`
    /// sizes.
    #[test]
    fn top_k_chunks_cover_the_row_within_the_scratch() {
        for n in [1usize, 3, 4, 7, 4095, 4096, 4097, 32_000, 128_256, 262_144, 1 << 22] {
            for rows in [1usize, 2, 3, 7, 64, 255, 256, 257, 1000] {
                let (chunks, chunk) = top_k_chunks(n, rows);
                assert!(chunks >= 1 && chunk.is_multiple_of(4), "n {n}, rows {rows}");
                assert!(
                    chunks * chunk >= n && (chunks - 1) * chunk < n,
                    "n {n}, rows {rows}: a chunk empty or missing"
                );
                assert!(rows * chunks < rows + TOPK_BLOCKS, "n {n}, rows {rows}: {chunks} chunks");
                if n >= TOPK_CHUNK_MIN * 2 && rows == 1 {
                    assert!(chunks > 1, "n {n}: one row is split");
                }
            }
        }
    }
}
