//! Activations of the feed-forward network and logit soft-capping.
//!
//! - SiLU (Elfwing et al. 2017; Hendrycks & Gimpel 2016): `silu(x) = x · σ(x) = x / (1 + e^(-x))`,
//!   ggml's scalar `ggml_silu_f32`.
//! - GELU, tanh approximation (Hendrycks & Gimpel 2016):
//!   `gelu(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, ggml's `ggml_gelu_f32`.
//!   We evaluate the identical function through `0.5·(1 + tanh z) = 1 / (1 + e^(-2z))`,
//!   which avoids the cancellation of `1 + tanh z` for negative `x` (where the
//!   tanh form in f32 loses every digit below `x ≈ -4`); for `x ≥ 0` both
//!   forms agree to a few ulps.
//! - Gated units (Shazeer 2020, "GLU Variants Improve Transformer"):
//!   `swiglu = silu(gate) · up`, `geglu = gelu(gate) · up` (ggml `swiglu`, `geglu`).
//! - Soft-capping (Gemma 2): `c · tanh(x / c)`.
//!
//! `e^x` is [`super::exp::exp`] (vectorizable, within 2 ulp), as ggml's
//! vector SiLU uses its own `expf` approximation.

use super::exp::exp;
#[cfg(target_arch = "x86_64")]
use crate::cpu::simd::env_allows_x86;

/// `√(2/π)`, ggml's `SQRT_2_OVER_PI`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// ggml's `GELU_COEF_A`.
const GELU_COEF_A: f32 = 0.044715;

#[inline(always)]
fn silu1(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

#[inline(always)]
fn gelu1(x: f32) -> f32 {
    let z = SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x);
    x / (1.0 + exp(-2.0 * z))
}

/// `x[i] ← f(x[i])`, built with AVX2 where the processor has it (wider
/// vectors; the same f32 operations, so the same bits).
#[inline(always)]
fn map1(x: &mut [f32], f: impl Fn(f32) -> f32 + Copy) {
    #[inline(always)]
    fn each(x: &mut [f32], f: impl Fn(f32) -> f32) {
        x.iter_mut().for_each(|v| *v = f(*v));
    }
    /// # Safety
    /// The processor must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn each_avx2(x: &mut [f32], f: impl Fn(f32) -> f32) {
        each(x, f)
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && env_allows_x86(false) {
        // SAFETY: checked just above.
        return unsafe { each_avx2(x, f) };
    }
    each(x, f)
}

/// `out[i] ← f(a[i], b[i])`, built as [`map1`].
#[inline(always)]
fn map2(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32 + Copy) {
    #[inline(always)]
    fn each(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = f(x, y);
        }
    }
    /// # Safety
    /// The processor must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn each_avx2(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
        each(a, b, out, f)
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && env_allows_x86(false) {
        // SAFETY: checked just above.
        return unsafe { each_avx2(a, b, out, f) };
    }
    each(a, b, out, f)
}

/// SiLU in place: `x[i] ← x[i] / (1 + e^(-x[i]))`. Shape `[n]`, any `n`.
pub fn silu(x: &mut [f32]) {
    map1(x, silu1)
}

/// GELU (tanh approximation) in place:
/// `x[i] ← 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, evaluated as
/// `x / (1 + e^(-2z))` (see the module docs). Shape `[n]`, any `n`.
pub fn gelu_tanh(x: &mut [f32]) {
    map1(x, gelu1)
}

/// SwiGLU: `out[i] = silu(gate[i]) · up[i]` (ggml `swiglu`).
///
/// Contract (debug-asserted): `gate`, `up`, `out` all have length `n_ff`.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    debug_assert_eq!(up.len(), gate.len());
    debug_assert_eq!(out.len(), gate.len());
    map2(gate, up, out, |g, u| silu1(g) * u)
}

/// GEGLU: `out[i] = gelu_tanh(gate[i]) · up[i]` (ggml `geglu`; Gemma's FFN).
///
/// Contract (debug-asserted): `gate`, `up`, `out` all have length `n_ff`.
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    debug_assert_eq!(up.len(), gate.len());
    debug_assert_eq!(out.len(), gate.len());
    map2(gate, up, out, |g, u| gelu1(g) * u)
}

/// Soft-capping in place: `x[i] ← c · tanh(x[i] · (1/c))`, as llama.cpp
/// builds it (`scale(1/c)`, `tanh`, `scale(c)`); Gemma 2's final-logit cap.
///
/// Contract (debug-asserted): `c > 0`.
pub fn softcap(x: &mut [f32], c: f32) {
    debug_assert!(c > 0.0);
    let inv = 1.0 / c;
    for v in x.iter_mut() {
        *v = c * (*v * inv).tanh();
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    fn silu_ref(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    fn gelu_ref(x: f64) -> f64 {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
    }

    /// f64 GELU that keeps relative accuracy where `1 + tanh` cancels.
    fn gelu_ref_exact(x: f64) -> f64 {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        let z = k * (x + 0.044715 * x * x * x);
        // 0.5·(1 + tanh z) = 1/(1 + e^(-2z)) exactly; in f64 the two agree
        // except for z ≪ 0, where only this form keeps its digits.
        x / (1.0 + (-2.0 * z).exp())
    }

    fn inputs(seed: u64, n: usize) -> Vec<f32> {
        let mut x = rand_vec(seed, n, 8.0);
        // Edges: zero, tiny, saturated.
        for (i, e) in [0.0f32, -1e-20, 1e-20, -30.0, 30.0].into_iter().enumerate() {
            if i < n && n > 5 {
                x[i] = e;
            }
        }
        x
    }

    #[test]
    fn silu_matches_f64() {
        for (k, &n) in LENS.iter().enumerate() {
            let x = inputs(1 + k as u64, n);
            let want: Vec<f64> = x.iter().map(|&v| silu_ref(v as f64)).collect();
            let mut y = x.clone();
            silu(&mut y);
            assert_close("silu", &y, &want, 1e-5, 1e-30);
        }
    }

    #[test]
    fn gelu_tanh_matches_f64() {
        for (k, &n) in LENS.iter().enumerate() {
            let x = inputs(11 + k as u64, n);
            let want: Vec<f64> = x.iter().map(|&v| gelu_ref_exact(v as f64)).collect();
            let mut y = x.clone();
            gelu_tanh(&mut y);
            assert_close("gelu_tanh", &y, &want, 1e-5, 1e-30);
            // The textbook tanh form agrees in absolute terms everywhere.
            let tanh_form: Vec<f64> = x.iter().map(|&v| gelu_ref(v as f64)).collect();
            assert_close("gelu_tanh vs tanh form", &y, &tanh_form, 1e-5, 1e-12);
        }
    }

    #[test]
    fn gated_match_f64() {
        for (k, &n) in LENS.iter().enumerate() {
            let g = inputs(21 + k as u64, n);
            let u = rand_vec(31 + k as u64, n, 3.0);
            let mut out = vec![f32::NAN; n];
            swiglu(&g, &u, &mut out);
            let want: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| silu_ref(g as f64) * u as f64).collect();
            assert_close("swiglu", &out, &want, 1e-5, 1e-30);
            geglu(&g, &u, &mut out);
            let want: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| gelu_ref_exact(g as f64) * u as f64).collect();
            assert_close("geglu", &out, &want, 1e-5, 1e-30);
        }
    }

    #[test]
    fn softcap_matches_f64() {
        for (k, &n) in LENS.iter().enumerate() {
            let x = rand_vec(41 + k as u64, n, 100.0);
            for c in [1.0f32, 30.0, 50.0] {
                let want: Vec<f64> = x.iter().map(|&v| c as f64 * (v as f64 / c as f64).tanh()).collect();
                let mut y = x.clone();
                softcap(&mut y, c);
                assert_close("softcap", &y, &want, 1e-5, 1e-30);
                assert!(y.iter().all(|v| v.abs() <= c));
            }
        }
    }
}
