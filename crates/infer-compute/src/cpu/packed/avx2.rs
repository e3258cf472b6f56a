//! AVX2 kernels of the packed products (`cpu::packed`), for processors
//! without AVX-512 VNNI: the same layouts, each 16-row group taken as two
//! halves of 8 rows (one 256-bit vector each), up to 4 tokens per pass.
//!
//! `vpdpbusd` is emulated exactly: `vpmaddubsw` (u8 × i8 pairs into i16)
//! then `vpmaddwd` by ones. No pair can saturate: the unsigned codes are
//! below 64 (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K), so a pair is at most
//! 2·63·128; the signed codes of Q8_0 and IQ4_NL go through `|q|` and `sign(a, q)`, so a
//! pair is at most 2·128·127 (Q8_0 activations of finite inputs lie in
//! -127..=127; a block with a NaN input, whose codes may hold -128, which
//! `sign` cannot negate, has a NaN scale and a NaN result on every level:
//! see `PackedActs::quantize`). Every integer sum is therefore the exact one
//! of the AVX-512 kernels and of `PackedWeight::dot_ref`, and the f32
//! operations per lane are the same: the results have the same bits.

use std::arch::x86_64::*;

use super::acts::PackedActs;
use super::format::{by_format, params, Params, F_IQ4_NL, F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1, F_Q8_0};
use crate::quant::iq4_nl::KVALUES_IQ4NL;
use crate::GgmlType;

/// Tokens per pass (register budget: 16 vector registers).
const T_MAX: usize = 4;

/// As `avx512::tile`: group `scales`/`codes` of `ty` against tokens
/// `t0..t0 + n` (`1 <= n <= 8`), lanes `..valid` of token `t`'s outputs at
/// `y + (t - t0)·ld_y`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; the pointers as in
/// `avx512::tile`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile(
    ty: GgmlType,
    scales: *const u8,
    codes: *const u8,
    nb: usize,
    a: &PackedActs,
    t0: usize,
    n: usize,
    y: *mut f32,
    ld_y: usize,
    valid: usize,
) {
    let Some(Params { sc, rec, shift, aux_per }) = params(ty) else { return };
    let mut t = 0;
    while t < n {
        let m = (n - t).min(T_MAX);
        let tt = t0 + t;
        // The tokens from `t` on, rows `8 * half ..` of the group.
        let view = |half: usize| View {
            scales,
            codes,
            sc,
            rec,
            shift,
            half,
            nb,
            qs: a.qs.as_ptr().add(tt * a.cols),
            ld_a: a.cols,
            d: a.d.as_ptr().add(tt * nb),
            aux: a.aux.as_ptr().add(tt * nb * aux_per),
            aux_per,
            y: y.add(t * ld_y + 8 * half),
            ld_y,
            lanes: valid.saturating_sub(8 * half).min(8),
        };
        if m == 1 && valid > 8 && !matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
            // One token, both halves in one pass (`q32_pair`).
            let (v0, v1) = (view(0), view(1));
            macro_rules! pair {
                (q32, $c:expr) => {
                    q32_pair::<{ $c }>(v0, v1)
                };
                ($f:ident) => {{}};
            }
            by_format!(ty, pair);
            t += 1;
            continue;
        }
        for half in 0..2 {
            let v = view(half);
            if v.lanes == 0 {
                continue;
            }
            macro_rules! by_n {
                ($f:ident $(, $c:expr)?) => {
                    match m {
                        1 => $f::<$($c,)? 1>(v),
                        2 => $f::<$($c,)? 2>(v),
                        3 => $f::<$($c,)? 3>(v),
                        _ => $f::<$($c,)? 4>(v),
                    }
                };
            }
            by_format!(ty, by_n)
        }
        t += m;
    }
}

/// Raw pointers of one pass over one half (see [`tile`]).
#[derive(Clone, Copy)]
struct View {
    scales: *const u8,
    codes: *const u8,
    /// Scale bytes per block (`packed::layout`).
    sc: usize,
    /// Bytes of one code record (`packed::layout`).
    rec: usize,
    /// log2 of the unsigned 32-wide codes' offset (`packed::offset`).
    shift: u32,
    /// Rows `8·half..8·half + 8` of the group.
    half: usize,
    nb: usize,
    qs: *const i8,
    ld_a: usize,
    d: *const f32,
    aux: *const i32,
    aux_per: usize,
    /// Token 0's outputs for this half; token `t` at `+ t·ld_y`.
    y: *mut f32,
    ld_y: usize,
    /// Valid rows of this half (1..=8).
    lanes: usize,
}

impl View {
    /// Aux word `i` of block `b` of token `t`.
    ///
    /// # Safety
    /// `t`, `b` and `i` lie inside the call this view describes (`t < n`, `b < nb`, `i < aux_per`).
    #[inline(always)]
    unsafe fn aux(&self, t: usize, b: usize, i: usize) -> i32 {
        *self.aux.add((t * self.nb + b) * self.aux_per + i)
    }
    /// The activation scale of block `b` of token `t`.
    ///
    /// # Safety
    /// `t < n` and `b < nb` of the call this view describes.
    #[inline(always)]
    unsafe fn d(&self, t: usize, b: usize) -> f32 {
        *self.d.add(t * self.nb + b)
    }
    /// This half's 32 bytes of the 64-byte plane at `p`.
    ///
    /// # Safety
    /// AVX2 must be available; `p..p + 64` must be readable.
    #[inline(always)]
    unsafe fn plane(&self, p: *const u8) -> __m256i {
        _mm256_load_si256(p.add(32 * self.half) as *const __m256i)
    }
}

/// In decode (`T == 1`), on the first half's pass (the second finds the
/// group in cache), prefetches as `avx512::prefetch` does: the
/// record 2 KiB or two records (whichever is further) past the record at
/// `r`, so that each core keeps several weight reads in flight.
///
/// # Safety
/// None beyond x86-64 itself (SSE): a prefetch is a hint that never faults, and its address is formed with
/// wrapping arithmetic.
#[inline(always)]
unsafe fn prefetch<const T: usize>(v: &View, r: *const u8) {
    if T == 1 && v.half == 0 {
        let mut off = 0;
        while off < v.rec {
            _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add((2 * v.rec).max(2048) + off) as *const i8);
            off += 64;
        }
    }
}

/// Four activation codes at byte `at` of token `t`, in every lane.
///
/// # Safety
/// AVX2 must be available; bytes `at..at + 4` of token `t` must lie in the view's activation codes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn act4(v: &View, t: usize, at: usize) -> __m256i {
    _mm256_set1_epi32((v.qs.add(t * v.ld_a + at) as *const i32).read_unaligned())
}

/// 8 f16 scales of this half at `p` (the group's 16), as f32.
///
/// # Safety
/// AVX2 and F16C must be available; `p..p + 32` (the group's 16 scales) must be readable.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn scales8(v: &View, p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * v.half) as *const __m128i))
}

/// `acc + Σ_4 w·a` per i32 lane for unsigned `w` below 64 (exact).
///
/// # Safety
/// AVX2 must be available (register arithmetic only, no memory access).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot_u(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)))
}

/// `acc + Σ_4 q·a` per i32 lane for signed `q` (exact through `|q|` and
/// `sign(a, q)`).
///
/// # Safety
/// AVX2 must be available (register arithmetic only, no memory access).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot_s(acc: __m256i, q: __m256i, a: __m256i) -> __m256i {
    dot_u(acc, _mm256_abs_epi8(q), _mm256_sign_epi8(a, q))
}

/// Stores `acc[t]` (this half's lanes) for every token of the pass.
///
/// # Safety
/// AVX2 must be available; outputs `..lanes` of tokens `..T` (at `y + t·ld_y`) must be writable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store<const T: usize>(v: &View, acc: &[__m256; T]) {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(v.lanes as i32), idx);
    for t in 0..T {
        _mm256_maskstore_ps(v.y.add(t * v.ld_y), mask, acc[t]);
    }
}

/// Signed codes (Q8_0, IQ4_NL) or unsigned codes (Q4_0, Q4_1, Q5_0, Q5_1)
/// of values `4m..4m + 4` of a 32-wide code record, this half's 8 lanes.
///
/// # Safety
/// AVX2 must be available; `r` must point to a whole, 64-byte aligned code record of format `F`
/// (`packed::layout`); `m < 8`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn codes32<const F: u8>(v: &View, r: *const u8, m: usize) -> __m256i {
    if F == F_Q8_0 {
        // Stored biased by 128: flipping the top bit gives q as i8.
        return _mm256_xor_si256(v.plane(r.add(64 * m)), _mm256_set1_epi8(-128));
    }
    let raw = v.plane(r.add(64 * (m % 4)));
    let lo4 = _mm256_set1_epi8(0x0f);
    let nib = if m < 4 { _mm256_and_si256(raw, lo4) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(raw), lo4) };
    match F {
        F_Q5_0 | F_Q5_1 => {
            // The fifth bits of this half: 32 mask bits, one per byte.
            let bits = ((r.add(256 + 8 * m) as *const u64).read_unaligned() >> (32 * v.half)) as u32 as i32;
            // Byte k of lane j takes bit 4j + k: spread the bits to bytes.
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(bits),
                _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                ),
            );
            let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
            _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(16)))
        }
        F_IQ4_NL => {
            let kv = &KVALUES_IQ4NL;
            let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(kv.as_ptr() as *const __m128i));
            _mm256_shuffle_epi8(table, nib)
        }
        _ => nib,
    }
}

/// The products of one half-group of a 32-wide format `F` with `T` tokens.
///
/// # Safety
/// As [`tile`]: the view describes buffers of a live `tile` call with a group of format `F` and `T` tokens.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q32<const F: u8, const T: usize>(v: View) {
    let signed = F == F_Q8_0 || F == F_IQ4_NL;
    let with_min = F == F_Q4_1 || F == F_Q5_1;
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..v.nb {
        let r = v.codes.add(b * v.rec);
        prefetch::<T>(&v, r);
        let mut is = [_mm256_setzero_si256(); T];
        if !signed && !with_min {
            for t in 0..T {
                is[t] = _mm256_set1_epi32(-(v.aux(t, b, 0) << v.shift));
            }
        }
        let mut s16 = [_mm256_setzero_si256(); T];
        for m in 0..8 {
            let w = codes32::<F>(&v, r, m);
            for t in 0..T {
                let a = act4(&v, t, b * 32 + 4 * m);
                if signed {
                    is[t] = dot_s(is[t], w, a);
                } else {
                    s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(w, a));
                }
            }
            if !signed && (m + 1) % i16_steps(F) == 0 {
                for t in 0..T {
                    is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(s16[t], _mm256_set1_epi16(1)));
                    s16[t] = _mm256_setzero_si256();
                }
            }
        }
        let wd = scales8(&v, v.scales.add(v.sc * b));
        if with_min {
            let wm = scales8(&v, v.scales.add(v.sc * b + 32));
            for t in 0..T {
                let m = _mm256_mul_ps(wm, _mm256_set1_ps(v.aux(t, b, 0) as f32));
                let x = _mm256_fmadd_ps(wd, _mm256_cvtepi32_ps(is[t]), m);
                acc[t] = _mm256_fmadd_ps(x, _mm256_set1_ps(v.d(t, b)), acc[t]);
            }
        } else {
            for t in 0..T {
                let s = _mm256_mul_ps(wd, _mm256_set1_ps(v.d(t, b)));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), s, acc[t]);
            }
        }
    }
    store::<T>(&v, &acc);
}

/// Code pairs `F`'s `vpmaddubsw` sums can take in i16 before they must be
/// widened: a pair is at most `2·max|q|·128`, so 8 steps of 4-bit codes
/// (`8·2·15·128 = 30720`), 4 of 5-bit ones, and 1 of signed 8-bit ones fit
/// in `i16` (exact either way; fewer widenings).
const fn i16_steps(f: u8) -> usize {
    match f {
        F_Q4_0 | F_Q4_1 => 8,
        F_Q5_0 | F_Q5_1 => 4,
        _ => 1,
    }
}

/// [`q32`] for one token and both halves of a group in one pass: each
/// activation broadcast serves 16 rows, and the i16 sums of `vpmaddubsw` are
/// widened once per [`i16_steps`]. The same integer sums and the same f32
/// operations per lane as [`q32`], so the same bits.
///
/// # Safety
/// As [`q32`] with `T = 1`, for `v0` (half 0) and `v1` (half 1) of the same
/// group and token.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q32_pair<const F: u8>(v0: View, v1: View) {
    let signed = F == F_Q8_0 || F == F_IQ4_NL;
    let with_min = F == F_Q4_1 || F == F_Q5_1;
    let steps = i16_steps(F);
    let ones = _mm256_set1_epi16(1);
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for b in 0..v0.nb {
        let r = v0.codes.add(b * v0.rec);
        prefetch::<1>(&v0, r);
        let (mut is0, mut is1) = if !signed && !with_min {
            let init = _mm256_set1_epi32(-(v0.aux(0, b, 0) << v0.shift));
            (init, init)
        } else {
            (_mm256_setzero_si256(), _mm256_setzero_si256())
        };
        let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for m in 0..8 {
            let a = act4(&v0, 0, b * 32 + 4 * m);
            let (w0, w1) = (codes32::<F>(&v0, r, m), codes32::<F>(&v1, r, m));
            if signed {
                is0 = dot_s(is0, w0, a);
                is1 = dot_s(is1, w1, a);
            } else {
                s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(w0, a));
                s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(w1, a));
                if (m + 1) % steps == 0 {
                    is0 = _mm256_add_epi32(is0, _mm256_madd_epi16(s0, ones));
                    is1 = _mm256_add_epi32(is1, _mm256_madd_epi16(s1, ones));
                    (s0, s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                }
            }
        }
        let ad = _mm256_set1_ps(v0.d(0, b));
        let (wd0, wd1) = (scales8(&v0, v0.scales.add(v0.sc * b)), scales8(&v1, v1.scales.add(v1.sc * b)));
        if with_min {
            let asum = _mm256_set1_ps(v0.aux(0, b, 0) as f32);
            let at = v0.sc * b + 32;
            let (m0, m1) = (
                _mm256_mul_ps(scales8(&v0, v0.scales.add(at)), asum),
                _mm256_mul_ps(scales8(&v1, v1.scales.add(at)), asum),
            );
            acc0 = _mm256_fmadd_ps(_mm256_fmadd_ps(wd0, _mm256_cvtepi32_ps(is0), m0), ad, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_fmadd_ps(wd1, _mm256_cvtepi32_ps(is1), m1), ad, acc1);
        } else {
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is0), _mm256_mul_ps(wd0, ad), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is1), _mm256_mul_ps(wd1, ad), acc1);
        }
    }
    store::<1>(&v0, &[acc0]);
    store::<1>(&v1, &[acc1]);
}

/// The products of one Q4_K half-group with `T` tokens.
///
/// # Safety
/// As [`tile`]: the view describes buffers of a live `tile` call with a Q4_K group and `T` tokens.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k<const T: usize>(v: View) {
    let lo4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); T];
    for sb in 0..v.nb {
        let r = v.codes.add(sb * v.rec);
        prefetch::<T>(&v, r);
        let a0 = sb * 256;
        let mut s = [_mm256_setzero_si256(); T];
        for sub in 0..8 {
            let mut is = [_mm256_setzero_si256(); T];
            for m in 0..8 {
                let raw = v.plane(r.add(256 + 64 * (8 * (sub / 2) + m)));
                let w = if sub % 2 == 0 {
                    _mm256_and_si256(raw, lo4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(raw), lo4)
                };
                for t in 0..T {
                    is[t] = dot_u(is[t], w, act4(&v, t, a0 + 32 * sub + 4 * m));
                }
            }
            let sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(r.add(16 * sub + 8 * v.half) as *const __m128i));
            for t in 0..T {
                s[t] = _mm256_add_epi32(s[t], _mm256_mullo_epi32(is[t], sc));
            }
        }
        let mut mins = [_mm256_setzero_si256(); T];
        for p in 0..4 {
            let mp = _mm256_cvtepu8_epi16(_mm_loadu_si128(r.add(128 + 32 * p + 16 * v.half) as *const __m128i));
            for t in 0..T {
                mins[t] = _mm256_add_epi32(mins[t], _mm256_madd_epi16(mp, _mm256_set1_epi32(v.aux(t, sb, 16 + p))));
            }
        }
        let d = scales8(&v, v.scales.add(64 * sb));
        let dmin = scales8(&v, v.scales.add(64 * sb + 32));
        for t in 0..T {
            let m = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mins[t]));
            let x = _mm256_fmsub_ps(d, _mm256_cvtepi32_ps(s[t]), m);
            acc[t] = _mm256_fmadd_ps(x, _mm256_set1_ps(v.d(t, sb)), acc[t]);
        }
    }
    store::<T>(&v, &acc);
}

/// The u8 codes (`0..64`) of Q6_K group `gi`, this half's 8 lanes.
///
/// # Safety
/// AVX2 must be available; `r` must point to a whole Q6_K code record (`packed::layout`); `gi` must name one
/// of its 64-value groups.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn codes_q6k(v: &View, r: *const u8, gi: usize) -> __m256i {
    let raw = v.plane(r.add(256 + 64 * (gi % 32)));
    let lo4 = _mm256_set1_epi8(0x0f);
    let nib = if gi < 32 { _mm256_and_si256(raw, lo4) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(raw), lo4) };
    let h = v.plane(r.add(2304 + 64 * (gi % 16)));
    let h = match gi / 16 {
        0 => h,
        1 => _mm256_srli_epi16::<2>(h),
        2 => _mm256_slli_epi16::<4>(h),
        _ => _mm256_slli_epi16::<2>(h),
    };
    _mm256_or_si256(nib, _mm256_and_si256(h, _mm256_set1_epi8(0x30)))
}

/// The products of one Q6_K half-group with `T` tokens.
///
/// # Safety
/// As [`tile`]: the view describes buffers of a live `tile` call with a Q6_K group and `T` tokens.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k<const T: usize>(v: View) {
    let mut acc = [_mm256_setzero_ps(); T];
    for sb in 0..v.nb {
        let r = v.codes.add(sb * v.rec);
        prefetch::<T>(&v, r);
        let a0 = sb * 256;
        let mut s = [_mm256_setzero_si256(); T];
        for sub in 0..16 {
            let mut is = [_mm256_setzero_si256(); T];
            for t in 0..T {
                is[t] = _mm256_set1_epi32(-(v.aux(t, sb, sub) << 5));
            }
            for m in 0..4 {
                let w = codes_q6k(&v, r, 4 * sub + m);
                for t in 0..T {
                    is[t] = dot_u(is[t], w, act4(&v, t, a0 + 16 * sub + 4 * m));
                }
            }
            let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(r.add(16 * sub + 8 * v.half) as *const __m128i));
            for t in 0..T {
                s[t] = _mm256_add_epi32(s[t], _mm256_mullo_epi32(is[t], sc));
            }
        }
        let d = scales8(&v, v.scales.add(32 * sb));
        for t in 0..T {
            let da = _mm256_mul_ps(d, _mm256_set1_ps(v.d(t, sb)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), da, acc[t]);
        }
    }
    store::<T>(&v, &acc);
}
