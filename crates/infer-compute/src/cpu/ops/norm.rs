//! Normalizations and residual arithmetic over one row of `n` f32 values.
//!
//! - RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"):
//!   `out[i] = x[i] · 1/sqrt(Σx²/n + eps) · w[i]`.
//! - LayerNorm (Ba et al. 2016): `out[i] = (x[i] - μ) · 1/sqrt(σ² + eps) · w[i] (+ b[i])`.
//!
//! Arithmetic mirrors ggml's CPU ops (`ggml_compute_forward_rms_norm_f32`,
//! `ggml_compute_forward_norm_f32`) followed by `ggml_mul` (and `ggml_add`
//! for a bias): squares (and deviations) are formed in f32, summed in f64
//! (`ggml_float`), the mean is rounded to f32, the scale is
//! `1.0f / sqrtf(mean + eps)` in f32, and the output is `(x · scale) · w`.
//! Our f64 sums use 8 interleaved partial sums (so the loop vectorizes)
//! where ggml sums sequentially; in f64 that reordering is far below the
//! f32 rounding of the mean.

/// Partial sums in the f64 reductions; fixed so that fused and unfused
/// paths sum in the same order.
const ACC: usize = 8;

/// `Σ f(x[i])` in f64 over 8 interleaved partial sums, `f` evaluated in f32.
#[inline(always)]
fn sum_f64(x: &[f32], f: impl Fn(f32) -> f32) -> f64 {
    let split = x.len() - x.len() % ACC;
    let mut acc = [0.0f64; ACC];
    for c in x[..split].chunks_exact(ACC) {
        for i in 0..ACC {
            acc[i] += f(c[i]) as f64;
        }
    }
    let mut tail = 0.0f64;
    for &v in &x[split..] {
        tail += f(v) as f64;
    }
    let mut w = ACC;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0] + tail
}

/// `1 / sqrt(Σx²/n + eps)` as ggml computes it (mean rounded to f32).
#[inline]
fn rms_scale(sum_sq: f64, n: usize, eps: f32) -> f32 {
    let mean = (sum_sq / n as f64) as f32;
    1.0f32 / (mean + eps).sqrt()
}

/// RMSNorm with weight: `out[i] = x[i] · (1 / sqrt(Σx²/n + eps)) · weight[i]`.
///
/// Shapes: `x`, `weight`, `out`: `[n]`. Source: ggml `rms_norm` then `mul`;
/// the sum of squares is accumulated in f64 as ggml does.
///
/// Contract (debug-asserted): `weight.len() == out.len() == x.len()`, `n > 0`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(!x.is_empty());
    debug_assert_eq!(weight.len(), x.len());
    debug_assert_eq!(out.len(), x.len());
    let s = rms_scale(sum_f64(x, |v| v * v), x.len(), eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = (v * s) * w;
    }
}

/// [`rms_norm`] in place: `x[i] ← x[i] · (1 / sqrt(Σx²/n + eps)) · weight[i]`.
///
/// Contract (debug-asserted): `weight.len() == x.len()`, `n > 0`.
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    debug_assert!(!x.is_empty());
    debug_assert_eq!(weight.len(), x.len());
    let s = rms_scale(sum_f64(x, |v| v * v), x.len(), eps);
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = (*v * s) * w;
    }
}

/// Per-head RMSNorm in place (q/k norm of Gemma 3, Qwen3): `x: [n_head, head_dim]`
/// row-major; each head's `head_dim` values are normalized on their own
/// and multiplied by the shared `weight: [head_dim]`.
///
/// Contract (debug-asserted): `head_dim > 0`, `x.len() % head_dim == 0`,
/// `weight.len() == head_dim`.
pub fn rms_norm_heads(x: &mut [f32], head_dim: usize, weight: &[f32], eps: f32) {
    debug_assert!(head_dim > 0 && x.len().is_multiple_of(head_dim));
    debug_assert_eq!(weight.len(), head_dim);
    for h in x.chunks_exact_mut(head_dim) {
        rms_norm_inplace(h, weight, eps);
    }
}

/// LayerNorm with weight and optional bias:
/// `out[i] = ((x[i] - μ) · (1 / sqrt(σ² + eps))) · weight[i] (+ bias[i])`,
/// `μ = Σx/n`, `σ² = Σ(x - μ)²/n` (biased variance).
///
/// Shapes: all `[n]`. Source: ggml `norm` then `mul` and `add`; sums in f64,
/// `μ` and `σ²` rounded to f32, deviations formed in f32, as ggml does.
///
/// Contract (debug-asserted): `weight`, `bias` (if any) and `out` have
/// `x.len()` values, `n > 0`.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let n = x.len();
    debug_assert!(n > 0);
    debug_assert_eq!(weight.len(), n);
    debug_assert_eq!(out.len(), n);
    debug_assert!(bias.is_none_or(|b| b.len() == n));
    let mean = (sum_f64(x, |v| v) / n as f64) as f32;
    let var = (sum_f64(x, |v| (v - mean) * (v - mean)) / n as f64) as f32;
    let s = 1.0f32 / (var + eps).sqrt();
    match bias {
        Some(b) => {
            for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(weight).zip(b) {
                *o = ((v - mean) * s) * w + b;
            }
        }
        None => {
            for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
                *o = ((v - mean) * s) * w;
            }
        }
    }
}

/// Fused residual add and RMSNorm: `residual[i] += x[i]`, then
/// `out = rms_norm(residual, weight, eps)`.
///
/// Bit-identical to [`add`] followed by [`rms_norm`] (same summation order),
/// with one pass less over `residual`. Source: ggml's fused add + rms_norm
/// pattern.
///
/// Contract (debug-asserted): all four slices have the same length `n > 0`.
pub fn add_rms_norm(residual: &mut [f32], x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = residual.len();
    debug_assert!(n > 0);
    debug_assert_eq!(x.len(), n);
    debug_assert_eq!(weight.len(), n);
    debug_assert_eq!(out.len(), n);
    // Add and square in one pass, same partial-sum layout as `sum_f64`.
    let split = n - n % ACC;
    let mut acc = [0.0f64; ACC];
    for (r, a) in residual[..split].chunks_exact_mut(ACC).zip(x[..split].chunks_exact(ACC)) {
        for i in 0..ACC {
            r[i] += a[i];
            acc[i] += (r[i] * r[i]) as f64;
        }
    }
    let mut tail = 0.0f64;
    for (r, &a) in residual[split..].iter_mut().zip(&x[split..]) {
        *r += a;
        tail += (*r * *r) as f64;
    }
    let mut w = ACC;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    let s = rms_scale(acc[0] + tail, n, eps);
    for ((o, &v), &w) in out.iter_mut().zip(residual.iter()).zip(weight) {
        *o = (v * s) * w;
    }
}

/// Residual add: `residual[i] += x[i]` (ggml `add`).
///
/// Contract (debug-asserted): `x.len() == residual.len()`.
pub fn add(residual: &mut [f32], x: &[f32]) {
    debug_assert_eq!(x.len(), residual.len());
    for (r, &a) in residual.iter_mut().zip(x) {
        *r += a;
    }
}

/// Scaling: `x[i] *= s` (ggml `scale`; e.g. Gemma's embedding scale sqrt(n_embd)).
pub fn scale(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    const EPS: f32 = 1e-6;

    fn rms_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
        let n = x.len() as f64;
        let ms: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n;
        let s = 1.0 / (ms + eps as f64).sqrt();
        x.iter().zip(w).map(|(&v, &w)| v as f64 * s * w as f64).collect()
    }

    #[test]
    fn rms_norm_matches_f64() {
        for (k, &n) in LENS.iter().enumerate() {
            let x = rand_vec(100 + k as u64, n, 3.0);
            let w = rand_vec(200 + k as u64, n, 2.0);
            let want = rms_ref(&x, &w, EPS);
            let mut out = vec![f32::NAN; n];
            rms_norm(&x, &w, EPS, &mut out);
            assert_close("rms_norm", &out, &want, 1e-5, 0.0);
            let mut y = x.clone();
            rms_norm_inplace(&mut y, &w, EPS);
            assert_eq!(y, out, "in place differs from out of place");
        }
    }

    #[test]
    fn rms_norm_eps_dominates_tiny_input() {
        // A zero row stays zero (no NaN), and eps enters the scale.
        let x = vec![0.0f32; 7];
        let w = vec![1.0f32; 7];
        let mut out = vec![1.0f32; 7];
        rms_norm(&x, &w, 1e-5, &mut out);
        assert!(out.iter().all(|&v| v == 0.0));
        let x = vec![1e-3f32; 7];
        rms_norm(&x, &w, 1e-2, &mut out);
        let want = rms_ref(&x, &w, 1e-2);
        assert_close("rms_norm eps", &out, &want, 1e-5, 0.0);
    }

    #[test]
    fn rms_norm_heads_is_per_head() {
        let (n_head, hd) = (5, 7);
        let x = rand_vec(300, n_head * hd, 2.0);
        let w = rand_vec(301, hd, 1.5);
        let mut y = x.clone();
        rms_norm_heads(&mut y, hd, &w, EPS);
        for h in 0..n_head {
            let want = rms_ref(&x[h * hd..(h + 1) * hd], &w, EPS);
            assert_close("rms_norm_heads", &y[h * hd..(h + 1) * hd], &want, 1e-5, 0.0);
        }
    }

    #[test]
    fn layer_norm_matches_f64() {
        for (k, &n) in LENS.iter().enumerate() {
            // An offset makes the mean matter.
            let x: Vec<f32> = rand_vec(400 + k as u64, n, 2.0).iter().map(|v| v + 0.75).collect();
            let w = rand_vec(500 + k as u64, n, 2.0);
            let b = rand_vec(600 + k as u64, n, 1.0);
            let nf = n as f64;
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / nf;
            let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / nf;
            let s = 1.0 / (var + EPS as f64).sqrt();
            let norm: Vec<f64> = x.iter().zip(&w).map(|(&v, &w)| (v as f64 - mean) * s * w as f64).collect();
            let mut out = vec![f32::NAN; n];
            layer_norm(&x, &w, None, EPS, &mut out);
            // n = 1: x - mean is exactly 0; absolute floor for cancellation.
            assert_close("layer_norm", &out, &norm, 1e-5, 1e-5);
            let with_b: Vec<f64> = norm.iter().zip(&b).map(|(v, &b)| v + b as f64).collect();
            layer_norm(&x, &w, Some(&b), EPS, &mut out);
            assert_close("layer_norm+bias", &out, &with_b, 1e-5, 1e-5);
        }
    }

    #[test]
    fn add_rms_norm_equals_add_then_rms_norm() {
        for (k, &n) in LENS.iter().enumerate() {
            let r0 = rand_vec(700 + k as u64, n, 3.0);
            let x = rand_vec(800 + k as u64, n, 3.0);
            let w = rand_vec(900 + k as u64, n, 2.0);
            let (mut r1, mut r2) = (r0.clone(), r0.clone());
            let (mut o1, mut o2) = (vec![0.0; n], vec![0.0; n]);
            add_rms_norm(&mut r1, &x, &w, EPS, &mut o1);
            add(&mut r2, &x);
            rms_norm(&r2, &w, EPS, &mut o2);
            assert_eq!(r1, r2, "fused residual differs (n={n})");
            assert_eq!(o1, o2, "fused output differs (n={n})");
            // And both against f64.
            let sum: Vec<f64> = r0.iter().zip(&x).map(|(&a, &b)| a as f64 + b as f64).collect();
            assert_close("add", &r1, &sum, 1e-6, 1e-6);
            let sum32: Vec<f32> = sum.iter().map(|&v| v as f32).collect();
            assert_close("add_rms_norm", &o1, &rms_ref(&sum32, &w, EPS), 1e-5, 0.0);
        }
    }

    #[test]
    fn add_and_scale_match_f64() {
        for (k, &n) in LENS.iter().enumerate() {
            let mut r = rand_vec(1000 + k as u64, n, 5.0);
            let x = rand_vec(1100 + k as u64, n, 5.0);
            let want: Vec<f64> = r.iter().zip(&x).map(|(&a, &b)| (a as f64 + b as f64) * 25.3f32 as f64).collect();
            add(&mut r, &x);
            scale(&mut r, 25.3);
            assert_close("add+scale", &r, &want, 1e-6, 2e-5);
        }
    }
}
