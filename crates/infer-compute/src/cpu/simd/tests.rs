//! Unit tests of the helpers of `blocks.rs` (the kernels themselves are
//! compared with the scalar reference in `tests/simd_matvec.rs`).

use super::blocks::{k4_scales_mins, q3k_scales, read_f32, read_u16, read_u32};
use crate::quant::k_common::get_scale_min_k4;

/// A small deterministic generator (xorshift), enough for byte patterns.
fn bytes<const N: usize>(seed: &mut u64) -> [u8; N] {
    let mut out = [0u8; N];
    for b in &mut out {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *b = (*seed >> 32) as u8;
    }
    out
}

#[test]
fn k4_scales_mins_matches_get_scale_min_k4() {
    let mut seed = 0x1234_5678_9abc_def0u64;
    for round in 0..2000 {
        let packed: [u8; 12] = if round == 0 { [0xff; 12] } else { bytes(&mut seed) };
        let sm = k4_scales_mins(packed).to_le_bytes();
        for j in 0..8 {
            let (s, m) = get_scale_min_k4(j, &packed);
            assert_eq!((sm[j], sm[8 + j]), (s, m), "group {j} of {packed:02x?}");
        }
    }
}

/// Q3_K's scale of group `g`, straight from the layout description in
/// `quant/q3_k.rs`.
fn q3k_scale(packed: &[u8; 12], g: usize) -> i8 {
    let low = if g < 8 { packed[g] & 0xf } else { packed[g - 8] >> 4 };
    let high = (packed[8 + g % 4] >> (2 * (g / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

#[test]
fn q3k_scales_matches_layout() {
    let mut seed = 0x0fed_cba9_8765_4321u64;
    for round in 0..2000 {
        let packed: [u8; 12] = if round == 0 { [0xff; 12] } else { bytes(&mut seed) };
        let s = q3k_scales(packed);
        for (g, &got) in s.iter().enumerate() {
            assert_eq!(got, q3k_scale(&packed, g), "group {g} of {packed:02x?}");
        }
    }
}

#[test]
fn unaligned_reads_are_little_endian() {
    let b = [0x11u8, 0x22, 0x33, 0x44, 0x00, 0x00, 0x80, 0x3f];
    // SAFETY: every read stays inside `b`.
    unsafe {
        assert_eq!(read_u16(b.as_ptr().add(1)), 0x3322);
        assert_eq!(read_u32(b.as_ptr().add(1)), 0x0044_3322);
        assert_eq!(read_f32(b.as_ptr().add(4)), 1.0);
    }
}
