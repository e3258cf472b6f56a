//! Tests of `infer_compute::linalg`: residuals of the Cholesky factor, solve
//! and inverse on seeded random SPD matrices (bounds `c·ε·n·‖A‖…`), the ridge
//! edit against two independent references (primal normal equations; SVD of
//! `K`, which never forms `K·Kᵀ`), and the error cases.
//!
//! Products in the checks use ndarray's `dot` (matrixmultiply), not faer, so
//! the checks do not share code with what they check.

use infer_compute::linalg::{
    cholesky, cholesky_inverse, cholesky_solve, ridge_decomposition_solve, ridge_decomposition_solve_with_report,
    CholeskyFactor,
};
use infer_compute::Error;
use ndarray::{array, Array2, ArrayView2};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

const EPS: f64 = f64::EPSILON;
const SIZES: [usize; 5] = [1, 2, 50, 200, 400];

fn randn(rng: &mut StdRng, r: usize, c: usize) -> Array2<f64> {
    Array2::from_shape_fn((r, c), |_| StandardNormal.sample(rng))
}

fn randn_f32(rng: &mut StdRng, r: usize, c: usize) -> Array2<f32> {
    Array2::from_shape_fn((r, c), |_| StandardNormal.sample(rng))
}

/// `A = G·Gᵀ/n + I/2`: SPD, `κ(A)` below ~10, exactly symmetric.
fn random_spd(rng: &mut StdRng, n: usize) -> Array2<f64> {
    let g = randn(rng, n, n);
    let mut a = g.dot(&g.t()) / n as f64;
    for i in 0..n {
        a[[i, i]] += 0.5;
    }
    // Make it bitwise symmetric.
    let at = a.t().to_owned();
    (&a + &at) / 2.0
}

fn fro(a: ArrayView2<f64>) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn fro32(a: ArrayView2<f32>) -> f64 {
    a.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt()
}

fn rel_diff32(a: ArrayView2<f32>, b: ArrayView2<f32>) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum();
    d.sqrt() / fro32(b)
}

fn to32(a: &Array2<f64>) -> Array2<f32> {
    a.mapv(|x| x as f32)
}

fn to64(a: ArrayView2<f32>) -> Array2<f64> {
    a.mapv(f64::from)
}

/// Reference ΔW from a faer SVD of `K = U·S·Vᵀ` (thin):
/// `ΔW = Tᵀ·U·diag(s/(s² + λ))·Vᵀ`. Never forms `K·Kᵀ`.
fn ridge_via_svd(k: ArrayView2<f32>, t: ArrayView2<f32>, lambda: f64) -> Array2<f32> {
    let (n, d) = k.dim();
    let km = faer::Mat::<f64>::from_fn(n, d, |i, j| f64::from(k[[i, j]]));
    let svd = km.thin_svd().expect("svd converges");
    let (u, v, s) = (svd.U(), svd.V(), svd.S().column_vector());
    let r = s.nrows();
    let u = Array2::from_shape_fn((n, r), |(i, j)| u[(i, j)]);
    let vt = Array2::from_shape_fn((r, d), |(i, j)| v[(j, i)]);
    let scale = Array2::from_shape_fn((r, r), |(i, j)| if i == j { s[i] / (s[i] * s[i] + lambda) } else { 0.0 });
    to32(&to64(t).t().dot(&u).dot(&scale).dot(&vt))
}

/// Reference ΔW from the primal normal equations, `(KᵀK + λI)·ΔWᵀ = Kᵀ·T`,
/// solved with faer's partial-pivoting LU (a different factorization).
fn ridge_via_normal_equations(k: ArrayView2<f32>, t: ArrayView2<f32>, lambda: f64) -> Array2<f32> {
    let (k, t) = (to64(k), to64(t));
    let d = k.ncols();
    let mut a = k.t().dot(&k);
    for i in 0..d {
        a[[i, i]] += lambda;
    }
    let rhs = k.t().dot(&t);
    let am = faer::Mat::<f64>::from_fn(d, d, |i, j| a[[i, j]]);
    let mut x = faer::Mat::<f64>::from_fn(d, rhs.ncols(), |i, j| rhs[[i, j]]);
    use faer::linalg::solvers::Solve;
    am.partial_piv_lu().solve_in_place(x.as_mut());
    to32(&Array2::from_shape_fn((d, x.ncols()), |(i, j)| x[(i, j)]).t().to_owned())
}

// ---------------------------------------------------------------- cholesky

#[test]
fn cholesky_reconstructs_random_spd() {
    let mut rng = StdRng::seed_from_u64(0x11);
    for &n in &SIZES {
        let a = random_spd(&mut rng, n);
        let f = cholesky(a.view(), 0.0).unwrap();
        assert_eq!(f.n(), n);
        let l = f.l();
        for i in 0..n {
            assert!(l[[i, i]] > 0.0, "n={n}: diagonal {i} not positive");
            for j in i + 1..n {
                assert_eq!(l[[i, j]], 0.0, "n={n}: L[{i},{j}] above the diagonal");
            }
        }
        let err = fro((l.dot(&l.t()) - &a).view());
        let bound = 4.0 * EPS * n as f64 * fro(a.view());
        assert!(err <= bound, "n={n}: ‖L·Lᵀ − A‖ = {err:e} > {bound:e}");
    }
}

#[test]
fn cholesky_ridge_shifts_diagonal() {
    let mut rng = StdRng::seed_from_u64(0x12);
    let n = 50;
    let a = random_spd(&mut rng, n);
    let ridge = 0.25;
    let f = cholesky(a.view(), ridge).unwrap();
    assert_eq!(f.ridge(), ridge);
    let l = f.l();
    let shifted = &a + &(Array2::<f64>::eye(n) * ridge);
    let err = fro((l.dot(&l.t()) - &shifted).view());
    assert!(err <= 4.0 * EPS * n as f64 * fro(shifted.view()), "err {err:e}");
}

#[test]
fn cholesky_accepts_any_layout() {
    let mut rng = StdRng::seed_from_u64(0x13);
    let a = random_spd(&mut rng, 20);
    let at = a.t(); // Fortran layout view of the same (symmetric) matrix
    let l1 = cholesky(a.view(), 0.0).unwrap().l();
    let l2 = cholesky(at, 0.0).unwrap().l();
    assert_eq!(l1, l2);
}

// ---------------------------------------------------------------- solve

#[test]
fn solve_residual_random_spd() {
    let mut rng = StdRng::seed_from_u64(0x21);
    for &n in &SIZES {
        let a = random_spd(&mut rng, n);
        let b = randn(&mut rng, n, 3);
        let f = cholesky(a.view(), 0.0).unwrap();
        let x = cholesky_solve(&f, b.view()).unwrap();
        assert_eq!(x.dim(), (n, 3));
        let res = fro((a.dot(&x) - &b).view());
        let bound = 8.0 * EPS * n as f64 * fro(a.view()) * fro(x.view());
        assert!(res <= bound, "n={n}: ‖A·X − B‖ = {res:e} > {bound:e}");
        // The method form agrees.
        assert_eq!(f.solve(b.view()).unwrap(), x);
    }
}

#[test]
fn solve_with_ridge_solves_shifted_system() {
    let mut rng = StdRng::seed_from_u64(0x22);
    let n = 200;
    let a = random_spd(&mut rng, n);
    let b = randn(&mut rng, n, 5);
    let f = cholesky(a.view(), 2.0).unwrap();
    let x = cholesky_solve(&f, b.view()).unwrap();
    let shifted = &a + &(Array2::<f64>::eye(n) * 2.0);
    let res = fro((shifted.dot(&x) - &b).view());
    assert!(res <= 8.0 * EPS * n as f64 * fro(shifted.view()) * fro(x.view()), "res {res:e}");
}

// ---------------------------------------------------------------- inverse

#[test]
fn inverse_times_a_is_identity() {
    let mut rng = StdRng::seed_from_u64(0x31);
    for &n in &SIZES {
        let a = random_spd(&mut rng, n);
        let f = cholesky(a.view(), 0.0).unwrap();
        let inv = cholesky_inverse(&f).unwrap();
        assert_eq!(inv, inv.t(), "n={n}: inverse not exactly symmetric");
        let err = fro((inv.dot(&a) - Array2::<f64>::eye(n)).view());
        // ‖X·A − I‖ <= c·n·ε·κ(A); κ_F = ‖A‖_F·‖A⁻¹‖_F bounds κ₂.
        let bound = 8.0 * EPS * n as f64 * fro(a.view()) * fro(inv.view());
        assert!(err <= bound, "n={n}: ‖A⁻¹·A − I‖ = {err:e} > {bound:e}");
        assert_eq!(f.inverse().unwrap(), inv);
    }
}

// ---------------------------------------------------------------- rank-deficient example

/// `A` with rows (1,2,3), (4,5,6), (7,8,9), (7,8,9) has rank 2, so `AᵀA`
/// (3×3) is singular.
fn rank2_gram() -> Array2<f64> {
    let a = array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [7.0, 8.0, 9.0]];
    a.t().dot(&a)
}

#[test]
fn rank_deficient_gram_rejected_without_ridge() {
    match cholesky(rank2_gram().view(), 0.0) {
        Err(Error::NotPositiveDefinite { pivot, value }) => {
            assert_eq!(pivot, 2, "the third pivot is the dependent one");
            assert!(value.abs() < 1e-10, "pivot value {value:e} should be ~0");
        }
        other => panic!("expected NotPositiveDefinite, got {other:?}"),
    }
}

#[test]
fn rank_deficient_gram_solvable_with_ridge() {
    let ata = rank2_gram();
    let ridge = 1e-6;
    let f = cholesky(ata.view(), ridge).unwrap();
    let b = array![[1.0], [-2.0], [0.5]];
    let x = cholesky_solve(&f, b.view()).unwrap();
    let shifted = &ata + &(Array2::<f64>::eye(3) * ridge);
    let res = fro((shifted.dot(&x) - &b).view());
    let bound = 16.0 * EPS * 3.0 * fro(shifted.view()) * fro(x.view());
    assert!(res <= bound, "‖(AᵀA + 1e-6·I)·X − B‖ = {res:e} > {bound:e}");
    assert!(res / fro(b.view()) < 1e-6, "relative residual {:e}", res / fro(b.view()));
}

#[test]
fn indefinite_matrix_names_pivot_and_value() {
    // Leading 1×1 block is PD, the 2×2 Schur complement 1 − 4/1 = −3 is not.
    let a = array![[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
    match cholesky(a.view(), 0.0) {
        Err(Error::NotPositiveDefinite { pivot, value }) => {
            assert_eq!(pivot, 1);
            assert!((value + 3.0).abs() < 1e-12, "value {value}");
        }
        other => panic!("expected NotPositiveDefinite, got {other:?}"),
    }
    // The first pivot itself negative.
    let a = array![[-1.0, 0.0], [0.0, 1.0]];
    assert!(matches!(cholesky(a.view(), 0.0), Err(Error::NotPositiveDefinite { pivot: 0, value }) if value == -1.0));
    // A big enough ridge makes it definite.
    assert!(cholesky(a.view(), 2.0).is_ok());
}

#[test]
fn indefinite_large_matrix_names_pivot() {
    // Past faer's unblocked threshold: SPD except one late pivot.
    let mut rng = StdRng::seed_from_u64(0x41);
    let n = 300;
    let mut a = random_spd(&mut rng, n);
    // Make row/column 250 a copy of row/column 10 → singular at pivot 250,
    // then push it negative.
    for j in 0..n {
        a[[250, j]] = a[[10, j]];
    }
    for i in 0..n {
        a[[i, 250]] = a[[i, 10]];
    }
    a[[250, 250]] = a[[10, 10]] - 1.0;
    match cholesky(a.view(), 0.0) {
        Err(Error::NotPositiveDefinite { pivot, value }) => {
            assert_eq!(pivot, 250);
            assert!((value + 1.0).abs() < 1e-9, "value {value}");
        }
        other => panic!("expected NotPositiveDefinite, got {other:?}"),
    }
}

// ---------------------------------------------------------------- error cases

#[test]
fn cholesky_rejects_bad_input() {
    let rect = Array2::<f64>::zeros((3, 4));
    assert!(matches!(cholesky(rect.view(), 0.0), Err(Error::Shape { .. })));

    let mut asym = random_spd(&mut StdRng::seed_from_u64(0x51), 6);
    asym[[4, 1]] += 1e-3;
    match cholesky(asym.view(), 0.0) {
        Err(Error::NotSymmetric { i, j, diff }) => {
            assert_eq!((i, j), (4, 1));
            assert!((diff - 1e-3).abs() < 1e-12);
        }
        other => panic!("expected NotSymmetric, got {other:?}"),
    }
    // Rounding-level asymmetry is accepted.
    let mut nearly = random_spd(&mut StdRng::seed_from_u64(0x52), 6);
    nearly[[4, 1]] *= 1.0 + 4.0 * EPS;
    assert!(cholesky(nearly.view(), 0.0).is_ok());

    let mut nan = Array2::<f64>::eye(3);
    nan[[1, 1]] = f64::NAN;
    assert!(matches!(cholesky(nan.view(), 0.0), Err(Error::NonFinite(_))));
    let mut inf = Array2::<f64>::eye(3);
    inf[[2, 0]] = f64::INFINITY;
    inf[[0, 2]] = f64::INFINITY;
    assert!(matches!(cholesky(inf.view(), 0.0), Err(Error::NonFinite(_))));

    let eye = Array2::<f64>::eye(3);
    assert!(matches!(cholesky(eye.view(), -1.0), Err(Error::Shape { .. })));
    assert!(matches!(cholesky(eye.view(), f64::NAN), Err(Error::NonFinite(_))));
    assert!(matches!(cholesky(eye.view(), f64::INFINITY), Err(Error::NonFinite(_))));
}

#[test]
fn solve_rejects_bad_rhs() {
    let f: CholeskyFactor = cholesky(Array2::<f64>::eye(4).view(), 0.0).unwrap();
    let b = Array2::<f64>::zeros((3, 2));
    assert!(matches!(cholesky_solve(&f, b.view()), Err(Error::Shape { .. })));
    let mut b = Array2::<f64>::zeros((4, 2));
    b[[0, 1]] = f64::NAN;
    assert!(matches!(cholesky_solve(&f, b.view()), Err(Error::NonFinite(_))));
}

#[test]
fn empty_matrix() {
    let a = Array2::<f64>::zeros((0, 0));
    let f = cholesky(a.view(), 0.0).unwrap();
    assert_eq!(f.n(), 0);
    assert_eq!(cholesky_solve(&f, Array2::<f64>::zeros((0, 2)).view()).unwrap().dim(), (0, 2));
    assert_eq!(cholesky_inverse(&f).unwrap().dim(), (0, 0));
}

// ---------------------------------------------------------------- ridge

#[test]
fn ridge_matches_normal_equations_well_conditioned() {
    let mut rng = StdRng::seed_from_u64(0x61);
    for &(n, d) in &[(1, 8), (16, 64), (64, 64), (40, 128)] {
        let k = randn_f32(&mut rng, n, d);
        let t = randn_f32(&mut rng, n, d);
        let lambda = 1e-2;
        let dw = ridge_decomposition_solve(k.view(), t.view(), lambda).unwrap();
        assert_eq!(dw.dim(), (d, d));
        let reference = ridge_via_normal_equations(k.view(), t.view(), lambda);
        let err = rel_diff32(dw.view(), reference.view());
        assert!(err < 1e-5, "N={n} d={d}: relative difference {err:e}");
    }
}

#[test]
fn ridge_rectangular_layer() {
    // d_in = 96 keys, d_out = 32 targets.
    let mut rng = StdRng::seed_from_u64(0x62);
    let (k, t) = (randn_f32(&mut rng, 12, 96), randn_f32(&mut rng, 12, 32));
    let dw = ridge_decomposition_solve(k.view(), t.view(), 1e-3).unwrap();
    assert_eq!(dw.dim(), (32, 96));
    let reference = ridge_via_svd(k.view(), t.view(), 1e-3);
    assert!(rel_diff32(dw.view(), reference.view()) < 1e-5);
}

/// Keys that share a dominant direction: `kᵢ = c + 1e-3·noise`.
fn shared_direction_keys(rng: &mut StdRng, n: usize, d: usize) -> Array2<f32> {
    let c = randn(rng, 1, d);
    let noise = randn(rng, n, d);
    to32(&Array2::from_shape_fn((n, d), |(i, j)| c[[0, j]] + 1e-3 * noise[[i, j]]))
}

#[test]
fn ridge_accurate_on_shared_direction_keys() {
    let mut rng = StdRng::seed_from_u64(0x63);
    let (n, d) = (8, 64);
    let k = shared_direction_keys(&mut rng, n, d);
    let t = randn_f32(&mut rng, n, d);
    let lambda = 1e-9;

    let (dw, report) = ridge_decomposition_solve_with_report(k.view(), t.view(), lambda).unwrap();
    let reference = ridge_via_svd(k.view(), t.view(), lambda);
    let err64 = rel_diff32(dw.view(), reference.view());
    assert!(err64 < 1e-5, "f64 path vs SVD: relative difference {err64:e}");
    assert_eq!(report.len(), n);
    assert!(report.min_cosine() > 0.999, "cosines {:?}", report.cosine);
    assert!(report.max_relative_residual() < 0.05, "residuals {:?}", report.relative_residual);

    // The same normal equations in f32 (faer's f32 Cholesky) lose the
    // key-separating part of K·Kᵀ: this is why the solve runs in f64.
    let kk = k.dot(&k.t());
    let mut g = faer::Mat::<f32>::from_fn(n, n, |i, j| kk[[i, j]]);
    for i in 0..n {
        g[(i, i)] += lambda as f32;
    }
    let err32 = match g.llt(faer::Side::Lower) {
        Err(_) => f64::INFINITY,
        Ok(llt) => {
            use faer::linalg::solvers::Solve;
            let mut x = faer::Mat::<f32>::from_fn(n, d, |i, j| k[[i, j]]);
            llt.solve_in_place(x.as_mut());
            let x = Array2::from_shape_fn((n, d), |(i, j)| x[(i, j)]);
            rel_diff32(t.t().dot(&x).view(), reference.view())
        }
    };
    eprintln!("shared-direction keys: relative error f64 path {err64:e}, f32 normal equations {err32:e}");
    assert!(err32 > 100.0 * err64, "f32 ({err32:e}) was expected to be far worse than f64 ({err64:e})");
}

#[test]
fn ridge_report_exact_fit() {
    let mut rng = StdRng::seed_from_u64(0x64);
    let (k, t) = (randn_f32(&mut rng, 8, 64), randn_f32(&mut rng, 8, 64));
    let (dw, report) = ridge_decomposition_solve_with_report(k.view(), t.view(), 0.0).unwrap();
    for (i, (&c, &r)) in report.cosine.iter().zip(&report.relative_residual).enumerate() {
        assert!(c > 1.0 - 1e-10, "fact {i}: cosine {c}");
        assert!(r < 1e-5, "fact {i}: residual {r:e}");
    }
    // Independent check of one fact with ndarray.
    let y = dw.dot(&k.row(3));
    let diff: f32 = (&y - &t.row(3)).iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!(diff < 1e-4 * t.row(3).dot(&t.row(3)).sqrt());
    // The plain form returns the same ΔW.
    assert_eq!(ridge_decomposition_solve(k.view(), t.view(), 0.0).unwrap(), dw);
}

#[test]
fn ridge_large_lambda_shrinks() {
    let mut rng = StdRng::seed_from_u64(0x65);
    let (k, t) = (randn_f32(&mut rng, 4, 16), randn_f32(&mut rng, 4, 16));
    let small = ridge_decomposition_solve(k.view(), t.view(), 1e-3).unwrap();
    let big = ridge_decomposition_solve(k.view(), t.view(), 1e6).unwrap();
    assert!(fro32(big.view()) < 1e-3 * fro32(small.view()));
}

#[test]
fn ridge_rejects_bad_input() {
    let k = Array2::<f32>::ones((4, 8));
    let t = Array2::<f32>::ones((3, 8));
    assert!(matches!(ridge_decomposition_solve(k.view(), t.view(), 1.0), Err(Error::Shape { .. })));
    let t = Array2::<f32>::ones((4, 8));
    assert!(matches!(ridge_decomposition_solve(k.view(), t.view(), -1.0), Err(Error::Shape { .. })));
    assert!(matches!(ridge_decomposition_solve(k.view(), t.view(), f64::NAN), Err(Error::NonFinite(_))));
    let mut bad = k.clone();
    bad[[2, 3]] = f32::NAN;
    assert!(matches!(ridge_decomposition_solve(bad.view(), t.view(), 1.0), Err(Error::NonFinite(_))));
    assert!(matches!(ridge_decomposition_solve(k.view(), bad.view(), 1.0), Err(Error::NonFinite(_))));
    // Four identical keys, no ridge: K·Kᵀ has rank 1, the second key depends on the first.
    match ridge_decomposition_solve(k.view(), t.view(), 0.0) {
        Err(Error::NotPositiveDefinite { pivot, .. }) => assert_eq!(pivot, 1),
        other => panic!("expected NotPositiveDefinite, got {other:?}"),
    }
    // More facts than features, no ridge.
    let mut rng = StdRng::seed_from_u64(0x66);
    let (k, t) = (randn_f32(&mut rng, 10, 4), randn_f32(&mut rng, 10, 4));
    assert!(matches!(ridge_decomposition_solve(k.view(), t.view(), 0.0), Err(Error::NotPositiveDefinite { .. })));
    assert!(ridge_decomposition_solve(k.view(), t.view(), 1e-2).is_ok());
}

#[test]
fn ridge_no_facts() {
    let k = Array2::<f32>::zeros((0, 8));
    let t = Array2::<f32>::zeros((0, 5));
    let (dw, report) = ridge_decomposition_solve_with_report(k.view(), t.view(), 0.0).unwrap();
    assert_eq!(dw, Array2::<f32>::zeros((5, 8)));
    assert!(report.is_empty());
}
