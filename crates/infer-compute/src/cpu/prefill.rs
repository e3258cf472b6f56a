//! Prefill products for the 32-wide integer formats (Q4_0, Q5_0, Q8_0,
//! IQ4_NL) with AVX-512 VNNI.
//!
//! Decoding one token reads each weight block once, so its kernels unpack
//! blocks on the fly. Prefill dots every weight row with many tokens, so
//! here a tile of rows is unpacked once into biased bytes `u = q + 128`
//! (every code of these formats is an integer in -128..=127 times one f32
//! scale per 32 values, so the conversion is exact) and each (row, token)
//! block dot becomes one `vpdpbusd` (u8 × i8 → i32) on the token's Q8_0
//! codes. The bias is removed inside the integer sum: each token carries,
//! per block, the 8 lanes of `-128·Σ a` over the 4 bytes each lane of
//! `vpdpbusd` covers, which start the accumulation, so every lane ends at
//! exactly `Σ (u - 128)·a = Σ q·a`. Four tokens share each weight load.
//!
//! The integer sums are exact, so results differ from the row-dot kernels
//! only in the order of the f32 sums over blocks.

use super::kernels::{Kernels, SimdLevel};
use crate::backend::QuantWeight;
use crate::quant::{self, BlockIQ4NL, BlockQ4_0, BlockQ5_0, BlockQ8_0, QK};
use crate::GgmlType;

/// Whether [`matmul`] handles weights of `ty` with kernels `k`.
pub(crate) fn supported(k: &Kernels, ty: GgmlType) -> bool {
    k.level() == SimdLevel::Avx512Vnni && matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL)
}

/// Unpacks one weight row into biased codes (`q + 128`, 32 per block) and
/// per-block scales.
fn unpack_row(ty: GgmlType, row: &[u8], codes: &mut [u8], scales: &mut [f32]) -> crate::Result<()> {
    fn put(codes: &mut [u8], q: impl Iterator<Item = i32>) {
        for (c, q) in codes.iter_mut().zip(q) {
            *c = (q + 128) as u8;
        }
    }
    match ty {
        GgmlType::Q8_0 => {
            for ((b, c), s) in quant::blocks::<BlockQ8_0>(row)?.iter().zip(codes.chunks_exact_mut(QK)).zip(scales.iter_mut()) {
                *s = b.d.to_f32();
                put(c, b.qs.iter().map(|&q| q as i32));
            }
        }
        GgmlType::Q4_0 => {
            for ((b, c), s) in quant::blocks::<BlockQ4_0>(row)?.iter().zip(codes.chunks_exact_mut(QK)).zip(scales.iter_mut()) {
                *s = b.d.to_f32();
                put(c, b.qs.iter().map(|&q| (q & 0x0f) as i32 - 8).chain(b.qs.iter().map(|&q| (q >> 4) as i32 - 8)));
            }
        }
        GgmlType::Q5_0 => {
            for ((b, c), s) in quant::blocks::<BlockQ5_0>(row)?.iter().zip(codes.chunks_exact_mut(QK)).zip(scales.iter_mut()) {
                *s = b.d.to_f32();
                put(c, quant::q5_0::unpack5(&b.qs, b.qh).iter().map(|&q| q as i32 - 16));
            }
        }
        GgmlType::IQ4_NL => {
            let kv = &quant::iq4_nl::KVALUES_IQ4NL;
            for ((b, c), s) in quant::blocks::<BlockIQ4NL>(row)?.iter().zip(codes.chunks_exact_mut(QK)).zip(scales.iter_mut()) {
                *s = b.d.to_f32();
                put(
                    c,
                    b.qs.iter().map(|&q| kv[(q & 0x0f) as usize] as i32).chain(b.qs.iter().map(|&q| kv[(q >> 4) as usize] as i32)),
                );
            }
        }
        _ => return Err(crate::Error::Unsupported { op: "prefill matmul", ty }),
    }
    Ok(())
}

/// Tokens' Q8_0 activations split into codes, scales and bias corrections.
struct Acts {
    nb: usize,
    /// `[n_tokens][nb * 32]` codes.
    qs: Vec<i8>,
    /// `[n_tokens][nb]` scales.
    d: Vec<f32>,
    /// `[n_tokens][nb][8]`: `-128 · Σ` of the 4 codes under each i32 lane.
    bias: Vec<i32>,
}

impl Acts {
    fn new(acts: &[u8], n_tokens: usize, nb: usize) -> crate::Result<Self> {
        let blocks = quant::blocks::<BlockQ8_0>(acts)?;
        let mut a = Acts { nb, qs: Vec::with_capacity(n_tokens * nb * QK), d: Vec::with_capacity(n_tokens * nb), bias: Vec::with_capacity(n_tokens * nb * 8) };
        for b in blocks {
            a.qs.extend_from_slice(&b.qs);
            a.d.push(b.d.to_f32());
            a.bias.extend(b.qs.chunks_exact(4).map(|c| -128 * c.iter().map(|&q| q as i32).sum::<i32>()));
        }
        Ok(a)
    }
}

/// `Y = X·Wᵀ` for `n_tokens` activations already quantized to Q8_0
/// (`acts`: `n_tokens` rows of `w.cols / 32` blocks). `y` is
/// `n_tokens × w.rows`. The caller checked [`supported`] and the lengths.
pub(crate) fn matmul(k: &Kernels, w: &QuantWeight, acts: &[u8], n_tokens: usize, y: &mut [f32]) -> crate::Result<()> {
    use rayon::prelude::*;
    debug_assert!(supported(k, w.ty));
    let nb = w.cols / QK;
    let a = Acts::new(acts, n_tokens, nb)?;
    let tile = 16usize;
    let tiles: Vec<crate::Result<Vec<f32>>> = (0..w.rows.div_ceil(tile))
        .into_par_iter()
        .map(|c| {
            let r0 = c * tile;
            let r1 = (r0 + tile).min(w.rows);
            let mut codes = vec![0u8; nb * QK];
            let mut scales = vec![0f32; nb];
            let mut out = vec![0f32; (r1 - r0) * n_tokens];
            for r in r0..r1 {
                unpack_row(w.ty, w.row(r), &mut codes, &mut scales)?;
                let o = &mut out[(r - r0) * n_tokens..(r - r0 + 1) * n_tokens];
                row_dots(&codes, &scales, &a, o);
            }
            Ok(out)
        })
        .collect();
    for (c, out) in tiles.into_iter().enumerate() {
        let out = out?;
        let r0 = c * tile;
        for i in 0..out.len() / n_tokens {
            for t in 0..n_tokens {
                y[t * w.rows + r0 + i] = out[i * n_tokens + t];
            }
        }
    }
    Ok(())
}

/// Dots of one unpacked weight row with every token.
fn row_dots(codes: &[u8], scales: &[f32], a: &Acts, out: &mut [f32]) {
    let nb = a.nb;
    let n = out.len();
    let tok = |t: usize| Tok { qs: a.qs[t * nb * QK..].as_ptr(), bias: a.bias[t * nb * 8..].as_ptr(), d: &a.d[t * nb..(t + 1) * nb] };
    let mut t = 0;
    while t < n {
        let m = (n - t).min(4);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` checked that the table's level is AVX-512
        // VNNI, which `Kernels::for_level` verified against this CPU (it
        // implies AVX-512 F/VL and FMA); `codes` holds nb·32 bytes, and each
        // token nb·32 codes, nb·8 bias lanes and nb scales, as the kernel
        // reads.
        unsafe {
            if m == 4 {
                dots_vnni::<4>(codes.as_ptr(), scales, [tok(t), tok(t + 1), tok(t + 2), tok(t + 3)], &mut out[t..t + 4]);
            } else {
                for i in t..t + m {
                    dots_vnni::<1>(codes.as_ptr(), scales, [tok(i)], &mut out[i..i + 1]);
                }
            }
        }
        t += m;
    }
}

/// One token's activation blocks as the kernel reads them.
#[derive(Clone, Copy)]
struct Tok<'a> {
    qs: *const i8,
    bias: *const i32,
    d: &'a [f32],
}

/// `out[i] = Σ_b ws[b]·d_i[b]·Σ_j q[b][j]·a_i[b][j]` for N tokens, with
/// `codes = q + 128`.
///
/// The f32 arithmetic is, operation for operation, that of the decode
/// kernels of these formats (`simd::avx2::q8_0_row!`): per block the
/// integer lanes are converted and fused-multiply-added with `w_d · a_d`
/// into accumulator `b mod 4` (blocks past the last multiple of four into
/// accumulator 0), then `hsum((acc0 + acc1) + (acc2 + acc3))`. The
/// integer lanes are exact in both, so prefill and token-by-token decode
/// give bit-identical results, and with them identical activation
/// quantization downstream.
///
/// # Safety
/// The CPU must support AVX-512 F/VL/VNNI and FMA; `codes` must point to
/// `nb·32` bytes; each token's `qs` to `nb·32` bytes, `bias` to `nb·8`
/// lanes, and `d` and `ws` must hold `nb = ws.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma")]
unsafe fn dots_vnni<const N: usize>(codes: *const u8, ws: &[f32], toks: [Tok<'_>; N], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let nb = ws.len();
    let main = nb - nb % 4;
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    for (b, &wsb) in ws.iter().enumerate() {
        let w = _mm256_loadu_si256(codes.add(b * QK) as *const __m256i);
        let wsv = _mm256_set1_ps(wsb);
        let slot = if b < main { b % 4 } else { 0 };
        for i in 0..N {
            let av = _mm256_loadu_si256(toks[i].qs.add(b * QK) as *const __m256i);
            let bias = _mm256_loadu_si256(toks[i].bias.add(b * 8) as *const __m256i);
            let isum = _mm256_dpbusd_epi32(bias, w, av);
            // w_d · a_d in every lane (the same IEEE product as decode's),
            // with the token's scale broadcast from memory.
            let s = _mm256_mul_ps(wsv, _mm256_broadcast_ss(toks[i].d.get_unchecked(b)));
            acc[i][slot] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), s, acc[i][slot]);
        }
    }
    for i in 0..N {
        let [a0, a1, a2, a3] = acc[i];
        let v = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        out[i] = _mm_cvtss_f32(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::AlignedBytes;
    use crate::cpu::matvec;

    #[test]
    fn prefill_kernel_matches_per_token_scalar_dots() {
        let best = Kernels::detect();
        let scalar = Kernels::for_level(SimdLevel::Scalar);
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::IQ4_NL] {
            if !supported(&best, ty) {
                println!("{ty}: prefill VNNI kernel skipped (CPU level {})", best.level().name());
                continue;
            }
            for &(rows, cols, n) in &[(1, 32, 2), (3, 224, 5), (17, 640, 4), (33, 2048, 7)] {
                let mut seed = (rows * 7919 + cols * 31 + n) as u64;
                let mut rnd = || {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
                };
                let wf: Vec<f32> = (0..rows * cols).map(|_| rnd()).collect();
                let x: Vec<f32> = (0..n * cols).map(|_| rnd() * 300.0).collect();
                let rb = ty.row_bytes(cols).unwrap();
                let mut wq = vec![0u8; rows * rb];
                for r in 0..rows {
                    quant::quantize_row(ty, &wf[r * cols..(r + 1) * cols], &mut wq[r * rb..(r + 1) * rb]).unwrap();
                }
                let w = QuantWeight::new(ty, rows, cols, wq.into()).unwrap();
                let mut got = vec![0f32; n * rows];
                let mut scratch = AlignedBytes::default();
                matvec::matmul_quant(&best, &w, &x, n, &mut got, &mut scratch).unwrap();
                for t in 0..n {
                    // Bit-identical to decode's row-dot kernels at the same level.
                    let mut same = vec![0f32; rows];
                    matvec::matvec(&best, &w, &x[t * cols..(t + 1) * cols], &mut same, &mut scratch).unwrap();
                    for r in 0..rows {
                        assert_eq!(got[t * rows + r].to_bits(), same[r].to_bits(), "{ty} {rows}x{cols} n={n} t={t} r={r}: prefill differs from decode");
                    }
                    let mut want = vec![0f32; rows];
                    matvec::matvec(&scalar, &w, &x[t * cols..(t + 1) * cols], &mut want, &mut scratch).unwrap();
                    for r in 0..rows {
                        let mag: f32 = (0..cols).map(|j| (wf[r * cols + j] * x[t * cols + j]).abs()).sum();
                        let g = got[t * rows + r];
                        assert!((g - want[r]).abs() <= 1e-5 * mag + 1e-6, "{ty} {rows}x{cols} n={n} t={t} r={r}: {g} vs {}", want[r]);
                    }
                }
            }
        }
    }
}
