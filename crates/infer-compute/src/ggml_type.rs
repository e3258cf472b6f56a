//! ggml tensor types: ids, names and block geometry, as stored in GGUF files.
//!
//! Ids and sizes follow ggml's `ggml_type` enum and `type_traits` table
//! (ggml/src/ggml.c). A type is data, not behaviour: kernels dispatch on it.

use crate::error::{Error, Result};

/// A ggml tensor element type. Discriminants are ggml's numeric ids (the
/// values stored in GGUF tensor infos).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ4_NL = 20,
    BF16 = 30,
}

impl GgmlType {
    /// Every supported type, in id order.
    pub const ALL: [GgmlType; 16] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ4_NL,
        GgmlType::BF16,
    ];

    /// The type for a ggml id.
    ///
    /// # Errors
    /// [`Error::UnknownType`] for ids this library does not support
    /// (including ids ggml has removed or that we do not implement).
    pub fn from_id(id: u32) -> Result<Self> {
        Self::ALL.iter().copied().find(|t| *t as u32 == id).ok_or(Error::UnknownType(id))
    }

    /// ggml's id of this type.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name (`"q4_K"`, `"f16"`, ...), as printed by ggml and GGUF tools.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q8_1 => "q8_1",
            GgmlType::Q2_K => "q2_K",
            GgmlType::Q3_K => "q3_K",
            GgmlType::Q4_K => "q4_K",
            GgmlType::Q5_K => "q5_K",
            GgmlType::Q6_K => "q6_K",
            GgmlType::Q8_K => "q8_K",
            GgmlType::IQ4_NL => "iq4_nl",
            GgmlType::BF16 => "bf16",
        }
    }

    /// Parses ggml's name (exact, case-sensitive as ggml prints it; upper
    /// case is accepted too).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.name() == name || t.name().eq_ignore_ascii_case(name))
    }

    /// Number of values in one block (1 for plain float types).
    pub const fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1
            | GgmlType::IQ4_NL => 32,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_K => 256,
        }
    }

    /// Bytes in one block.
    pub const fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::Q8_K => 292,
            GgmlType::IQ4_NL => 18,
        }
    }

    /// Bits per weight, including scales.
    pub fn bits_per_weight(self) -> f64 {
        self.type_size() as f64 * 8.0 / self.block_size() as f64
    }

    /// The activation type this weight type is paired with in dot products
    /// (ggml's `vec_dot_type`), or `None` for activation-only types.
    pub fn vec_dot_type(self) -> Option<GgmlType> {
        match self {
            GgmlType::F32 => Some(GgmlType::F32),
            GgmlType::F16 => Some(GgmlType::F16),
            GgmlType::BF16 => Some(GgmlType::BF16),
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => Some(GgmlType::Q8_0),
            GgmlType::Q4_1 | GgmlType::Q5_1 => Some(GgmlType::Q8_1),
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => Some(GgmlType::Q8_K),
            GgmlType::Q8_1 | GgmlType::Q8_K => None,
        }
    }

    /// Bytes of one row of `cols` values.
    ///
    /// # Errors
    /// [`Error::RowNotBlockMultiple`] when `cols` is not a multiple of the
    /// block size; [`Error::Overflow`] when the size does not fit `usize`.
    pub fn row_bytes(self, cols: usize) -> Result<usize> {
        let bs = self.block_size();
        if !cols.is_multiple_of(bs) {
            return Err(Error::RowNotBlockMultiple { ty: self, cols, block_size: bs });
        }
        (cols / bs).checked_mul(self.type_size()).ok_or(Error::Overflow("row size"))
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
