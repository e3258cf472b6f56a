//! TurboQuant's CPU kernels ([`crate::turboquant`] is the format and its
//! scalar reference): a code decoded into the rotated basis
//! ([`decode_rotated`]) and its inner product with a rotated query
//! ([`dot_rotated`]), on the widest instruction set the processor has.
//!
//! Indices of `B ≤ 4` bits come 8 at a time from `B` bytes of the bit
//! stream: the `B` bytes as one little-endian word, broadcast to 8 lanes,
//! shifted right by `B · lane` and masked. A lane's value is then a table
//! look-up of the norm-scaled centroids: one `vpermps` of 16 entries on
//! AVX-512, one (3 bits) or two and a blend (4 bits) of 8 entries on AVX2.
//! Other widths, and dimensions that are not a multiple of 16, run the
//! scalar reference.

#[cfg(target_arch = "x86_64")]
use half::f16;

#[cfg(target_arch = "x86_64")]
use crate::cpu::simd::env_allows_x86;
use crate::turboquant::{decode_rotated_ref, dot_rotated_ref, TurboQuant};

/// `out = n · c[idx]` for `code` (one code of `tq`): the decoded vector in
/// the rotated basis, as [`TurboQuant::decode_rotated`] (same bits: each
/// value is one product).
///
/// Contract: `code` is [`TurboQuant::code_bytes`] bytes and `out` has
/// [`TurboQuant::dim`] values (asserted).
pub fn decode_rotated(tq: &TurboQuant, code: &[u8], out: &mut [f32]) {
    assert!(code.len() == tq.code_bytes() && out.len() == tq.dim());
    #[cfg(target_arch = "x86_64")]
    if let Some(table) = Table::new(tq, code) {
        let bits = &code[2..];
        if std::is_x86_feature_detected!("avx512f") && env_allows_x86(true) {
            // SAFETY: the processor supports AVX-512 F; lengths as asserted.
            unsafe {
                match tq.bits() {
                    3 => x86::decode_avx512::<3>(&table.0, bits, out),
                    _ => x86::decode_avx512::<4>(&table.0, bits, out),
                }
            }
            return;
        }
        if std::is_x86_feature_detected!("avx2") && env_allows_x86(false) {
            // SAFETY: the processor supports AVX2; lengths as asserted.
            unsafe {
                match tq.bits() {
                    3 => x86::decode_avx2::<3>(&table.0, bits, out),
                    _ => x86::decode_avx2::<4>(&table.0, bits, out),
                }
            }
            return;
        }
    }
    decode_rotated_ref(tq.centroids(), tq.bits(), code, out);
}

/// `⟨q_rot, n · c[idx]⟩`, as [`TurboQuant::dot_rotated`] (the products
/// summed in another order: equal within f32 rounding).
///
/// Contract: lengths as [`decode_rotated`] (asserted).
pub fn dot_rotated(tq: &TurboQuant, code: &[u8], q_rot: &[f32]) -> f32 {
    assert!(code.len() == tq.code_bytes() && q_rot.len() == tq.dim());
    #[cfg(target_arch = "x86_64")]
    if let Some(table) = Table::new(tq, code) {
        let bits = &code[2..];
        if std::is_x86_feature_detected!("avx512f") && env_allows_x86(true) {
            // SAFETY: the processor supports AVX-512 F; lengths as asserted.
            return unsafe {
                match tq.bits() {
                    3 => x86::dot_avx512::<3>(&table.0, bits, q_rot),
                    _ => x86::dot_avx512::<4>(&table.0, bits, q_rot),
                }
            };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") && env_allows_x86(false) {
            // SAFETY: the processor supports AVX2 and FMA; lengths as asserted.
            return unsafe {
                match tq.bits() {
                    3 => x86::dot_avx2::<3>(&table.0, bits, q_rot),
                    _ => x86::dot_avx2::<4>(&table.0, bits, q_rot),
                }
            };
        }
    }
    dot_rotated_ref(tq.centroids(), tq.bits(), code, q_rot)
}

/// The centroids times the code's norm, padded to 16 entries, when the
/// SIMD kernels take the code (3 or 4 bits, `dim` a multiple of 16).
#[cfg(target_arch = "x86_64")]
struct Table([f32; 16]);

#[cfg(target_arch = "x86_64")]
impl Table {
    fn new(tq: &TurboQuant, code: &[u8]) -> Option<Table> {
        if !matches!(tq.bits(), 3 | 4) || !tq.dim().is_multiple_of(16) {
            return None;
        }
        let norm = f16::from_le_bytes([code[0], code[1]]).to_f32();
        let mut t = [0.0f32; 16];
        for (t, &c) in t.iter_mut().zip(tq.centroids()) {
            *t = norm * c;
        }
        Some(Table(t))
    }
}

/// The `B` bytes of index group `g` (indices `8g .. 8g + 8`) as one
/// little-endian word.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn group_word<const B: usize>(bits: &[u8], g: usize) -> i32 {
    let b = &bits[g * B..g * B + B];
    let mut w = 0u32;
    for (k, &x) in b.iter().enumerate() {
        w |= (x as u32) << (8 * k);
    }
    w as i32
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::group_word;

    /// Indices `16i .. 16i + 16` as 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn idx16<const B: usize>(bits: &[u8], i: usize, shifts: __m512i, mask: __m512i) -> __m512i {
        let (w0, w1) = (group_word::<B>(bits, 2 * i), group_word::<B>(bits, 2 * i + 1));
        let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_set1_epi32(w0)), _mm256_set1_epi32(w1));
        _mm512_and_si512(_mm512_srlv_epi32(v, shifts), mask)
    }

    /// The right shifts of `N` lanes that take 8 indices of `B` bits out
    /// of a broadcast word (repeated every 8 lanes).
    fn shifts<const B: usize, const N: usize>() -> [i32; N] {
        std::array::from_fn(|l| (B * (l % 8)) as i32)
    }

    /// [`super::decode_rotated`] on AVX-512.
    ///
    /// # Safety
    /// The processor supports AVX-512 F; `out.len()` is a multiple of 16
    /// and `bits` holds `out.len() · B / 8` bytes.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn decode_avx512<const B: usize>(table: &[f32; 16], bits: &[u8], out: &mut [f32]) {
        let t = _mm512_loadu_ps(table.as_ptr());
        let shifts = _mm512_loadu_si512(shifts::<B, 16>().as_ptr().cast());
        let mask = _mm512_set1_epi32((1 << B) - 1);
        for (i, o) in out.chunks_exact_mut(16).enumerate() {
            let x = _mm512_permutexvar_ps(idx16::<B>(bits, i, shifts, mask), t);
            // SAFETY: `o` is 16 values.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), x) };
        }
    }

    /// [`super::dot_rotated`] on AVX-512.
    ///
    /// # Safety
    /// As [`decode_avx512`], `q` in place of `out`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot_avx512<const B: usize>(table: &[f32; 16], bits: &[u8], q: &[f32]) -> f32 {
        let t = _mm512_loadu_ps(table.as_ptr());
        let shifts = _mm512_loadu_si512(shifts::<B, 16>().as_ptr().cast());
        let mask = _mm512_set1_epi32((1 << B) - 1);
        let mut acc = _mm512_setzero_ps();
        for (i, qc) in q.chunks_exact(16).enumerate() {
            let x = _mm512_permutexvar_ps(idx16::<B>(bits, i, shifts, mask), t);
            // SAFETY: `qc` is 16 values.
            acc = _mm512_fmadd_ps(unsafe { _mm512_loadu_ps(qc.as_ptr()) }, x, acc);
        }
        _mm512_reduce_add_ps(acc)
    }

    /// Values of indices `8g .. 8g + 8` (a table of 8, or 16 for `B = 4`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn vals8<const B: usize>(bits: &[u8], g: usize, lo: __m256, hi: __m256, shifts: __m256i) -> __m256 {
        let v = _mm256_set1_epi32(group_word::<B>(bits, g));
        let idx = _mm256_and_si256(_mm256_srlv_epi32(v, shifts), _mm256_set1_epi32((1 << B) - 1));
        let a = _mm256_permutevar8x32_ps(lo, idx);
        if B <= 3 {
            return a;
        }
        // Index bit 3 (moved to the sign) picks the upper 8 entries.
        let b = _mm256_permutevar8x32_ps(hi, idx);
        _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx)))
    }

    /// [`super::decode_rotated`] on AVX2.
    ///
    /// # Safety
    /// The processor supports AVX2; lengths as [`decode_avx512`].
    #[target_feature(enable = "avx2")]
    pub unsafe fn decode_avx2<const B: usize>(table: &[f32; 16], bits: &[u8], out: &mut [f32]) {
        let (lo, hi) = (_mm256_loadu_ps(table.as_ptr()), _mm256_loadu_ps(table[8..].as_ptr()));
        let shifts = _mm256_loadu_si256(shifts::<B, 8>().as_ptr().cast());
        for (g, o) in out.chunks_exact_mut(8).enumerate() {
            // SAFETY: `o` is 8 values.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), vals8::<B>(bits, g, lo, hi, shifts)) };
        }
    }

    /// [`super::dot_rotated`] on AVX2 and FMA.
    ///
    /// # Safety
    /// The processor supports AVX2 and FMA; lengths as [`decode_avx512`].
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_avx2<const B: usize>(table: &[f32; 16], bits: &[u8], q: &[f32]) -> f32 {
        let (lo, hi) = (_mm256_loadu_ps(table.as_ptr()), _mm256_loadu_ps(table[8..].as_ptr()));
        let shifts = _mm256_loadu_si256(shifts::<B, 8>().as_ptr().cast());
        let mut acc = _mm256_setzero_ps();
        for (g, qc) in q.chunks_exact(8).enumerate() {
            // SAFETY: `qc` is 8 values.
            let qv = unsafe { _mm256_loadu_ps(qc.as_ptr()) };
            acc = _mm256_fmadd_ps(qv, vals8::<B>(bits, g, lo, hi, shifts), acc);
        }
        let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::Rng;

    /// Every build against the scalar reference: decoding bit for bit, the
    /// inner product within f32 rounding, on codes of random vectors
    /// (huge and zero norms included).
    #[test]
    fn simd_kernels_match_the_reference() {
        let mut rng = Rng::new(5);
        for dim in [16usize, 32, 64, 128, 256, 8] {
            for bits in [3u32, 4, 2] {
                let tq = TurboQuant::new(dim, bits).unwrap();
                for scale in [1.0f32, 1e-3, 3e5, 0.0] {
                    let x: Vec<f32> = rng.normals(dim, 1.0).iter().map(|v| v * scale).collect();
                    let q = rng.normals(dim, 1.0);
                    let mut code = vec![0u8; tq.code_bytes()];
                    tq.encode(&x, &mut code).unwrap();
                    let mut y = vec![0.0f32; dim];
                    tq.decode_rotated(&code, &mut y).unwrap();
                    let mut got = vec![f32::NAN; dim];
                    decode_rotated(&tq, &code, &mut got);
                    assert_eq!(got, y, "dim {dim}, {bits} bits, scale {scale}");
                    assert!(got.iter().all(|v| v.is_finite()), "dim {dim}, {bits} bits, scale {scale}");
                    let want = tq.dot_rotated(&code, &q).unwrap();
                    let got = dot_rotated(&tq, &code, &q);
                    let mag: f32 = q.iter().zip(&y).map(|(a, b)| (a * b).abs()).sum();
                    assert!((got - want).abs() <= 1e-5 * mag, "dim {dim}, {bits} bits: {got} vs {want}");
                }
            }
        }
    }
}
