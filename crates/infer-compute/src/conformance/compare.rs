//! How the suite compares a backend's numbers with the reference's, with the
//! measures ggml's `test-backend-ops` uses (normalized mean squared error) and
//! the near-tie rule for the top token of two quantized paths.

/// Normalized mean squared error `Σ(a − b)² / Σ b²` (0 for two zero
/// vectors; infinite when `a` has a non-finite value).
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    if got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let err: f64 = got.iter().zip(want).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    let norm: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    if norm == 0.0 {
        if err == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        err / norm
    }
}

/// Cosine similarity of two vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb).max(f64::MIN_POSITIVE)
}

/// The first `n` indices where `got` and `want` differ by more than
/// `atol + rtol·|want|`, with both values and the error, for messages.
pub fn first_mismatches(got: &[f32], want: &[f32], rtol: f32, atol: f32, n: usize) -> String {
    got.iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (&g, &w))| !((g - w).abs() <= atol + rtol * w.abs()))
        .take(n)
        .map(|(i, (&g, &w))| format!("[{i}] got {g:e} want {w:e} (abs {:e})", (g - w).abs()))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Checks logits against the reference's: all finite, cosine ≥ 0.999, and
/// the same top token unless the reference's margin is a near-tie (within
/// 1e-3 of the logit range, or three times the RMS difference of the two
/// vectors: two quantized paths round differently, and their difference
/// sets the scale of a tie).
///
/// # Errors
/// A message naming the first violated bound.
pub fn check_logits(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} logits, want {}", got.len(), want.len()));
    }
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        return Err(format!("{what}: non-finite logit {} at {i}", got[i]));
    }
    let cos = cosine(got, want);
    if cos < 0.999 {
        return Err(format!("{what}: cosine {cos:.6} < 0.999"));
    }
    let top = |v: &[f32], whose: &str| {
        crate::greedy_token(v).map(|t| t as usize).map_err(|e| format!("{what}: {whose} logits: {e}"))
    };
    let (tg, tw) = (top(got, "the")?, top(want, "the reference's")?);
    if tg != tw {
        let max = want.iter().cloned().fold(f32::MIN, f32::max);
        let min = want.iter().cloned().fold(f32::MAX, f32::min);
        let rms = (got.iter().zip(want).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
        let margin = want[tw] - want[tg];
        if margin > (1e-3 * (max - min)).max(3.0 * rms as f32) {
            return Err(format!("{what}: top-1 {tg} vs reference {tw} (margin {margin:e}, RMS difference {rms:e})"));
        }
    }
    Ok(())
}
