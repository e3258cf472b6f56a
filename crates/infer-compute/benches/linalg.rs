//! Benchmarks of `infer_compute::linalg` at n = 64, 256, 1024.
//!
//! Throughput is declared as `Throughput::Elements(flop count)`, so the
//! "elem/s" criterion prints is **flop/s** (read "Gelem/s" as GFLOP/s).
//! Flop counts (one flop per multiply and per add, Golub & Van Loan):
//! * `cholesky`         — `n³/3`
//! * `cholesky_solve`   — `2·n²·m`, with `m = n` right-hand sides
//! * `cholesky_inverse` — `2n³/3` (from an existing factor)
//! * `ridge`            — `4·N²·d + N³/3 + 2·N·d²`, `N` facts, `d = 1024`
//!   (Gram GEMM, Cholesky, solve, `Tᵀ·X` product)
//!
//! Inputs and conversions to and from faer are part of what is timed,
//! as callers pay them.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use infer_compute::linalg::{cholesky, cholesky_inverse, cholesky_solve, ridge_decomposition_solve};
use ndarray::Array2;
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use std::time::Duration;

const SIZES: [usize; 3] = [64, 256, 1024];
const RIDGE_D: usize = 1024;

fn randn(rng: &mut StdRng, r: usize, c: usize) -> Array2<f64> {
    Array2::from_shape_fn((r, c), |_| StandardNormal.sample(rng))
}

/// `G·Gᵀ/n + I`, made bitwise symmetric.
fn random_spd(rng: &mut StdRng, n: usize) -> Array2<f64> {
    let g = randn(rng, n, n);
    let a = g.dot(&g.t()) / n as f64 + Array2::<f64>::eye(n);
    (&a + &a.t()) / 2.0
}

fn bench_linalg(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(7);
    let mut group = c.benchmark_group("linalg");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));

    for &n in &SIZES {
        let nf = n as f64;
        let a = random_spd(&mut rng, n);
        let b = randn(&mut rng, n, n);
        let factor = cholesky(a.view(), 0.0).unwrap();

        group.throughput(Throughput::Elements((nf * nf * nf / 3.0) as u64));
        group.bench_with_input(BenchmarkId::new("cholesky", n), &a, |bch, a| {
            bch.iter(|| cholesky(black_box(a.view()), 0.0).unwrap())
        });

        group.throughput(Throughput::Elements((2.0 * nf * nf * nf) as u64));
        group.bench_with_input(BenchmarkId::new("cholesky_solve", n), &b, |bch, b| {
            bch.iter(|| cholesky_solve(&factor, black_box(b.view())).unwrap())
        });

        group.throughput(Throughput::Elements((2.0 * nf * nf * nf / 3.0) as u64));
        group.bench_function(BenchmarkId::new("cholesky_inverse", n), |bch| {
            bch.iter(|| cholesky_inverse(black_box(&factor)).unwrap())
        });

        let d = RIDGE_D as f64;
        let k = randn(&mut rng, n, RIDGE_D).mapv(|x| x as f32);
        let t = randn(&mut rng, n, RIDGE_D).mapv(|x| x as f32);
        let flops = 4.0 * nf * nf * d + nf * nf * nf / 3.0 + 2.0 * nf * d * d;
        group.throughput(Throughput::Elements(flops as u64));
        group.bench_function(BenchmarkId::new(format!("ridge_d{RIDGE_D}"), n), |bch| {
            bch.iter(|| ridge_decomposition_solve(black_box(k.view()), black_box(t.view()), 1e-2).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench_linalg);
criterion_main!(benches);
