//! Element types of a KV cache ([`KvCacheType`]) and the pair chosen for a
//! pool's keys and values ([`KvTypes`]), named as llama.cpp's
//! `--cache-type-k` / `--cache-type-v` name them (`common/arg.cpp`,
//! `kv_cache_types`).
//!
//! Every type stores one cache position as one row of
//! `kv_dim = n_head_kv · head_dim` values, position-major
//! (`[n_ctx][n_head_kv][head_dim]`); the block types quantize that row in
//! ggml's blocks of 32 consecutive values (`quant::q8_0`, `quant::q4_0`,
//! bit-exact with ggml's `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref`),
//! so a block never straddles two heads when `head_dim` is a multiple of 32.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::GgmlType;

/// The element type of a KV cache's keys or values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvCacheType {
    /// 32-bit floats (4 bytes per value).
    F32,
    /// IEEE half floats (2 bytes per value); the default, as in llama.cpp.
    #[default]
    F16,
    /// ggml Q8_0: blocks of 32 values, an f16 scale and 32 `i8` codes
    /// (34 bytes per 32 values, 8.5 bits per value).
    Q8_0,
    /// ggml Q4_0: blocks of 32 values, an f16 scale and 32 4-bit codes
    /// offset by 8 (18 bytes per 32 values, 4.5 bits per value).
    Q4_0,
}

impl KvCacheType {
    /// Every type, in the order of [`KvCacheType::name`]'s help text.
    pub const ALL: [KvCacheType; 4] = [KvCacheType::F32, KvCacheType::F16, KvCacheType::Q8_0, KvCacheType::Q4_0];

    /// llama.cpp's name (`f32`, `f16`, `q8_0`, `q4_0`).
    pub fn name(self) -> &'static str {
        match self {
            KvCacheType::F32 => "f32",
            KvCacheType::F16 => "f16",
            KvCacheType::Q8_0 => "q8_0",
            KvCacheType::Q4_0 => "q4_0",
        }
    }

    /// The ggml type whose layout this cache type uses.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            KvCacheType::F32 => GgmlType::F32,
            KvCacheType::F16 => GgmlType::F16,
            KvCacheType::Q8_0 => GgmlType::Q8_0,
            KvCacheType::Q4_0 => GgmlType::Q4_0,
        }
    }

    /// Values per block (1 for the float types, 32 for the block types):
    /// `head_dim` must be a multiple of it.
    pub fn block_size(self) -> usize {
        self.ggml_type().block_size()
    }

    /// Bytes of `n` values.
    ///
    /// # Errors
    /// [`Error::RowNotBlockMultiple`] when `n` is not a multiple of the
    /// block size; [`Error::Overflow`].
    pub fn row_bytes(self, n: usize) -> Result<usize> {
        self.ggml_type().row_bytes(n)
    }

    /// Storage bits per value, scales included (32, 16, 8.5, 4.5).
    pub fn bits_per_value(self) -> f64 {
        let t = self.ggml_type();
        (t.type_size() * 8) as f64 / t.block_size() as f64
    }

    /// Whether a head of `head_dim` values can be stored: a whole number of
    /// blocks.
    ///
    /// # Errors
    /// [`Error::UnsupportedKvCache`] saying why not.
    pub fn check_head_dim(self, head_dim: usize) -> Result<()> {
        if head_dim == 0 || !head_dim.is_multiple_of(self.block_size()) {
            return Err(Error::UnsupportedKvCache {
                ty: self,
                reason: format!("head_dim {head_dim} is not a multiple of its block size {}", self.block_size()),
            });
        }
        Ok(())
    }
}

impl fmt::Display for KvCacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvCacheType {
    type Err = Error;

    /// Parses llama.cpp's name (case-insensitive).
    ///
    /// # Errors
    /// [`Error::UnknownKvCacheType`] naming the input.
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.to_ascii_lowercase();
        KvCacheType::ALL.into_iter().find(|t| t.name() == lower).ok_or_else(|| Error::UnknownKvCacheType(s.to_owned()))
    }
}

/// The element types of a pool's keys (`k`) and values (`v`), chosen
/// separately as with llama.cpp's `-ctk` and `-ctv`. The default is f16 for
/// both, llama.cpp's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct KvTypes {
    pub k: KvCacheType,
    pub v: KvCacheType,
}

impl KvTypes {
    /// Keys and values of type `ty`.
    pub fn both(ty: KvCacheType) -> Self {
        KvTypes { k: ty, v: ty }
    }

    /// Bytes one cache position takes over all layers, keys and values:
    /// `Σ_layers row_bytes_k(kv_dim) + row_bytes_v(kv_dim)` for the layers'
    /// `kv_dim = n_head_kv · head_dim`.
    ///
    /// # Errors
    /// As [`KvCacheType::row_bytes`].
    pub fn bytes_per_token(self, kv_dims: impl IntoIterator<Item = usize>) -> Result<u64> {
        let mut total = 0u64;
        for d in kv_dims {
            total += (self.k.row_bytes(d)? + self.v.row_bytes(d)?) as u64;
        }
        Ok(total)
    }
}

impl fmt::Display for KvTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "K {}, V {}", self.k, self.v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes() {
        for t in KvCacheType::ALL {
            assert_eq!(t.name().parse::<KvCacheType>().unwrap(), t);
            assert_eq!(t.name().to_uppercase().parse::<KvCacheType>().unwrap(), t);
        }
        assert!(matches!("q4_k".parse::<KvCacheType>(), Err(Error::UnknownKvCacheType(s)) if s == "q4_k"));
        let bits: Vec<f64> = KvCacheType::ALL.iter().map(|t| t.bits_per_value()).collect();
        assert_eq!(bits, [32.0, 16.0, 8.5, 4.5]);
        assert_eq!(KvCacheType::Q8_0.row_bytes(64).unwrap(), 68);
        assert_eq!(KvCacheType::Q4_0.row_bytes(64).unwrap(), 36);
        assert!(KvCacheType::Q4_0.row_bytes(48).is_err());
        assert!(KvCacheType::Q8_0.check_head_dim(80).is_err());
        assert!(KvCacheType::F16.check_head_dim(80).is_ok());
        assert!(KvCacheType::F16.check_head_dim(0).is_err());
        assert_eq!(KvTypes::default(), KvTypes::both(KvCacheType::F16));
        let t = KvTypes { k: KvCacheType::Q8_0, v: KvCacheType::F16 };
        // Two layers of kv_dim 64: (68 + 128) · 2.
        assert_eq!(t.bytes_per_token([64, 64]).unwrap(), 392);
        assert_eq!(t.to_string(), "K q8_0, V f16");
    }
}
