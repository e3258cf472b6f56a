//! Dequantization throughput of every GGUF block format that has a
//! dequantizer: a 4096 × 4096-value tensor (one large weight matrix),
//! dequantized row by row to f32 with the scalar reference
//! `quant::dequantize_row`. Throughput is reported in bytes of quantized
//! input per second.
//!
//! `cargo bench -p infer-compute --bench dequant [-- FILTER]`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use infer_compute::{quant, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

const ROWS: usize = 4096;
const COLS: usize = 4096;

/// A zeroed byte buffer with 8-byte alignment (block structs need up to 4).
fn aligned_bytes(len: usize) -> (Vec<u64>, usize) {
    (vec![0u64; len.div_ceil(8)], len)
}

fn quantize_tensor(ty: GgmlType, x: &[f32]) -> Result<(Vec<u64>, usize), String> {
    let row_bytes = ty.row_bytes(COLS).map_err(|e| e.to_string())?;
    let (mut words, len) = aligned_bytes(row_bytes * ROWS);
    let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..len];
    for (row, out) in x.chunks_exact(COLS).zip(bytes.chunks_exact_mut(row_bytes)) {
        quant::quantize_row(ty, row, out).map_err(|e| e.to_string())?;
    }
    Ok((words, len))
}

fn bench_dequant(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let x: Vec<f32> = (0..ROWS * COLS).map(|_| rng.sample::<f32, _>(StandardNormal)).collect();
    let mut y = vec![0f32; ROWS * COLS];

    let mut group = c.benchmark_group("dequantize_4096x4096");
    group.sample_size(10);
    for ty in GgmlType::ALL {
        // F32 has nothing to dequantize; Q8_1 is an activation format that
        // ggml never dequantizes.
        if matches!(ty, GgmlType::F32 | GgmlType::Q8_1) {
            continue;
        }
        // A format still being written may panic; skip it rather than the
        // whole run.
        let quantized = std::panic::catch_unwind(|| quantize_tensor(ty, &x));
        let (words, len) = match quantized {
            Ok(Ok(q)) => q,
            Ok(Err(e)) => {
                eprintln!("skipping {ty}: {e}");
                continue;
            }
            Err(_) => {
                eprintln!("skipping {ty}: quantization panicked");
                continue;
            }
        };
        let q = &bytemuck::cast_slice::<u64, u8>(&words)[..len];
        let row_bytes = len / ROWS;
        if std::panic::catch_unwind(|| {
            let mut probe = vec![0f32; COLS];
            quant::dequantize_row(ty, &q[..row_bytes], &mut probe)
        })
        .is_err()
        {
            eprintln!("skipping {ty}: dequantization panicked");
            continue;
        }
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function(ty.name(), |b| {
            b.iter(|| {
                for (qr, yr) in q.chunks_exact(row_bytes).zip(y.chunks_exact_mut(COLS)) {
                    quant::dequantize_row(ty, black_box(qr), yr).expect("dequantize_row");
                }
                black_box(&mut y);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_dequant);
criterion_main!(benches);
