//! What only the CUDA backend has, against the CPU reference: every mat-vec
//! type on awkward shapes (NMSE ≤ 5e-4, ggml test-backend-ops' bound for
//! quantized mat-mul; max relative error reported), each pipeline op
//! against its CPU op, cuBLAS products, and on the conformance suite's
//! random models (whose logits against the CPU the suite checks) graph
//! replay equal to direct launches, the device argmax, errors instead of
//! panics and the kernel modules a model loads.
//!
//! Without a GPU every test is reported as ignored, with the reason (the
//! harness is libtest-mimic's, which can decide at run time), unless
//! `INFER_REQUIRE_CUDA=1`, which turns a missing device into a failure.
//! Built only with the `cuda` feature.

use std::sync::Arc;

use half::{bf16, f16};
use infer_compute::conformance::model::{random_model, tokens, Arch};
use infer_compute::cpu::{ops, CpuBackend};
use infer_compute::cuda::{CudaBackend, CudaOptions};
use infer_compute::pipeline::{RopeSpec, RopeType};
use infer_compute::{Batch, ComputeBackend, DeviceModel, Out, QuantWeight, WeightBytes};
use infer_compute::{Error, GgmlType, KvCacheType, KvTypes};
use ndarray::Array2;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

#[macro_use]
#[path = "support/cuda.rs"]
mod cuda_support;

// ---------------------------------------------------------------------------
// Random data.

fn rand_vec(rng: &mut StdRng, n: usize, amp: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-amp..amp)).collect()
}

/// A random `rows × cols` weight of type `ty`: random quant bits with
/// finite scales of magnitude about `scale` (k-quants: `scale / 16`, since
/// their sub-scales multiply it), or random floats for F32/F16/BF16.
fn rand_weight(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize, scale: f32) -> QuantWeight {
    let n = rows * cols;
    let bytes: Vec<u8> = match ty {
        GgmlType::F32 => rand_vec(rng, n, scale * 8.0).iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => rand_vec(rng, n, scale * 8.0).iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
        GgmlType::BF16 => rand_vec(rng, n, scale * 8.0).iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
        _ => {
            let size = ty.row_bytes(cols).unwrap() * rows;
            let mut b = vec![0u8; size];
            rng.fill_bytes(&mut b);
            let ts = ty.type_size();
            let s = if ty.block_size() == 256 { scale / 16.0 } else { scale };
            for blk in b.chunks_exact_mut(ts) {
                for &off in infer_compute::quant::f16_scale_offsets(ty) {
                    let v = f16::from_f32(rng.gen_range(0.25 * s..s));
                    blk[off..off + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            b
        }
    };
    QuantWeight::new(ty, rows, cols, WeightBytes::from(bytes)).unwrap()
}

// ---------------------------------------------------------------------------
// Error measures.

struct Cmp {
    nmse: f64,
    max_rel: f64,
}

/// NMSE = Σ(g - r)² / Σ r²; max relative error relative to max |r|.
fn compare(got: &[f32], want: &[f32]) -> Cmp {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den, mut max_abs, mut scale) = (0f64, 0f64, 0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = g as f64 - w as f64;
        num += d * d;
        den += (w as f64) * (w as f64);
        max_abs = max_abs.max(d.abs());
        scale = scale.max((w as f64).abs());
    }
    Cmp { nmse: if den > 0.0 { num / den } else { num }, max_rel: max_abs / scale.max(1e-30) }
}

#[track_caller]
fn assert_close(what: &str, got: &[f32], want: &[f32], rtol: f32, atol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (&g, &w))| !((g - w).abs() <= atol + rtol * w.abs()))
        .take(5)
        .map(|(i, (&g, &w))| format!("[{i}] got {g:e} want {w:e} abs {:.3e}", (g - w).abs()))
        .collect();
    assert!(bad.is_empty(), "{what}: n={} mismatches:\n{}", got.len(), bad.join("\n"));
}

// ---------------------------------------------------------------------------
// Mat-vec.

const MV_TYPES: [GgmlType; 14] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::BF16,
    GgmlType::IQ4_NL,
];

/// CPU scalar reference (ggml's generic dot with the quantized activation)
/// of `W·x`, the exact f64 product of the dequantized weights, and per row
/// a rigorous bound on the GPU's error against the exact product: the GPU
/// quantizes `x` per 32 values with step `d = amax / 127`, so each term
/// moves by at most `|w|·d/2`; float weights use `x` as it is. On top,
/// `1e-4·Σ|w·x|` covers f32 accumulation.
fn cpu_matvec(w: &QuantWeight, x: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f64>) {
    let deq = w.to_f32().unwrap();
    let quantized = w.ty.block_size() > 1;
    let steps: Vec<f64> = x
        .chunks(32)
        .map(|c| if quantized { c.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0 / 2.0 } else { 0.0 })
        .collect();
    let (mut reference, mut exact, mut bound) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..w.rows {
        reference.push(infer_compute::quant::vec_dot(w.ty, w.row(r), x).unwrap());
        let row = &deq[r * w.cols..(r + 1) * w.cols];
        exact.push(row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32);
        let q: f64 = row.iter().enumerate().map(|(k, &a)| a.abs() as f64 * steps[k / 32]).sum();
        let mag: f64 = row.iter().zip(x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
        bound.push(q * 1.001 + 1e-4 * mag + 1e-30);
    }
    (reference, exact, bound)
}

/// Checks `got` against the exact product within the rigorous bound.
#[track_caller]
fn check_bound(what: &str, got: &[f32], exact: &[f32], bound: &[f64]) {
    let bad: Vec<String> = got
        .iter()
        .zip(exact)
        .zip(bound)
        .enumerate()
        .filter(|(_, ((&g, &e), &b))| !((g as f64 - e as f64).abs() <= b))
        .take(5)
        .map(|(i, ((&g, &e), &b))| format!("[{i}] got {g:e} exact {e:e} bound {b:.3e}"))
        .collect();
    assert!(bad.is_empty(), "{what}: outside the activation-quantization bound:\n{}", bad.join("\n"));
}

fn matvec_every_type_matches_cpu_on_awkward_shapes() {
    let cuda = cuda_or_skip!();
    let mut rng = StdRng::seed_from_u64(1);
    let mut report = Vec::new();
    for ty in MV_TYPES {
        let bs = ty.block_size();
        let widths = if bs == 1 { [1usize, 7, 4096] } else { [bs, 7 * bs, 4096] };
        let (mut all_got, mut all_ref, mut all_exact) = (Vec::new(), Vec::new(), Vec::new());
        for rows in [1usize, 3, 17, 4099] {
            for cols in widths {
                let w = rand_weight(&mut rng, ty, rows, cols, 0.01);
                let x = rand_vec(&mut rng, cols, 1.0);
                let mut y = vec![f32::NAN; rows];
                cuda.matvec(&w, &x, &mut y).unwrap();
                let (reference, exact, bound) = cpu_matvec(&w, &x);
                assert!(y.iter().all(|v| v.is_finite()), "{ty} {rows}x{cols}: non-finite output");
                check_bound(&format!("{ty} {rows}x{cols}"), &y, &exact, &bound);
                all_got.extend_from_slice(&y);
                all_ref.extend_from_slice(&reference);
                all_exact.extend_from_slice(&exact);
            }
        }
        // ggml test-backend-ops' measure over the whole output of the type.
        let c = compare(&all_got, &all_ref);
        let ce = compare(&all_got, &all_exact);
        let cr = compare(&all_ref, &all_exact);
        assert!(c.nmse <= 5e-4, "{ty}: NMSE {:.3e} vs the CPU reference (max rel {:.3e})", c.nmse, c.max_rel);
        report.push(format!(
            "{:>7}: NMSE vs CPU {:.2e} (max rel {:.2e}); vs exact: GPU {:.2e}, CPU {:.2e}",
            ty.name(),
            c.nmse,
            c.max_rel,
            ce.nmse,
            cr.nmse
        ));
    }
    println!("cuda matvec vs CPU scalar reference (all shapes of a type together):\n{}", report.join("\n"));
}

fn matmul_quant_batches_match_cpu() {
    let cuda = cuda_or_skip!();
    // The same shapes with the tensor-core products from 2 tokens, in the
    // narrow tile (256 rows, 32 tokens) up to 32 tokens.
    let opts = CudaOptions { mmq_min_tokens: Some(2), mmq_narrow: true, ..CudaOptions::default() };
    let narrow = CudaBackend::with_options(0, opts).expect("a second CUDA backend");
    for (label, cuda) in [("default", &cuda), ("mmq from 2 tokens, narrow tile", &narrow)] {
        println!("{label}");
        matmul_quant_batches_on(cuda);
    }
}

fn matmul_quant_batches_on(cuda: &CudaBackend) {
    let mut rng = StdRng::seed_from_u64(2);
    for ty in MV_TYPES {
        let wide = if ty.block_size() == 1 { 100 } else { 2 * ty.block_size().max(128) };
        // 7 blocks: a row of an odd number of chunks.
        let narrow = if ty.block_size() == 1 { 7 } else { 7 * ty.block_size() };
        let (mut all_got, mut all_ref) = (Vec::new(), Vec::new());
        // 1 token: the one-token kernels; more: the 8-token kernels (one
        // row per warp below `CudaOptions::mv_rows_min_tokens`, 4 rows per
        // warp from it, the rows of a partial last warp at 17, 33, 130, 7,
        // 65, 3, 70 and 5), the last pass partial (5, 13, 70) or whole; 40
        // and 64 tokens run the `mmq` kernels below.
        let cases = [(17usize, 1usize, wide), (33, 5, wide), (130, 13, wide), (7, 40, wide), (65, 64, wide)];
        // Rows of 72 and 128 chunks: `tr` row groups split over 2 warps
        // (lanes of one and two chunks, of two and of four chunks).
        let (split2, split4) = (9 * ty.block_size().max(256), 16 * ty.block_size().max(256));
        // 24-64 tokens: the tensor-core `mmq` kernels (tiles of 128 rows, 64
        // tokens and 64 values; 24 and 40 tokens fill part of a token tile,
        // the narrow rows end in half a K step, and 200 rows of 128 chunks
        // split K over several blocks); 17 tokens, just below them.
        let more = [(3, 2, narrow), (70, 9, narrow), (5, 70, wide), (70, 13, split4), (33, 16, split2)];
        let mmq = [(70, 24, narrow), (200, 40, split4), (129, 17, wide)];
        // 32 768+ rows (a vocabulary): 4 rows per warp from 2 tokens, one
        // block of the row, a partial last group.
        let many = [(32769, 3, ty.block_size().max(32))];
        for (rows, n_tok, cols) in cases.into_iter().chain(more).chain(mmq).chain(many) {
            let w = rand_weight(&mut rng, ty, rows, cols, 0.01);
            let x = Array2::from_shape_vec((n_tok, cols), rand_vec(&mut rng, n_tok * cols, 1.0)).unwrap();
            let y = cuda.matmul_quant(&w, x.view()).unwrap();
            assert_eq!(y.dim(), (n_tok, rows));
            for t in 0..n_tok {
                let (reference, exact, bound) = cpu_matvec(&w, x.row(t).as_slice().unwrap());
                let got: Vec<f32> = y.row(t).to_vec();
                check_bound(&format!("{ty} {rows}x{cols} token {t}/{n_tok}"), &got, &exact, &bound);
                all_got.extend_from_slice(&got);
                all_ref.extend_from_slice(&reference);
            }
        }
        let c = compare(&all_got, &all_ref);
        assert!(c.nmse <= 5e-4, "{ty}: batched NMSE {:.3e} vs the CPU reference", c.nmse);
    }
}

fn activation_only_types_are_unsupported_not_panics() {
    let cuda = cuda_or_skip!();
    for ty in [GgmlType::Q8_K, GgmlType::Q8_1] {
        let bytes = vec![0u8; ty.row_bytes(256).unwrap() * 2];
        let w = QuantWeight::new(ty, 2, 256, WeightBytes::from(bytes)).unwrap();
        let mut y = vec![0f32; 2];
        match cuda.matvec(&w, &vec![0.5; 256], &mut y) {
            Err(Error::Unsupported { .. }) => {}
            other => panic!("{ty}: expected Unsupported, got {other:?}"),
        }
    }
    // Length mismatch is a shape error.
    let mut rng = StdRng::seed_from_u64(3);
    let w = rand_weight(&mut rng, GgmlType::Q8_0, 4, 64, 0.01);
    let mut y = vec![0f32; 4];
    assert!(matches!(cuda.matvec(&w, &[0.0; 32], &mut y), Err(Error::Shape { .. })));
}

fn dequantize_matches_cpu() {
    let cuda = cuda_or_skip!();
    let mut rng = StdRng::seed_from_u64(4);
    for ty in MV_TYPES {
        let cols = if ty.block_size() == 1 { 37 } else { 3 * ty.block_size() };
        let w = rand_weight(&mut rng, ty, 5, cols, 0.01);
        let got = cuda.dequantize(&w).unwrap();
        let want = w.to_f32().unwrap();
        assert_close(&format!("dequantize {ty}"), &got, &want, 1e-6, 1e-9);
    }
}

fn cublas_matmul_matches_cpu() {
    let cuda = cuda_or_skip!();
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(5);
    for (m, k, n) in [(1usize, 1usize, 1usize), (3, 5, 7), (64, 33, 17), (130, 257, 129)] {
        let a = Array2::from_shape_vec((m, k), rand_vec(&mut rng, m * k, 1.0)).unwrap();
        let b = Array2::from_shape_vec((k, n), rand_vec(&mut rng, k * n, 1.0)).unwrap();
        let bt = b.t().to_owned();
        let got = cuda.matmul(a.view(), b.view()).unwrap();
        let want = cpu.matmul(a.view(), b.view()).unwrap();
        assert_close("matmul", got.as_slice().unwrap(), want.as_slice().unwrap(), 1e-4, 1e-4);
        let got_t = cuda.matmul_transb(a.view(), bt.view()).unwrap();
        assert_close("matmul_transb", got_t.as_slice().unwrap(), want.as_slice().unwrap(), 1e-4, 1e-4);
        // A non-contiguous operand (transposed view).
        let got_v = cuda.matmul(a.view(), bt.t()).unwrap();
        assert_close("matmul view", got_v.as_slice().unwrap(), want.as_slice().unwrap(), 1e-4, 1e-4);
    }
    let a = Array2::<f32>::zeros((2, 3));
    let b = Array2::<f32>::zeros((4, 5));
    assert!(matches!(cuda.matmul(a.view(), b.view()), Err(Error::Shape { .. })));
}

// ---------------------------------------------------------------------------
// Pipeline ops.

fn norms_match_cpu() {
    let cuda = cuda_or_skip!();
    let mut rng = StdRng::seed_from_u64(6);
    for n in [1usize, 7, 640, 1000, 4099] {
        let rows = 3;
        let x = rand_vec(&mut rng, rows * n, 3.0);
        let w = rand_vec(&mut rng, n, 2.0);
        let b = rand_vec(&mut rng, n, 1.0);
        let add = rand_vec(&mut rng, rows * n, 2.0);
        let aw = rand_vec(&mut rng, n, 1.5);
        let eps = 1e-6;
        // RMSNorm.
        let (_, out) = cuda.residual_norm(&x, None, None, &w, None, false, eps).unwrap();
        let mut want = vec![0f32; rows * n];
        for r in 0..rows {
            ops::rms_norm(&x[r * n..(r + 1) * n], &w, eps, &mut want[r * n..(r + 1) * n]);
        }
        assert_close(&format!("rms_norm n={n}"), &out, &want, 1e-5, 1e-6);
        // LayerNorm with bias.
        let (_, out) = cuda.residual_norm(&x, None, None, &w, Some(&b), true, eps).unwrap();
        for r in 0..rows {
            ops::layer_norm(&x[r * n..(r + 1) * n], &w, Some(&b), eps, &mut want[r * n..(r + 1) * n]);
        }
        assert_close(&format!("layer_norm n={n}"), &out, &want, 1e-4, 1e-4);
        // Sandwich: x += rms_norm(add)·aw, then rms_norm(x).
        let (xn, out) = cuda.residual_norm(&x, Some(&add), Some((&aw, eps)), &w, None, false, eps).unwrap();
        let mut xr = x.clone();
        let mut tmp = vec![0f32; n];
        for r in 0..rows {
            ops::rms_norm(&add[r * n..(r + 1) * n], &aw, eps, &mut tmp);
            ops::add(&mut xr[r * n..(r + 1) * n], &tmp);
            ops::rms_norm(&xr[r * n..(r + 1) * n], &w, eps, &mut want[r * n..(r + 1) * n]);
        }
        assert_close(&format!("residual n={n}"), &xn, &xr, 1e-5, 1e-5);
        assert_close(&format!("add+rms_norm n={n}"), &out, &want, 1e-4, 1e-5);
    }
}

fn rope_matches_cpu() {
    let cuda = cuda_or_skip!();
    let mut rng = StdRng::seed_from_u64(7);
    for kind in [RopeType::NeoX, RopeType::Normal] {
        for (n_head, hd, n_rot, base) in
            [(4usize, 64usize, 64usize, 10_000f32), (2, 256, 256, 1_000_000.0), (3, 80, 32, 10_000.0)]
        {
            for pos0 in [0usize, 5, 1000, 4099] {
                let spec = RopeSpec { kind, base, n_rot, freq_scale: 1.0 };
                let n_tok = 3;
                let x = rand_vec(&mut rng, n_tok * n_head * hd, 2.0);
                let nw = rand_vec(&mut rng, hd, 1.5);
                for with_norm in [false, true] {
                    let got = cuda.rope(&x, n_head, hd, pos0, &spec, with_norm.then_some((&nw[..], 1e-6))).unwrap();
                    let mut want = x.clone();
                    for t in 0..n_tok {
                        let row = &mut want[t * n_head * hd..(t + 1) * n_head * hd];
                        if with_norm {
                            ops::rms_norm_heads(row, hd, &nw, 1e-6);
                        }
                        ops::rope(row, n_head, hd, pos0 + t, &spec);
                    }
                    // sin/cos of angles up to ~4100 rad: both sides are
                    // accurate to a few ulps of the angle.
                    assert_close(
                        &format!("rope {kind:?} hd={hd} n_rot={n_rot} pos={pos0} norm={with_norm}"),
                        &got,
                        &want,
                        1e-4,
                        2e-4,
                    );
                }
            }
        }
    }
}

fn attention_matches_cpu() {
    let cuda = cuda_or_skip!();
    let mut rng = StdRng::seed_from_u64(8);
    let shapes = [(4usize, 1usize, 64usize), (8, 2, 64), (6, 3, 80), (16, 2, 128), (20, 2, 64), (4, 1, 256)];
    let opts = [(None, None), (Some(50.0f32), None), (None, Some(5usize)), (Some(1.0), Some(200))];
    for (nh, nkv, hd) in shapes {
        for (cap, win) in opts {
            for pos in [0usize, 7, 200, 1000] {
                let n_ctx = pos + 3;
                let kvd = nkv * hd;
                // The device cache is f16: give the CPU the same rounded values.
                let round = |v: Vec<f32>| v.into_iter().map(|x| f16::from_f32(x).to_f32()).collect::<Vec<f32>>();
                let kc = round(rand_vec(&mut rng, n_ctx * kvd, 1.0));
                let vc = round(rand_vec(&mut rng, n_ctx * kvd, 1.0));
                let q = rand_vec(&mut rng, nh * hd, 1.0);
                let scale = 1.0 / (hd as f32).sqrt();
                let got = cuda.attention_decode(&q, &kc, &vc, pos, nh, nkv, hd, scale, cap, win).unwrap();
                let p = ops::AttnParams { n_head: nh, n_head_kv: nkv, head_dim: hd, scale, softcap: cap, window: win };
                let mut scratch = vec![0f32; nh * n_ctx];
                let mut want = vec![0f32; nh * hd];
                ops::attention_decode(&q, &kc, &vc, pos, &p, &mut scratch, &mut want);
                assert_close(
                    &format!("attention {nh}/{nkv}x{hd} cap={cap:?} win={win:?} pos={pos}"),
                    &got,
                    &want,
                    1e-4,
                    1e-5,
                );
            }
        }
    }
}

/// The rows a quantized KV cache stores on the device are the CPU's bits:
/// each head rotated by `H/√n` on the type's blocks
/// (`KvCacheType::hadamard_block`, same butterflies, same f32 arithmetic),
/// then ggml's reference quantization (`quant::quantize_row`), codes then
/// scales; f16 rows round to nearest even.
fn kv_cache_rows_match_cpu_quantization() {
    let cuda = cuda_or_skip!();
    let mut rng = StdRng::seed_from_u64(21);
    for (n_kv, hd) in [(2usize, 64usize), (1, 256), (3, 96), (4, 128)] {
        let kv_dim = n_kv * hd;
        let n_pos = 5;
        let k = rand_vec(&mut rng, n_pos * kv_dim, 3.0);
        let mut v = rand_vec(&mut rng, n_pos * kv_dim, 0.5);
        v[3] = 40.0; // an outlier, spread over its block by the rotation
        for (kt, vt) in [
            (KvCacheType::Q8_0, KvCacheType::Q4_0),
            (KvCacheType::Q4_0, KvCacheType::Q8_0),
            (KvCacheType::F16, KvCacheType::Q4_0),
        ] {
            let (kb, vb) = cuda.store_kv_rows(&k, &v, n_kv, hd, KvTypes { k: kt, v: vt }).unwrap();
            for (what, ty, x, got, keys) in [("K", kt, &k, &kb, true), ("V", vt, &v, &vb, false)] {
                let want = cpu_cache_rows(ty, x, n_kv, hd, keys);
                assert_eq!(got.len() % n_pos, 0);
                let row = got.len() / n_pos;
                for p in 0..n_pos {
                    assert_eq!(
                        &got[p * row..p * row + want[p].len()],
                        &want[p][..],
                        "{what} {ty} {n_kv}x{hd}: row {p} differs from the CPU's"
                    );
                }
            }
        }
    }
}

/// Rows of `ty` as the device stores them, computed on the CPU: codes,
/// then f16 scales (the padding left out); f16 values for F16.
fn cpu_cache_rows(ty: KvCacheType, x: &[f32], n_kv: usize, hd: usize, keys: bool) -> Vec<Vec<u8>> {
    let kv_dim = n_kv * hd;
    x.chunks_exact(kv_dim)
        .map(|row| {
            let Some(gt) = ty.ggml_type().filter(|t| *t != GgmlType::F16) else {
                return row.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
            };
            let mut r = row.to_vec();
            if let Some(n) = ty.hadamard_block(hd, keys) {
                for b in r.chunks_exact_mut(n) {
                    infer_compute::turboquant::rotation::fwht(b);
                    let s = 1.0 / (n as f32).sqrt();
                    b.iter_mut().for_each(|v| *v *= s);
                }
            }
            let mut q = vec![0u8; gt.row_bytes(kv_dim).unwrap()];
            infer_compute::quant::quantize_row(gt, &r, &mut q).unwrap();
            // ggml blocks: the f16 scale, then the codes.
            let (mut codes, mut scales) = (Vec::new(), Vec::new());
            for blk in q.chunks_exact(gt.type_size()) {
                scales.extend_from_slice(&blk[..2]);
                codes.extend_from_slice(&blk[2..]);
            }
            codes.extend(scales);
            codes
        })
        .collect()
}

fn glu_matches_cpu() {
    let cuda = cuda_or_skip!();
    let mut rng = StdRng::seed_from_u64(9);
    for n in [1usize, 7, 2048, 4099] {
        let g = rand_vec(&mut rng, n, 8.0);
        let u = rand_vec(&mut rng, n, 3.0);
        let mut want = vec![0f32; n];
        ops::geglu(&g, &u, &mut want);
        assert_close("geglu", &cuda.glu(&g, &u, true).unwrap(), &want, 1e-5, 1e-6);
        ops::swiglu(&g, &u, &mut want);
        assert_close("swiglu", &cuda.glu(&g, &u, false).unwrap(), &want, 1e-5, 1e-6);
    }
}

// ---------------------------------------------------------------------------
// Whole models: what only CUDA has (graphs, the device argmax, kernel
// modules). Their logits against the CPU are the conformance suite's
// (`model::*`, `batch::*`), on the suite's random models used here too.

fn graph_replay_equals_direct_launches() {
    let cuda = cuda_or_skip!();
    let spec = random_model(30, Arch::Gemma3);
    let toks = tokens(31, 20, spec.n_vocab);
    let mut m = cuda.prepare_cuda(&spec).unwrap();
    let run = |m: &mut infer_compute::cuda::CudaModel| -> Vec<Vec<f32>> {
        let mut kv = m.new_kv_cache(32).unwrap();
        toks.iter().enumerate().map(|(p, &t)| m.decode_token(kv.as_mut(), t, p).unwrap().to_vec()).collect()
    };
    m.set_use_graph(true);
    let with_graph = run(&mut m);
    // A second cache: the graph is captured again for it.
    let with_graph2 = run(&mut m);
    m.set_use_graph(false);
    let direct = run(&mut m);
    for (p, ((a, b), c)) in with_graph.iter().zip(&with_graph2).zip(&direct).enumerate() {
        assert_eq!(a, c, "pos {p}: graph replay differs from direct launches");
        assert_eq!(a, b, "pos {p}: replay on a second cache differs");
    }
}

/// A steady batch of decode steps of several sequences is captured once
/// and replayed (the positions change, the slots do not); its logits equal
/// direct launches bit for bit; another slot list is another graph, and
/// the first is found again after it.
fn batched_decode_graphs_replay_and_equal_direct_launches() {
    let cuda = cuda_or_skip!();
    let spec = random_model(33, Arch::LlamaBias);
    let mut m = cuda.prepare_cuda(&spec).unwrap();
    let n_slots = 5;
    let prompt = tokens(34, 6, spec.n_vocab);
    let run = |m: &mut infer_compute::cuda::CudaModel, graph: bool| -> (Vec<Vec<f32>>, usize) {
        m.set_use_graph(graph);
        let mut pool = m.new_kv_pool(n_slots, 32).unwrap();
        for slot in 0..n_slots {
            m.forward(pool.as_mut(), &Batch::seq(slot, 0, &prompt[..slot + 2], Out::Last)).unwrap();
        }
        let before = m.captures();
        let mut len: Vec<usize> = (0..n_slots).map(|slot| slot + 2).collect();
        let mut out = Vec::new();
        for step in 0..6 {
            // Steps 0-1 and 4-5 decode slots 0, 2, 3; steps 2-3 slots 1 and 4.
            let slots: &[usize] = if (2..4).contains(&step) { &[1, 4] } else { &[0, 2, 3] };
            let mut batch = Batch::new();
            for &slot in slots {
                batch.push(prompt[(slot + step) % prompt.len()], len[slot], slot, true);
                len[slot] += 1;
            }
            out.push(m.forward(pool.as_mut(), &batch).unwrap().to_vec());
        }
        (out, m.captures() - before)
    };
    let (direct, direct_captures) = run(&mut m, false);
    let (replayed, captures) = run(&mut m, true);
    assert_eq!(direct_captures, 0);
    assert_eq!(captures, 2, "one graph per slot list, reused across positions and after another list");
    for (step, (a, b)) in replayed.iter().zip(&direct).enumerate() {
        assert_eq!(a, b, "step {step}: graph replay differs from direct launches");
    }
}

/// The device argmax of `decode_greedy` picks the host argmax of the same
/// step's logits, through the graph and through direct launches.
fn greedy_decode_equals_host_argmax() {
    let cuda = cuda_or_skip!();
    let spec = random_model(32, Arch::Gemma3);
    let mut m = cuda.prepare_cuda(&spec).unwrap();
    for graph in [true, false] {
        m.set_use_graph(graph);
        let (mut kv, mut kv2) = (m.new_kv_cache(24).unwrap(), m.new_kv_cache(24).unwrap());
        let mut token = 1u32;
        for p in 0..24 {
            let want = infer_compute::greedy_token(m.decode_token(kv.as_mut(), token, p).unwrap()).unwrap();
            let got = m.decode_greedy(kv2.as_mut(), token, p).unwrap();
            assert_eq!(got, want, "graph {graph}, pos {p}");
            token = got;
        }
    }
}

fn errors_instead_of_panics() {
    let cuda = cuda_or_skip!();
    let spec = random_model(40, Arch::Gemma3);
    let mut m = cuda.prepare(&spec).unwrap();
    let mut kv = m.new_kv_cache(4).unwrap();
    for p in 0..4 {
        m.decode_token(kv.as_mut(), 1, p).unwrap();
    }
    assert!(matches!(m.decode_token(kv.as_mut(), 1, 4), Err(Error::ContextOverflow { .. })));
    let mut kv = m.new_kv_cache(4).unwrap();
    assert!(matches!(m.prefill(kv.as_mut(), &[1, 2, 3, 4, 5], 0), Err(Error::ContextOverflow { .. })));
    assert!(m.decode_token(kv.as_mut(), spec.n_vocab as u32, 0).is_err(), "token past the vocabulary");
    assert!(m.decode_token(kv.as_mut(), 1, 2).is_err(), "a gap in the cache");
    assert!(m.new_kv_cache(0).is_err());
    // A cache of another model (or backend) is refused.
    let cpu = CpuBackend::new();
    let cm = cpu.prepare(&spec).unwrap();
    let mut ckv = cm.new_kv_cache(4).unwrap();
    assert!(matches!(m.decode_token(ckv.as_mut(), 1, 0), Err(Error::ForeignKvCache)));
    // Still usable afterwards.
    let mut kv = m.new_kv_cache(4).unwrap();
    assert!(m.decode_token(kv.as_mut(), 1, 0).is_ok());
    let _ = Arc::new(());
}

fn device_info_names_the_device() {
    let cuda = cuda_or_skip!();
    let info = cuda.device_info();
    println!("{info}");
    assert!(info.contains("compute capability"));
    assert_eq!(cuda.name(), "cuda");
}

/// A model loads the product modules of its own weight layouts and no
/// others (a first run compiles only those).
fn a_model_loads_only_its_kernel_modules() {
    let cuda = cuda_or_skip!();
    assert_eq!(cuda.loaded_kernel_modules(), ["common"]);
    let _m = cuda.prepare(&random_model(7, Arch::Gemma3)).unwrap();
    // Q4_1, IQ4_NL, Q2_K, Q3_K and Q5_K in GGUF rows; Q4_0, Q4_K, Q5_0,
    // Q6_K and Q8_0 repacked; F16 in the common module.
    let want = ["common", "q4_1", "iq4_nl", "q2_k", "q3_k", "q5_k", "q8_0r", "q4_0r", "q5_0r", "q4_kr", "q6_kr"];
    assert_eq!(cuda.loaded_kernel_modules(), want);
}

/// Every kernel module compiles and loads, and defines the kernels the
/// backend looks up in it (a model loads only its weight types' modules,
/// so the suite's models would not reach every one).
fn every_kernel_module_loads() {
    let cuda = cuda_or_skip!();
    let res = cuda.kernel_resources().unwrap();
    let names: std::collections::HashSet<_> = res.iter().map(|r| r.0).collect();
    for k in [
        "quantize_q8",
        "attn_prefill_hd96",
        "mv_bf16_t8",
        "mv_q4_0_t1",
        "mvn_iq4_nl",
        "mv_q6_kr_t1s",
        "mv_q4_kr_tr",
        "mvn2_q5_0r_q8_0r",
        "attn_decode_flat_batch_q_hd256",
        "mmq_q6_kr_n",
        "attn_split_tq",
        "tq_encode",
    ] {
        assert!(names.contains(k), "{k} missing");
    }
    // 56 common kernels (12 of them the flat decode attention, 9 the
    // TurboQuant caches'), 3 float types × 2, 16 quantized layouts × 8, 3
    // mixed.
    assert_eq!(res.len(), 56 + 6 + 16 * 8 + 3);
}

/// The tests above, run when this machine has a CUDA device; otherwise
/// each is ignored with the reason, or fails under `INFER_REQUIRE_CUDA=1`.
#[path = "support/gpu_tests.rs"]
mod gpu_tests;

fn main() {
    let tests: Vec<(&'static str, fn())> = vec![
        ("matvec_every_type_matches_cpu_on_awkward_shapes", matvec_every_type_matches_cpu_on_awkward_shapes),
        ("matmul_quant_batches_match_cpu", matmul_quant_batches_match_cpu),
        ("activation_only_types_are_unsupported_not_panics", activation_only_types_are_unsupported_not_panics),
        ("dequantize_matches_cpu", dequantize_matches_cpu),
        ("cublas_matmul_matches_cpu", cublas_matmul_matches_cpu),
        ("norms_match_cpu", norms_match_cpu),
        ("rope_matches_cpu", rope_matches_cpu),
        ("attention_matches_cpu", attention_matches_cpu),
        ("kv_cache_rows_match_cpu_quantization", kv_cache_rows_match_cpu_quantization),
        ("glu_matches_cpu", glu_matches_cpu),
        ("graph_replay_equals_direct_launches", graph_replay_equals_direct_launches),
        (
            "batched_decode_graphs_replay_and_equal_direct_launches",
            batched_decode_graphs_replay_and_equal_direct_launches,
        ),
        ("greedy_decode_equals_host_argmax", greedy_decode_equals_host_argmax),
        ("errors_instead_of_panics", errors_instead_of_panics),
        ("device_info_names_the_device", device_info_names_the_device),
        ("every_kernel_module_loads", every_kernel_module_loads),
        ("a_model_loads_only_its_kernel_modules", a_model_loads_only_its_kernel_modules),
    ];
    let unavailable = CudaBackend::new(0).err().map(|e| format!("no CUDA device here ({e})"));
    gpu_tests::run(tests, unavailable, "INFER_REQUIRE_CUDA")
}
