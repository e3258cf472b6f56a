//! AVX-512 (F, BW, VL) + VNNI row dots for the types that dominate decoding;
//! the level's other types keep the AVX2 kernels.
//!
//! - 32-value formats (Q8_0, Q4_0, Q5_0, IQ4_NL): one block per 256-bit
//!   vector, integer dot by `vpdpbusd` (`u8 × i8`, four products summed into
//!   each `i32` lane); Q5_0's fifth bits are applied with a byte mask loaded
//!   straight into a mask register. Offsets (`-8`, `-16`) are subtracted as
//!   `vpdpbusd(c, a)`. Scales as in the AVX2 kernels, four blocks at a time.
//! - Q4_K, Q5_K: the AVX2 row loop (256-bit), with `vpdpwssd` multiplying
//!   the `i16` pair sums by the broadcast sub-block scales and accumulating
//!   in one instruction.
//! - Q6_K: 64 values per 512-bit vector; `vpmaddubsw` pair sums, sub-block
//!   scales spread over the lanes by `vpermw`, `vpdpwssd`.
//! - F32: 16 lanes, four accumulators.
//!
//! The row loops and helpers shared with the AVX2 kernels (`q8_0_row!`,
//! `k4_row!`, `hsum_ps`, ...) are in `x86_common.rs`.

use core::arch::x86_64::*;

use super::blocks::layout as L;
use super::blocks::{read_f32, read_u16, read_u32};
use super::level::DotFn;
use super::x86_common::{
    broadcast_load_f32, f16_mul, f16_to_f32, hsum_ps, k4_prepare, k4_row, prefetch_ahead, q8_0_row, scale_products4,
    Pairs,
};
use crate::quant::iq4_nl::KVALUES_IQ4NL;
use crate::GgmlType;

/// The AVX-512 VNNI kernels, of the types they cover (over the AVX2 ones).
pub(super) fn dots() -> [(GgmlType, DotFn); 8] {
    [
        (GgmlType::F32, dot_f32),
        (GgmlType::Q8_0, dot_q8_0),
        (GgmlType::Q4_0, dot_q4_0),
        (GgmlType::Q5_0, dot_q5_0),
        (GgmlType::IQ4_NL, dot_iq4_nl),
        (GgmlType::Q4_K, dot_q4_k),
        (GgmlType::Q5_K, dot_q5_k),
        (GgmlType::Q6_K, dot_q6_k),
    ]
}

/// Declares the safe [`DotFn`] wrapper `$name` of the AVX-512 kernel
/// `$kernel`.
macro_rules! safe_dot512 {
    ($name:ident, $kernel:ident) => {
        #[doc = concat!("Safe wrapper of [`", stringify!($kernel), "`], installed only at the AVX-512 VNNI level.")]
        fn $name(w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: `dots` lists this function only for the
            // AVX-512 VNNI level, which `Kernels::for_level` checked against
            // the CPU (AVX-512 F/BW/VL/VNNI, FMA, F16C; AVX2 comes with them).
            unsafe { $kernel(w, a) }
        }
    };
}

safe_dot512!(dot_f32, f32_dot);
safe_dot512!(dot_q8_0, q8_0_dot);
safe_dot512!(dot_q4_0, q4_0_dot);
safe_dot512!(dot_q5_0, q5_0_dot);
safe_dot512!(dot_iq4_nl, iq4_nl_dot);
safe_dot512!(dot_q4_k, q4_k_dot);
safe_dot512!(dot_q5_k, q5_k_dot);
safe_dot512!(dot_q6_k, q6_k_dot);

/// The 32 nibbles of 16 packed bytes, in value order (low nibbles, then
/// high nibbles), without a cross-lane shuffle.
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features; `p..p + 16`
/// readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    let x = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
    let x = _mm256_srlv_epi64(x, _mm256_setr_epi64x(0, 0, 4, 4));
    _mm256_and_si256(x, _mm256_set1_epi8(0x0f))
}

/// `Σ x·y` of signed bytes in 8 `i32` lanes: `|x| · (y·sign(x))` through
/// `vpdpbusd` (`y` must avoid -128, which the quantizers never produce).
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(x), _mm256_sign_epi8(y, x))
}

/// `Σ (u - c)·y` for unsigned bytes `u` and the constant byte `c`, in 8
/// `i32` lanes.
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_u8_offset(u: __m256i, c: __m256i, y: __m256i) -> __m256i {
    let zero = _mm256_setzero_si256();
    _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, u, y), _mm256_dpbusd_epi32(zero, c, y))
}

/// Q8_0 × Q8_0.
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_0_dot(w: &[u8], a: &[u8]) -> f32 {
    q8_0_row!(w, a, L::Q8_0, |wb, aq| {
        dot_i8(_mm256_loadu_si256(wb.add(L::Q8_0_QS).cast()), _mm256_loadu_si256(aq.cast()))
    })
}

/// Q4_0 × Q8_0: `Σ q·a − 8·Σ a`.
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_0_dot(w: &[u8], a: &[u8]) -> f32 {
    let eight = _mm256_set1_epi8(8);
    q8_0_row!(w, a, L::Q4_0, |wb, aq| {
        dot_u8_offset(nibbles32(wb.add(L::Q4_0_QS)), eight, _mm256_loadu_si256(aq.cast()))
    })
}

/// Q5_0 × Q8_0: the fifth bits (`qh`, one per value) are a byte mask that
/// adds 16 to the nibbles; then `Σ q·a − 16·Σ a`.
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_0_dot(w: &[u8], a: &[u8]) -> f32 {
    let sixteen = _mm256_set1_epi8(16);
    q8_0_row!(w, a, L::Q5_0, |wb, aq| {
        let q = nibbles32(wb.add(L::Q5_0_QS));
        let q = _mm256_mask_add_epi8(q, read_u32(wb.add(L::Q5_0_QH)), q, sixteen);
        dot_u8_offset(q, sixteen, _mm256_loadu_si256(aq.cast()))
    })
}

/// IQ4_NL × Q8_0: table lookup of the nibbles, then the signed product.
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4_nl_dot(w: &[u8], a: &[u8]) -> f32 {
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    q8_0_row!(w, a, L::IQ4_NL, |wb, aq| {
        let x = _mm256_shuffle_epi8(table, nibbles32(wb.add(L::IQ4_NL_QS)));
        dot_i8(x, _mm256_loadu_si256(aq.cast()))
    })
}

/// F32 × F32, 64 values per iteration.
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn f32_dot(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len().min(a.len()) / 4;
    let (wp, ap) = (w.as_ptr().cast::<f32>(), a.as_ptr().cast::<f32>());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (of every read below): element indices stay below `n`.
    while i + 64 <= n {
        prefetch_ahead::<256>(wp.add(i).cast());
        for (j, acc) in acc.iter_mut().enumerate() {
            let k = i + 16 * j;
            *acc = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(k)), _mm512_loadu_ps(ap.add(k)), *acc);
        }
        i += 64;
    }
    while i + 16 <= n {
        acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(i)), _mm512_loadu_ps(ap.add(i)), acc[0]);
        i += 16;
    }
    if i < n {
        // The last 1..15 values, masked (masked-off lanes are not read).
        let m: __mmask16 = (1u16 << (n - i)) - 1;
        acc[1] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, wp.add(i)), _mm512_maskz_loadu_ps(m, ap.add(i)), acc[1]);
    }
    let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(s)
}

// ---------------------------------------------------------------------------
// k-quants.

/// Index vector for `vpermw` that fills 512 bits with `[g ×8, g+1 ×8,
/// g+2 ×8, g+3 ×8]` (for 16-value groups).
const fn spread4(g: u16) -> [u16; 32] {
    let mut v = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        v[i] = g + (i / 8) as u16;
        i += 1;
    }
    v
}

const SPREAD4: [[u16; 32]; 4] = [spread4(0), spread4(4), spread4(8), spread4(12)];

/// Loads a 64-byte constant table.
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn table512(t: &[u16; 32]) -> __m512i {
    _mm512_loadu_si512(t.as_ptr().cast())
}

/// Q6_K × Q8_K: codes `u = low4 | high2 << 4`, value `u − 32`, 16 groups of
/// 16 with signed 8-bit scales; `d_a·d·(Σ_g s_g·Σ u·a − 32·Σ_g s_g·bsum_g)`.
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k_dot(w: &[u8], a: &[u8]) -> f32 {
    let nb = (w.len() / L::Q6_K).min(a.len() / L::Q8_K);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let spread = [table512(&SPREAD4[0]), table512(&SPREAD4[1]), table512(&SPREAD4[2]), table512(&SPREAD4[3])];
    let low4 = _mm512_set1_epi8(0x0f);
    let bits45 = _mm512_set1_epi8(0x30);
    // Per 256-bit half: qh bits (0,1) and (2,3) to bits (4,5) for the low
    // 64 values of a 128-value half; bits (4,5) and (6,7) for the high 64.
    let shl_lo = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
    let shr_hi = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        // SAFETY (of every read of this iteration): block `i < nb` lies
        // inside both slices.
        let wb = wp.add(i * L::Q6_K);
        prefetch_ahead::<256>(wb);
        let ab = ap.add(i * L::Q8_K);
        let aq = ab.add(L::Q8_K_QS);
        let d = f16_to_f32(read_u16(wb.add(L::Q6_K_D))) * read_f32(ab);
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(L::Q6_K_SCALES).cast()));
        let offset = _mm256_madd_epi16(sc16, _mm256_loadu_si256(ab.add(L::Q8_K_BSUMS).cast()));
        let sc = _mm512_castsi256_si512(sc16);
        let mut s0 = _mm512_setzero_si512();
        let mut s1 = _mm512_setzero_si512();
        for n in 0..2 {
            let ql = _mm512_loadu_si512(wb.add(64 * n).cast());
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(wb.add(L::Q6_K_QH + 32 * n).cast()));
            let u_lo =
                _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_and_si512(_mm512_sllv_epi64(qh, shl_lo), bits45));
            let u_hi = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4),
                _mm512_and_si512(_mm512_srlv_epi64(qh, shr_hi), bits45),
            );
            let p_lo = _mm512_maddubs_epi16(u_lo, _mm512_loadu_si512(aq.add(128 * n).cast()));
            let p_hi = _mm512_maddubs_epi16(u_hi, _mm512_loadu_si512(aq.add(128 * n + 64).cast()));
            s0 = _mm512_dpwssd_epi32(s0, p_lo, _mm512_permutexvar_epi16(spread[2 * n], sc));
            s1 = _mm512_dpwssd_epi32(s1, p_hi, _mm512_permutexvar_epi16(spread[2 * n + 1], sc));
        }
        // Fold to 256 bits and take off 32·Σ s_g·bsum_g.
        let sumi = _mm512_add_epi32(s0, s1);
        let sumi = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64::<1>(sumi));
        let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<5>(offset));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    }
    hsum_ps(acc)
}

/// `acc + Σ` of the two `i16 × i16` products of each dword lane of `p` and
/// the dword at `s` broadcast (`vpdpwssd` with an embedded-broadcast
/// memory operand: one instruction, no shuffle). Written as `asm!`: the
/// compiler otherwise splits it into `vpmaddwd` + `vpaddd` and a separate
/// broadcast.
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features; `s..s + 4`
/// readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dpwssd_broadcast(acc: __m256i, p: __m256i, s: *const u32) -> __m256i {
    let mut acc = acc;
    // SAFETY: reads 4 bytes at `s` (the caller's promise); no other effect.
    core::arch::asm!(
        "vpdpwssd {acc}, {p}, dword ptr [{s}]{{1to8}}",
        acc = inout(ymm_reg) acc,
        p = in(ymm_reg) p,
        s = in(reg) s,
        options(pure, readonly, nostack, preserves_flags)
    );
    acc
}

/// Q4_K × Q8_K: the AVX2 row loop with `vpdpwssd` applying the broadcast
/// scales (256-bit vectors measured faster here than 512-bit ones, which
/// need lane shuffles to pair nibbles with activations).
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_dot(w: &[u8], a: &[u8]) -> f32 {
    k4_row!(w, a, L::Q4_K, false, |acc, p, s| dpwssd_broadcast(acc, p, s))
}

/// Q5_K × Q8_K, as Q4_K.
///
/// # Safety
/// The CPU must support the AVX-512 VNNI level's features.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_k_dot(w: &[u8], a: &[u8]) -> f32 {
    k4_row!(w, a, L::Q5_K, true, |acc, p, s| dpwssd_broadcast(acc, p, s))
}
