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
//! The TurboQuant types (`tq3`, `tq4`; [`crate::turboquant`]) code each
//! head's `head_dim` values as one vector: an f16 scale, then `head_dim`
//! indices of 3 or 4 bits ([`crate::turboquant`]'s code layout, rotation
//! seed [`crate::turboquant::DEFAULT_SEED`]), so `head_dim` must be a power
//! of two (its Walsh–Hadamard rotation). That is every position's bytes;
//! besides, each slot of a cache keeps its first [`TQ_EXACT_POSITIONS`]
//! positions in f16 (in the rotated basis; a fixed
//! `TQ_EXACT_POSITIONS · kv_dim · 2` bytes per slot and layer, not per
//! token, so not in [`KvTypes::bytes_per_token`]) and one centre of
//! `kv_dim` f32: the mean of those exact rows from position
//! [`TQ_CENTRE_FROM`] on, set when the last of them is written. A
//! position past them is stored as the code of its row less that centre
//! ([`crate::turboquant::TurboQuant::encode_rotated_norm_kept`], scale
//! `‖y‖ / ‖c[idx]‖`, [`TQ_REFINE_PASSES`] sweeps), read back as the decoded
//! code plus the centre; a query reads the rows within [`TQ_WINDOW`]
//! positions of it in f16 (each slot keeps its last `TQ_WINDOW` rows so,
//! besides their codes: `TQ_WINDOW · kv_dim · 2` bytes per slot and
//! layer). Keys of a layer with q and k norms of one gain
//! per head channel are multiplied per channel by a scale fixed from those
//! gains before the rotation, and the queries that meet them divided by it
//! ([`crate::turboquant::ChannelScale`]). A position's stored bits depend
//! only on its own row and on its slot's rows `TQ_CENTRE_FROM ..
//! TQ_EXACT_POSITIONS`, so a prompt prefilled in any chunks and the same
//! tokens decoded one by one store the same bits.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::GgmlType;

/// Positions at the start of each slot that a TurboQuant cache (`tq3`,
/// `tq4`) stores in f16 instead of coding them: the attention sinks (the
/// first token draws much of many heads' attention, with a key and value
/// unlike the others') and the rows the centre is taken from.
pub const TQ_EXACT_POSITIONS: usize = 16;

/// Positions within which of a query a TurboQuant cache's keys and values
/// are read exact (f16): each slot keeps its last `TQ_WINDOW` rows in f16
/// besides their codes, and a query at position `i` reads rows
/// `i − TQ_WINDOW < j ≤ i` from them, older rows from their codes (KIVI's
/// full-precision residual of recent tokens, Liu et al. 2024, "KIVI: A
/// Tuning-Free Asymmetric 2bit Quantization for KV Cache"). Most
/// attention falls on the recent rows, where a code's error costs most:
/// perplexity over the f16 cache at `-c 2048` went from +6.1% / +8.1%
/// (SmolLM2 / Gemma 3 270M, tq4) to about +0.6% / +0.8% (BENCHMARKS.md).
/// A fixed `TQ_WINDOW · kv_dim · 2` bytes per slot, layer, K and V.
pub const TQ_WINDOW: usize = 128;

/// The power `p` of a TurboQuant value cache's scale `s_i = (1 / r_i)^p`
/// ([`crate::turboquant::ChannelScale::for_values`]). Perplexity of a tq3
/// cache over the f16 cache's, whole benchmark text at `-c 2048`
/// (BENCHMARKS.md, "A fixed value scale"): Gemma 3 270M +3.23% without a scale, +2.34% at 3/8,
/// +2.55% at 1/2, +3.08% at 1; SmolLM2 135M +2.25% without, +2.13% at
/// 1/2. (Had `r_i` the channels' true variances, 1/4 would minimize the
/// output's squared error; the weights' estimate spreads less than the
/// data do, so a larger power.)
pub const TQ_VALUE_SCALE_POWER: f64 = 0.5;

/// The first exact position of the TurboQuant centre's mean (position 0,
/// the usual sink, is left out: its key is a poor centre).
pub const TQ_CENTRE_FROM: usize = 1;

/// Sweeps of [`crate::turboquant::TurboQuant::encode_rotated_norm_kept`]
/// by which a TurboQuant cache refines each code's direction.
pub const TQ_REFINE_PASSES: usize = 2;

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
    /// TurboQuant, 3-bit indices: per head, an f16 scale and `head_dim`
    /// 3-bit indices (`2 + 3·head_dim/8` bytes, `3 + 16/head_dim` bits per
    /// value: 3.25 at head_dim 64, 3.0625 at 256).
    Tq3,
    /// TurboQuant, 4-bit indices: per head, an f16 scale and `head_dim`
    /// 4-bit indices (`2 + head_dim/2` bytes, `4 + 16/head_dim` bits per
    /// value: 4.25 at head_dim 64, 4.0625 at 256).
    Tq4,
}

impl KvCacheType {
    /// Every type, in the order of [`KvCacheType::name`]'s help text.
    pub const ALL: [KvCacheType; 6] =
        [KvCacheType::F32, KvCacheType::F16, KvCacheType::Q8_0, KvCacheType::Q4_0, KvCacheType::Tq3, KvCacheType::Tq4];

    /// llama.cpp's name (`f32`, `f16`, `q8_0`, `q4_0`), and `tq3`, `tq4`.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheType::F32 => "f32",
            KvCacheType::F16 => "f16",
            KvCacheType::Q8_0 => "q8_0",
            KvCacheType::Q4_0 => "q4_0",
            KvCacheType::Tq3 => "tq3",
            KvCacheType::Tq4 => "tq4",
        }
    }

    /// The ggml type whose layout this cache type uses (`None` for the
    /// TurboQuant types, which ggml does not have).
    pub fn ggml_type(self) -> Option<GgmlType> {
        match self {
            KvCacheType::F32 => Some(GgmlType::F32),
            KvCacheType::F16 => Some(GgmlType::F16),
            KvCacheType::Q8_0 => Some(GgmlType::Q8_0),
            KvCacheType::Q4_0 => Some(GgmlType::Q4_0),
            KvCacheType::Tq3 | KvCacheType::Tq4 => None,
        }
    }

    /// The index bits of a TurboQuant type (3, 4), `None` for the others.
    pub fn turboquant_bits(self) -> Option<u32> {
        match self {
            KvCacheType::Tq3 => Some(3),
            KvCacheType::Tq4 => Some(4),
            _ => None,
        }
    }

    /// The block `n` of the Sylvester–Hadamard rotation `H/√n` that a
    /// cache of this type stores its keys (`keys`) or values in, on every
    /// backend: q8_0 and q4_0 when `head_dim` is a multiple of 64, keys in
    /// the largest power of two from 64 on that divides `head_dim`, values
    /// in 64, as llama.cpp does by default for a quantized cache since its
    /// PR 21038 (`llama-kv-cache.cpp`, `n_rot_k`, `n_rot_v`); `None` for
    /// the others (f32 and f16 are stored as computed; the TurboQuant types
    /// have their own rotation of the whole head).
    pub fn hadamard_block(self, head_dim: usize, keys: bool) -> Option<usize> {
        match self {
            KvCacheType::Q8_0 | KvCacheType::Q4_0 if head_dim.is_multiple_of(64) => {
                let mut n = 64;
                while keys && head_dim.is_multiple_of(2 * n) {
                    n *= 2;
                }
                Some(n)
            }
            _ => None,
        }
    }

    /// Bytes of one head's row of `head_dim` values.
    ///
    /// # Errors
    /// As [`KvCacheType::check_head_dim`].
    pub fn head_bytes(self, head_dim: usize) -> Result<usize> {
        self.check_head_dim(head_dim)?;
        match (self.ggml_type(), self.turboquant_bits()) {
            (Some(t), _) => t.row_bytes(head_dim),
            (None, Some(b)) => Ok(2 + head_dim * b as usize / 8),
            (None, None) => unreachable!("every cache type is a ggml type or a TurboQuant one"),
        }
    }

    /// Bytes of one cache position of `n_head_kv` heads of `head_dim`
    /// values.
    ///
    /// # Errors
    /// As [`KvCacheType::check_head_dim`]; [`Error::Overflow`].
    pub fn row_bytes(self, n_head_kv: usize, head_dim: usize) -> Result<usize> {
        self.head_bytes(head_dim)?.checked_mul(n_head_kv).ok_or(Error::Overflow("the bytes of a KV cache row"))
    }

    /// Storage bits per value of heads of `head_dim` values, scales and
    /// norms included (32, 16, 8.5, 4.5; TurboQuant `b + 16/head_dim`), or
    /// `None` when such a head cannot be stored.
    pub fn bits_per_value(self, head_dim: usize) -> Option<f64> {
        Some((self.head_bytes(head_dim).ok()? * 8) as f64 / head_dim as f64)
    }

    /// Whether a head of `head_dim` values can be stored: a whole number of
    /// blocks, or for the TurboQuant types a power of two of at least 16
    /// (the rotation is a Walsh–Hadamard transform; the CPU decodes 16
    /// indices at a time).
    ///
    /// # Errors
    /// [`Error::UnsupportedKvCache`] saying why not.
    pub fn check_head_dim(self, head_dim: usize) -> Result<()> {
        let reason = match self.ggml_type() {
            Some(t) if head_dim == 0 || !head_dim.is_multiple_of(t.block_size()) => {
                format!("head_dim {head_dim} is not a multiple of its block size {}", t.block_size())
            }
            None if head_dim < 16 || !head_dim.is_power_of_two() => format!(
                "head_dim {head_dim} is not a power of two of at least 16 (TurboQuant rotates each head by a \
                 Walsh–Hadamard transform)"
            ),
            _ => return Ok(()),
        };
        Err(Error::UnsupportedKvCache { ty: self, reason })
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
    /// `Σ_layers row_bytes_k + row_bytes_v` for the layers' `(n_head_kv,
    /// head_dim)`.
    ///
    /// # Errors
    /// As [`KvCacheType::row_bytes`].
    pub fn bytes_per_token(self, layers: impl IntoIterator<Item = (usize, usize)>) -> Result<u64> {
        let mut total = 0u64;
        for (n_head_kv, head_dim) in layers {
            total += (self.k.row_bytes(n_head_kv, head_dim)? + self.v.row_bytes(n_head_kv, head_dim)?) as u64;
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
        let bits: Vec<f64> = KvCacheType::ALL.iter().map(|t| t.bits_per_value(64).unwrap()).collect();
        assert_eq!(bits, [32.0, 16.0, 8.5, 4.5, 3.25, 4.25]);
        assert_eq!(KvCacheType::Tq4.bits_per_value(256), Some(4.0625));
        assert_eq!(KvCacheType::Q8_0.row_bytes(1, 64).unwrap(), 68);
        assert_eq!(KvCacheType::Q4_0.row_bytes(2, 32).unwrap(), 36);
        assert_eq!(KvCacheType::Tq3.row_bytes(2, 64).unwrap(), 2 * 26);
        assert_eq!(KvCacheType::Tq4.head_bytes(128).unwrap(), 66);
        assert!(KvCacheType::Q4_0.row_bytes(1, 48).is_err());
        assert!(KvCacheType::Q8_0.check_head_dim(80).is_err());
        assert!(KvCacheType::F16.check_head_dim(80).is_ok());
        assert!(KvCacheType::F16.check_head_dim(0).is_err());
        for hd in [0, 8, 96, 80] {
            assert!(matches!(KvCacheType::Tq4.check_head_dim(hd), Err(Error::UnsupportedKvCache { .. })), "{hd}");
        }
        assert_eq!(KvCacheType::Tq3.bits_per_value(96), None);
        assert_eq!(KvTypes::default(), KvTypes::both(KvCacheType::F16));
        let t = KvTypes { k: KvCacheType::Q8_0, v: KvCacheType::F16 };
        // Two layers of one 64-value head: (68 + 128) · 2.
        assert_eq!(t.bytes_per_token([(1, 64), (1, 64)]).unwrap(), 392);
        assert_eq!(t.to_string(), "K q8_0, V f16");
    }
}
