//! Elementwise and attention ops of the decode pipeline, on f32 slices.
//!
//! Every op is a plain function over caller-owned buffers; none allocates
//! on a warm decode path (the per-token prefill attention allocates one
//! scratch row per rayon work split; the tiled kernel keeps thread-local
//! scratch that grows once). Lengths are the caller's contract: they are checked with
//! `debug_assert!` only, because these are inner-loop hot paths that the
//! backend calls after validating the model once ([`crate::pipeline::ModelSpec::validate`]).
//!
//! | file | ops | ggml counterpart |
//! | --- | --- | --- |
//! | [`norm`] | [`rms_norm`], [`layer_norm`], fused [`add_rms_norm`], [`add`], [`scale`] | `ggml_rms_norm` + `ggml_mul`, `ggml_norm`, `ggml_add`, `ggml_scale` |
//! | [`activation`] | [`silu`], [`gelu_tanh`], [`swiglu`], [`geglu`], [`softcap`] | `ggml_silu`, `ggml_gelu`, `ggml_swiglu`, `ggml_geglu`, scale/tanh/scale |
//! | [`mod@rope`] | [`rope()`], [`RopeCache`] | `ggml_rope_ext` (modes NORM and NEOX, no YaRN) |
//! | [`mod@softmax`] | [`softmax()`] | `ggml_soft_max` |
//! | [`attention`] | [`attention_decode`], [`attention_prefill`], [`kv_append`] | `mul_mat(k, q)` → softcap → `soft_max_ext` with causal/SWA mask → `mul_mat(v, kq)` |
//! | [`attn_tiled`] | [`attention_tiled_on`] (prompt chunks) | `ggml_compute_forward_flash_attn_ext_f16` (tiled, online softmax) |
//!
//! The loops that carry the decode time (sum of squares, residual add, q·k
//! dot, p·v accumulation) are written in chunked form with independent
//! accumulators so that the compiler vectorizes them; nothing here uses
//! explicit SIMD, so each function is its own scalar reference (the tiled
//! kernel's portable build is that of its AVX2 and AVX-512 builds).

pub mod activation;
pub mod attention;
mod attn_few_rows;
pub mod attn_tiled;
pub mod exp;
pub mod norm;
pub mod rope;
pub mod softmax;

pub use activation::{geglu, gelu_tanh, silu, softcap, swiglu};
pub use attention::{
    attention_batch_on, attention_decode, attention_decode_on, attention_prefill, attention_prefill_on,
    attention_probs, attention_scratch_len, kv_append, AttnParams,
};
pub use attn_tiled::attention_tiled_on;
pub use norm::{add, add_rms_norm, layer_norm, rms_norm, rms_norm_heads, rms_norm_inplace, scale};
pub use rope::{rope, rope_tokens, RopeCache};
pub use softmax::softmax;

/// Dot product `Σ a[i]·b[i]` in f32 with 16 independent accumulators, so
/// that it vectorizes; summation order differs from a sequential loop.
///
/// Contract: `a.len() == b.len()` (debug-asserted).
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    const L: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let split = n - n % L;
    let mut acc = [0.0f32; L];
    for (x, y) in a[..split].chunks_exact(L).zip(b[..split].chunks_exact(L)) {
        for i in 0..L {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in a[split..].iter().zip(&b[split..]) {
        tail += x * y;
    }
    // Pairwise reduction of the accumulators.
    let mut w = L;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0] + tail
}

/// [`dot`] with AVX-512: the 16 accumulators are the lanes of one vector and
/// the reduction is the same pairwise tree, so the result has the same bits.
///
/// # Safety
/// The processor must support AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let split = n - n % 16;
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i < split {
        let x = _mm512_loadu_ps(a.as_ptr().add(i));
        let y = _mm512_loadu_ps(b.as_ptr().add(i));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(x, y));
        i += 16;
    }
    let mut tail = 0.0f32;
    for (x, y) in a[split..n].iter().zip(&b[split..n]) {
        tail += x * y;
    }
    let hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    let s8 = _mm256_add_ps(_mm512_castps512_ps256(acc), hi8);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    _mm_cvtss_f32(s1) + tail
}

/// [`dot`] with AVX2: the 16 accumulators are the lanes of two vectors and
/// the reduction is the same pairwise tree, so the result has the same bits.
///
/// # Safety
/// The processor must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let split = n - n % 16;
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i < split {
        let (pa, pb) = (a.as_ptr().add(i), b.as_ptr().add(i));
        lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(pa), _mm256_loadu_ps(pb)));
        hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(pa.add(8)), _mm256_loadu_ps(pb.add(8))));
        i += 16;
    }
    let mut tail = 0.0f32;
    for (x, y) in a[split..n].iter().zip(&b[split..n]) {
        tail += x * y;
    }
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    _mm_cvtss_f32(s1) + tail
}

/// Shared helpers of the op tests: seeded inputs and error reports.
#[cfg(test)]
pub(crate) mod test_util {
    use super::AttnParams;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The awkward lengths every elementwise op is tested on.
    pub const LENS: [usize; 5] = [1, 7, 640, 1000, 4099];

    /// `n` values uniform in `[-amp, amp)`, from a fixed seed.
    pub fn rand_vec(seed: u64, n: usize, amp: f32) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.gen_range(-amp..amp)).collect()
    }

    /// Asserts `|got[i] - want[i]| <= atol + rtol·|want[i]|` for every `i`;
    /// on failure lists the first few bad indices with both errors.
    #[track_caller]
    pub fn assert_close(what: &str, got: &[f32], want: &[f64], rtol: f64, atol: f64) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        let bad: Vec<String> = got
            .iter()
            .zip(want)
            .enumerate()
            .filter(|(_, (&g, &w))| !((g as f64 - w).abs() <= atol + rtol * w.abs()))
            .take(5)
            .map(|(i, (&g, &w))| {
                let abs = (g as f64 - w).abs();
                format!("[{i}] got {g:e} want {w:e} abs {abs:.3e} rel {:.3e}", abs / w.abs())
            })
            .collect();
        assert!(bad.is_empty(), "{what}: n={} mismatches:\n{}", got.len(), bad.join("\n"));
    }

    /// f64 reference of one decode step of attention (the formula of
    /// [`super::attention`]): `(probs [n_head, pos + 1], out [n_head, head_dim])`.
    pub fn attn_ref(q: &[f32], kc: &[f32], vc: &[f32], pos: usize, p: &AttnParams) -> (Vec<f64>, Vec<f64>) {
        let (hd, kvd) = (p.head_dim, p.kv_dim());
        let group = p.n_head / p.n_head_kv;
        let mut probs = vec![0.0f64; p.n_head * (pos + 1)];
        let mut out = vec![0.0f64; p.q_dim()];
        for h in 0..p.n_head {
            let g = h / group;
            let visible = |j: usize| p.window.is_none_or(|w| pos - j < w);
            let mut l = vec![f64::NEG_INFINITY; pos + 1];
            for j in (0..=pos).filter(|&j| visible(j)) {
                let d: f64 = (0..hd).map(|d| q[h * hd + d] as f64 * kc[j * kvd + g * hd + d] as f64).sum();
                let mut x = p.scale as f64 * d;
                if let Some(c) = p.softcap {
                    x = c as f64 * (x / c as f64).tanh();
                }
                l[j] = x;
            }
            let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = l.iter().map(|&x| if x == f64::NEG_INFINITY { 0.0 } else { (x - m).exp() }).collect();
            let s: f64 = e.iter().sum();
            for j in 0..=pos {
                let pj = e[j] / s;
                probs[h * (pos + 1) + j] = pj;
                for d in 0..hd {
                    out[h * hd + d] += pj * vc[j * kvd + g * hd + d] as f64;
                }
            }
        }
        (probs, out)
    }

    pub fn params(
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        softcap: Option<f32>,
        window: Option<usize>,
    ) -> AttnParams {
        AttnParams { n_head, n_head_kv, head_dim, scale: 1.0 / (head_dim as f32).sqrt(), softcap, window }
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;

    #[test]
    fn dot_matches_f64() {
        for (s, &n) in LENS.iter().enumerate() {
            let a = rand_vec(10 + s as u64, n, 1.0);
            let b = rand_vec(20 + s as u64, n, 1.0);
            let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let mag: f64 = a.iter().zip(&b).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum();
            let got = dot(&a, &b);
            assert!((got as f64 - want).abs() <= 1e-6 * mag, "n={n}: {got} vs {want}");
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx512f") {
                // SAFETY: checked just above.
                let wide = unsafe { dot_avx512(&a, &b) };
                assert_eq!(wide.to_bits(), got.to_bits(), "n={n}: AVX-512 dot {wide} vs {got}");
            }
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: checked just above.
                let wide = unsafe { dot_avx2(&a, &b) };
                assert_eq!(wide.to_bits(), got.to_bits(), "n={n}: AVX2 dot {wide} vs {got}");
            }
        }
    }
}
