//! Quantized mat-vec throughput (GB/s of weight bytes read) per weight type
//! and shape, with 1 and 2 threads, next to the machine's measured read
//! bandwidth for a working set of the same size.
//!
//! Each case calls `ComputeBackend::matvec` of a `CpuBackend` built with
//! `Kernels::detect()` (so `INFER_CPU_SIMD=avx2` or `=scalar` selects
//! another level), which quantizes the activation and runs the row dots on
//! the backend's thread pool: the whole cost of one decode-time mat-vec.
//!
//! Run: `cargo bench -p infer-compute --bench matvec` (criterion filters
//! work: `-- q4_K`). A best-of-N summary with the bandwidth of each
//! working set is printed first (`MATVEC_NO_SUMMARY=1` skips it,
//! `MATVEC_TYPES=q4_K,q8_0` restricts it; `MATVEC_HOT=1` adds every
//! level's single-thread kernel speed on a cache-resident matrix).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use infer_compute::cpu::kernels::{quantize_activation, AlignedBytes};
use infer_compute::cpu::packed::{self, PackedActs, PackedWeight};
use infer_compute::cpu::{simd, CpuBackend, Kernels, Precision, SimdLevel};
use infer_compute::{quant, ComputeBackend, GgmlType};
use infer_compute::{QuantWeight, WeightBytes};

/// Weight types benchmarked (the default model's types first).
const TYPES: [GgmlType; 6] =
    [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q4_0, GgmlType::F32];

/// `(rows, cols)`: square layers and Gemma 3 270M's output matrix (640
/// columns; the k-quants, whose rows are whole 256-value super-blocks, use
/// 768 instead: the same DRAM-resident regime).
const SHAPES: [(usize, usize); 3] = [(2048, 2048), (4096, 4096), (262144, 640)];

/// The shape actually used for `ty` (see [`SHAPES`]).
fn shape_for(ty: GgmlType, (rows, cols): (usize, usize)) -> (usize, usize) {
    (rows, cols.next_multiple_of(ty.block_size()))
}

const THREADS: [usize; 2] = [1, 2];

/// Deterministic pseudo-random f32 in `[-1, 1)` (xorshift).
fn noise(seed: &mut u64) -> f32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// A `rows × cols` weight of type `ty`: 61 distinct quantized random rows,
/// repeated (quantizing 10⁸ values with the reference quantizers would
/// dominate the run; the bytes streamed are the same).
fn weight(ty: GgmlType, rows: usize, cols: usize) -> QuantWeight {
    let rb = ty.row_bytes(cols).expect("whole blocks");
    let distinct = rows.min(61);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ ty.id() as u64;
    let mut pool = vec![0u8; distinct * rb];
    for row in pool.chunks_exact_mut(rb) {
        let x: Vec<f32> = (0..cols).map(|_| noise(&mut seed)).collect();
        quant::quantize_row(ty, &x, row).expect("quantize");
    }
    let mut data = Vec::with_capacity(rows * rb);
    for r in 0..rows {
        let p = r % distinct;
        data.extend_from_slice(&pool[p * rb..(p + 1) * rb]);
    }
    QuantWeight::new(ty, rows, cols, WeightBytes::from(data)).expect("shape")
}

/// Sum of an f32 slice with independent accumulators (vectorizes; the
/// loads are the cost).
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    let chunks = x.chunks_exact(32);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Read bandwidth in GB/s of summing `data` with `threads` threads (each
/// its own contiguous part), best of `passes`.
fn read_bandwidth_of(data: &[f32], threads: usize, passes: usize) -> f64 {
    let part = data.len().div_ceil(threads);
    let mut best = f64::MAX;
    for _ in 0..passes {
        let t = Instant::now();
        let s: f32 = std::thread::scope(|sc| {
            let hs: Vec<_> = data.chunks(part).map(|c| sc.spawn(move || sum(c))).collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        });
        std::hint::black_box(s);
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::mem::size_of_val(data) as f64 / best / 1e9
}

/// An f32 array of `bytes` bytes for [`read_bandwidth_of`].
fn bandwidth_array(bytes: usize) -> Vec<f32> {
    (0..bytes / 4).map(|i| (i % 13) as f32).collect()
}

/// Passes of a bandwidth or mat-vec measurement over `bytes`: about 1.5 GB
/// read, at least 3.
fn passes_for(bytes: usize) -> usize {
    (1_500_000_000 / bytes.max(1)).clamp(3, 300)
}

/// Seconds of the fastest of `reps` calls of `f` (the least disturbed by
/// other processes).
fn best_time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// The system load average over the last minute (Linux), for the record:
/// other processes on a small machine disturb every number.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// Prints the read bandwidth of the machine and a summary of every case
/// next to the read bandwidth of an f32 array of the same size, measured in
/// alternation with it (three rounds, best of each), so that both see the
/// same disturbances. Criterion's statistics follow.
fn print_summary(backends: &[(usize, CpuBackend)]) {
    println!("kernels: {}, load average {}", Kernels::detect().level().name(), load_average());
    let big = bandwidth_array(1 << 30);
    let gib: Vec<String> =
        THREADS.iter().map(|&t| format!("{t} thread(s) {:.1} GB/s", read_bandwidth_of(&big, t, 5))).collect();
    drop(big);
    println!("read bandwidth, 1 GiB f32 array: {}", gib.join(", "));
    println!("{:<8} {:>12} {:>9} {:>3} {:>9} {:>9} {:>6}", "type", "shape", "MB", "thr", "GB/s", "bw GB/s", "%bw");
    let only = std::env::var("MATVEC_TYPES").unwrap_or_default();
    for ty in TYPES {
        if !only.is_empty() && !only.split(',').any(|t| t == ty.name()) {
            continue;
        }
        for shape in SHAPES {
            let (rows, cols) = shape_for(ty, shape);
            if ty == GgmlType::F32 && rows * cols > 4096 * 4096 {
                continue;
            }
            let w = weight(ty, rows, cols);
            let bytes = w.data.as_bytes().len();
            let mut seed = 7u64;
            let x: Vec<f32> = (0..cols).map(|_| noise(&mut seed)).collect();
            let mut y = vec![0f32; rows];
            let array = bandwidth_array(bytes);
            let passes = passes_for(bytes).div_ceil(3);
            for (threads, backend) in backends {
                let (mut t, mut bw) = (f64::MAX, 0f64);
                for _ in 0..3 {
                    t = t.min(best_time(passes, || backend.matvec(&w, &x, &mut y).expect("matvec")));
                    bw = bw.max(read_bandwidth_of(&array, *threads, passes));
                }
                let gbs = bytes as f64 / t / 1e9;
                println!(
                    "{:<8} {:>12} {:>9.1} {:>3} {:>9.1} {:>9.1} {:>5.0}%",
                    ty.name(),
                    format!("{rows}x{cols}"),
                    bytes as f64 / 1e6,
                    threads,
                    gbs,
                    bw,
                    100.0 * gbs / bw
                );
            }
            let k = Kernels::detect();
            if packed::supported(&k, ty) {
                // The packed layout of the same matrix (what a prepared
                // model's layers use), activation quantization included.
                let pw = PackedWeight::new(&w).expect("pack");
                let (mut a, mut tmp) = (PackedActs::default(), AlignedBytes::default());
                for (threads, backend) in backends {
                    let mut t = f64::MAX;
                    for _ in 0..3 {
                        t = t.min(backend.install(|| {
                            best_time(passes, || {
                                a.quantize(&k, ty, &x, 1, cols, &mut tmp).expect("quantize");
                                packed::matmul(&k, &pw, &a, &mut y).expect("packed")
                            })
                        }));
                    }
                    let gbs = pw.bytes() as f64 / t / 1e9;
                    println!(
                        "{:<8} {:>12} {:>9.1} {:>3} {:>9.1}   (packed)",
                        ty.name(),
                        format!("{rows}x{cols}"),
                        pw.bytes() as f64 / 1e6,
                        threads,
                        gbs
                    );
                }
            }
        }
    }
    println!("load average after the summary: {}", load_average());
}

/// Single-thread speed of each level's row-dot kernels on a cache-resident
/// 512x2048 matrix (`MATVEC_HOT=1`): the kernels' compute rate without the
/// memory system, thread pool or activation quantization.
fn print_hot() {
    let types = [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q5_K,
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
    ];
    let (rows, cols) = (512, 2048);
    println!("cache-resident {rows}x{cols}, one thread, GB/s of weights (best of 300):");
    for ty in types {
        let w = weight(ty, rows, cols);
        let rb = w.row_bytes();
        let mut seed = 3u64;
        let x: Vec<f32> = (0..cols).map(|_| noise(&mut seed)).collect();
        let mut act = AlignedBytes::default();
        quantize_activation(ty, &x, &mut act).expect("quantize");
        let mut line = format!("{:<7}", ty.name());
        for level in SimdLevel::all_available() {
            let dot = Kernels::for_level(level).dot(ty);
            let data = w.data.as_bytes();
            let t = best_time(300, || {
                let mut s = 0f32;
                for r in 0..rows {
                    s += dot(&data[r * rb..(r + 1) * rb], act.as_bytes());
                }
                std::hint::black_box(s);
            });
            line += &format!("  {} {:6.1}", level.name(), data.len() as f64 / t / 1e9);
        }
        let k = Kernels::detect();
        if packed::supported(&k, ty) {
            // The packed product of the same matrix, on one thread.
            let pw = PackedWeight::new(&w).expect("pack");
            let mut a = PackedActs::default();
            a.quantize(&k, ty, &x, 1, cols, &mut act).expect("quantize");
            let mut y = vec![0f32; rows];
            let one = CpuBackend::with_options(1, k, Precision::Quantized).expect("thread pool");
            let t = one.install(|| best_time(300, || packed::matmul(&k, &pw, &a, &mut y).expect("packed")));
            line += &format!("  packed {:6.1}", pw.bytes() as f64 / t / 1e9);
            // Prefill: 64 tokens against the same cached matrix, in
            // integer multiply-adds per second (GMAC/s).
            let n = 64;
            let xs: Vec<f32> = (0..n * cols).map(|_| noise(&mut seed)).collect();
            a.quantize(&k, ty, &xs, n, cols, &mut act).expect("quantize");
            let mut ys = vec![0f32; n * rows];
            let t = one.install(|| best_time(50, || packed::matmul(&k, &pw, &a, &mut ys).expect("packed")));
            line += &format!("  prefill {:6.1} GMAC/s", (n * rows * cols) as f64 / t / 1e9);
        }
        println!("{line}");
    }
}

fn bench_matvec(c: &mut Criterion) {
    if std::env::var_os("MATVEC_HOT").is_some() {
        print_hot();
    }
    let backends: Vec<(usize, CpuBackend)> = THREADS
        .iter()
        .map(|&t| (t, CpuBackend::with_options(t, Kernels::detect(), Precision::Quantized).expect("thread pool")))
        .collect();
    if std::env::var_os("MATVEC_NO_SUMMARY").is_none() {
        print_summary(&backends);
    }
    for ty in TYPES {
        let mut group = c.benchmark_group(format!("matvec/{}", ty.name()));
        group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
        for shape in SHAPES {
            let (rows, cols) = shape_for(ty, shape);
            if ty == GgmlType::F32 && rows * cols > 4096 * 4096 {
                continue; // 671 MB: the DRAM case is covered by the quantized types
            }
            let w = weight(ty, rows, cols);
            let mut seed = 7u64;
            let x: Vec<f32> = (0..cols).map(|_| noise(&mut seed)).collect();
            let mut y = vec![0f32; rows];
            group.throughput(Throughput::Bytes(w.data.as_bytes().len() as u64));
            for (threads, backend) in &backends {
                group.bench_function(format!("{rows}x{cols}/{threads}t"), |b| {
                    b.iter(|| backend.matvec(&w, &x, &mut y).expect("matvec"))
                });
            }
        }
        group.finish();
    }
}

/// The activation quantization that precedes every mat-vec (one vector of
/// the model's widths): the reference quantizer (what `matvec` calls) and
/// the SIMD one of `cpu::simd::quantize_activation_row`.
fn bench_quantize_activation(c: &mut Criterion) {
    let mut group = c.benchmark_group("quantize_activation");
    group.sample_size(20).warm_up_time(Duration::from_millis(200)).measurement_time(Duration::from_secs(1));
    let kernels = Kernels::detect();
    for (weight_ty, n) in [(GgmlType::Q8_0, 640), (GgmlType::Q8_0, 2048), (GgmlType::Q4_K, 768), (GgmlType::Q4_K, 2048)]
    {
        let mut seed = 11u64;
        let x: Vec<f32> = (0..n).map(|_| noise(&mut seed)).collect();
        let mut out = AlignedBytes::default();
        let Some(act) = weight_ty.vec_dot_type() else { continue };
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(format!("{}/{n}/reference", act.name()), |b| {
            b.iter(|| quantize_activation(weight_ty, &x, &mut out).expect("quantize"))
        });
        out.resize(act.row_bytes(n).expect("whole blocks"));
        if simd::quantize_activation_row(kernels.level(), act, &x, out.as_bytes_mut()) {
            group.bench_function(format!("{}/{n}/{}", act.name(), kernels.level().name()), |b| {
                b.iter(|| simd::quantize_activation_row(kernels.level(), act, &x, out.as_bytes_mut()))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_matvec, bench_quantize_activation);
criterion_main!(benches);
