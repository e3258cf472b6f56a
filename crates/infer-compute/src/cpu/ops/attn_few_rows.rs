//! The kernels of [`super::attn_tiled`] for a decode step: one token's few
//! query rows (the query heads of one kv head, at most [`FEW_ROWS`])
//! against a block of keys.
//!
//! The prompt tiles put the rows on the vector lanes, padded to 16: a
//! decode step of 3 or 4 rows would leave three quarters of every lane
//! empty, and broadcast each key value on its own. Here the vectors run
//! along `head_dim`: each key's values are loaded once for all the rows,
//! a logit is one multiply-add run and a horizontal sum, and logits and
//! probabilities are row-major (`s[r · ls + c]`), so the softmax runs
//! along the keys. Same formula as the tiles; the sums run in another
//! order.

use super::attention::{AVX2, AVX512};

/// Most rows the few-row kernels take.
pub(super) const FEW_ROWS: usize = 8;

/// `$f::<R>(args)` for the run-time row count `R` in `1..=FEW_ROWS`.
#[cfg(target_arch = "x86_64")]
macro_rules! by_rows {
    ($rows:expr, $f:ident($($a:expr),*)) => {
        match $rows {
            1 => $f::<1>($($a),*),
            2 => $f::<2>($($a),*),
            3 => $f::<3>($($a),*),
            4 => $f::<4>($($a),*),
            5 => $f::<5>($($a),*),
            6 => $f::<6>($($a),*),
            7 => $f::<7>($($a),*),
            _ => $f::<8>($($a),*),
        }
    };
}

/// `s[r · ls + c] = q[r] · k[c]` for `rows ≤ FEW_ROWS` rows of `q` (`hd`
/// apart) and `nk` keys `k = (values, stride)`.
#[inline(always)]
pub(super) fn scores<const W: u8>(
    q: &[f32],
    rows: usize,
    (k, stride): (&[f32], usize),
    nk: usize,
    hd: usize,
    (s, ls): (&mut [f32], usize),
) {
    assert!((1..=FEW_ROWS).contains(&rows) && q.len() >= rows * hd && nk <= ls);
    assert!((nk == 0 || (nk - 1) * stride + hd <= k.len()) && (rows - 1) * ls + nk <= s.len());
    #[cfg(target_arch = "x86_64")]
    {
        let (qp, kp, sp) = (q.as_ptr(), k.as_ptr(), s.as_mut_ptr());
        if W == AVX512 {
            // SAFETY: `W == AVX512` only inside `Job::run_avx512` (AVX-512
            // F and FMA enabled); the asserts bound every access.
            unsafe { by_rows!(rows, scores_avx512(qp, kp, stride, nk, hd, sp, ls)) };
            return;
        }
        if W == AVX2 {
            // SAFETY: `W == AVX2` only inside `Job::run_avx2` (AVX2 and FMA
            // enabled); the asserts bound every access.
            unsafe { by_rows!(rows, scores_avx2(qp, kp, stride, nk, hd, sp, ls)) };
            return;
        }
    }
    for c in 0..nk {
        let kc = &k[c * stride..][..hd];
        for r in 0..rows {
            s[r * ls + c] = q[r * hd..][..hd].iter().zip(kc).map(|(a, b)| a * b).sum();
        }
    }
}

/// `o[r] = o[r] · alpha[r] + Σ_c p[r · ls + c] · v[c]` for `rows ≤
/// FEW_ROWS` rows of `o` (`hd` apart) over `nk` value rows `v = (values,
/// stride)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn pv<const W: u8>(
    (p, ls): (&[f32], usize),
    rows: usize,
    alpha: &[f32],
    (v, stride): (&[f32], usize),
    nk: usize,
    hd: usize,
    o: &mut [f32],
) {
    assert!((1..=FEW_ROWS).contains(&rows) && alpha.len() >= rows && o.len() >= rows * hd && nk <= ls);
    assert!((nk == 0 || (nk - 1) * stride + hd <= v.len()) && (rows - 1) * ls + nk <= p.len());
    #[cfg(target_arch = "x86_64")]
    {
        let (pp, ap, vp, op) = (p.as_ptr(), alpha.as_ptr(), v.as_ptr(), o.as_mut_ptr());
        if W == AVX512 {
            // SAFETY: as in `scores`: AVX-512 F enabled, accesses bounded
            // by the asserts.
            unsafe { by_rows!(rows, pv_avx512(pp, ls, ap, vp, stride, nk, hd, op)) };
            return;
        }
        if W == AVX2 {
            // SAFETY: as in `scores`: AVX2 and FMA enabled, accesses
            // bounded by the asserts.
            unsafe { by_rows!(rows, pv_avx2(pp, ls, ap, vp, stride, nk, hd, op)) };
            return;
        }
    }
    for r in 0..rows {
        let or = &mut o[r * hd..][..hd];
        for x in or.iter_mut() {
            *x *= alpha[r];
        }
        for c in 0..nk {
            let pc = p[r * ls + c];
            for (x, &y) in or.iter_mut().zip(&v[c * stride..][..hd]) {
                *x += pc * y;
            }
        }
    }
}

/// The lanes `0..n` (`n ≤ 16`) of a 16-lane mask.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn lanes(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// [`scores`] of `R` rows in AVX-512 registers (a masked tail past the
/// last whole vector of `hd`).
///
/// # Safety
/// AVX-512 F and FMA must be enabled; `q` holds `R · hd` values, `k` `nk`
/// rows of `hd` values `stride` apart, `s` `R` rows of `nk` values `ls`
/// apart.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scores_avx512<const R: usize>(
    q: *const f32,
    k: *const f32,
    stride: usize,
    nk: usize,
    hd: usize,
    s: *mut f32,
    ls: usize,
) {
    use std::arch::x86_64::*;
    let main = hd / 16 * 16;
    let tail = lanes(hd - main);
    for c in 0..nk {
        let kc = k.add(c * stride);
        let mut acc = [_mm512_setzero_ps(); R];
        let mut d = 0;
        while d < main {
            let kv = _mm512_loadu_ps(kc.add(d));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(r * hd + d)), kv, *a);
            }
            d += 16;
        }
        if tail != 0 {
            let kv = _mm512_maskz_loadu_ps(tail, kc.add(main));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q.add(r * hd + main)), kv, *a);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            *s.add(r * ls + c) = _mm512_reduce_add_ps(*a);
        }
    }
}

/// [`scores`] of `R` rows in AVX2 registers (a scalar tail past the last
/// whole vector of `hd`).
///
/// # Safety
/// AVX2 and FMA must be enabled; bounds as [`scores_avx512`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scores_avx2<const R: usize>(
    q: *const f32,
    k: *const f32,
    stride: usize,
    nk: usize,
    hd: usize,
    s: *mut f32,
    ls: usize,
) {
    use crate::cpu::simd::x86_common::hsum_ps;
    use std::arch::x86_64::*;
    let main = hd / 8 * 8;
    for c in 0..nk {
        let kc = k.add(c * stride);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut d = 0;
        while d < main {
            let kv = _mm256_loadu_ps(kc.add(d));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(r * hd + d)), kv, *a);
            }
            d += 8;
        }
        for (r, a) in acc.iter().enumerate() {
            let mut sum = hsum_ps(*a);
            for d in main..hd {
                sum += *q.add(r * hd + d) * *kc.add(d);
            }
            *s.add(r * ls + c) = sum;
        }
    }
}

/// [`pv`] of `R` rows in AVX-512 registers: column tiles of 32 (two
/// vectors per row, masked past `hd`).
///
/// # Safety
/// AVX-512 F and FMA must be enabled; `p` holds `R` rows of `nk` values
/// `ls` apart, `alpha` `R` values, `v` `nk` rows of `hd` values `stride`
/// apart, `o` `R · hd` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_avx512<const R: usize>(
    p: *const f32,
    ls: usize,
    alpha: *const f32,
    v: *const f32,
    stride: usize,
    nk: usize,
    hd: usize,
    o: *mut f32,
) {
    use std::arch::x86_64::*;
    let mut d0 = 0;
    while d0 < hd {
        let (m0, m1) = (lanes(hd - d0), lanes((hd - d0).saturating_sub(16)));
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            let f = _mm512_set1_ps(*alpha.add(r));
            let src = o.add(r * hd + d0);
            *a = [
                _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, src), f),
                _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, src.add(16)), f),
            ];
        }
        for c in 0..nk {
            let vc = v.add(c * stride + d0);
            let (v0, v1) = (_mm512_maskz_loadu_ps(m0, vc), _mm512_maskz_loadu_ps(m1, vc.add(16)));
            for (r, a) in acc.iter_mut().enumerate() {
                let pc = _mm512_set1_ps(*p.add(r * ls + c));
                a[0] = _mm512_fmadd_ps(pc, v0, a[0]);
                a[1] = _mm512_fmadd_ps(pc, v1, a[1]);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let dst = o.add(r * hd + d0);
            _mm512_mask_storeu_ps(dst, m0, a[0]);
            _mm512_mask_storeu_ps(dst.add(16), m1, a[1]);
        }
        d0 += 32;
    }
}

/// [`pv`] of `R` rows in AVX2 registers: column tiles of 8 (one vector
/// per row), then single columns past the last whole tile.
///
/// # Safety
/// AVX2 and FMA must be enabled; bounds as [`pv_avx512`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_avx2<const R: usize>(
    p: *const f32,
    ls: usize,
    alpha: *const f32,
    v: *const f32,
    stride: usize,
    nk: usize,
    hd: usize,
    o: *mut f32,
) {
    use std::arch::x86_64::*;
    let main = hd / 8 * 8;
    let mut d0 = 0;
    while d0 < main {
        let mut acc = [_mm256_setzero_ps(); R];
        for (r, a) in acc.iter_mut().enumerate() {
            *a = _mm256_mul_ps(_mm256_loadu_ps(o.add(r * hd + d0)), _mm256_set1_ps(*alpha.add(r)));
        }
        for c in 0..nk {
            let vc = _mm256_loadu_ps(v.add(c * stride + d0));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_set1_ps(*p.add(r * ls + c)), vc, *a);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(o.add(r * hd + d0), *a);
        }
        d0 += 8;
    }
    for d in main..hd {
        for r in 0..R {
            let mut x = *o.add(r * hd + d) * *alpha.add(r);
            for c in 0..nk {
                x += *p.add(r * ls + c) * *v.add(c * stride + d);
            }
            *o.add(r * hd + d) = x;
        }
    }
}
