//! AVX2 + FMA + F16C row dots: the 32-value ("legacy") formats, IQ4_NL and
//! the float types here, the k-quants in `avx2_kquants.rs`; the helpers and
//! the Q8_0 row loop shared with the AVX-512 kernels in `x86_common.rs`.
//!
//! Integer core: `vpmaddubsw` multiplies unsigned weight bytes with signed
//! activation bytes into `i16` pair sums (no overflow: the largest is
//! `2·63·127` for Q6_K), `vpmaddwd` with ones widens to `i32`. Signed
//! weights (Q8_0, IQ4_NL) go through the sign trick `|w| · (a·sign(w))`.
//! Formats with an offset (Q4_0: `q - 8`) subtract `8·Σa` computed the same
//! way. Each 32-value block ends in `acc += f32(sum) · d_w·d_a` with a
//! vector FMA; the horizontal sum happens once per row.

use core::arch::x86_64::*;

use super::blocks::layout as L;
use super::blocks::{read_u16, read_u32};
use super::level::DotFn;
use super::x86_common::{
    broadcast_load_f32, f16_mul, f16_to_f32, hsum_ps, prefetch_ahead, q8_0_row, safe_dot, scale_products4,
};
use crate::quant::iq4_nl::KVALUES_IQ4NL;
use crate::GgmlType;

/// The AVX2 kernels of every type.
pub(super) fn dots() -> [(GgmlType, DotFn); 14] {
    [
        (GgmlType::F32, dot_f32),
        (GgmlType::F16, dot_f16),
        (GgmlType::BF16, dot_bf16),
        (GgmlType::Q4_0, dot_q4_0),
        (GgmlType::Q4_1, dot_q4_1),
        (GgmlType::Q5_0, dot_q5_0),
        (GgmlType::Q5_1, dot_q5_1),
        (GgmlType::Q8_0, dot_q8_0),
        (GgmlType::IQ4_NL, dot_iq4_nl),
        (GgmlType::Q2_K, super::avx2_kquants::dot_q2_k),
        (GgmlType::Q3_K, super::avx2_kquants::dot_q3_k),
        (GgmlType::Q4_K, super::avx2_kquants::dot_q4_k),
        (GgmlType::Q5_K, super::avx2_kquants::dot_q5_k),
        (GgmlType::Q6_K, super::avx2_kquants::dot_q6_k),
    ]
}

safe_dot!(dot_f32, f32_dot);
safe_dot!(dot_f16, f16_dot);
safe_dot!(dot_bf16, bf16_dot);
safe_dot!(dot_q8_0, q8_0_dot);
safe_dot!(dot_q4_0, q4_0_dot);
safe_dot!(dot_q4_1, q4_1_dot);
safe_dot!(dot_q5_0, q5_0_dot);
safe_dot!(dot_q5_1, q5_1_dot);
safe_dot!(dot_iq4_nl, iq4_nl_dot);

// ---------------------------------------------------------------------------
// Helpers of this file's kernels.

/// Σ over pairs of `u8 × i8` products, widened to 8 `i32` lanes.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn madd_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Σ of `i8 × i8` products in 8 `i32` lanes (sign trick; both operands
/// must avoid -128, which the quantizers never produce for activations).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn madd_i8_i8(x: __m256i, y: __m256i) -> __m256i {
    madd_u8_i8(_mm256_abs_epi8(x), _mm256_sign_epi8(y, x))
}

/// The 32 nibbles of 16 packed bytes, in value order: low nibbles of
/// bytes 0..16, then high nibbles.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `p..p + 16` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles32(p: *const u8) -> __m256i {
    // The same 16 bytes in both 128-bit lanes (a plain load), the upper
    // lane shifted right by 4: no cross-lane shuffle.
    let x = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
    let x = _mm256_srlv_epi64(x, _mm256_setr_epi64x(0, 0, 4, 4));
    _mm256_and_si256(x, _mm256_set1_epi8(0x0f))
}

/// Bytes `0xff` where bit `j` of `bits` is set (byte `j`, `j < 32`),
/// else 0.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bits_to_bytes(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select)
}

/// Row loop of Q4_1 / Q5_1 with Q8_1: as [`q8_0_row!`], plus `m_w·s_a` per
/// block (`m` at offset 2 of the weight block, `s` at offset 2 of Q8_1),
/// four blocks at a time.
macro_rules! q8_1_row {
    ($w:expr, $a:expr, $wsize:expr, |$wb:ident, $aq:ident| $body:expr) => {{
        let (w, a): (&[u8], &[u8]) = ($w, $a);
        let nb = (w.len() / $wsize).min(a.len() / L::Q8_1);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut acc_m = _mm_setzero_ps();
        let mut scales = [0f32; 4];
        let mut i = 0;
        // SAFETY (of the pointer arithmetic and of every read below): the
        // blocks `i..i + 4` (first loop) and `i` (second loop) are below
        // `nb`, so they lie inside both slices.
        while i + 4 <= nb {
            let (wb0, ab0) = (wp.add(i * $wsize), ap.add(i * L::Q8_1));
            prefetch_ahead::<128>(wb0);
            _mm_storeu_ps(scales.as_mut_ptr(), scale_products4(wb0, $wsize, ab0, L::Q8_1));
            acc_m = _mm_add_ps(acc_m, scale_products4(wb0.add(L::Q4_1_M), $wsize, ab0.add(L::Q8_1_S), L::Q8_1));
            for (j, acc) in acc.iter_mut().enumerate() {
                let $wb = wb0.add(j * $wsize);
                let $aq = ab0.add(j * L::Q8_1 + L::Q8_1_QS);
                let sum: __m256i = $body;
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), broadcast_load_f32(&scales[j]), *acc);
            }
            i += 4;
        }
        let mut tail_m = 0f32;
        while i < nb {
            let $wb = wp.add(i * $wsize);
            let ab = ap.add(i * L::Q8_1);
            let $aq = ab.add(L::Q8_1_QS);
            let sum: __m256i = $body;
            let d = _mm256_set1_ps(f16_mul(read_u16($wb), read_u16(ab)));
            acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), d, acc[0]);
            tail_m += f16_mul(read_u16($wb.add(L::Q4_1_M)), read_u16(ab.add(L::Q8_1_S)));
            i += 1;
        }
        let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
        let m = _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
        hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))) + m + tail_m
    }};
}

// ---------------------------------------------------------------------------
// 32-value formats.

/// Q8_0 × Q8_0.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_dot(w: &[u8], a: &[u8]) -> f32 {
    q8_0_row!(w, a, L::Q8_0, |wb, aq| {
        let x = _mm256_loadu_si256(wb.add(L::Q8_0_QS).cast());
        let y = _mm256_loadu_si256(aq.cast());
        madd_i8_i8(x, y)
    })
}

/// Q4_0 × Q8_0: `Σ (q - 8)·a = Σ q·a - 8·Σ a`, both from `vpmaddubsw`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_dot(w: &[u8], a: &[u8]) -> f32 {
    let eight = _mm256_set1_epi8(8);
    q8_0_row!(w, a, L::Q4_0, |wb, aq| {
        let q = nibbles32(wb.add(L::Q4_0_QS));
        let y = _mm256_loadu_si256(aq.cast());
        let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(eight, y));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    })
}

/// Q5_0 × Q8_0: codes `nibble | 16·bit` in `0..32`, minus `16·Σ a`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_dot(w: &[u8], a: &[u8]) -> f32 {
    let sixteen = _mm256_set1_epi8(16);
    q8_0_row!(w, a, L::Q5_0, |wb, aq| {
        let hi = _mm256_and_si256(bits_to_bytes(read_u32(wb.add(L::Q5_0_QH))), sixteen);
        let q = _mm256_or_si256(nibbles32(wb.add(L::Q5_0_QS)), hi);
        let y = _mm256_loadu_si256(aq.cast());
        let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(sixteen, y));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    })
}

/// IQ4_NL × Q8_0: nibbles looked up in the 16-level table (`vpshufb`),
/// then the signed product.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4_nl_dot(w: &[u8], a: &[u8]) -> f32 {
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    q8_0_row!(w, a, L::IQ4_NL, |wb, aq| {
        let x = _mm256_shuffle_epi8(table, nibbles32(wb.add(L::IQ4_NL_QS)));
        let y = _mm256_loadu_si256(aq.cast());
        madd_i8_i8(x, y)
    })
}

/// Q4_1 × Q8_1: `d_w·d_a·Σ q·a + m_w·s_a`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_1_dot(w: &[u8], a: &[u8]) -> f32 {
    q8_1_row!(w, a, L::Q4_1, |wb, aq| {
        let q = nibbles32(wb.add(L::Q4_1_QS));
        madd_u8_i8(q, _mm256_loadu_si256(aq.cast()))
    })
}

/// Q5_1 × Q8_1: codes `nibble | 16·bit`, then as Q4_1.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_1_dot(w: &[u8], a: &[u8]) -> f32 {
    let sixteen = _mm256_set1_epi8(16);
    q8_1_row!(w, a, L::Q5_1, |wb, aq| {
        let hi = _mm256_and_si256(bits_to_bytes(read_u32(wb.add(L::Q5_1_QH))), sixteen);
        let q = _mm256_or_si256(nibbles32(wb.add(L::Q5_1_QS)), hi);
        madd_u8_i8(q, _mm256_loadu_si256(aq.cast()))
    })
}

// ---------------------------------------------------------------------------
// Float types.

/// Row loop of the float types over `$n` elements: `$load` (with `$i`
/// bound to the element index) yields 8 f32 of each side, `$tail` one
/// product, `$prefetch(i)` prefetches ahead of the 32 weights at `i`; four
/// accumulators.
macro_rules! float_row {
    ($n:expr, $prefetch:expr, |$i:ident| $load:expr, $tail:expr) => {{
        let n: usize = $n;
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut $i = 0;
        while $i + 32 <= n {
            let base = $i;
            $prefetch(base);
            for (j, acc) in acc.iter_mut().enumerate() {
                $i = base + 8 * j;
                let (x, y) = $load;
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
            $i = base + 32;
        }
        while $i + 8 <= n {
            let (x, y) = $load;
            acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
            $i += 8;
        }
        let mut sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        while $i < n {
            sum += $tail;
            $i += 1;
        }
        sum
    }};
}

/// F32 × F32.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f32_dot(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len().min(a.len()) / 4;
    let (wp, ap) = (w.as_ptr().cast::<f32>(), a.as_ptr().cast::<f32>());
    // SAFETY (of every read below): element indices stay below `n`.
    float_row!(
        n,
        |i: usize| prefetch_ahead::<128>(wp.add(i).cast()),
        |i| (_mm256_loadu_ps(wp.add(i)), _mm256_loadu_ps(ap.add(i))),
        wp.add(i).read_unaligned() * ap.add(i).read_unaligned()
    )
}

/// F16 × F16 (products and sums in f32).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_dot(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len().min(a.len()) / 2;
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    // SAFETY (of every read below): element indices stay below `n`.
    float_row!(
        n,
        |i: usize| prefetch_ahead::<64>(wp.add(2 * i)),
        |i| (
            _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * i).cast())),
            _mm256_cvtph_ps(_mm_loadu_si128(ap.add(2 * i).cast()))
        ),
        f16_to_f32(read_u16(wp.add(2 * i))) * f16_to_f32(read_u16(ap.add(2 * i)))
    )
}

/// Widens 8 bf16 at `p` to f32.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `p..p + 16` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16x8(p: *const u8) -> __m256 {
    let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
}

/// BF16 × BF16 (products and sums in f32).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bf16_dot(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len().min(a.len()) / 2;
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    // SAFETY (of every read below): element indices stay below `n`.
    float_row!(
        n,
        |i: usize| prefetch_ahead::<64>(wp.add(2 * i)),
        |i| (bf16x8(wp.add(2 * i)), bf16x8(ap.add(2 * i))),
        f32::from_bits((read_u16(wp.add(2 * i)) as u32) << 16) * f32::from_bits((read_u16(ap.add(2 * i)) as u32) << 16)
    )
}
