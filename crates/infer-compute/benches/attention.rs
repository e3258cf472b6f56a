//! The CPU's tiled attention (`cpu::ops::attn_tiled`) over an f16 cache, on
//! the shapes of the two real models: a 512-token prompt chunk at positions
//! 1536..2048 (the last chunk of a 2048-token prompt) and one decode token
//! at depth 4096, on a team of 1 and 2 threads. Throughput is in
//! multiply-adds: `2 · head_dim` per (query head, attended key), the
//! `Q·Kᵀ` and `P·V` runs (the exponentials and the f16 conversion are the
//! overhead this shows).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;
use infer_compute::cpu::kv_cache::KvData;
use infer_compute::cpu::ops::attention::AttnParams;
use infer_compute::cpu::ops::attn_tiled::attention_tiled_on;
use infer_compute::cpu::team::{Par, Team};

/// (name, n_head, n_head_kv, head_dim, window).
const SHAPES: [(&str, usize, usize, usize, Option<usize>); 3] =
    [("smollm2", 9, 3, 64, None), ("gemma3_global", 4, 1, 256, None), ("gemma3_local", 4, 1, 256, Some(512))];

/// Multiply-adds of `n_tok` tokens from `pos0`: each query head's keys,
/// causal and inside the window, times `2 · head_dim`.
fn fmas(p: &AttnParams, pos0: usize, n_tok: usize) -> u64 {
    (pos0..pos0 + n_tok).map(|i| (i + 1).min(p.window.unwrap_or(usize::MAX)) as u64).sum::<u64>()
        * (p.n_head * 2 * p.head_dim) as u64
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("attention_tiled_f16");
    g.sample_size(10);
    for (name, n_head, n_head_kv, head_dim, window) in SHAPES {
        let p =
            AttnParams { n_head, n_head_kv, head_dim, scale: 1.0 / (head_dim as f32).sqrt(), softcap: None, window };
        for (test, pos0, n_tok) in [("pp512_at_1536", 1536, 512), ("tg_at_4096", 4096, 1)] {
            let n_ctx = pos0 + n_tok;
            let kv_values = n_ctx * p.kv_dim();
            let k: Vec<f16> = (0..kv_values).map(|i| f16::from_f32(((i * 37 % 101) as f32 - 50.0) * 0.02)).collect();
            let v: Vec<f16> = (0..kv_values).map(|i| f16::from_f32(((i * 53 % 97) as f32 - 48.0) * 0.02)).collect();
            let q: Vec<f32> = (0..n_tok * p.q_dim()).map(|i| ((i * 29 % 89) as f32 - 44.0) * 0.03).collect();
            let mut out = vec![0.0f32; n_tok * p.q_dim()];
            g.throughput(Throughput::Elements(fmas(&p, pos0, n_tok)));
            for threads in [1usize, 2] {
                let team = Team::new(threads).expect("threads");
                let id = BenchmarkId::new(format!("{name}_t{threads}"), test);
                g.bench_with_input(id, &(), |b, _| {
                    b.iter(|| {
                        attention_tiled_on(
                            Par::Team(&team),
                            &q,
                            KvData::F16(&k),
                            KvData::F16(&v),
                            pos0,
                            n_tok,
                            &p,
                            &mut out,
                        )
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
