//! AVX2 activation quantizers (Q8_0, Q8_K), bit-identical to the reference
//! quantizers in `quant/q8_0.rs` and `quant/q8_k.rs` for finite inputs.
//!
//! The reference rounds with `f32::round` (a library call per value on
//! baseline x86-64) and dominated small mat-vecs: 9 µs for 640 values,
//! about the time of a 256x640 Q5_0 mat-vec. Blocks holding a NaN or an
//! infinity go through the reference, so every input gives the reference's
//! bytes.
//!
//! Exactness: the block maxima are exact; `d`, `1/d`, `-127/max` and the
//! products `x·id` are the same single f32 operations as in the reference;
//! Q8_0's round-half-away-from-zero is `t = trunc(v)` plus `±1` where
//! `|v − t| ≥ 0.5` (the difference is exact); Q8_K's `nearest_int` is
//! round-half-to-even, which is what `vcvtps2dq` does under the default
//! rounding mode for the magnitudes involved (≤ 128); `min(127, ·)` is the
//! saturating pack; f16 rounding of `d` is F16C's round-to-nearest-even,
//! which agrees with `quant::float::f32_to_f16` on every non-NaN value.

use core::arch::x86_64::*;

use super::blocks::layout as L;
use crate::quant::{BlockFormat, BlockQ8K, BlockQ8_0, QK, QK_K};

/// Largest `|x|` of 8 lanes.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hmax_ps(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// Rounds half away from zero (C `roundf`), exactly.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_half_away(v: __m256) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
    let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    let step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0));
    let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
    _mm256_add_ps(t, _mm256_and_ps(up, step))
}

/// Packs 32 `i32` lanes (4 vectors, in order) to 32 bytes with signed
/// saturation, in order.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack32(q: [__m256i; 4]) -> __m256i {
    // The packs work per 128-bit lane; a final dword permutation restores
    // the order.
    let ab = _mm256_packs_epi32(q[0], q[1]);
    let cd = _mm256_packs_epi32(q[2], q[3]);
    let bytes = _mm256_packs_epi16(ab, cd);
    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Whether any lane is NaN or infinite.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn any_non_finite(v: __m256) -> bool {
    let exp = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7f80_0000)));
    _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_UQ>(exp, _mm256_castsi256_ps(_mm256_set1_epi32(0x7f80_0000)))) != 0
}

/// Quantizes `x` (a whole number of 32-value blocks) to Q8_0 into `out`
/// (`x.len() / 32` blocks of 34 bytes).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. Only whole blocks present in
/// both slices are written.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / QK).min(out.len() / L::Q8_0);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for b in 0..nb {
        let xb = &x[b * QK..(b + 1) * QK];
        let ob = &mut out[b * L::Q8_0..(b + 1) * L::Q8_0];
        // SAFETY: `xb` holds 32 f32 and `ob` 34 bytes (slices above).
        let v: [__m256; 4] = [
            _mm256_loadu_ps(xb.as_ptr()),
            _mm256_loadu_ps(xb.as_ptr().add(8)),
            _mm256_loadu_ps(xb.as_ptr().add(16)),
            _mm256_loadu_ps(xb.as_ptr().add(24)),
        ];
        if any_non_finite(v[0]) || any_non_finite(v[1]) || any_non_finite(v[2]) || any_non_finite(v[3]) {
            reference::<BlockQ8_0>(xb, ob);
            continue;
        }
        let a = [
            _mm256_and_ps(v[0], abs_mask),
            _mm256_and_ps(v[1], abs_mask),
            _mm256_and_ps(v[2], abs_mask),
            _mm256_and_ps(v[3], abs_mask),
        ];
        let amax = hmax_ps(_mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3])));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        let q = [
            _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[0], idv))),
            _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[1], idv))),
            _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[2], idv))),
            _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[3], idv))),
        ];
        let dh = _mm_extract_epi16::<0>(_mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm_set_ss(d))) as u16;
        ob[..2].copy_from_slice(&dh.to_le_bytes());
        _mm256_storeu_si256(ob.as_mut_ptr().add(2).cast(), pack32(q));
    }
}

/// Quantizes `x` (a whole number of 256-value blocks) to Q8_K into `out`
/// (`x.len() / 256` blocks of 292 bytes).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. Only whole blocks present in
/// both slices are written.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / QK_K).min(out.len() / L::Q8_K);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for b in 0..nb {
        let xb = &x[b * QK_K..(b + 1) * QK_K];
        let ob = &mut out[b * L::Q8_K..(b + 1) * L::Q8_K];
        let p = xb.as_ptr();
        // Largest magnitude, and whether every value is finite.
        let mut m = _mm256_setzero_ps();
        let mut bad = false;
        for j in 0..QK_K / 8 {
            // SAFETY: `j * 8 + 8 ≤ 256` values of `xb`.
            let v = _mm256_loadu_ps(p.add(8 * j));
            bad |= any_non_finite(v);
            m = _mm256_max_ps(m, _mm256_and_ps(v, abs_mask));
        }
        if bad {
            reference::<BlockQ8K>(xb, ob);
            continue;
        }
        let amax = hmax_ps(m);
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        // The first value of that magnitude, with its sign (the reference
        // keeps the first one on ties).
        let target = _mm256_set1_ps(amax);
        let mut max = 0f32;
        for j in 0..QK_K / 8 {
            // SAFETY: as above.
            let v = _mm256_loadu_ps(p.add(8 * j));
            let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_and_ps(v, abs_mask), target));
            if hit != 0 {
                max = xb[8 * j + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0f32 / max;
        let sv = _mm256_set1_ps(iscale);
        let qs = ob.as_mut_ptr().add(L::Q8_K_QS);
        let mut sums = [0u64; 16];
        for j in 0..QK_K / 32 {
            // SAFETY: values `32j..32j + 32` of `xb`; bytes `32j..32j + 32`
            // of the block's `qs`.
            let q = [
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(32 * j)), sv)),
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(32 * j + 8)), sv)),
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(32 * j + 16)), sv)),
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(32 * j + 24)), sv)),
            ];
            let bytes = pack32(q);
            _mm256_storeu_si256(qs.add(32 * j).cast(), bytes);
            // Group sums: |sum of (q + 128)| over 8 bytes by `vpsadbw`.
            let biased = _mm256_xor_si256(bytes, _mm256_set1_epi8(-128));
            let s = _mm256_sad_epu8(biased, _mm256_setzero_si256());
            let mut four = [0u64; 4];
            _mm256_storeu_si256(four.as_mut_ptr().cast(), s);
            sums[2 * j] = four[0] + four[1];
            sums[2 * j + 1] = four[2] + four[3];
        }
        let bs = ob.as_mut_ptr().add(L::Q8_K_BSUMS);
        for (g, s) in sums.iter().enumerate() {
            let v = (*s as i64 - 16 * 128) as i16;
            bs.add(2 * g).cast::<i16>().write_unaligned(v.to_le());
        }
        ob[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// The reference quantizer for one block (non-finite inputs).
fn reference<B: BlockFormat>(x: &[f32], out: &mut [u8]) {
    let mut block = [<B as bytemuck::Zeroable>::zeroed()];
    B::quantize_row_ref(x, &mut block);
    out.copy_from_slice(bytemuck::bytes_of(&block[0]));
}
