//! Solve `L·Lᵀ·X = B` with a [`CholeskyFactor`]: forward substitution with
//! `L`, back substitution with `Lᵀ` (faer's `Llt` solve, `2·n²·m` flops).

use super::{check_finite_f64, from_faer, to_faer, CholeskyFactor};
use crate::error::{shape_err, Result};
use faer::linalg::solvers::Solve;
use ndarray::{Array2, ArrayView2};

/// Solves `(A + ridge·I)·X = B`, i.e. `L·Lᵀ·X = B`, for `X: [n, m]`.
///
/// * `l` — the factor from [`cholesky`](super::cholesky), order `n`.
/// * `b: [n, m]` — right-hand sides, one per column, any memory layout. For a
///   single vector `b: [n]` pass `b.insert_axis(Axis(1))`.
///
/// Backward stable: the computed `X` satisfies
/// `‖A·X − B‖ <= c·n·ε·‖A‖·‖X‖` for a small constant `c` (Higham, *Accuracy
/// and Stability of Numerical Algorithms*, 2nd ed., Thm. 10.4).
///
/// # Errors
/// * [`Error::Shape`](crate::Error::Shape) — `b` does not have `n` rows.
/// * [`Error::NonFinite`](crate::Error::NonFinite) — `b` contains NaN or
///   infinity.
pub fn cholesky_solve(l: &CholeskyFactor, b: ArrayView2<f64>) -> Result<Array2<f64>> {
    let n = l.n();
    if b.nrows() != n {
        return Err(shape_err(
            "cholesky_solve",
            format!("factor is [{n}, {n}] but b is [{}, {}]", b.nrows(), b.ncols()),
        ));
    }
    check_finite_f64(b, "cholesky_solve right-hand side")?;
    let mut x = to_faer(b);
    l.llt().solve_in_place(x.as_mut());
    Ok(from_faer(x.as_ref()))
}
