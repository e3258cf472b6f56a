//! f64 dense linear algebra for weight-editing callers, built on faer.
//!
//! One file per verb, in the style of faer:
//!
//! | verb | function | computes |
//! |------|----------|----------|
//! | factor | [`cholesky`] | `L` with `L·Lᵀ = A + ridge·I`, `A: [n, n]` symmetric positive definite |
//! | solve | [`cholesky_solve`] | `X: [n, m]` with `L·Lᵀ·X = B` |
//! | inverse | [`cholesky_inverse`] | `(L·Lᵀ)⁻¹ : [n, n]` |
//! | ridge | [`ridge_decomposition_solve`] | `ΔW = Tᵀ (K·Kᵀ + λI)⁻¹ K : [d_out, d_in]` |
//!
//! The public API speaks [`ndarray`] (`Array2<f64>`, `ArrayView2`); the
//! factorization, triangular solves, inverse and matrix products are faer's
//! (`faer::linalg::solvers::Llt`, `faer::linalg::matmul`). Inputs are copied
//! into faer matrices and results copied back: an `O(n²)` cost next to the
//! `O(n³)` work, and no `unsafe` pointer sharing between the two crates.
//!
//! This module's own work is the API, the input checks (shape, finiteness,
//! symmetry, ridge), the naming of the failing pivot, and the ridge formula.
//!
//! # Errors
//!
//! Every function returns [`crate::Error`] instead of panicking:
//! [`Error::Shape`] for operands that do not agree,
//! [`Error::NonFinite`] for NaN or infinity,
//! [`Error::NotSymmetric`] and
//! [`Error::NotPositiveDefinite`] for a
//! matrix that cannot be Cholesky-factored.

mod cholesky;
mod inverse;
mod ridge;
mod solve;

pub use cholesky::{cholesky, CholeskyFactor, SYMMETRY_RTOL};
pub use inverse::cholesky_inverse;
pub use ridge::{ridge_decomposition_solve, ridge_decomposition_solve_with_report, RidgeReport};
pub use solve::cholesky_solve;

use crate::error::{shape_err, Error, Result};
use faer::Mat;
use ndarray::{Array2, ArrayView2};

/// Checks a ridge (Tikhonov) coefficient: finite and `>= 0`.
fn check_ridge(op: &'static str, ridge: f64) -> Result<()> {
    if !ridge.is_finite() {
        return Err(Error::NonFinite("ridge coefficient"));
    }
    if ridge < 0.0 {
        // error.rs has no general invalid-argument variant; `Shape` carries
        // the op name and a readable detail.
        return Err(shape_err(op, format!("ridge coefficient must be >= 0, got {ridge}")));
    }
    Ok(())
}

/// Returns `Err(NonFinite(what))` if any element of `a` is NaN or infinite.
fn check_finite_f64(a: ArrayView2<f64>, what: &'static str) -> Result<()> {
    if a.iter().all(|x| x.is_finite()) {
        Ok(())
    } else {
        Err(Error::NonFinite(what))
    }
}

/// Copies an ndarray view (any strides) into a column-major faer matrix.
fn to_faer(a: ArrayView2<f64>) -> Mat<f64> {
    Mat::from_fn(a.nrows(), a.ncols(), |i, j| a[[i, j]])
}

/// Copies a faer matrix into a standard-layout ndarray.
fn from_faer(m: faer::MatRef<'_, f64>) -> Array2<f64> {
    Array2::from_shape_fn((m.nrows(), m.ncols()), |(i, j)| m[(i, j)])
}
