//! Numerically stable softmax over one row, as ggml's `ggml_soft_max`
//! computes it on the CPU: `m = max x`, `e_i = e^(x_i - m)` in f32 (by
//! [`super::exp::exp`], within 2 ulp of `expf`),
//! `S = Σ e_i` accumulated in f64 (`ggml_float`), `y_i = e_i · (float)(1/S)`.
//!
//! Subtracting the maximum keeps every exponent `<= 0`, so nothing
//! overflows and at least one term is exactly 1 (so `S >= 1`).

/// Softmax in place: `x[i] ← exp(x[i] - max x) / Σ_j exp(x[j] - max x)`.
///
/// Entries equal to `-inf` get probability exactly 0 (masking). A row
/// whose entries are **all** `-inf` (nothing to attend to) is defined to
/// become all zeros, never NaN. An empty row is left as is.
///
/// Contract: entries are finite or `-inf` (a `+inf` or NaN entry yields NaN,
/// as in ggml).
#[inline(always)]
pub fn softmax(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let mut max = f32::NEG_INFINITY;
    for &v in x.iter() {
        if v > max {
            max = v;
        }
    }
    if max == f32::NEG_INFINITY {
        // Only -inf (or NaN) entries: zeros, by definition. Keep NaN visible.
        for v in x.iter_mut() {
            if !v.is_nan() {
                *v = 0.0;
            }
        }
        return;
    }
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        let e = super::exp::exp(*v - max);
        *v = e;
        sum += e as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    fn softmax_ref(x: &[f32]) -> Vec<f64> {
        let m = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let e: Vec<f64> = x.iter().map(|&v| (v as f64 - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    #[test]
    fn softmax_matches_f64() {
        for (k, &n) in LENS.iter().enumerate() {
            for amp in [1.0f32, 30.0] {
                let mut x = rand_vec(k as u64, n, amp);
                // A large offset must not overflow.
                for v in x.iter_mut() {
                    *v += 1e4;
                }
                let want = softmax_ref(&x);
                softmax(&mut x);
                assert_close("softmax", &x, &want, 1e-5, 1e-30);
                let s: f64 = x.iter().map(|&v| v as f64).sum();
                assert!((s - 1.0).abs() < 1e-5, "sum {s}");
            }
        }
    }

    #[test]
    fn masked_entries_are_exactly_zero() {
        for &n in &LENS[1..] {
            let mut x = rand_vec(5, n, 4.0);
            for i in (0..n).step_by(3) {
                x[i] = f32::NEG_INFINITY;
            }
            let want = softmax_ref(&x);
            softmax(&mut x);
            assert_close("softmax masked", &x, &want, 1e-5, 1e-30);
            for i in (0..n).step_by(3) {
                assert_eq!(x[i], 0.0);
            }
        }
    }

    #[test]
    fn all_neg_inf_is_zeros_not_nan() {
        for &n in &LENS {
            let mut x = vec![f32::NEG_INFINITY; n];
            softmax(&mut x);
            assert!(x.iter().all(|&v| v == 0.0), "{:?}", &x[..n.min(4)]);
        }
        let mut empty: [f32; 0] = [];
        softmax(&mut empty);
    }

    #[test]
    fn single_finite_entry_is_one() {
        let mut x = [f32::NEG_INFINITY, -3.0, f32::NEG_INFINITY];
        softmax(&mut x);
        assert_eq!(x, [0.0, 1.0, 0.0]);
    }
}
