//! Decode speed of the CUDA backend on random Gemma-3-shaped models
//! (270M and 1B shapes, Q4_K_M-like weight types), with CUDA-graph replay
//! and with direct launches, plus a prefill timing.
//!
//! Reports tokens/s, the weight bytes one decode step reads, and the
//! fraction of a 4.3 TB/s bandwidth roofline (the H200's measured copy
//! bandwidth): `tok/s × bytes per token / 4.3e12`.
//!
//! `cargo run --release --features cuda -p infer-compute --example cuda_decode_bench [-- 270m|1b|all]`

#[cfg(feature = "cuda")]
fn main() {
    if let Err(e) = bench::run() {
        eprintln!("cuda_decode_bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("cuda_decode_bench needs --features cuda");
}

#[cfg(feature = "cuda")]
mod bench {
    use std::time::Instant;

    use half::f16;
    use infer_compute::cuda::{CudaBackend, CudaOptions};
    use infer_compute::pipeline::{Activation, FfnType, LayerSpec, ModelSpec, Norm, NormType, RopeSpec, RopeType};
    use infer_compute::{DeviceModel, QuantWeight, WeightBytes};
    use infer_compute::{GgmlType, Result};
    use rand::rngs::StdRng;
    use rand::{Rng, RngCore, SeedableRng};

    const PEAK: f64 = 4.3e12;

    struct Shape {
        name: &'static str,
        n_embd: usize,
        n_layer: usize,
        n_head: usize,
        n_kv: usize,
        hd: usize,
        n_ff: usize,
        vocab: usize,
    }

    const SHAPES: [Shape; 2] = [
        Shape {
            name: "gemma3-270m",
            n_embd: 640,
            n_layer: 18,
            n_head: 4,
            n_kv: 1,
            hd: 256,
            n_ff: 2048,
            vocab: 262_144,
        },
        Shape { name: "gemma3-1b", n_embd: 1152, n_layer: 26, n_head: 4, n_kv: 1, hd: 256, n_ff: 6912, vocab: 262_144 },
    ];

    fn weight(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> Result<QuantWeight> {
        let mut b = vec![0u8; ty.row_bytes(cols)? * rows];
        rng.fill_bytes(&mut b);
        let s = if ty.block_size() == 256 { 0.004 / 16.0 } else { 0.004 };
        for blk in b.chunks_exact_mut(ty.type_size()) {
            for &off in infer_compute::quant::f16_scale_offsets(ty) {
                blk[off..off + 2].copy_from_slice(&f16::from_f32(rng.gen_range(0.25 * s..s)).to_le_bytes());
            }
        }
        QuantWeight::new(ty, rows, cols, WeightBytes::from(b))
    }

    fn norm(n: usize) -> Result<Norm> {
        let v = vec![1.0f32; n];
        let w = QuantWeight::new(GgmlType::F32, 1, n, WeightBytes::from(bytemuck::cast_slice::<f32, u8>(&v).to_vec()))?;
        Ok(Norm { kind: NormType::RmsNorm, eps: 1e-6, weight: w, bias: None })
    }

    /// A type for a matrix of `cols` columns: k-quant when the width allows,
    /// else the 32-block fallback, as Q4_K_M files do.
    fn pick(cols: usize, k: GgmlType, fallback: GgmlType) -> GgmlType {
        if cols.is_multiple_of(256) {
            k
        } else {
            fallback
        }
    }

    fn model(s: &Shape) -> Result<ModelSpec> {
        let mut rng = StdRng::seed_from_u64(7);
        let e = s.n_embd;
        let mut layers = Vec::new();
        for i in 0..s.n_layer {
            let global = i % 6 == 5;
            layers.push(LayerSpec {
                n_head: s.n_head,
                n_head_kv: s.n_kv,
                head_dim: s.hd,
                rope: RopeSpec {
                    kind: RopeType::NeoX,
                    base: if global { 1_000_000.0 } else { 10_000.0 },
                    n_rot: s.hd,
                    freq_scale: 1.0,
                },
                sliding_window: (!global).then_some(512),
                attn_softcap: None,
                attn_scale: 1.0 / (s.hd as f32).sqrt(),
                attn_norm: norm(e)?,
                wq: weight(&mut rng, pick(e, GgmlType::Q4_K, GgmlType::Q5_0), s.n_head * s.hd, e)?,
                wk: weight(&mut rng, pick(e, GgmlType::Q4_K, GgmlType::Q5_0), s.n_kv * s.hd, e)?,
                wv: weight(&mut rng, pick(e, GgmlType::Q6_K, GgmlType::Q8_0), s.n_kv * s.hd, e)?,
                wo: weight(&mut rng, GgmlType::Q4_K, e, s.n_head * s.hd)?,
                bq: None,
                bk: None,
                bv: None,
                q_norm: Some(norm(s.hd)?),
                k_norm: Some(norm(s.hd)?),
                post_attn_norm: Some(norm(e)?),
                ffn_norm: norm(e)?,
                ffn: FfnType::Gated,
                activation: Activation::GeluTanh,
                ffn_gate: Some(weight(&mut rng, pick(e, GgmlType::Q4_K, GgmlType::Q5_0), s.n_ff, e)?),
                ffn_up: weight(&mut rng, pick(e, GgmlType::Q4_K, GgmlType::Q5_0), s.n_ff, e)?,
                ffn_down: weight(&mut rng, GgmlType::Q6_K, e, s.n_ff)?,
                post_ffn_norm: Some(norm(e)?),
            });
        }
        let embd = weight(&mut rng, pick(e, GgmlType::Q6_K, GgmlType::Q8_0), s.vocab, e)?;
        Ok(ModelSpec {
            arch: s.name.into(),
            n_embd: e,
            n_vocab: s.vocab,
            n_ctx_train: 32_768,
            output: embd.clone(),
            token_embd: embd,
            embd_scale: (e as f32).sqrt(),
            layers,
            output_norm: norm(e)?,
            final_logit_softcap: None,
        })
    }

    fn decode(m: &mut infer_compute::cuda::CudaModel, start: usize, n: usize, n_ctx: usize) -> Result<f64> {
        let mut kv = m.new_kv_cache(n_ctx)?;
        // Fill the cache up to `start` with a prefill (not timed).
        let toks: Vec<u32> = (0..start.max(1) as u32).map(|i| (i * 7919) % 262_144).collect();
        m.prefill(kv.as_mut(), &toks, 0)?;
        let mut pos = toks.len();
        // Warm-up: graph capture, and time for the clocks to rise.
        for _ in 0..64 {
            m.decode_token(kv.as_mut(), 42, pos)?;
            pos += 1;
        }
        let t = Instant::now();
        for _ in 0..n {
            m.decode_token(kv.as_mut(), (pos as u32 * 31) % 262_144, pos)?;
            pos += 1;
        }
        Ok(n as f64 / t.elapsed().as_secs_f64())
    }

    pub fn run() -> Result<()> {
        let which = std::env::args().nth(1).unwrap_or_else(|| "all".into());
        let cuda = CudaBackend::new(0)?;
        // The same device with GGUF rows everywhere (no repacking).
        let gguf_rows = CudaBackend::with_options(0, CudaOptions { repack: false, ..cuda.options().clone() })?;
        println!("{}", infer_compute::ComputeBackend::device_info(&cuda));
        println!(
            "| model | weights MB/token | context | graph tok/s | % of 4.3 TB/s | direct tok/s | prefill 512 tok/s |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- |");
        let mut notes = Vec::new();
        for s in SHAPES.iter().filter(|s| which == "all" || s.name.contains(&which)) {
            let spec = model(s)?;
            let mut m = cuda.prepare_cuda(&spec)?;
            let wb = m.weight_bytes_per_token() as f64;
            for start in [1usize, 1024] {
                let n_ctx = 4096;
                m.set_use_graph(true);
                let g = decode(&mut m, start, 256, n_ctx)?;
                // KV bytes read per token at this depth (f16 K and V, per
                // layer min(pos, window) positions).
                let kv_bytes: f64 = spec
                    .layers
                    .iter()
                    .map(|l| {
                        let p = start + 64 + 128;
                        let n = l.sliding_window.map_or(p, |w| p.min(w));
                        (n * l.n_head_kv * l.head_dim * 2 * 2) as f64
                    })
                    .sum();
                m.set_use_graph(false);
                let direct = decode(&mut m, start, 64, n_ctx)?;
                let pf = if start == 1 {
                    let mut kv = m.new_kv_cache(n_ctx)?;
                    let toks: Vec<u32> = (0..512u32).map(|i| (i * 7919) % 262_144).collect();
                    m.prefill(kv.as_mut(), &toks[..32], 0)?;
                    let mut kv = m.new_kv_cache(n_ctx)?;
                    let t = Instant::now();
                    m.prefill(kv.as_mut(), &toks, 0)?;
                    format!("{:.0}", 512.0 / t.elapsed().as_secs_f64())
                } else {
                    "-".into()
                };
                println!(
                    "| {} | {:.1} (+{:.1} KV) | {} | {:.0} | {:.1}% | {:.0} | {} |",
                    s.name,
                    wb / 1e6,
                    kv_bytes / 1e6,
                    start,
                    g,
                    100.0 * g * (wb + kv_bytes) / PEAK,
                    direct,
                    pf
                );
            }
            // Per-kernel times of 32 direct steps (synchronized launches).
            m.profile(true);
            decode(&mut m, 1, 32, 4096)?;
            let prof = m.profile(false);
            let total: f64 = prof.iter().map(|p| p.1).sum();
            let mut lines = vec![format!("{}: per-kernel time of a decode step (launches timed one by one, incl. launch latency), total {:.1} us/token", s.name, total * 1e6 / 96.0)];
            for (k, t, n) in prof.iter().take(12) {
                lines.push(format!(
                    "  {:<14} {:>8.1} us/token  {:>6.2} us/launch  {:>4.1}%",
                    k,
                    t * 1e6 / 96.0,
                    t * 1e6 / *n as f64,
                    100.0 * t / total
                ));
            }
            // Per-kernel times of one 512-token prefill (synchronized).
            {
                let mut kv = m.new_kv_cache(640)?;
                let toks: Vec<u32> = (0..512u32).map(|i| (i * 7919) % s.vocab as u32).collect();
                m.prefill(kv.as_mut(), &toks, 0)?;
                m.profile(true);
                let t = Instant::now();
                m.prefill(kv.as_mut(), &toks, 0)?;
                let wall = t.elapsed().as_secs_f64();
                let prof = m.profile(false);
                let total: f64 = prof.iter().map(|p| p.1).sum();
                lines.push(format!(
                    "{}: per-kernel time of a 512-token prefill (timed one by one), total {:.2} ms of {:.2} ms",
                    s.name,
                    total * 1e3,
                    wall * 1e3
                ));
                for (k, t, n) in prof.iter().take(12) {
                    lines.push(format!(
                        "  {:<18} {:>8.2} ms  {:>5} launches  {:>4.1}%",
                        k,
                        t * 1e3,
                        n,
                        100.0 * t / total
                    ));
                }
            }
            m.set_use_graph(true);
            drop(m);
            let mut m0 = gguf_rows.prepare_cuda(&spec)?;
            let g0 = decode(&mut m0, 1, 256, 4096)?;
            lines.push(format!(
                "{}: GGUF-layout mat-vecs (no repacking): {:.0} tok/s with graph at context 1",
                s.name, g0
            ));
            notes.push(lines.join("\n"));
        }
        println!();
        for n in notes {
            println!("{n}");
        }
        println!();
        let res: Vec<String> = cuda
            .kernel_resources()?
            .iter()
            .map(|(k, r, l)| format!("{k}: {r} regs{}", if *l > 0 { format!(", {l} B local") } else { String::new() }))
            .collect();
        println!("kernel registers: {}", res.join("; "));
        Ok(())
    }
}
