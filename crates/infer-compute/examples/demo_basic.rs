//! What infer-compute finds on this machine, and how fast its kernels are.
//!
//! 1. Backends: the default backend, whether the CUDA backend is compiled
//!    in, the CPU features seen at run time and the SIMD kernel levels
//!    available ([`SimdLevel::all_available`]).
//! 2. A dense f32 matrix product through [`ComputeBackend::matmul`]
//!    (GFLOP/s).
//! 3. A quantized mat-vec `y = W·x` of a 2048 × 4096 weight in each common
//!    GGUF type, on every available CPU kernel level (µs per call, GB/s of
//!    weight bytes read, and the largest difference from the scalar
//!    reference's result).
//!
//! Run: `cargo run --release --example demo_basic [-- THREADS]` (default:
//! all cores).

use std::time::{Duration, Instant};

use infer_compute::cpu::{CpuBackend, Kernels, Precision, SimdLevel};
use infer_compute::{default_backend, ComputeBackend, GgmlType, QuantWeight};
use ndarray::Array2;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Weight rows and columns of the mat-vec test.
const ROWS: usize = 2048;
const COLS: usize = 4096;

/// The weight types measured: every type with a CPU dot product that GGUF
/// models commonly use.
const TYPES: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Runs `f` at least 3 times and until about 0.3 s have passed (at most 50
/// times); returns the fastest run.
fn best_time(mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut best = Duration::MAX;
    let mut n = 0;
    while n < 3 || (start.elapsed() < Duration::from_millis(300) && n < 50) {
        let t0 = Instant::now();
        f();
        best = best.min(t0.elapsed());
        n += 1;
    }
    best
}

fn cpu_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$(if is_x86_feature_detected!($f) { v.push($f); })*};
        }
        probe!("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512bf16");
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$(if std::arch::is_aarch64_feature_detected!($f) { v.push($f); })*};
        }
        probe!("neon", "dotprod", "i8mm", "sve");
    }
    v
}

fn main() -> Result<(), infer_compute::Error> {
    let threads = match std::env::args().nth(1) {
        Some(t) => match t.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("error: the argument must be a thread count ≥ 1, got `{t}`");
                std::process::exit(2);
            }
        },
        None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    };

    println!("== backends ==");
    let default = default_backend();
    println!("default backend:   {} — {}", default.name(), default.device_info());
    println!(
        "CUDA backend:      {}",
        if cfg!(feature = "cuda") {
            "compiled in (feature `cuda`)"
        } else {
            "not compiled in (build with --features cuda)"
        }
    );
    println!("CPU architecture:  {}, {} core(s) available", std::env::consts::ARCH, threads);
    println!("CPU features:      {}", cpu_features().join(" "));
    let levels = SimdLevel::all_available();
    let names: Vec<&str> = levels.iter().map(|l| l.name()).collect();
    println!("SIMD levels:       {} (best first; INFER_CPU_SIMD=<level> picks one)", names.join(", "));
    println!("selected:          {}", Kernels::detect().level().name());

    println!();
    println!("== f32 matmul (ComputeBackend::matmul, {threads} thread(s)) ==");
    let cpu = CpuBackend::with_options(threads, Kernels::detect(), Precision::Quantized)?;
    let mut rng = StdRng::seed_from_u64(1);
    for (m, k, n) in [(512, 512, 512), (1024, 1024, 1024), (1, 4096, 4096)] {
        let a = Array2::from_shape_fn((m, k), |_| rng.gen_range(-1.0f32..1.0));
        let b = Array2::from_shape_fn((k, n), |_| rng.gen_range(-1.0f32..1.0));
        let mut result = Ok(());
        let t = best_time(|| {
            if let Err(e) = cpu.matmul(a.view(), b.view()) {
                result = Err(e);
            }
        });
        result?;
        let gflops = 2.0 * (m * k * n) as f64 / t.as_secs_f64() / 1e9;
        println!("  {m:>5} x {k:>5} · {k:>5} x {n:>5}: {:>9.1} µs, {gflops:>7.1} GFLOP/s", t.as_secs_f64() * 1e6);
    }

    println!();
    println!("== quantized mat-vec y = W·x, W {ROWS} x {COLS} ({threads} thread(s)) ==");
    println!("  weights: random values quantized with each type's reference quantizer; x: random, quantized to the");
    println!("  type's activation format inside each call, as the decode path does. max |Δ|: vs the scalar kernels.");
    println!();
    print!("| {:<7} | {:>10} |", "type", "W bytes");
    for l in &levels {
        print!(" {:>22} |", format!("{} µs (GB/s)", l.name()));
    }
    println!(" {:>9} |", "max |Δ|");
    print!("| {:-<7} | {:->9}: |", "", "");
    for _ in &levels {
        print!(" {:->21}: |", "");
    }
    println!(" {:->8}: |", "");

    let values: Vec<f32> = (0..ROWS * COLS).map(|_| rng.gen_range(-1.0f32..1.0) * 0.05).collect();
    let x: Vec<f32> = (0..COLS).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let backends: Vec<CpuBackend> = levels
        .iter()
        .map(|&l| CpuBackend::with_options(threads, Kernels::for_level(l), Precision::Quantized))
        .collect::<Result<_, _>>()?;
    for ty in TYPES {
        let row_bytes = ty.row_bytes(COLS)?;
        let mut bytes = vec![0u8; row_bytes * ROWS];
        // Quantize row by row (through an aligned scratch row).
        let mut scratch = vec![0u64; row_bytes.div_ceil(8)];
        for (r, dst) in bytes.chunks_exact_mut(row_bytes).enumerate() {
            let s = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut scratch)[..row_bytes];
            infer_compute::quant::quantize_row(ty, &values[r * COLS..(r + 1) * COLS], s)?;
            dst.copy_from_slice(s);
        }
        let w = QuantWeight::new(ty, ROWS, COLS, bytes.into())?;
        let mut outputs: Vec<Vec<f32>> = Vec::new();
        print!("| {:<7} | {:>10} |", ty.name(), format!("{:.2} MiB", (row_bytes * ROWS) as f64 / (1 << 20) as f64));
        for b in &backends {
            let mut y = vec![0f32; ROWS];
            let mut result = Ok(());
            let t = best_time(|| {
                if let Err(e) = b.matvec(&w, &x, &mut y) {
                    result = Err(e);
                }
            });
            result?;
            let gbps = (row_bytes * ROWS) as f64 / t.as_secs_f64() / 1e9;
            print!(" {:>22} |", format!("{:.1} ({gbps:.1})", t.as_secs_f64() * 1e6));
            outputs.push(y);
        }
        let scalar = outputs.last().cloned().unwrap_or_default();
        let max_diff =
            outputs.iter().flat_map(|y| y.iter().zip(&scalar).map(|(a, b)| (a - b).abs())).fold(0f32, f32::max);
        println!(" {max_diff:>9.2e} |");
    }
    Ok(())
}
