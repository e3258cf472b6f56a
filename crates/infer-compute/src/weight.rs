//! Weight tensors as the backends receive them: [`WeightBytes`] (shared,
//! immutable bytes, usually a range of a memory-mapped GGUF file) and
//! [`QuantWeight`] (a 2-D matrix of one GGUF block type over such bytes).
//!
//! This module sits below the backend contract: file readers, the pipeline
//! description and every backend describe weights with it, and it depends
//! only on the block formats ([`crate::quant`]).

use std::sync::Arc;

use crate::error::{shape_err, Result};
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
        if !(self.data.as_bytes().as_ptr() as usize).is_multiple_of(align) {
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
