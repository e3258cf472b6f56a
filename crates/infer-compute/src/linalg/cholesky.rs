//! Cholesky factorization `A + ridge·I = L·Lᵀ` of a symmetric positive
//! definite `A: [n, n]`, `L` lower triangular with a positive diagonal.
//!
//! The factoring is faer's blocked, SIMD, rayon-parallel `Llt` on the lower
//! triangle of `A + ridge·I`. Around it this file checks the input (square,
//! finite, symmetric within [`SYMMETRY_RTOL`], ridge finite and `>= 0`) and,
//! when the matrix is not positive definite, names the failing pivot and its
//! value.
//!
//! Pivot `k` is the Schur complement `d_k = a_kk − Σ_{j<k} l_kj²` (so that
//! `l_kk = √d_k`); the factorization exists iff every `d_k > 0`. A pivot that
//! is positive but `<= n·ε·a_kk` (ε = `f64::EPSILON`) has lost every
//! significant digit to cancellation: the matrix is singular to working
//! precision (e.g. the Gram matrix of rank-deficient data, which exact
//! arithmetic would reject and rounding may accept with a ~1e-14 pivot), and
//! it is rejected the same way instead of yielding a solve dominated by
//! rounding noise. Source: Golub & Van Loan, *Matrix Computations*, 4th ed.,
//! §4.2 (Cholesky and its pivots), Higham, *Accuracy and Stability of
//! Numerical Algorithms*, 2nd ed., ch. 10.

use super::{check_finite_f64, check_ridge, from_faer, to_faer};
use crate::error::{shape_err, Error, Result};
use faer::linalg::solvers::{Llt, LltError};
use faer::{Mat, MatRef, Side};
use ndarray::{Array2, ArrayView2};

/// Relative tolerance of the symmetry check in [`cholesky`]:
/// `|a_ij − a_ji| <= SYMMETRY_RTOL · max_kl |a_kl|` is accepted.
///
/// Generous enough for Gram matrices formed by a GEMM that does not mirror
/// its output (their rounding asymmetry is about `n·ε·max|a|`, `1e-8` covers
/// `n` up to ~10⁷), strict enough to catch a matrix that is not symmetric.
pub const SYMMETRY_RTOL: f64 = 1e-8;

/// The Cholesky factor `L` of `A + ridge·I` (`[n, n]`, lower triangular,
/// positive diagonal), as returned by [`cholesky`] and consumed by
/// [`cholesky_solve`](super::cholesky_solve) and
/// [`cholesky_inverse`](super::cholesky_inverse).
///
/// Holds faer's factorization; [`CholeskyFactor::l`] copies `L` out.
#[derive(Clone, Debug)]
pub struct CholeskyFactor {
    llt: Llt<f64>,
    ridge: f64,
}

impl CholeskyFactor {
    /// Order `n` of the factored matrix.
    pub fn n(&self) -> usize {
        self.llt.L().nrows()
    }

    /// The ridge that was added to the diagonal before factoring: this
    /// factors `A + ridge·I`, and solves and inverts that matrix.
    pub fn ridge(&self) -> f64 {
        self.ridge
    }

    /// The lower-triangular factor `L: [n, n]` (zeros above the diagonal),
    /// copied into an ndarray.
    pub fn l(&self) -> Array2<f64> {
        from_faer(self.llt.L())
    }

    /// Same as [`cholesky_solve(self, b)`](super::cholesky_solve).
    ///
    /// # Errors
    /// See [`cholesky_solve`](super::cholesky_solve).
    pub fn solve(&self, b: ArrayView2<f64>) -> Result<Array2<f64>> {
        super::cholesky_solve(self, b)
    }

    /// Same as [`cholesky_inverse(self)`](super::cholesky_inverse).
    ///
    /// # Errors
    /// See [`cholesky_inverse`](super::cholesky_inverse).
    pub fn inverse(&self) -> Result<Array2<f64>> {
        super::cholesky_inverse(self)
    }

    /// faer's factorization, for the solve and inverse verbs.
    pub(super) fn llt(&self) -> &Llt<f64> {
        &self.llt
    }
}

/// Cholesky-factors `A + ridge·I = L·Lᵀ`.
///
/// * `a: [n, n]` — symmetric positive definite (or positive semidefinite
///   made definite by `ridge`), any memory layout. Only the lower triangle is
///   used for the factoring, after checking that it matches the upper one.
/// * `ridge >= 0` — Tikhonov term added to the diagonal (`0.0` for a plain
///   Cholesky).
///
/// Cost: `n³/3` flops (faer `Llt`; one flop per multiply and per add), plus
/// `O(n²)` for the checks and the copy into faer.
///
/// # Errors
/// * [`Error::Shape`] — `a` is not square, or `ridge` is negative.
/// * [`Error::NonFinite`] — `a` or `ridge` contains NaN or infinity.
/// * [`Error::NotSymmetric`] — some `|a_ij − a_ji|` exceeds
///   [`SYMMETRY_RTOL`]` · max|a|`; the largest offending pair is reported.
/// * [`Error::NotPositiveDefinite`] `{ pivot, value }` — the first pivot `k`
///   whose Schur complement `d_k` is `<= 0` (or `<= n·ε·a_kk`, singular to
///   working precision; see the module docs), with `value = d_k`.
pub fn cholesky(a: ArrayView2<f64>, ridge: f64) -> Result<CholeskyFactor> {
    const OP: &str = "cholesky";
    let (n, ncols) = a.dim();
    if n != ncols {
        return Err(shape_err(OP, format!("matrix must be square, got [{n}, {ncols}]")));
    }
    check_ridge(OP, ridge)?;
    check_finite_f64(a, "cholesky input matrix")?;
    check_symmetric(a)?;
    let mut m = to_faer(a);
    for i in 0..n {
        m[(i, i)] += ridge;
    }
    factor_shifted(m, ridge)
}

/// Factors `m` (= `A + ridge·I`, already shifted, finite) from its lower
/// triangle, without the symmetry check. For callers inside `linalg` that
/// built `m` themselves as a Gram matrix.
pub(super) fn factor_shifted(m: Mat<f64>, ridge: f64) -> Result<CholeskyFactor> {
    match Llt::new(m.as_ref(), Side::Lower) {
        Ok(llt) => match negligible_pivot(&llt, m.as_ref()) {
            Some((pivot, value)) => Err(Error::NotPositiveDefinite { pivot, value }),
            None => Ok(CholeskyFactor { llt, ridge }),
        },
        Err(LltError::NonPositivePivot { index }) => {
            let (pivot, value) = failing_pivot(m.as_ref(), index);
            Err(Error::NotPositiveDefinite { pivot, value })
        }
    }
}

/// First pivot of a successful factorization of `m` (or of its leading block)
/// that is positive but `<= n·ε·m_kk`, with its value `l_kk²`; `n` is the
/// order of the whole matrix. Such a pivot survived only through rounding.
fn negligible_pivot(llt: &Llt<f64>, m: MatRef<'_, f64>) -> Option<(usize, f64)> {
    let tol = m.nrows() as f64 * f64::EPSILON;
    let l = llt.L();
    (0..l.nrows()).map(|k| (k, l[(k, k)] * l[(k, k)])).find(|&(k, d)| d <= tol * m[(k, k)])
}

/// The pivot to report when faer found pivot `k` non-positive: factor the
/// leading `k × k` block (faer got past it), solve `L₁₁·y = m[0..k, k]` and
/// return `(k, m_kk − yᵀy)`. `O(k³/3)`, paid only on the error path. An
/// earlier pivot is reported instead when it is negligible (rank-deficient
/// input often gives a ~1e-15 pivot followed by a negative one), or when
/// rounding makes the leading block fail this time.
fn failing_pivot(m: MatRef<'_, f64>, mut k: usize) -> (usize, f64) {
    loop {
        if k == 0 {
            return (0, m[(0, 0)]);
        }
        match Llt::new(m.submatrix(0, 0, k, k), Side::Lower) {
            Ok(llt) => {
                if let Some(early) = negligible_pivot(&llt, m) {
                    return early;
                }
                // Lower triangle only: row k of m, columns 0..k, as a column.
                let mut y = Mat::from_fn(k, 1, |i, _| m[(k, i)]);
                faer::linalg::triangular_solve::solve_lower_triangular_in_place(llt.L(), y.as_mut(), faer::Par::Seq);
                let yty: f64 = (0..k).map(|i| y[(i, 0)] * y[(i, 0)]).sum();
                return (k, m[(k, k)] - yty);
            }
            Err(LltError::NonPositivePivot { index }) => k = index,
        }
    }
}

/// Symmetry check for [`cholesky`]; reports the largest offending pair.
fn check_symmetric(a: ArrayView2<f64>) -> Result<()> {
    let n = a.nrows();
    let max_abs = a.iter().fold(0.0_f64, |m, x| m.max(x.abs()));
    let tol = SYMMETRY_RTOL * max_abs;
    let mut worst: Option<(usize, usize, f64)> = None;
    for i in 0..n {
        for j in 0..i {
            let diff = (a[[i, j]] - a[[j, i]]).abs();
            let worse = match worst {
                Some((_, _, w)) => diff > w,
                None => true,
            };
            if diff > tol && worse {
                worst = Some((i, j, diff));
            }
        }
    }
    match worst {
        Some((i, j, diff)) => Err(Error::NotSymmetric { i, j, diff }),
        None => Ok(()),
    }
}
