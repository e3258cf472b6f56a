//! AVX2 + FMA + F16C row dots of the k-quants with Q8_K activations.
//!
//! Per super-block of 256 values: the weight codes are unpacked to bytes
//! (`0..2^bits`, unsigned), multiplied with the activation's `i8` quants by
//! `vpmaddubsw` into `i16` pair sums, and `vpmaddwd` against a vector of the
//! sub-block scales (as `i16`) both widens and applies them, so one `i32`
//! vector collects `Σ_g s_g·Σ q·a` exactly. Offsets and mins never touch the
//! individual codes: they are `Σ_g c_g · bsums_g`, one `vpmaddwd` on Q8_K's
//! 16 group sums. The super-block's float scales are applied with one FMA.

use core::arch::x86_64::*;

use super::avx2::{f16_to_f32 as f16_to_f32_scalar, hsum_ps, prefetch_ahead, safe_dot};
use super::layout as L;
use super::{q3k_scales, read_f32, read_u16, read_u32};

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

/// The scales and mins of a Q4_K / Q5_K block, prepared for the row loop:
/// every 6-bit scale `s_g` as the `i16` pair `(s_g, s_g)` in dword `g` of
/// `pairs` (`g < 4`) or `g + 4` (`g ≥ 4`), so that spreading one over a
/// vector is a plain broadcast load; returned, the mins as 16 `i16` lanes
/// `m_0 m_0 m_1 m_1 … m_7 m_7`, one per Q8_K group sum.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `wb` must point to a readable
/// Q4_K or Q5_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_prepare(wb: *const u8, pairs: &mut Pairs) -> __m256i {
    // `k4_scales_mins` in vector lanes: with the packed words u0, u1, u2 at
    // offsets 4, 8, 12 of the block (the 16-byte load also takes 4 bytes of
    // `qs`, unused), lanes [u0 & 3f, u2 & 0f | (u0 >> 6 & 3) << 4,
    // u1 & 3f, u2 >> 4 & 0f | (u1 >> 6 & 3) << 4] are the scales 0..4,
    // scales 4..8, mins 0..4 and mins 4..8.
    let u = _mm_loadu_si128(wb.add(L::Q4_K_SCALES).cast());
    let low = _mm_srlv_epi32(_mm_shuffle_epi32::<0b10_01_10_00>(u), _mm_setr_epi32(0, 0, 0, 4));
    let low = _mm_and_si128(low, _mm_setr_epi32(0x3f3f_3f3f, 0x0f0f_0f0f, 0x3f3f_3f3f, 0x0f0f_0f0f));
    let top = _mm_srli_epi32::<6>(_mm_shuffle_epi32::<0b01_00_00_00>(u));
    let top = _mm_slli_epi32::<4>(_mm_and_si128(top, _mm_setr_epi32(0, 0x0303_0303, 0, 0x0303_0303)));
    let sm = _mm_or_si128(low, top);
    // Lane 0: the 8 scales, lane 1: the 8 mins, as i16.
    let v = _mm256_cvtepu8_epi16(sm);
    let lo = _mm256_unpacklo_epi16(v, v);
    let hi = _mm256_unpackhi_epi16(v, v);
    _mm256_store_si256(pairs.0.as_mut_ptr().cast(), lo);
    _mm256_store_si256(pairs.0.as_mut_ptr().add(8).cast(), hi);
    _mm256_permute2x128_si256::<0x31>(lo, hi)
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

/// Scratch for [`k4_prepare`]: 16 dwords, aligned for vector stores.
#[repr(C, align(32))]
pub(super) struct Pairs(pub(super) [u32; 16]);

/// Row loop of Q4_K (`$qh = false`) and Q5_K (`$qh = true`) with Q8_K:
/// `d_a·(d·Σ_g sc_g·Σ q·a − dmin·Σ_g m_g·(bsum_2g + bsum_2g+1))`, 8 groups
/// of 32. `$scaled(acc, p, s)` adds the `i16` pair sums `p` times the
/// scale pair at `s` (broadcast) to the `i32` lanes of `acc` (`vpmaddwd` +
/// add, or VNNI's `vpdpwssd` with a broadcast memory operand).
macro_rules! k4_row {
    ($w:expr, $a:expr, $wsize:expr, $qh:expr, |$acc:ident, $p:ident, $s:ident| $scaled:expr) => {{
        let (w, a): (&[u8], &[u8]) = ($w, $a);
        let nb = (w.len() / $wsize).min(a.len() / L::Q8_K);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let qs_at = if $qh { L::Q5_K_QS } else { L::Q4_K_QS };
        let low4 = _mm256_set1_epi8(0x0f);
        let bit4 = _mm256_set1_epi8(0x10);
        let mut pairs = Pairs([0u32; 16]);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm256_setzero_ps();
        for i in 0..nb {
            // SAFETY (of every read of this iteration): block `i < nb` lies
            // inside both slices.
            let wb = wp.add(i * $wsize);
            prefetch_ahead::<192>(wb);
            let ab = ap.add(i * L::Q8_K);
            let aq = ab.add(L::Q8_K_QS);
            let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(read_u32(wb) as i32));
            let dd = _mm_mul_ps(dd, _mm_set1_ps(read_f32(ab))); // [d, dmin, ..]
            let mins = k4_prepare(wb, &mut pairs);
            let pm = _mm256_madd_epi16(mins, _mm256_loadu_si256(ab.add(L::Q8_K_BSUMS).cast()));
            acc_m = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pm), _mm256_broadcastss_ps(_mm_movehdup_ps(dd)), acc_m);
            let mut qh = if $qh { _mm256_loadu_si256(wb.add(L::Q5_K_QH).cast()) } else { _mm256_setzero_si256() };
            let mut sum = [_mm256_setzero_si256(); 2];
            for j in 0..4 {
                let q = _mm256_loadu_si256(wb.add(qs_at + 32 * j).cast());
                let mut lo = _mm256_and_si256(q, low4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4);
                if $qh {
                    // Bits 0 and 1 of the progressively shifted qh bytes
                    // become bit 4 of the low and high codes.
                    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bit4));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(qh), bit4));
                    qh = _mm256_srli_epi16::<2>(qh);
                }
                let g_lo = if j < 2 { 2 * j } else { 2 * j + 4 };
                for (k, (codes, g)) in [(lo, g_lo), (hi, g_lo + 1)].into_iter().enumerate() {
                    let $p = _mm256_maddubs_epi16(codes, _mm256_loadu_si256(aq.add(64 * j + 32 * k).cast()));
                    let $s: *const u32 = pairs.0.as_ptr().add(g);
                    let $acc = sum[k];
                    sum[k] = $scaled;
                }
            }
            let sumi = _mm256_add_epi32(sum[0], sum[1]);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_broadcastss_ps(dd), acc);
        }
        hsum_ps(_mm256_sub_ps(acc, acc_m))
    }};
}
pub(super) use k4_row;

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
