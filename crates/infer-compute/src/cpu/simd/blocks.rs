//! How the kernels of every level read a block's bytes: the record sizes
//! and field offsets ([`layout`]), unaligned little-endian reads, and the
//! word-parallel unpacking of the k-quants' packed 6-bit scales. The bottom
//! of the row-dot kernels, beside `level.rs`: it imports nothing from them.

/// Byte layout of the blocks, shared by the kernels of every level: record
/// sizes and field offsets taken from the structs of `quant/<type>.rs`
/// (`size_of`, `offset_of!`), so a kernel's pointer arithmetic cannot drift
/// from the format's one definition.
#[allow(dead_code)]
pub(crate) mod layout {
    use core::mem::{offset_of, size_of};

    use crate::quant::*;

    /// Q8_0 record, and the offset of its `qs` (after `d: f16`).
    pub const Q8_0: usize = size_of::<BlockQ8_0>();
    pub const Q8_0_QS: usize = offset_of!(BlockQ8_0, qs);
    /// Q8_1 record: `d`, `s` (`d · Σ qs`), `qs`.
    pub const Q8_1: usize = size_of::<BlockQ8_1>();
    pub const Q8_1_S: usize = offset_of!(BlockQ8_1, s);
    pub const Q8_1_QS: usize = offset_of!(BlockQ8_1, qs);
    /// Q4_0 record: `d`, `qs`.
    pub const Q4_0: usize = size_of::<BlockQ4_0>();
    pub const Q4_0_QS: usize = offset_of!(BlockQ4_0, qs);
    /// Q4_1 record: `d`, `m`, `qs`.
    pub const Q4_1: usize = size_of::<BlockQ4_1>();
    pub const Q4_1_M: usize = offset_of!(BlockQ4_1, m);
    pub const Q4_1_QS: usize = offset_of!(BlockQ4_1, qs);
    /// Q5_0 record: `d`, `qh`, `qs`.
    pub const Q5_0: usize = size_of::<BlockQ5_0>();
    pub const Q5_0_QH: usize = offset_of!(BlockQ5_0, qh);
    pub const Q5_0_QS: usize = offset_of!(BlockQ5_0, qs);
    /// Q5_1 record: `d`, `m`, `qh`, `qs`.
    pub const Q5_1: usize = size_of::<BlockQ5_1>();
    pub const Q5_1_M: usize = offset_of!(BlockQ5_1, m);
    pub const Q5_1_QH: usize = offset_of!(BlockQ5_1, qh);
    pub const Q5_1_QS: usize = offset_of!(BlockQ5_1, qs);
    /// IQ4_NL record: `d`, `qs`.
    pub const IQ4_NL: usize = size_of::<BlockIQ4NL>();
    pub const IQ4_NL_QS: usize = offset_of!(BlockIQ4NL, qs);
    /// Q8_K record: `d: f32`, `qs`, `bsums`.
    pub const Q8_K: usize = size_of::<BlockQ8K>();
    pub const Q8_K_QS: usize = offset_of!(BlockQ8K, qs);
    pub const Q8_K_BSUMS: usize = offset_of!(BlockQ8K, bsums);
    /// Q2_K record: `scales`, `qs`, `d`, `dmin`.
    pub const Q2_K: usize = size_of::<BlockQ2K>();
    pub const Q2_K_QS: usize = offset_of!(BlockQ2K, qs);
    pub const Q2_K_D: usize = offset_of!(BlockQ2K, d);
    pub const Q2_K_DMIN: usize = offset_of!(BlockQ2K, dmin);
    /// Q3_K record: `hmask`, `qs`, `scales`, `d`.
    pub const Q3_K: usize = size_of::<BlockQ3K>();
    pub const Q3_K_QS: usize = offset_of!(BlockQ3K, qs);
    pub const Q3_K_SCALES: usize = offset_of!(BlockQ3K, scales);
    pub const Q3_K_D: usize = offset_of!(BlockQ3K, d);
    /// Q4_K record: `d`, `dmin`, `scales`, `qs`.
    pub const Q4_K: usize = size_of::<BlockQ4K>();
    pub const Q4_K_DMIN: usize = offset_of!(BlockQ4K, dmin);
    pub const Q4_K_SCALES: usize = offset_of!(BlockQ4K, scales);
    pub const Q4_K_QS: usize = offset_of!(BlockQ4K, qs);
    /// Q5_K record: `d`, `dmin`, `scales`, `qh`, `qs`.
    pub const Q5_K: usize = size_of::<BlockQ5K>();
    pub const Q5_K_DMIN: usize = offset_of!(BlockQ5K, dmin);
    pub const Q5_K_SCALES: usize = offset_of!(BlockQ5K, scales);
    pub const Q5_K_QH: usize = offset_of!(BlockQ5K, qh);
    pub const Q5_K_QS: usize = offset_of!(BlockQ5K, qs);
    /// Q6_K record: `ql`, `qh`, `scales`, `d`.
    pub const Q6_K: usize = size_of::<BlockQ6K>();
    pub const Q6_K_QH: usize = offset_of!(BlockQ6K, qh);
    pub const Q6_K_SCALES: usize = offset_of!(BlockQ6K, scales);
    pub const Q6_K_D: usize = offset_of!(BlockQ6K, d);

    // Fields the kernels read at a block's start, and the `m` that the shared
    // Q4_1/Q5_1 loop reads at one offset for both.
    const _: () = assert!(
        offset_of!(BlockQ8_0, d) == 0
            && offset_of!(BlockQ8_1, d) == 0
            && offset_of!(BlockQ4_0, d) == 0
            && offset_of!(BlockQ4_1, d) == 0
            && offset_of!(BlockQ5_0, d) == 0
            && offset_of!(BlockQ5_1, d) == 0
            && offset_of!(BlockIQ4NL, d) == 0
            && offset_of!(BlockQ8K, d) == 0
            && offset_of!(BlockQ2K, scales) == 0
            && offset_of!(BlockQ3K, hmask) == 0
            && offset_of!(BlockQ4K, d) == 0
            && offset_of!(BlockQ5K, d) == 0
            && offset_of!(BlockQ6K, ql) == 0
            && Q4_1_M == offset_of!(BlockQ5_1, m)
            && Q5_K_QS == Q5_K_QH + 32
    );
}

/// Reads a little-endian `u16` at `p` (any alignment).
///
/// # Safety
/// `p..p + 2` must be readable.
#[allow(dead_code)]
#[inline(always)]
pub(crate) unsafe fn read_u16(p: *const u8) -> u16 {
    // SAFETY: the caller guarantees two readable bytes.
    u16::from_le(unsafe { p.cast::<u16>().read_unaligned() })
}

/// Reads a little-endian `u32` at `p` (any alignment).
///
/// # Safety
/// `p..p + 4` must be readable.
#[allow(dead_code)]
#[inline(always)]
pub(crate) unsafe fn read_u32(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees four readable bytes.
    u32::from_le(unsafe { p.cast::<u32>().read_unaligned() })
}

/// Reads a little-endian `f32` at `p` (any alignment).
///
/// # Safety
/// `p..p + 4` must be readable.
#[allow(dead_code)]
#[inline(always)]
pub(crate) unsafe fn read_f32(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees four readable bytes.
    f32::from_bits(unsafe { read_u32(p) })
}

/// The 8 six-bit scales (bytes 0..8) and 8 six-bit mins (bytes 8..16) of a
/// Q4_K / Q5_K super-block from its 12 packed bytes, as one little-endian
/// `u128`: the word-parallel form of `quant::k_common::get_scale_min_k4`.
///
/// Packing (per byte lane of the three little-endian words `u0, u1, u2`):
/// scales 0..4 are the low 6 bits of `u0`, mins 0..4 those of `u1`; scales
/// 4..8 take their low nibble from `u2` and their top 2 bits from bits 6..8
/// of `u0`; mins 4..8 the high nibble of `u2` and bits 6..8 of `u1`.
#[allow(dead_code)]
#[inline(always)]
pub(crate) fn k4_scales_mins(packed: [u8; 12]) -> u128 {
    let u0 = u32::from_le_bytes([packed[0], packed[1], packed[2], packed[3]]);
    let u1 = u32::from_le_bytes([packed[4], packed[5], packed[6], packed[7]]);
    let u2 = u32::from_le_bytes([packed[8], packed[9], packed[10], packed[11]]);
    let sc_lo = u0 & 0x3f3f_3f3f;
    let sc_hi = (u2 & 0x0f0f_0f0f) | (((u0 >> 6) & 0x0303_0303) << 4);
    let m_lo = u1 & 0x3f3f_3f3f;
    let m_hi = ((u2 >> 4) & 0x0f0f_0f0f) | (((u1 >> 6) & 0x0303_0303) << 4);
    (sc_lo as u128) | ((sc_hi as u128) << 32) | ((m_lo as u128) << 64) | ((m_hi as u128) << 96)
}

/// The 16 signed group scales (`s_g - 32`, in `-32..=31`) of a Q3_K
/// super-block from its 12 packed bytes, as 16 bytes: the word-parallel
/// form of the per-group decode in `quant/q3_k.rs`.
///
/// Group `g`'s low nibble is in byte `g % 8` of the first 8 bytes (low half
/// for `g < 8`), its top 2 bits at bits `2·(g / 4)` of byte `8 + g % 4`.
#[allow(dead_code)]
#[inline(always)]
pub(crate) fn q3k_scales(packed: [u8; 12]) -> [i8; 16] {
    let u0 = u32::from_le_bytes([packed[0], packed[1], packed[2], packed[3]]);
    let u1 = u32::from_le_bytes([packed[4], packed[5], packed[6], packed[7]]);
    let u2 = u32::from_le_bytes([packed[8], packed[9], packed[10], packed[11]]);
    const LO: u32 = 0x0f0f_0f0f;
    const HI: u32 = 0x0303_0303;
    let words = [
        (u0 & LO) | ((u2 & HI) << 4),
        (u1 & LO) | (((u2 >> 2) & HI) << 4),
        ((u0 >> 4) & LO) | (((u2 >> 4) & HI) << 4),
        ((u1 >> 4) & LO) | (((u2 >> 6) & HI) << 4),
    ];
    let mut out = [0i8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        for (b, v) in o.iter_mut().zip(w.to_le_bytes()) {
            *b = v as i8 - 32;
        }
    }
    out
}
