//! Dense f32 matrix products through the `gemm` crate.
//!
//! `gemm` (the kernel library under faer) was chosen over `faer::linalg::matmul`
//! and `matrixmultiply`: it takes arbitrary row/column strides (so ndarray
//! views and the transposed operand of `a·bᵀ` need no copies), it
//! dispatches AVX2/AVX-512/NEON micro-kernels at run time, and it
//! parallelizes over rayon. `benches/gemm.rs` measures the three side by side.

use ndarray::{Array2, ArrayView2};

use crate::error::{shape_err, Result};

/// `a · b` with strides taken from the views. `threads` > 1 uses rayon.
pub fn matmul(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, threads: usize) -> Result<Array2<f32>> {
    let (m, k) = a.dim();
    let (k2, n) = b.dim();
    if k != k2 {
        return Err(shape_err("matmul", format!("a is {m}x{k}, b is {k2}x{n}")));
    }
    let sa = a.strides();
    let sb = b.strides();
    Ok(gemm_raw(m, n, k, a.as_ptr(), sa[1], sa[0], b.as_ptr(), sb[1], sb[0], threads))
}

/// `a · bᵀ`: `a` is m×k, `b` is n×k.
pub fn matmul_transb(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, threads: usize) -> Result<Array2<f32>> {
    let (m, k) = a.dim();
    let (n, k2) = b.dim();
    if k != k2 {
        return Err(shape_err("matmul_transb", format!("a is {m}x{k}, b is {n}x{k2}")));
    }
    let sa = a.strides();
    let sb = b.strides();
    // bᵀ[i][j] = b[j][i]: its column stride is b's row stride and vice versa.
    Ok(gemm_raw(m, n, k, a.as_ptr(), sa[1], sa[0], b.as_ptr(), sb[0], sb[1], threads))
}

#[allow(clippy::too_many_arguments)]
fn gemm_raw(
    m: usize,
    n: usize,
    k: usize,
    lhs: *const f32,
    lhs_cs: isize,
    lhs_rs: isize,
    rhs: *const f32,
    rhs_cs: isize,
    rhs_rs: isize,
    threads: usize,
) -> Array2<f32> {
    let mut dst = Array2::<f32>::zeros((m, n));
    if m == 0 || n == 0 {
        return dst;
    }
    let par = if threads > 1 && m * n * k >= 64 * 64 * 64 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    let dst_ptr = dst.as_mut_ptr();
    // SAFETY: `dst` is a fresh, contiguous m×n row-major array (row stride
    // n, column stride 1); lhs and rhs point into live views whose shapes
    // (m×k, k×n after the stride swap) and strides came from ndarray, so
    // every index gemm forms is in bounds. read_dst = false, so dst's initial
    // contents are not read; alpha is ignored then and beta = 1.
    unsafe {
        gemm::gemm(
            m, n, k, dst_ptr, 1, n as isize, false, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs, 0.0f32, 1.0f32, false,
            false, false, par,
        );
    }
    dst
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    fn naive(a: &Array2<f32>, b: &Array2<f32>) -> Array2<f32> {
        let (m, k) = a.dim();
        let n = b.dim().1;
        Array2::from_shape_fn((m, n), |(i, j)| (0..k).map(|p| a[[i, p]] as f64 * b[[p, j]] as f64).sum::<f64>() as f32)
    }

    #[test]
    fn matmul_and_transb_match_naive_on_awkward_shapes() {
        for &(m, k, n) in &[(1, 1, 1), (3, 17, 5), (33, 64, 7), (1, 300, 129), (70, 70, 70)] {
            let a = Array2::from_shape_fn((m, k), |(i, j)| ((i * 7 + j * 3) % 11) as f32 - 5.0);
            let b = Array2::from_shape_fn((k, n), |(i, j)| ((i * 5 + j * 13) % 7) as f32 * 0.5 - 1.0);
            let want = naive(&a, &b);
            for threads in [1, 2] {
                let got = matmul(a.view(), b.view(), threads).unwrap();
                assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-3 * w.abs().max(1.0)), "matmul {m}x{k}x{n}");
                let bt = b.t().to_owned();
                let got = matmul_transb(a.view(), bt.view(), threads).unwrap();
                assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-3 * w.abs().max(1.0)), "transb {m}x{k}x{n}");
            }
        }
        assert!(matmul(Array2::zeros((2, 3)).view(), Array2::zeros((4, 2)).view(), 1).is_err());
    }
}
