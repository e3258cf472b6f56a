//! The [`ComputeBackend`] trait: every hardware-specific operation behind
//! one small interface, and [`default_backend`], which picks the best device
//! available at run time.
//!
//! Two levels:
//! - single ops (`matmul`, `matvec`, `matmul_quant`) for callers that build
//!   their own graphs or test kernels;
//! - the pipeline: [`ComputeBackend::prepare`] takes a device-independent
//!   [`ModelSpec`] and returns a [`DeviceModel`] whose weights live where the
//!   backend wants them (borrowed from the memory map on the CPU, uploaded
//!   once on a GPU). Its KV caches are created and owned by the backend.

use std::any::Any;
use std::sync::Arc;

use ndarray::{Array2, ArrayView2};

use crate::error::{shape_err, Result};
use crate::pipeline::ModelSpec;
use crate::GgmlType;

/// Shared, immutable bytes of a weight tensor: a range of an owner such as a
/// memory-mapped GGUF file (zero copy) or a `Vec<u8>`.
#[derive(Clone)]
pub struct WeightBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl WeightBytes {
    /// The whole of `owner`.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        let len = (*owner).as_ref().len();
        Self { owner, start: 0, len }
    }

    /// `len` bytes of `owner` from `start`.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the range is out of bounds.
    pub fn range(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, start: usize, len: usize) -> Result<Self> {
        let total = (*owner).as_ref().len();
        match start.checked_add(len) {
            Some(end) if end <= total => Ok(Self { owner, start, len }),
            _ => Err(shape_err("WeightBytes::range", format!("range {start}+{len} past the end of {total} bytes"))),
        }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

impl From<Vec<u8>> for WeightBytes {
    fn from(v: Vec<u8>) -> Self {
        Self::new(Arc::new(v))
    }
}

/// f32 values viewed as their bytes (4-byte aligned, as F32 weights need).
struct F32Bytes(Vec<f32>);

impl AsRef<[u8]> for F32Bytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

impl From<Vec<f32>> for WeightBytes {
    /// The bytes of f32 values, without copying them.
    fn from(v: Vec<f32>) -> Self {
        Self::new(Arc::new(F32Bytes(v)))
    }
}

impl std::fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeightBytes({} bytes)", self.len)
    }
}

/// A 2-D weight matrix in a GGUF block format: `rows` rows of `cols` values,
/// row-major, each row `ty.row_bytes(cols)` bytes (ggml's `ne[0] = cols`,
/// `ne[1] = rows`). One-dimensional tensors (norm weights, biases) have
/// `rows == 1`.
#[derive(Clone, Debug)]
pub struct QuantWeight {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: WeightBytes,
}

impl QuantWeight {
    /// Checks that `data` holds exactly `rows` rows of `cols` values of `ty`.
    ///
    /// # Errors
    /// Row length not a multiple of the block size, or a byte length that does
    /// not match the shape.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: WeightBytes) -> Result<Self> {
        let w = Self { ty, rows, cols, data };
        w.check()?;
        Ok(w)
    }

    /// Checks that the (public) fields still agree: `data` holds exactly
    /// `rows` rows of `cols` values of `ty`. Kernels call this before
    /// indexing rows, so a hand-edited weight is an error, not a panic.
    ///
    /// Also checks that the bytes are aligned for the type's blocks (GGUF
    /// aligns tensor data to 32 bytes, so mapped tensors always are).
    ///
    /// # Errors
    /// As [`QuantWeight::new`]; misaligned bytes.
    pub fn check(&self) -> Result<()> {
        let need = self.ty.row_bytes(self.cols)?.checked_mul(self.rows).ok_or(crate::Error::Overflow("weight size"))?;
        if need != self.data.as_bytes().len() {
            return Err(shape_err(
                "QuantWeight",
                format!(
                    "{}x{} {} needs {need} bytes, holds {}",
                    self.rows,
                    self.cols,
                    self.ty,
                    self.data.as_bytes().len()
                ),
            ));
        }
        let align = crate::with_block_type!(self.ty, B => std::mem::align_of::<B>());
        if self.data.as_bytes().as_ptr() as usize % align != 0 {
            return Err(shape_err("QuantWeight", format!("{} bytes must be aligned to {align}", self.ty)));
        }
        Ok(())
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        // Validated in `new`.
        self.ty.row_bytes(self.cols).unwrap_or(0)
    }

    /// The bytes of row `i` (panics if `i >= rows`, like slice indexing).
    pub fn row(&self, i: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data.as_bytes()[i * rb..(i + 1) * rb]
    }

    /// Dequantizes the whole tensor to f32 (rows × cols, row-major).
    ///
    /// # Errors
    /// Types without a dequantizer.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        self.check()?;
        let n = self.rows.checked_mul(self.cols).ok_or(crate::Error::Overflow("f32 weight size"))?;
        let mut out =
            crate::memory::zeroed::<f32>(n, &format!("a {}x{} f32 copy of {} weights", self.rows, self.cols, self.ty))?;
        if self.cols > 0 {
            for (i, chunk) in out.chunks_mut(self.cols).enumerate() {
                crate::quant::dequantize_row(self.ty, self.row(i), chunk)?;
            }
        }
        Ok(out)
    }
}

/// A compute device. Callers program against this trait only.
pub trait ComputeBackend: Send + Sync {
    /// Short name (`"cpu"`, `"cuda"`).
    fn name(&self) -> &'static str;

    /// Human-readable description of the device and the kernels selected
    /// (e.g. CPU model, SIMD path, thread count; GPU name and memory).
    fn device_info(&self) -> String;

    /// Dense f32 matrix product `a · b`: a is m×k, b is k×n, result m×n.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the inner dimensions differ.
    fn matmul(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Result<Array2<f32>>;

    /// Dense f32 product with the second operand transposed, `a · bᵀ`: a is
    /// m×k, b is n×k, result m×n (the layout of weight matrices).
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the k dimensions differ.
    fn matmul_transb(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Result<Array2<f32>>;

    /// Quantized matrix-vector product `y = W·x` (GEMV): `x` has `w.cols`
    /// values, `y` has `w.rows`. The activation is quantized to the weight
    /// type's `vec_dot_type` as ggml does (exact f32 for F32 weights).
    ///
    /// # Errors
    /// Length mismatches; types without a dot product (Q8_1, Q8_K).
    fn matvec(&self, w: &QuantWeight, x: &[f32], y: &mut [f32]) -> Result<()>;

    /// Quantized matrix product for prefill: `x` is n_tokens × w.cols,
    /// result n_tokens × w.rows (`Y = X·Wᵀ`), each weight block reused across
    /// all tokens.
    ///
    /// # Errors
    /// As [`ComputeBackend::matvec`].
    fn matmul_quant(&self, w: &QuantWeight, x: ArrayView2<'_, f32>) -> Result<Array2<f32>>;

    /// Prepares a model for this device: validates the spec, repacks or
    /// uploads the weights once, and returns the runnable model.
    ///
    /// # Errors
    /// [`crate::Error::InvalidModel`] for inconsistent specs; device errors.
    fn prepare(&self, spec: &ModelSpec) -> Result<Box<dyn DeviceModel>>;
}

/// A model prepared on one device. Runs one sequence at a time against a KV
/// cache it created.
pub trait DeviceModel: Send {
    /// Vocabulary size (length of the logits).
    fn n_vocab(&self) -> usize;

    /// Creates an empty KV cache for `n_ctx` positions on this device.
    ///
    /// # Errors
    /// Allocation failures on the device; `n_ctx == 0`.
    fn new_kv_cache(&self, n_ctx: usize) -> Result<Box<dyn KvCache>>;

    /// Runs one token at position `pos` (0-based; the cache must hold
    /// positions `0..pos`) and returns the logits, `n_vocab` values.
    ///
    /// # Errors
    /// [`crate::Error::ContextOverflow`] when `pos >= kv.n_ctx()`; a token id
    /// past the vocabulary; a cache made by another model.
    fn decode_token(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<&[f32]>;

    /// Runs `tokens` at positions `pos..pos + tokens.len()` together (batched
    /// through each layer) and returns the logits of the last one.
    ///
    /// # Errors
    /// As [`DeviceModel::decode_token`]; an empty `tokens`.
    fn prefill(&mut self, kv: &mut dyn KvCache, tokens: &[u32], pos: usize) -> Result<&[f32]>;
}

/// A KV cache owned by a backend. Opaque to callers.
pub trait KvCache: Send {
    /// Capacity in positions.
    fn n_ctx(&self) -> usize;
    /// For the owning backend to recover its concrete type.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// The best backend available here: CUDA when built with the `cuda` feature
/// and a device and driver are found, otherwise the CPU backend with the
/// best SIMD path of this processor. Never panics: a missing driver falls
/// back to the CPU.
pub fn default_backend() -> Box<dyn ComputeBackend> {
    #[cfg(feature = "cuda")]
    {
        // `CudaBackend::new` checks for the driver library first and catches
        // the loader's panics, so a machine without CUDA lands here.
        if let Ok(b) = crate::cuda::CudaBackend::new(0) {
            return Box::new(b);
        }
    }
    Box::new(crate::cpu::CpuBackend::new())
}
