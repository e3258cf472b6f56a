//! AVX2 + FMA + F16C row dots of the k-quants with Q8_K activations.
//!
//! Per super-block of 256 values: the weight codes are unpacked to bytes
//! (`0..2^bits`, unsigned), multiplied with the activation's `i8` quants by
//! `vpmaddubsw` into `i16` pair sums, and `vpmaddwd` against a vector of the
//! sub-block scales (as `i16`) both widens and applies them, so one `i32`
//! vector collects `Σ_g s_g·Σ q·a` exactly. Offsets and mins never touch the
//! individual codes: they are `Σ_g c_g · bsums_g`, one `vpmaddwd` on Q8_K's
//! 16 group sums. The super-block's float scales are applied with one FMA.
//!
//! The Q4_K / Q5_K row loop (`k4_row!`), which the AVX-512 kernels share,
//! and the other shared helpers are in `x86_common.rs`; `avx2.rs` lists
//! these kernels in the AVX2 table.

use core::arch::x86_64::*;

use super::blocks::layout as L;
use super::blocks::{q3k_scales, read_f32, read_u16, read_u32};
use super::x86_common::{
    f16_to_f32 as f16_to_f32_scalar, hsum_ps, k4_prepare, k4_row, prefetch_ahead, safe_dot, Pairs,
};

safe_dot!(dot_q2_k, q2_k_dot);
safe_dot!(dot_q3_k, q3_k_dot);
safe_dot!(dot_q4_k, q4_k_dot);
safe_dot!(dot_q5_k, q5_k_dot);
safe_dot!(dot_q6_k, q6_k_dot);

/// Shuffle control that fills the low 128-bit lane with the `i16` at index
/// `lo` and the high lane with the `i16` at index `hi` of a 128-bit lane
/// (indices 0..8).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pick_i16(lo: i32, hi: i32) -> __m256i {
    let l = (2 * lo) | ((2 * lo + 1) << 8);
    let h = (2 * hi) | ((2 * hi + 1) << 8);
    _mm256_set_m128i(_mm_set1_epi16(h as i16), _mm_set1_epi16(l as i16))
}

/// The Q8_K block's 16 group sums as `i16` lanes.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `ab` must point to a readable
/// Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bsums(ab: *const u8) -> __m256i {
    _mm256_loadu_si256(ab.add(L::Q8_K_BSUMS).cast())
}

/// Number of whole blocks in both rows.
#[inline(always)]
fn n_blocks(w: &[u8], wsize: usize, a: &[u8]) -> usize {
    (w.len() / wsize).min(a.len() / L::Q8_K)
}

/// Broadcasts the dword at `p` to 8 lanes with a load (`vpbroadcastd` from
/// memory, no shuffle port). Written as `asm!` because the compiler turns
/// a broadcast of a value it has just stored into register shuffles, which
/// compete with the kernels' own shuffles.
///
/// # Safety
/// The CPU must support AVX2; `p..p + 4` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn broadcast_load_u32(p: *const u32) -> __m256i {
    let r: __m256i;
    // SAFETY: reads 4 bytes at `p` (the caller's promise); no other effect.
    core::arch::asm!(
        "vpbroadcastd {r}, dword ptr [{p}]",
        r = out(ymm_reg) r,
        p = in(reg) p,
        options(pure, readonly, nostack, preserves_flags)
    );
    r
}

/// Q4_K × Q8_K (see [`k4_row!`]).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_dot(w: &[u8], a: &[u8]) -> f32 {
    k4_row!(w, a, L::Q4_K, false, |acc, p, s| _mm256_add_epi32(acc, _mm256_madd_epi16(p, broadcast_load_u32(s))))
}

/// Q5_K × Q8_K: Q4_K with a fifth bit per code from `qh` (bit `2j` for the
/// low nibbles of `qs[32j..]`, bit `2j + 1` for the high nibbles).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_k_dot(w: &[u8], a: &[u8]) -> f32 {
    k4_row!(w, a, L::Q5_K, true, |acc, p, s| _mm256_add_epi32(acc, _mm256_madd_epi16(p, broadcast_load_u32(s))))
}

/// Q6_K × Q8_K: codes `u = low4 | high2 << 4` in `0..64`, value `u − 32`;
/// `d_a·d·(Σ_g s_g·Σ u·a − 32·Σ_g s_g·bsum_g)` with 16 groups of 16.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_dot(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, L::Q6_K, a);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let low4 = _mm256_set1_epi8(0x0f);
    let bits45 = _mm256_set1_epi8(0x30);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        // SAFETY (of every read of this iteration): block `i < nb` lies
        // inside both slices.
        let wb = wp.add(i * L::Q6_K);
        prefetch_ahead::<256>(wb);
        let ab = ap.add(i * L::Q8_K);
        let d = f16_to_f32_scalar(read_u16(wb.add(L::Q6_K_D))) * read_f32(ab);
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(L::Q6_K_SCALES).cast()));
        let offset = _mm256_madd_epi16(sc16, bsums(ab));
        let mut sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(offset));
        for n in 0..2 {
            let sc = if n == 0 {
                _mm256_permute2x128_si256::<0x00>(sc16, sc16)
            } else {
                _mm256_permute2x128_si256::<0x11>(sc16, sc16)
            };
            let ql0 = _mm256_loadu_si256(wb.add(64 * n).cast());
            let ql1 = _mm256_loadu_si256(wb.add(64 * n + 32).cast());
            let qh = _mm256_loadu_si256(wb.add(L::Q6_K_QH + 32 * n).cast());
            let u = [
                _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bits45)),
                _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16::<2>(qh), bits45)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4), _mm256_and_si256(qh, bits45)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), bits45),
                ),
            ];
            for (k, u) in u.into_iter().enumerate() {
                let y = _mm256_loadu_si256(ab.add(L::Q8_K_QS + 128 * n + 32 * k).cast());
                let g = 2 * k as i32;
                let s = _mm256_shuffle_epi8(sc, pick_i16(g, g + 1));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), s));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    }
    hsum_ps(acc)
}

/// Q2_K × Q8_K: 2-bit codes, 16 groups of 16 with 4-bit scales (low
/// nibble) and mins (high nibble) of `scales[g]`;
/// `d_a·(d·Σ_g sc_g·Σ q·a − dmin·Σ_g m_g·bsum_g)`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q2_k_dot(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, L::Q2_K, a);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let low2 = _mm256_set1_epi8(3);
    let low4 = _mm_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm256_setzero_ps();
    for i in 0..nb {
        // SAFETY (of every read of this iteration): block `i < nb` lies
        // inside both slices.
        let wb = wp.add(i * L::Q2_K);
        prefetch_ahead::<128>(wb);
        let ab = ap.add(i * L::Q8_K);
        let da = read_f32(ab);
        let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(read_u32(wb.add(L::Q2_K_D)) as i32));
        let dd = _mm_mul_ps(dd, _mm_set1_ps(da)); // [d, dmin, ..]
        let packed = _mm_loadu_si128(wb.cast());
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), low4));
        let pm = _mm256_madd_epi16(mins, bsums(ab));
        acc_m = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pm), _mm256_broadcastss_ps(_mm_movehdup_ps(dd)), acc_m);
        let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, low4));
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let sc = if n == 0 {
                _mm256_permute2x128_si256::<0x00>(sc16, sc16)
            } else {
                _mm256_permute2x128_si256::<0x11>(sc16, sc16)
            };
            let mut q = _mm256_loadu_si256(wb.add(L::Q2_K_QS + 32 * n).cast());
            for j in 0..4 {
                let u = _mm256_and_si256(q, low2);
                q = _mm256_srli_epi16::<2>(q);
                let y = _mm256_loadu_si256(ab.add(L::Q8_K_QS + 128 * n + 32 * j).cast());
                let g = 2 * j as i32;
                let s = _mm256_shuffle_epi8(sc, pick_i16(g, g + 1));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), s));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_broadcastss_ps(dd), acc);
    }
    hsum_ps(_mm256_sub_ps(acc, acc_m))
}

/// Q3_K × Q8_K: codes `u = low2 | hbit << 2` in `0..8`, value `u − 4`;
/// `d_a·d·(Σ_g s_g·Σ u·a − 4·Σ_g s_g·bsum_g)` with signed 6-bit scales.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q3_k_dot(w: &[u8], a: &[u8]) -> f32 {
    let nb = n_blocks(w, L::Q3_K, a);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let low2 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        // SAFETY (of every read of this iteration): block `i < nb` lies
        // inside both slices.
        let wb = wp.add(i * L::Q3_K);
        prefetch_ahead::<128>(wb);
        let ab = ap.add(i * L::Q8_K);
        let d = f16_to_f32_scalar(read_u16(wb.add(L::Q3_K_D))) * read_f32(ab);
        let scales = q3k_scales(wb.add(L::Q3_K_SCALES).cast::<[u8; 12]>().read_unaligned());
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(scales.as_ptr().cast()));
        let offset = _mm256_madd_epi16(sc16, bsums(ab));
        let mut sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<2>(offset));
        let hmask = _mm256_loadu_si256(wb.cast());
        for n in 0..2 {
            let sc = if n == 0 {
                _mm256_permute2x128_si256::<0x00>(sc16, sc16)
            } else {
                _mm256_permute2x128_si256::<0x11>(sc16, sc16)
            };
            let mut q = _mm256_loadu_si256(wb.add(L::Q3_K_QS + 32 * n).cast());
            for j in 0..4 {
                let bit = _mm256_set1_epi8((1u8 << (4 * n + j)) as i8);
                let h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit), four);
                let u = _mm256_or_si256(_mm256_and_si256(q, low2), h);
                q = _mm256_srli_epi16::<2>(q);
                let y = _mm256_loadu_si256(ab.add(L::Q8_K_QS + 128 * n + 32 * j).cast());
                let g = 2 * j as i32;
                let s = _mm256_shuffle_epi8(sc, pick_i16(g, g + 1));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), s));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    }
    hsum_ps(acc)
}
