//! Inverse `(L·Lᵀ)⁻¹ = L⁻ᵀ·L⁻¹` from a [`CholeskyFactor`]: faer inverts the
//! triangular factor and forms the product (`≈ 2n³/3` flops), then mirrors
//! the lower triangle so the result is exactly symmetric.
//!
//! Prefer [`cholesky_solve`](super::cholesky_solve) when the inverse is only
//! multiplied by something: it is cheaper and more accurate.

use super::{from_faer, CholeskyFactor};
use crate::error::{Error, Result};
use faer::linalg::solvers::DenseSolveCore;
use ndarray::Array2;

/// Returns `(A + ridge·I)⁻¹ : [n, n]`, symmetric, from its Cholesky factor.
///
/// Accuracy: `‖X·A − I‖ <= c·n·ε·κ(A)` (Higham, *Accuracy and Stability of
/// Numerical Algorithms*, 2nd ed., §14.2), so a large condition number
/// `κ(A)` shows up directly in the inverse.
///
/// # Errors
/// * [`Error::NonFinite`] — the inverse overflowed (the factor's pivots are
///   so small that `A⁻¹` is not representable).
pub fn cholesky_inverse(l: &CholeskyFactor) -> Result<Array2<f64>> {
    let inv = l.llt().inverse();
    let out = from_faer(inv.as_ref());
    if out.iter().all(|x| x.is_finite()) {
        Ok(out)
    } else {
        Err(Error::NonFinite("cholesky_inverse result"))
    }
}
