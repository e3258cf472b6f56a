//! AVX-512 VNNI kernels of the packed products (`cpu::packed`): one group
//! of 16 interleaved rows against a tile of 1 to 8 tokens.
//!
//! Each kernel keeps, per token, a 16-lane integer accumulator (one lane per
//! row) for the current block and a 16-lane f32 accumulator for the row
//! dots; the f32 operations per lane are exactly those of
//! `PackedWeight::dot_ref`, in the same order. Integer sums may be split and
//! regrouped freely: they are exact.

use std::arch::x86_64::*;

use crate::cpu::packed::PackedActs;
use crate::GgmlType;

/// Runs group `rec` (`nb` records of `ty`) against tokens `t0..t0 + n`
/// (`1 <= n <= 8`) of `a`, storing lanes `..valid` of token `t`'s outputs
/// at `y + (t - t0)·ld_y`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and FMA must be available; `rec` must point to `nb`
/// records of `ty`'s packed layout; `a` must hold tokens `t0..t0 + n` with
/// `nb` blocks each; `y + t·ld_y .. + valid` must be writable for `t < n`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile(ty: GgmlType, rec: *const u8, nb: usize, a: &PackedActs, t0: usize, n: usize, y: *mut f32, ld_y: usize, valid: usize) {
    let mask: __mmask16 = if valid >= 16 { 0xffff } else { (1u16 << valid) - 1 };
    let ld_a = a.cols;
    let qs = a.qs.as_ptr().add(t0 * ld_a);
    let aux_per = if ty == GgmlType::Q4_K || ty == GgmlType::Q6_K { 8 } else { 1 };
    let d = a.d.as_ptr().add(t0 * nb);
    let aux = a.aux.as_ptr().add(t0 * nb * aux_per);
    let v = View { rec, nb, qs, ld_a, d, aux, y, ld_y, mask };
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
    match ty {
        GgmlType::Q8_0 => by_n!(q32, F_Q8_0),
        GgmlType::Q4_0 => by_n!(q32, F_Q4_0),
        GgmlType::Q5_0 => by_n!(q32, F_Q5_0),
        GgmlType::IQ4_NL => by_n!(q32, F_IQ4_NL),
        GgmlType::Q4_K => by_n!(q4k),
        GgmlType::Q6_K => by_n!(q6k),
        _ => {}
    }
}

const F_Q8_0: u8 = 0;
const F_Q4_0: u8 = 1;
const F_Q5_0: u8 = 2;
const F_IQ4_NL: u8 = 3;

/// Raw pointers of one kernel call (see [`tile`]).
#[derive(Clone, Copy)]
struct View {
    rec: *const u8,
    nb: usize,
    /// Token 0's codes; token `t` at `+ t·ld_a`.
    qs: *const i8,
    ld_a: usize,
    /// Token 0's block scales; token `t` at `+ t·nb`.
    d: *const f32,
    /// Token 0's aux words; token `t` at `+ t·nb·(1 or 8)`.
    aux: *const i32,
    y: *mut f32,
    ld_y: usize,
    mask: __mmask16,
}

/// Four activation codes at byte `at` of token `t`, in every lane.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn act4(v: &View, t: usize, at: usize) -> __m512i {
    _mm512_set1_epi32((v.qs.add(t * v.ld_a + at) as *const i32).read_unaligned())
}

/// The u8 codes of values `4m..4m + 4` of a 32-wide record, 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn codes32<const F: u8>(r: *const u8, m: usize) -> __m512i {
    if F == F_Q8_0 {
        return _mm512_load_si512(r.add(64 + 64 * m) as *const __m512i);
    }
    let raw = _mm512_load_si512(r.add(64 + 64 * (m % 4)) as *const __m512i);
    let lo4 = _mm512_set1_epi8(0x0f);
    let nib = if m < 4 { _mm512_and_si512(raw, lo4) } else { _mm512_and_si512(_mm512_srli_epi16::<4>(raw), lo4) };
    match F {
        F_Q5_0 => {
            let hi = (r.add(320 + 8 * m) as *const u64).read_unaligned();
            _mm512_mask_add_epi8(nib, hi, nib, _mm512_set1_epi8(16))
        }
        F_IQ4_NL => {
            let kv = &super::KVALUES_IQ4NL;
            let t: [u8; 16] = std::array::from_fn(|i| (kv[i] as i32 + 128) as u8);
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const __m128i));
            _mm512_shuffle_epi8(table, nib)
        }
        _ => nib,
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn q32<const F: u8, const T: usize>(v: View) {
    // log2 of the code offset (`packed::offset`): 8, 16 or 128.
    let off_shift = match F {
        F_Q4_0 => 3,
        F_Q5_0 => 4,
        _ => 7,
    };
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..v.nb {
        let r = v.rec.add(b * 64 * rec_lines::<F>());
        // Two integer chains per token (even and odd m) shorten the
        // dependency chain when the tile is small.
        let mut is = [[_mm512_setzero_si512(); 2]; T];
        for t in 0..T {
            is[t][0] = _mm512_set1_epi32(-(*v.aux.add(t * v.nb + b) << off_shift));
        }
        for m in 0..8 {
            let w = codes32::<F>(r, m);
            for t in 0..T {
                let c = if T < 4 { m % 2 } else { 0 };
                is[t][c] = _mm512_dpbusd_epi32(is[t][c], w, act4(&v, t, b * 32 + 4 * m));
            }
        }
        let wd = _mm512_load_ps(r as *const f32);
        for t in 0..T {
            let isum = if T < 4 { _mm512_add_epi32(is[t][0], is[t][1]) } else { is[t][0] };
            let s = _mm512_mul_ps(wd, _mm512_set1_ps(*v.d.add(t * v.nb + b)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc[t]);
        }
    }
    for t in 0..T {
        _mm512_mask_storeu_ps(v.y.add(t * v.ld_y), v.mask, acc[t]);
    }
}

/// Record size of a 32-wide format in 64-byte lines.
const fn rec_lines<const F: u8>() -> usize {
    match F {
        F_Q8_0 => 9,
        F_Q5_0 => 6,
        _ => 5,
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn q4k<const T: usize>(v: View) {
    let lo4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); T];
    for sb in 0..v.nb {
        let r = v.rec.add(sb * 2560);
        let a0 = sb * 256;
        let mut s = [_mm512_setzero_si512(); T];
        for sub in 0..8 {
            let mut is = [_mm512_setzero_si512(); T];
            for m in 0..8 {
                let raw = _mm512_load_si512(r.add(512 + 64 * (8 * (sub / 2) + m)) as *const __m512i);
                let w = if sub % 2 == 0 { _mm512_and_si512(raw, lo4) } else { _mm512_and_si512(_mm512_srli_epi16::<4>(raw), lo4) };
                for t in 0..T {
                    is[t] = _mm512_dpbusd_epi32(is[t], w, act4(&v, t, a0 + 32 * sub + 4 * m));
                }
            }
            let sc = _mm512_cvtepu8_epi32(_mm_load_si128(r.add(128 + 16 * sub) as *const __m128i));
            for t in 0..T {
                s[t] = _mm512_add_epi32(s[t], _mm512_mullo_epi32(is[t], sc));
            }
        }
        let mut mins = [_mm512_setzero_si512(); T];
        for p in 0..8 {
            let mp = _mm512_cvtepu8_epi16(_mm256_load_si256(r.add(256 + 32 * p) as *const __m256i));
            for t in 0..T {
                let bs = _mm512_set1_epi32(*v.aux.add((t * v.nb + sb) * 8 + p));
                mins[t] = _mm512_dpwssd_epi32(mins[t], mp, bs);
            }
        }
        let d = _mm512_load_ps(r as *const f32);
        let dmin = _mm512_load_ps(r.add(64) as *const f32);
        for t in 0..T {
            let m = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mins[t]));
            let x = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(s[t]), m);
            acc[t] = _mm512_fmadd_ps(x, _mm512_set1_ps(*v.d.add(t * v.nb + sb)), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_mask_storeu_ps(v.y.add(t * v.ld_y), v.mask, acc[t]);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn q6k<const T: usize>(v: View) {
    let mut acc = [_mm512_setzero_ps(); T];
    for sb in 0..v.nb {
        let r = v.rec.add(sb * 4672);
        let a0 = sb * 256;
        let mut s = [_mm512_setzero_si512(); T];
        for sub in 0..16 {
            let mut is = [_mm512_setzero_si512(); T];
            for m in 0..4 {
                let w = _mm512_load_si512(r.add(576 + 64 * (4 * sub + m)) as *const __m512i);
                for t in 0..T {
                    is[t] = _mm512_dpbusd_epi32(is[t], w, act4(&v, t, a0 + 16 * sub + 4 * m));
                }
            }
            let sc = _mm512_cvtepi8_epi32(_mm_load_si128(r.add(64 + 16 * sub) as *const __m128i));
            for t in 0..T {
                s[t] = _mm512_add_epi32(s[t], _mm512_mullo_epi32(is[t], sc));
            }
        }
        let mut bsum = [_mm512_setzero_si512(); T];
        for p in 0..8 {
            let scp = _mm512_cvtepi8_epi16(_mm256_load_si256(r.add(320 + 32 * p) as *const __m256i));
            for t in 0..T {
                let bs = _mm512_set1_epi32(*v.aux.add((t * v.nb + sb) * 8 + p));
                bsum[t] = _mm512_dpwssd_epi32(bsum[t], scp, bs);
            }
        }
        let d = _mm512_load_ps(r as *const f32);
        for t in 0..T {
            let x = _mm512_sub_epi32(s[t], _mm512_slli_epi32::<5>(bsum[t]));
            let da = _mm512_mul_ps(d, _mm512_set1_ps(*v.d.add(t * v.nb + sb)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), da, acc[t]);
        }
    }
    for t in 0..T {
        _mm512_mask_storeu_ps(v.y.add(t * v.ld_y), v.mask, acc[t]);
    }
}
