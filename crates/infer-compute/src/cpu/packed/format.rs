//! The packed layouts' format, read by the packing (`weight.rs`), the
//! activations (`acts.rs`) and the kernels of both levels (`avx512.rs`,
//! `avx2.rs`): group and tile sizes, bytes per block, code offsets,
//! activation words, and the one table from weight types to kernels.

use crate::GgmlType;

/// Rows per interleaved group: the 16 i32 lanes of a 512-bit vector.
pub const GROUP: usize = 16;
/// Tokens per prefill tile: each unpacked weight vector feeds this many.
pub const TILE: usize = 8;

/// Bytes per block of a format's two regions: (scales, codes).
///
/// A group of 16 rows is stored as its `nb` blocks' scales (f16 ×16 per
/// block, `d` per lane; Q4_1, Q5_1: `d` ×16 then `m` ×16; Q4_K: `d` ×16
/// then `dmin` ×16), padded to 64 bytes,
/// then its `nb` code records. Code records are multiples of 64 bytes, so
/// with 64-byte aligned storage every code load is aligned. The sizes equal
/// the GGUF bytes of 16 rows, except Q4_K (+2.8%: its 6-bit scales and mins
/// are stored as bytes).
///
/// Code records (offsets in bytes; "lane `j`" is row `16g + j`):
/// - Q8_0, 512: `64m` (m < 8) lane `j` = codes `4m..4m+4` of row `j` plus
///   128, as u8.
/// - Q4_0 / Q4_1 / IQ4_NL, 256: `64m` (m < 4) lane `j` = bytes `4m..4m+4`
///   of row `j`'s `qs` (low nibbles: codes `4m..`, high nibbles: codes
///   `16 + 4m..`).
/// - Q5_0 / Q5_1, 320: as Q4_0, then at `256 + 8m` (m < 8) a 64-bit mask
///   whose bit `4j + i` is the fifth bit of code `4m + i` of row `j`.
/// - Q4_K, 2304 per super-block: `16s` (s < 8) sub-block scales (u8 ×16);
///   `128 + 32p` (p < 4) mins `(m_2p, m_2p+1)` (u8 pairs ×16);
///   `256 + 64(8c + m)` lane `j` = bytes `32c + 4m..+4` of row `j`'s `qs`
///   (low nibbles: sub-block `2c`, high: `2c + 1`).
/// - Q6_K, 3328 per super-block (codes `q` in `0..64`, value `q - 32`):
///   `16s` (s < 16) sub-block scales (i8 ×16); `256 + 64u` (u < 32) lane `j`
///   byte `i`: low nibble of code `4u + i`, high nibble of code
///   `128 + 4u + i`; `2304 + 64v` (v < 16) the codes' top two bits, at bits
///   4-5 for code `4v + i`, 6-7 for `64 + 4v + i`, 0-1 for `128 + 4v + i`
///   and 2-3 for `192 + 4v + i`.
pub const fn layout(ty: GgmlType) -> Option<(usize, usize)> {
    match ty {
        GgmlType::Q8_0 => Some((32, 512)),
        GgmlType::Q4_0 | GgmlType::IQ4_NL => Some((32, 256)),
        GgmlType::Q5_0 => Some((32, 320)),
        GgmlType::Q4_1 => Some((64, 256)),
        GgmlType::Q5_1 => Some((64, 320)),
        GgmlType::Q4_K => Some((64, 2304)),
        GgmlType::Q6_K => Some((32, 3328)),
        _ => None,
    }
}

/// The code offset of a 32-wide format: `value = code - offset` (times the
/// scale); 0 for Q4_1 and Q5_1, whose minimum is added separately.
pub(crate) const fn offset(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        GgmlType::Q4_1 | GgmlType::Q5_1 => 0,
        _ => 128,
    }
}

/// Activation words per Q8_K super-block in [`PackedActs`]: the 16 sums of
/// 16 codes (`bsums`) as i32, then the 8 sums of 32 as four i16 pairs.
pub(crate) const AUX_K: usize = 20;

/// Activation words per block in [`PackedActs`] for weights of `ty`: one
/// block sum (Q8_0 and Q8_1 activations) or [`AUX_K`] (Q8_K activations).
pub(crate) const fn aux_words(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q6_K => AUX_K,
        _ => 1,
    }
}

/// Ids of the 32-wide formats in the SIMD kernels' const parameter (both
/// levels).
pub(crate) const F_Q8_0: u8 = 0;
pub(crate) const F_Q4_0: u8 = 1;
pub(crate) const F_Q5_0: u8 = 2;
pub(crate) const F_IQ4_NL: u8 = 3;
pub(crate) const F_Q4_1: u8 = 4;
pub(crate) const F_Q5_1: u8 = 5;

/// What a kernel needs of a packed format `ty`: scale and code bytes per
/// block ([`layout`]), log2 of the 32-wide codes' offset ([`offset`]; Q4_1
/// and Q5_1 never read it) and activation words per block
/// ([`aux_words`]). `None` for types without a packed layout.
pub(crate) const fn params(ty: GgmlType) -> Option<Params> {
    match layout(ty) {
        Some((sc, rec)) => Some(Params { sc, rec, shift: offset(ty).trailing_zeros() % 32, aux_per: aux_words(ty) }),
        None => None,
    }
}

/// See [`params`].
#[derive(Clone, Copy)]
pub(crate) struct Params {
    pub sc: usize,
    pub rec: usize,
    pub shift: u32,
    pub aux_per: usize,
}

/// Expands to the kernel of packed type `$ty` through the caller's macro
/// `$k`: `$k!(q32, FLAVOUR)` for the 32-wide formats (flavour `F_*` as a
/// const parameter), `$k!(q4k)` and `$k!(q6k)` for the k-quants, nothing
/// for other types. The one type-to-kernel table of both SIMD levels.
macro_rules! by_format {
    ($ty:expr, $k:ident) => {
        match $ty {
            $crate::GgmlType::Q8_0 => $k!(q32, { $crate::cpu::packed::format::F_Q8_0 }),
            $crate::GgmlType::Q4_0 => $k!(q32, { $crate::cpu::packed::format::F_Q4_0 }),
            $crate::GgmlType::Q5_0 => $k!(q32, { $crate::cpu::packed::format::F_Q5_0 }),
            $crate::GgmlType::Q4_1 => $k!(q32, { $crate::cpu::packed::format::F_Q4_1 }),
            $crate::GgmlType::Q5_1 => $k!(q32, { $crate::cpu::packed::format::F_Q5_1 }),
            $crate::GgmlType::IQ4_NL => $k!(q32, { $crate::cpu::packed::format::F_IQ4_NL }),
            $crate::GgmlType::Q4_K => $k!(q4k),
            $crate::GgmlType::Q6_K => $k!(q6k),
            _ => {}
        }
    };
}
pub(crate) use by_format;
