//! Closed-form ridge solve for key–value weight editing.
//!
//! Given `N` facts, keys `K: [N, d_in]` (row `kᵢ` is the input a layer sees)
//! and targets `T: [N, d_out]` (row `tᵢ` is the output change wanted for
//! `kᵢ`), find the weight update `ΔW: [d_out, d_in]` that minimizes
//!
//! ```text
//! Σᵢ ‖ΔW·kᵢ − tᵢ‖² + λ‖ΔW‖²_F
//! ```
//!
//! The minimizer is `ΔW = Tᵀ·K·(KᵀK + λI)⁻¹`, and by the push-through
//! identity `K·(KᵀK + λI)⁻¹ = (KKᵀ + λI)⁻¹·K`, also
//!
//! ```text
//! ΔW = Tᵀ · (K·Kᵀ + λI)⁻¹ · K
//! ```
//!
//! which is what this file computes: the system is the `N × N` Gram matrix,
//! cheap when there are far fewer facts than features (`N ≪ d_in`). With
//! `λ → 0` and linearly independent keys, `ΔW·kᵢ = tᵢ` exactly and `ΔW` is
//! the minimum-norm such update. This is ridge regression (Hoerl & Kennard
//! 1970) in its dual / kernel form, and the closed-form key–value edit of
//! ROME and MEMIT (Meng et al. 2022, "Locating and Editing Factual
//! Associations in GPT", and "Mass-Editing Memory in a Transformer",
//! arXiv:2210.07229: `Δ = R·K₁ᵀ(C₀ + K₁K₁ᵀ)⁻¹`) with the key covariance
//! `C₀` replaced by `λI`.
//!
//! # Why f64
//!
//! Keys gathered at one layer typically share a dominant direction:
//! `kᵢ = c + εᵢ` with `‖εᵢ‖ ≪ ‖c‖`. Every entry of `K·Kᵀ` is then about
//! `‖c‖²`, while what tells the facts apart is the `εᵢ·εⱼ` part, smaller by
//! `‖ε‖²/‖c‖²` (1e-6 for 1e-3 noise on unit-scale components). f32 rounds
//! each entry with relative error 6e-8, which wipes out a good fraction of
//! that part, and the condition number `κ(K·Kᵀ) ≈ N‖c‖²/‖ε‖²` (~1e7 here)
//! amplifies what is left: an f32 Cholesky gives a wrong `ΔW` or fails
//! outright. In f64 (ε = 1.1e-16) the error is about `κ·ε ≈ 1e-9`. So keys
//! and targets are widened to f64, everything is computed in f64, and only
//! `ΔW` is rounded back to f32, the type of the weights it edits.

use super::check_ridge;
use super::cholesky::factor_shifted;
use crate::error::{shape_err, Error, Result};
use faer::linalg::matmul::matmul;
use faer::linalg::solvers::Solve;
use faer::{Accum, Mat};
use ndarray::{Array2, ArrayView2};

/// Per-fact reconstruction quality of a ridge edit, from
/// [`ridge_decomposition_solve_with_report`]. Entry `i` is about fact `i`
/// (row `i` of `K` and `T`), measured with the returned f32 `ΔW` applied in
/// f64.
#[derive(Clone, Debug, PartialEq)]
pub struct RidgeReport {
    /// `cos(ΔW·kᵢ, tᵢ) = ⟨ΔW·kᵢ, tᵢ⟩ / (‖ΔW·kᵢ‖·‖tᵢ‖)`, in `[-1, 1]`; `1` when
    /// both vectors are zero, `0` when exactly one is.
    pub cosine: Vec<f64>,
    /// `‖ΔW·kᵢ − tᵢ‖ / ‖tᵢ‖` (the absolute norm `‖ΔW·kᵢ‖` when `tᵢ = 0`).
    pub relative_residual: Vec<f64>,
}

impl RidgeReport {
    /// Number of facts reported on.
    pub fn len(&self) -> usize {
        self.cosine.len()
    }

    /// True when there were no facts.
    pub fn is_empty(&self) -> bool {
        self.cosine.is_empty()
    }

    /// Worst (smallest) cosine over the facts; `1.0` when there are none.
    pub fn min_cosine(&self) -> f64 {
        self.cosine.iter().copied().fold(1.0, f64::min)
    }

    /// Worst (largest) relative residual; `0.0` when there are none.
    pub fn max_relative_residual(&self) -> f64 {
        self.relative_residual.iter().copied().fold(0.0, f64::max)
    }
}

/// Ridge weight edit `ΔW = Tᵀ·(K·Kᵀ + λI)⁻¹·K`, computed in f64.
///
/// * `k: [N, d_in]` — one key per row.
/// * `t: [N, d_out]` — one target per row (`d_out = d_in = d` for a square
///   layer).
/// * `lambda >= 0` — ridge coefficient, in units of squared key norm
///   (e.g. `1e-6 · mean‖kᵢ‖²` for a near-exact fit); `0` asks for the exact
///   minimum-norm fit, which needs `N <= d_in` linearly independent keys.
///
/// Returns `ΔW: [d_out, d_in]` (f32). Cost in f64 flops: `2·N²·d_in`
/// (Gram, a full GEMM) + `N³/3` (Cholesky) + `2·N²·d_in` (solve) +
/// `2·N·d_in·d_out` (product).
/// `N = 0` gives a zero `ΔW`. See the module docs for the formula, its
/// source and why f64.
///
/// # Errors
/// * [`Error::Shape`] — `k` and `t` have different row counts, or `lambda`
///   is negative.
/// * [`Error::NonFinite`] — NaN or infinity in `k`, `t` or `lambda`, or a
///   `ΔW` entry beyond the f32 range.
/// * [`Error::NotPositiveDefinite`] — `K·Kᵀ + λI` is singular to working
///   precision (`λ = 0` with dependent keys, duplicated facts, or
///   `N > d_in`); the pivot names the first key that depends on the earlier
///   ones. Raise `lambda`.
pub fn ridge_decomposition_solve(k: ArrayView2<f32>, t: ArrayView2<f32>, lambda: f64) -> Result<Array2<f32>> {
    let (delta, _) = solve_f64(k, t, lambda)?;
    Ok(delta)
}

/// [`ridge_decomposition_solve`], plus a [`RidgeReport`] of how well the
/// returned `ΔW` maps each key `kᵢ` to its target `tᵢ`.
///
/// The report costs one extra `N × d_in × d_out` product.
///
/// # Errors
/// Those of [`ridge_decomposition_solve`].
pub fn ridge_decomposition_solve_with_report(
    k: ArrayView2<f32>,
    t: ArrayView2<f32>,
    lambda: f64,
) -> Result<(Array2<f32>, RidgeReport)> {
    let (delta, k64) = solve_f64(k, t, lambda)?;
    let (n, d_out) = t.dim();
    let d_in = k.ncols();
    // Y = K · ΔWᵀ : [N, d_out], row i = (ΔW·kᵢ)ᵀ, with the f32 ΔW the caller gets.
    let dw = Mat::from_fn(d_out, d_in, |i, j| f64::from(delta[[i, j]]));
    let mut y = Mat::<f64>::zeros(n, d_out);
    matmul(y.as_mut(), Accum::Replace, k64.as_ref(), dw.transpose(), 1.0, faer::get_global_parallelism());

    let mut report = RidgeReport { cosine: Vec::with_capacity(n), relative_residual: Vec::with_capacity(n) };
    for i in 0..n {
        let (mut dot, mut yy, mut tt, mut rr) = (0.0, 0.0, 0.0, 0.0);
        for j in 0..d_out {
            let (yj, tj) = (y[(i, j)], f64::from(t[[i, j]]));
            dot += yj * tj;
            yy += yj * yj;
            tt += tj * tj;
            rr += (yj - tj) * (yj - tj);
        }
        let cosine = match (yy > 0.0, tt > 0.0) {
            (true, true) => (dot / (yy.sqrt() * tt.sqrt())).clamp(-1.0, 1.0),
            (false, false) => 1.0,
            _ => 0.0,
        };
        let residual = if tt > 0.0 { (rr / tt).sqrt() } else { rr.sqrt() };
        report.cosine.push(cosine);
        report.relative_residual.push(residual);
    }
    Ok((delta, report))
}

/// Shared body: checks, f64 solve, rounding to f32. Also returns `K` in f64
/// for the report.
fn solve_f64(k: ArrayView2<f32>, t: ArrayView2<f32>, lambda: f64) -> Result<(Array2<f32>, Mat<f64>)> {
    const OP: &str = "ridge_decomposition_solve";
    let (n, d_in) = k.dim();
    let d_out = t.ncols();
    if t.nrows() != n {
        return Err(shape_err(
            OP,
            format!("keys are [{n}, {d_in}] but targets are [{}, {d_out}]: one target row per key row", t.nrows()),
        ));
    }
    check_ridge(OP, lambda)?;
    if !k.iter().all(|x| x.is_finite()) {
        return Err(Error::NonFinite("ridge keys"));
    }
    if !t.iter().all(|x| x.is_finite()) {
        return Err(Error::NonFinite("ridge targets"));
    }
    let k64 = Mat::from_fn(n, d_in, |i, j| f64::from(k[[i, j]]));
    if n == 0 {
        return Ok((Array2::zeros((d_out, d_in)), k64));
    }
    let t64 = Mat::from_fn(n, d_out, |i, j| f64::from(t[[i, j]]));
    let par = faer::get_global_parallelism();

    // G = K·Kᵀ + λI : [N, N]. Finite: |f32|² · d_in stays far below f64::MAX.
    let mut gram = Mat::<f64>::zeros(n, n);
    matmul(gram.as_mut(), Accum::Replace, k64.as_ref(), k64.transpose(), 1.0, par);
    for i in 0..n {
        gram[(i, i)] += lambda;
    }
    // The GEMM output is symmetric up to rounding; the factor reads the lower
    // triangle only.
    let chol = factor_shifted(gram, lambda)?;

    // X = G⁻¹·K : [N, d_in];  ΔW = Tᵀ·X : [d_out, d_in].
    let mut x = k64.clone();
    chol.llt().solve_in_place(x.as_mut());
    let mut dw = Mat::<f64>::zeros(d_out, d_in);
    matmul(dw.as_mut(), Accum::Replace, t64.transpose(), x.as_ref(), 1.0, par);

    let delta = Array2::from_shape_fn((d_out, d_in), |(i, j)| dw[(i, j)] as f32);
    if !delta.iter().all(|x| x.is_finite()) {
        return Err(Error::NonFinite("ridge_decomposition_solve result (beyond the f32 range)"));
    }
    Ok((delta, k64))
}
