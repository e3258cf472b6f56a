//! f32 GEMM candidates side by side: our backend's `cpu::gemm::matmul`
//! (faer for 8+ rows, the `gemm` crate below), faer's matmul alone and
//! `matrixmultiply`, on square 512³ and 2048³
//! products and the skinny 1×4096×4096 shape of a decode step, with 1 and 2
//! threads where the library offers threading. Throughput is in FLOP
//! (2·m·n·k per product).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use faer::{Mat, Par};
use ndarray::Array2;

fn shapes() -> [(usize, usize, usize); 3] {
    [(512, 512, 512), (2048, 2048, 2048), (1, 4096, 4096)]
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemm_f32");
    g.sample_size(10);
    for (m, k, n) in shapes() {
        let a = Array2::from_shape_fn((m, k), |(i, j)| ((i * 31 + j * 7) % 13) as f32 * 0.1);
        let b = Array2::from_shape_fn((k, n), |(i, j)| ((i * 17 + j * 5) % 11) as f32 * 0.1);
        let id = format!("{m}x{k}x{n}");
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        for threads in [1usize, 2] {
            g.bench_with_input(BenchmarkId::new(format!("backend_t{threads}"), &id), &(), |bch, _| {
                bch.iter(|| infer_compute::cpu::gemm::matmul(a.view(), b.view(), threads).unwrap())
            });
            let fa = Mat::<f32>::from_fn(m, k, |i, j| a[[i, j]]);
            let fb = Mat::<f32>::from_fn(k, n, |i, j| b[[i, j]]);
            let par = if threads == 1 { Par::Seq } else { Par::rayon(threads) };
            g.bench_with_input(BenchmarkId::new(format!("faer_t{threads}"), &id), &(), |bch, _| {
                bch.iter(|| {
                    let mut c = Mat::<f32>::zeros(m, n);
                    faer::linalg::matmul::matmul(
                        c.as_mut(),
                        faer::Accum::Replace,
                        fa.as_ref(),
                        fb.as_ref(),
                        1.0f32,
                        par,
                    );
                    c
                })
            });
        }
        g.bench_with_input(BenchmarkId::new("matrixmultiply_t1", &id), &(), |bch, _| {
            bch.iter(|| {
                let mut c = vec![0f32; m * n];
                // SAFETY: a, b are contiguous row-major m×k and k×n arrays;
                // c holds m×n values; strides match those layouts.
                unsafe {
                    matrixmultiply::sgemm(
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        k as isize,
                        1,
                        b.as_ptr(),
                        n as isize,
                        1,
                        0.0,
                        c.as_mut_ptr(),
                        n as isize,
                        1,
                    );
                }
                c
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
