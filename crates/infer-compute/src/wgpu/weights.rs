//! Weight matrices on the device ([`DevWeight`]): GGUF blocks as they are,
//! split into row blocks of at most `max_storage_buffer_binding_size` bytes
//! (a 262 144 × n_embd output matrix passes the 128 MiB to 2 GiB bindings
//! of most adapters), and the product over them ([`record_matvec`]).

use super::context::Gpu;
use super::shaders::{Kernel, Variant, WEIGHT_TYPES};
use super::step::{Step, Tag, P};
use crate::error::{shape_err, Error, Result};
use crate::weight::QuantWeight;
use crate::GgmlType;

/// Tokens per workgroup of `matvec.wgsl`'s `main` (`TT`).
const TT: usize = 4;
/// Rows and tokens per workgroup of `main_tiled` (`TM`, `TN`).
const TM: usize = 16;
const TN: usize = 16;
/// Rows and tokens per workgroup of `matmul_quant.wgsl` (`BM`, `BN`).
const BM: usize = 64;
const BN: usize = 64;

/// The product kernel for `n_tok` tokens, with its rows and tokens per
/// workgroup: a row and 4-token tiles below 8 tokens, the
/// 16 × 16 tiled product from 8 and the 64 × 64 GEMM from 64 (fewer
/// tokens would leave most of a tile empty).
fn product_kernel(n_tok: usize) -> (Kernel, usize, usize) {
    match n_tok {
        0..=7 => (Kernel::Matvec, 1, TT),
        8..=63 => (Kernel::MatvecTiled, TM, TN),
        _ => (Kernel::MatmulQuant, BM, BN),
    }
}

/// Byte offsets are u32 in the kernels: no binding larger than this.
const MAX_KERNEL_BYTES: u64 = 1 << 31;

/// Row block `row0..row0 + rows` of a matrix in a buffer of its own.
pub struct Part {
    pub buf: wgpu::Buffer,
    pub row0: usize,
    pub rows: usize,
}

/// A `rows × cols` matrix of `ty` on the device.
pub struct DevWeight {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    pub parts: Vec<Part>,
    /// Bytes uploaded.
    pub bytes: usize,
}

/// [`Error::Unsupported`] unless `ty` has a kernel here.
pub fn check_type(ty: GgmlType) -> Result<()> {
    if WEIGHT_TYPES.contains(&ty) {
        Ok(())
    } else {
        Err(Error::Unsupported { op: "wgpu product", ty })
    }
}

/// The largest binding the kernels may use on `gpu`, in bytes.
pub fn binding_limit(gpu: &Gpu) -> u64 {
    gpu.caps.max_storage_binding.min(gpu.caps.max_buffer).min(MAX_KERNEL_BYTES)
}

impl DevWeight {
    /// Uploads `w` (checked) in row blocks that fit one binding.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a type without a kernel; the errors of
    /// [`QuantWeight::check`]; [`Error::UnsupportedModel`] naming
    /// `max_storage_buffer_binding_size` when one row does not fit a
    /// binding; out of memory.
    pub fn upload(gpu: &Gpu, w: &QuantWeight, what: &str) -> Result<Self> {
        check_type(w.ty)?;
        w.check()?;
        let rb = w.row_bytes();
        let limit = binding_limit(gpu).min(gpu.weight_part_bytes.unwrap_or(u64::MAX)).saturating_sub(8);
        let per_part = if rb == 0 { w.rows.max(1) } else { (limit / rb as u64) as usize };
        if per_part == 0 {
            return Err(Error::UnsupportedModel(format!(
                "{what}: a row of {rb} bytes exceeds the adapter's max_storage_buffer_binding_size of {} bytes",
                gpu.caps.max_storage_binding
            )));
        }
        let bytes = w.data.as_bytes();
        let mut parts = Vec::new();
        let mut row0 = 0;
        while row0 < w.rows || parts.is_empty() {
            let rows = per_part.min(w.rows - row0);
            let buf = gpu.upload(what, &bytes[row0 * rb..(row0 + rows) * rb])?;
            parts.push(Part { buf, row0, rows });
            row0 += rows;
            if rows == 0 {
                break;
            }
        }
        Ok(DevWeight { ty: w.ty, rows: w.rows, cols: w.cols, row_bytes: rb, parts, bytes: bytes.len() })
    }
}

impl DevWeight {
    /// `a`'s rows, then `b`'s, as one matrix (a gated FFN's gate and up:
    /// one dispatch reads both, [`record_glu`]); `None` when their types or
    /// widths differ.
    ///
    /// # Errors
    /// As [`DevWeight::upload`]; out of host memory for the joined copy.
    pub fn upload_stacked(gpu: &Gpu, a: &QuantWeight, b: &QuantWeight, what: &str) -> Result<Option<Self>> {
        if a.ty != b.ty || a.cols != b.cols {
            return Ok(None);
        }
        check_type(a.ty)?;
        a.check()?;
        b.check()?;
        let (ab, bb) = (a.data.as_bytes(), b.data.as_bytes());
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(ab.len() + bb.len()).map_err(|_| Error::OutOfMemory {
            what: format!("{what} (host copy)"),
            bytes: (ab.len() + bb.len()) as u64,
        })?;
        bytes.extend_from_slice(ab);
        bytes.extend_from_slice(bb);
        let w = QuantWeight::new(a.ty, a.rows + b.rows, a.cols, bytes.into())?;
        Self::upload(gpu, &w, what).map(Some)
    }
}

/// Where the activations of a product are and where its results go: `n_tok`
/// rows of `x` from value `x_off` every `x_stride` values; results of token
/// `t`, row `r` at `y[y_off + t · y_stride + r]`, soft-capped by `cap`
/// when positive.
#[derive(Clone, Copy)]
pub struct ProductIo<'a> {
    pub x: &'a wgpu::Buffer,
    pub x_off: usize,
    pub x_stride: usize,
    pub n_tok: usize,
    pub y: &'a wgpu::Buffer,
    pub y_off: usize,
    pub y_stride: usize,
    pub cap: f32,
}

fn u32_of(v: usize, what: &'static str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Overflow(what))
}

/// Records `Y = X · Wᵀ` over every row block of `w` (one dispatch each).
///
/// # Errors
/// [`Error::Overflow`] for offsets past the kernels' 32-bit indices; those
/// of [`Step::dispatch`].
pub fn record_matvec(step: &mut Step<'_>, w: &DevWeight, io: ProductIo<'_>) -> Result<()> {
    record_matvec_rows(step, w, 0..w.rows, io)
}

/// [`record_matvec`] over rows `rows` of `w` only (one half of a stacked
/// gate/up matrix): its row `rows.start + r` gives result row `r`.
///
/// # Errors
/// As [`record_matvec`].
pub fn record_matvec_rows(
    step: &mut Step<'_>,
    w: &DevWeight,
    rows: std::ops::Range<usize>,
    io: ProductIo<'_>,
) -> Result<()> {
    let (kernel, rows_per_group, toks_per_group) = product_kernel(io.n_tok);
    let z = u32_of(io.n_tok.div_ceil(toks_per_group), "token tiles")?;
    for part in &w.parts {
        // The part's rows inside `rows`, from its own row `lo`.
        let lo = rows.start.max(part.row0);
        let hi = rows.end.min(part.row0 + part.rows);
        if lo >= hi {
            continue;
        }
        let [gx, gy] = step.grid((hi - lo).div_ceil(rows_per_group));
        let params = product_params(w, hi - lo, lo - part.row0, io, io.y_off + lo - rows.start, false)?;
        step.tag(Tag {
            op: "matvec".into(),
            ty: w.ty.name().into(),
            shape: format!("{}x{}", w.rows, w.cols),
            bytes: ((hi - lo) * w.row_bytes) as u64,
        });
        step.dispatch(kernel, Variant::Weight(w.ty), &[(0, &part.buf), (1, io.x), (2, io.y)], 3, &params, [gx, gy, z])?;
    }
    Ok(())
}

/// The parameter words of a product (`Params` in product.wgsl) of `rows`
/// rows from the part's row `w_row0`, results from `y_off`.
fn product_params(
    w: &DevWeight,
    rows: usize,
    w_row0: usize,
    io: ProductIo<'_>,
    y_off: usize,
    gelu: bool,
) -> Result<[P; 11]> {
    Ok([
        P::U(u32_of(rows, "rows")?),
        P::U(u32_of(w.cols, "cols")?),
        P::U(u32_of(io.n_tok, "tokens")?),
        P::U(u32_of(w.row_bytes, "row bytes")?),
        P::U(u32_of(io.x_off, "activation offset")?),
        P::U(u32_of(io.x_stride, "activation stride")?),
        P::U(u32_of(y_off, "result offset")?),
        P::U(u32_of(io.y_stride, "result stride")?),
        P::F(io.cap),
        P::U(u32_of(w_row0, "weight row")?),
        P::U(gelu as u32),
    ])
}

/// Whether [`record_glu`] runs `n_tok` tokens of the stacked gate/up
/// matrix `w`: a decode-sized batch (the `main` kernel's), and the matrix
/// in one binding (gate row r and up row n_ff + r read in one workgroup).
pub fn fused_glu(w: &DevWeight, n_tok: usize) -> bool {
    product_kernel(n_tok).0 == Kernel::Matvec && w.parts.len() == 1
}

/// Records `y = act(x · Gᵀ) ⊙ (x · Uᵀ)` over a stacked matrix `w` of `n_ff`
/// gate rows then `n_ff` up rows, as one dispatch (`main_glu`); GELU
/// (tanh) when `gelu`, else SiLU. Check [`fused_glu`] first.
///
/// # Errors
/// [`Error::Shape`] when `w` is not `2 · n_ff` rows in one binding; as
/// [`record_matvec`].
pub fn record_glu(step: &mut Step<'_>, w: &DevWeight, n_ff: usize, gelu: bool, io: ProductIo<'_>) -> Result<()> {
    if !fused_glu(w, io.n_tok) || w.rows != 2 * n_ff {
        return Err(shape_err("wgpu glu", format!("{} rows in {} bindings for n_ff {n_ff}", w.rows, w.parts.len())));
    }
    let z = u32_of(io.n_tok.div_ceil(TT), "token tiles")?;
    let [gx, gy] = step.grid(n_ff);
    let params = product_params(w, n_ff, 0, io, io.y_off, gelu)?;
    step.tag(Tag {
        op: "matvec_glu".into(),
        ty: w.ty.name().into(),
        shape: format!("{}x{}", w.rows, w.cols),
        bytes: (w.rows * w.row_bytes) as u64,
    });
    step.dispatch(
        Kernel::MatvecGlu,
        Variant::Weight(w.ty),
        &[(0, &w.parts[0].buf), (1, io.x), (2, io.y)],
        3,
        &params,
        [gx, gy, z],
    )
}

/// Checks a product's operands: `x` of `n_tok × w.cols` values.
///
/// # Errors
/// [`Error::Shape`].
pub fn check_x(w: &QuantWeight, x_len: usize, n_tok: usize, op: &'static str) -> Result<()> {
    if n_tok.checked_mul(w.cols) != Some(x_len) {
        return Err(shape_err(op, format!("x has {x_len} values, want {n_tok} x {}", w.cols)));
    }
    Ok(())
}
