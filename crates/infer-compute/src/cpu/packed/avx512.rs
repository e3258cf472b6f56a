//! AVX-512 VNNI kernels of the packed products (`cpu::packed`): one group
//! of 16 interleaved rows against a tile of 1 to 8 tokens.
//!
//! Each kernel keeps, per token, a 16-lane integer accumulator (one lane per
//! row) for the current block and a 16-lane f32 accumulator for the row
//! dots; the f32 operations per lane are exactly those of
//! `PackedWeight::dot_ref`, in the same order. Integer sums may be split and
//! regrouped freely: they are exact.

use std::arch::x86_64::*;

use super::acts::PackedActs;
use super::format::{by_format, params, Params, F_IQ4_NL, F_Q4_1, F_Q5_0, F_Q5_1, F_Q8_0};
use crate::quant::iq4_nl::KVALUES_IQ4NL;
use crate::GgmlType;

/// Runs one group (`scales`: its scale region, `codes`: its `nb` code
/// records, 64-byte aligned) of `ty` against tokens `t0..t0 + n`
/// (`1 <= n <= 8`) of `a`, storing lanes `..valid` of token `t`'s outputs at
/// `y + (t - t0)·ld_y`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and FMA must be available; `scales` and `codes` must
/// hold `nb` blocks of `ty`'s packed layout; `a` must hold tokens
/// `t0..t0 + n` with `nb` blocks each; `y + t·ld_y .. + valid` must be
/// writable for `t < n`.
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
    let mask: __mmask16 = if valid >= 16 { 0xffff } else { (1u16 << valid) - 1 };
    let ld_a = a.cols;
    let qs = a.qs.as_ptr().add(t0 * ld_a);
    let Some(Params { sc, rec, shift, aux_per }) = params(ty) else { return };
    let d = a.d.as_ptr().add(t0 * nb);
    let aux = a.aux.as_ptr().add(t0 * nb * aux_per);
    let v = View { scales, codes, sc, rec, shift, nb, qs, ld_a, d, aux, aux_per, y, ld_y, mask };
    macro_rules! by_n {
        ($f:ident $(, $c:expr)?) => {
            match n {
                1 => $f::<$($c,)? 1>(v),
                2 => $f::<$($c,)? 2>(v),
                3 => $f::<$($c,)? 3>(v),
                4 => $f::<$($c,)? 4>(v),
                5 => $f::<$($c,)? 5>(v),
                6 => $f::<$($c,)? 6>(v),
                7 => $f::<$($c,)? 7>(v),
                _ => $f::<$($c,)? 8>(v),
            }
        };
    }
    by_format!(ty, by_n)
}

/// Raw pointers of one kernel call (see [`tile`]).
#[derive(Clone, Copy)]
struct View {
    scales: *const u8,
    codes: *const u8,
    /// Scale bytes per block (`packed::layout`).
    sc: usize,
    /// Bytes of one code record (`packed::layout`).
    rec: usize,
    /// log2 of the 32-wide codes' offset (`packed::offset`).
    shift: u32,
    nb: usize,
    /// Token 0's codes; token `t` at `+ t·ld_a`.
    qs: *const i8,
    ld_a: usize,
    /// Token 0's block scales; token `t` at `+ t·nb`.
    d: *const f32,
    /// Token 0's aux words; token `t` at `+ t·nb·aux_per`.
    aux: *const i32,
    aux_per: usize,
    y: *mut f32,
    ld_y: usize,
    mask: __mmask16,
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
}

/// In decode (`T == 1`, weights streamed from memory once), prefetches the
/// record that lies 2 KiB or two records (whichever is further) past the
/// record at `r`: a kernel call
/// reads one group (several KiB) before the next, so without it each core
/// has a single stream of demand misses in flight. Prefill reuses cached
/// weights and skips it. Prefetching past the end of the weights is
/// harmless (a hint, never a fault).
///
/// # Safety
/// None beyond x86-64 itself (SSE): a prefetch is a hint that never faults, and its address is formed with
/// wrapping arithmetic.
#[inline(always)]
unsafe fn prefetch<const T: usize>(r: *const u8, bytes: usize) {
    if T == 1 {
        let mut off = 0;
        while off < bytes {
            _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add((2 * bytes).max(2048) + off) as *const i8);
            off += 64;
        }
    }
}

/// Four activation codes at byte `at` of token `t`, in every lane.
///
/// # Safety
/// AVX-512 F must be available; bytes `at..at + 4` of token `t` must lie in the view's activation codes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn act4(v: &View, t: usize, at: usize) -> __m512i {
    _mm512_set1_epi32((v.qs.add(t * v.ld_a + at) as *const i32).read_unaligned())
}

/// 16 f16 scales at `p`, as f32.
///
/// # Safety
/// AVX-512 F must be available; `p..p + 32` must be readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scales16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// The u8 codes of values `4m..4m + 4` of a 32-wide code record, 16 lanes.
///
/// # Safety
/// AVX-512 F/BW must be available; `r` must point to a whole, 64-byte aligned code record of format `F`
/// (`packed::layout`); `m < 8`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn codes32<const F: u8>(r: *const u8, m: usize) -> __m512i {
    if F == F_Q8_0 {
        return _mm512_load_si512(r.add(64 * m) as *const __m512i);
    }
    let raw = _mm512_load_si512(r.add(64 * (m % 4)) as *const __m512i);
    let lo4 = _mm512_set1_epi8(0x0f);
    let nib = if m < 4 { _mm512_and_si512(raw, lo4) } else { _mm512_and_si512(_mm512_srli_epi16::<4>(raw), lo4) };
    match F {
        F_Q5_0 | F_Q5_1 => {
            let hi = (r.add(256 + 8 * m) as *const u64).read_unaligned();
            _mm512_mask_add_epi8(nib, hi, nib, _mm512_set1_epi8(16))
        }
        F_IQ4_NL => {
            let kv = &KVALUES_IQ4NL;
            let t: [u8; 16] = std::array::from_fn(|i| (kv[i] as i32 + 128) as u8);
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const __m128i));
            _mm512_shuffle_epi8(table, nib)
        }
        _ => nib,
    }
}

/// The products of one group of a 32-wide format `F` with `T` tokens.
///
/// # Safety
/// As [`tile`]: the view describes buffers of a live [`tile`] call with a group of format `F` and `T` tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn q32<const F: u8, const T: usize>(v: View) {
    let with_min = F == F_Q4_1 || F == F_Q5_1;
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..v.nb {
        let r = v.codes.add(b * v.rec);
        prefetch::<T>(r, v.rec);
        // Two integer chains per token (even and odd m) shorten the
        // dependency chain when the tile is small.
        let mut is = [[_mm512_setzero_si512(); 2]; T];
        if !with_min {
            for t in 0..T {
                is[t][0] = _mm512_set1_epi32(-(v.aux(t, b, 0) << v.shift));
            }
        }
        for m in 0..8 {
            let w = codes32::<F>(r, m);
            for t in 0..T {
                let c = if T < 4 { m % 2 } else { 0 };
                is[t][c] = _mm512_dpbusd_epi32(is[t][c], w, act4(&v, t, b * 32 + 4 * m));
            }
        }
        let wd = scales16(v.scales.add(v.sc * b));
        let wm = if with_min { scales16(v.scales.add(v.sc * b + 32)) } else { _mm512_setzero_ps() };
        for t in 0..T {
            let isum = if T < 4 { _mm512_add_epi32(is[t][0], is[t][1]) } else { is[t][0] };
            if with_min {
                let m = _mm512_mul_ps(wm, _mm512_set1_ps(v.aux(t, b, 0) as f32));
                let x = _mm512_fmadd_ps(wd, _mm512_cvtepi32_ps(isum), m);
                acc[t] = _mm512_fmadd_ps(x, _mm512_set1_ps(v.d(t, b)), acc[t]);
            } else {
                let s = _mm512_mul_ps(wd, _mm512_set1_ps(v.d(t, b)));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc[t]);
            }
        }
    }
    for t in 0..T {
        _mm512_mask_storeu_ps(v.y.add(t * v.ld_y), v.mask, acc[t]);
    }
}

/// The products of one Q4_K group with `T` tokens.
///
/// # Safety
/// As [`tile`]: the view describes buffers of a live [`tile`] call with a Q4_K group and `T` tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn q4k<const T: usize>(v: View) {
    let lo4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); T];
    for sb in 0..v.nb {
        let r = v.codes.add(sb * v.rec);
        prefetch::<T>(r, v.rec);
        let a0 = sb * 256;
        let mut s = [_mm512_setzero_si512(); T];
        for sub in 0..8 {
            let mut is = [_mm512_setzero_si512(); T];
            for m in 0..8 {
                let raw = _mm512_load_si512(r.add(256 + 64 * (8 * (sub / 2) + m)) as *const __m512i);
                let w = if sub % 2 == 0 {
                    _mm512_and_si512(raw, lo4)
                } else {
                    _mm512_and_si512(_mm512_srli_epi16::<4>(raw), lo4)
                };
                for t in 0..T {
                    is[t] = _mm512_dpbusd_epi32(is[t], w, act4(&v, t, a0 + 32 * sub + 4 * m));
                }
            }
            let sc = _mm512_cvtepu8_epi32(_mm_load_si128(r.add(16 * sub) as *const __m128i));
            for t in 0..T {
                s[t] = _mm512_add_epi32(s[t], _mm512_mullo_epi32(is[t], sc));
            }
        }
        let mut mins = [_mm512_setzero_si512(); T];
        for p in 0..4 {
            let mp = _mm512_cvtepu8_epi16(_mm256_load_si256(r.add(128 + 32 * p) as *const __m256i));
            for t in 0..T {
                mins[t] = _mm512_dpwssd_epi32(mins[t], mp, _mm512_set1_epi32(v.aux(t, sb, 16 + p)));
            }
        }
        let d = scales16(v.scales.add(64 * sb));
        let dmin = scales16(v.scales.add(64 * sb + 32));
        for t in 0..T {
            let m = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mins[t]));
            let x = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(s[t]), m);
            acc[t] = _mm512_fmadd_ps(x, _mm512_set1_ps(v.d(t, sb)), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_mask_storeu_ps(v.y.add(t * v.ld_y), v.mask, acc[t]);
    }
}

/// The u8 codes (`0..64`) of Q6_K group `gi` (codes `4gi..4gi + 4`), 16 lanes.
///
/// # Safety
/// AVX-512 F/BW must be available; `r` must point to a whole Q6_K code record (`packed::layout`); `gi` must
/// name one of its 64-value groups.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn codes_q6k(r: *const u8, gi: usize) -> __m512i {
    let raw = _mm512_load_si512(r.add(256 + 64 * (gi % 32)) as *const __m512i);
    let lo4 = _mm512_set1_epi8(0x0f);
    let nib = if gi < 32 { _mm512_and_si512(raw, lo4) } else { _mm512_and_si512(_mm512_srli_epi16::<4>(raw), lo4) };
    let h = _mm512_load_si512(r.add(2304 + 64 * (gi % 16)) as *const __m512i);
    // Bring the group's two bits to bits 4-5 (16-bit shifts: bits crossing
    // into the neighbouring byte land outside the mask).
    let h = match gi / 16 {
        0 => h,
        1 => _mm512_srli_epi16::<2>(h),
        2 => _mm512_slli_epi16::<4>(h),
        _ => _mm512_slli_epi16::<2>(h),
    };
    // nib | (h & 0x30) (truth table 0xF8: a | (b & c)); nib has no bits above 3.
    _mm512_ternarylogic_epi32::<0xF8>(nib, h, _mm512_set1_epi8(0x30))
}

/// The products of one Q6_K group with `T` tokens.
///
/// # Safety
/// As [`tile`]: the view describes buffers of a live [`tile`] call with a Q6_K group and `T` tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn q6k<const T: usize>(v: View) {
    let mut acc = [_mm512_setzero_ps(); T];
    for sb in 0..v.nb {
        let r = v.codes.add(sb * v.rec);
        prefetch::<T>(r, v.rec);
        let a0 = sb * 256;
        let mut s = [_mm512_setzero_si512(); T];
        for sub in 0..16 {
            // Each sub-block's sum starts at -32·Σa (the codes' offset).
            let mut is = [_mm512_setzero_si512(); T];
            for t in 0..T {
                is[t] = _mm512_set1_epi32(-(v.aux(t, sb, sub) << 5));
            }
            for m in 0..4 {
                let w = codes_q6k(r, 4 * sub + m);
                for t in 0..T {
                    is[t] = _mm512_dpbusd_epi32(is[t], w, act4(&v, t, a0 + 16 * sub + 4 * m));
                }
            }
            let sc = _mm512_cvtepi8_epi32(_mm_load_si128(r.add(16 * sub) as *const __m128i));
            for t in 0..T {
                s[t] = _mm512_add_epi32(s[t], _mm512_mullo_epi32(is[t], sc));
            }
        }
        let d = scales16(v.scales.add(32 * sb));
        for t in 0..T {
            let da = _mm512_mul_ps(d, _mm512_set1_ps(v.d(t, sb)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), da, acc[t]);
        }
    }
    for t in 0..T {
        _mm512_mask_storeu_ps(v.y.add(t * v.ld_y), v.mask, acc[t]);
    }
}
