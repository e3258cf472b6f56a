//! Dense f32 matrix products through faer's matmul and the `gemm` crate.
//!
//! Both take arbitrary row/column strides (ndarray views and the transposed
//! operand of `a·bᵀ` need no copies), dispatch AVX2/AVX-512/NEON kernels at
//! run time and parallelize over rayon. `benches/gemm.rs` measures them and
//! `matrixmultiply` side by side; on the AVX-512 development machine (2
//! cores, quiet) faer led on square products (2048³, 2 threads: faer 230,
//! gemm 140, matrixmultiply 130 GFLOP/s single-threaded) and `gemm` on the
//! skinny decode-like 1×4096×4096 (13 vs 4.6 GFLOP/s). So products with
//! fewer than [`SKINNY_ROWS`] rows go to `gemm`, the rest to faer.

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

/// Below this many rows of `a`, the product goes to `gemm` (see the module
/// docs for the measurement).
pub const SKINNY_ROWS: usize = 8;

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
    if m >= SKINNY_ROWS && k > 0 {
        let par = if threads > 1 { faer::Par::rayon(threads) } else { faer::Par::Seq };
        // SAFETY: as for `gemm::gemm` below: the operands are live views of
        // shapes m×k and k×n with the given strides, `dst` a fresh
        // contiguous m×n row-major array that nothing else borrows.
        unsafe {
            let a = faer::MatRef::<f32>::from_raw_parts(lhs, m, k, lhs_rs, lhs_cs);
            let b = faer::MatRef::<f32>::from_raw_parts(rhs, k, n, rhs_rs, rhs_cs);
            let c = faer::MatMut::<f32>::from_raw_parts_mut(dst.as_mut_ptr(), m, n, n as isize, 1);
            faer::linalg::matmul::matmul(c, faer::Accum::Replace, a, b, 1.0f32, par);
        }
        return dst;
    }
    let par = if threads > 1 && m * n * k >= 64 * 64 * 64 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
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
        for &(m, k, n) in &[(1, 1, 1), (3, 17, 5), (33, 64, 7), (1, 300, 129), (70, 70, 70), (8, 1, 9), (129, 33, 65)] {
            let a = Array2::from_shape_fn((m, k), |(i, j)| ((i * 7 + j * 3) % 11) as f32 - 5.0);
            let b = Array2::from_shape_fn((k, n), |(i, j)| ((i * 5 + j * 13) % 7) as f32 * 0.5 - 1.0);
            let want = naive(&a, &b);
            for threads in [1, 2] {
                let got = matmul(a.view(), b.view(), threads).unwrap();
                assert!(
                    got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-3 * w.abs().max(1.0)),
                    "matmul {m}x{k}x{n}"
                );
                let bt = b.t().to_owned();
                let got = matmul_transb(a.view(), bt.view(), threads).unwrap();
                assert!(
                    got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-3 * w.abs().max(1.0)),
                    "transb {m}x{k}x{n}"
                );
                // A strided (transposed) view as the right operand.
                let got = matmul(a.view(), bt.t(), threads).unwrap();
                assert!(
                    got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-3 * w.abs().max(1.0)),
                    "strided {m}x{k}x{n}"
                );
            }
        }
        assert!(matmul(Array2::zeros((2, 3)).view(), Array2::zeros((4, 2)).view(), 1).is_err());
    }
}
