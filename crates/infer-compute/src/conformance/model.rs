//! Prepared models: decode, prefill (whole and in chunks), batched decode,
//! cache truncation and profiling of small random models of three
//! architecture shapes, against the CPU backend computing exactly (f32
//! weights and activations), and the errors of bad steps.

use super::compare::check_logits;
use super::ops::{quantize, random_weight};
use super::rng::Rng;
use super::{Case, Outcome};
use crate::backend::{ComputeBackend, DeviceModel, KvPool, SeqStep};
use crate::cpu::{CpuBackend, Kernels, Precision};
use crate::pipeline::{Activation, FfnType, LayerSpec, ModelSpec, Norm, NormType, RopeSpec, RopeType};
use crate::weight::QuantWeight;
use crate::{Error, GgmlType};

/// The architecture shapes the suite builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Gemma 3: sliding and global layers, q/k norms, sandwich norms, GQA,
    /// GELU-tanh gated FFN, NeoX RoPE, scaled embeddings, tied output.
    Gemma3,
    /// Gemma 2-like: Gemma 3 plus attention and final logit soft-caps.
    Gemma2Caps,
    /// Llama/Qwen2-like: pre-norms only, q/k/v biases, adjacent-pair RoPE
    /// over part of each head, SiLU, untied output.
    LlamaBias,
}

const ARCHES: [(Arch, &str); 3] =
    [(Arch::Gemma3, "gemma3"), (Arch::Gemma2Caps, "gemma2_caps"), (Arch::LlamaBias, "llama_bias")];

fn f32_row(v: &[f32]) -> QuantWeight {
    quantize(GgmlType::F32, v.len(), &[v.to_vec()])
}

fn norm(rng: &mut Rng, n: usize) -> Norm {
    let w: Vec<f32> = (0..n).map(|_| 1.0 + 0.1 * rng.normal()).collect();
    Norm { kind: NormType::RmsNorm, eps: 1e-6, weight: f32_row(&w), bias: None }
}

/// A 3-layer random model of `arch` (n_embd 256, 4 heads over 2 KV heads of
/// 64, n_ff 512, 384 tokens) with a different mix of weight types per layer.
pub fn random_model(seed: u64, arch: Arch) -> ModelSpec {
    random_model_heads(seed, arch, 256, 4, 2, 64)
}

/// [`random_model`] with `n_embd` values per token and `n_head` query
/// heads over `n_head_kv` KV heads of `head_dim` values.
pub fn random_model_heads(
    seed: u64,
    arch: Arch,
    n_embd: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
) -> ModelSpec {
    use GgmlType as T;
    // Layer 0: the q/k/v of a Q4_K_M file's `use_more_bits` layers.
    let qkv = [[T::Q4_K, T::Q4_K, T::Q6_K], [T::Q8_0, T::Q8_0, T::Q8_0]];
    model_with_qkv(seed, arch, (n_embd, n_head, n_head_kv, head_dim), qkv)
}

/// The model of [`random_model_heads`] with the q, k and v types of
/// layers 0 and 1 given.
fn model_with_qkv(seed: u64, arch: Arch, shape: (usize, usize, usize, usize), qkv: [[GgmlType; 3]; 2]) -> ModelSpec {
    let (n_embd, n_head, n_head_kv, head_dim) = shape;
    let mut rng = Rng::new(seed);
    let (e, nh, nkv, hd, n_ff, vocab) = (n_embd, n_head, n_head_kv, head_dim, 512usize, 384usize);
    let gemma = arch != Arch::LlamaBias;
    use GgmlType as T;
    let [a, b] = qkv;
    // Per layer: wq, wk, wv, wo, gate, up, down.
    let types = [
        [a[0], a[1], a[2], T::Q5_0, T::Q4_K, T::Q4_K, T::Q6_K],
        [b[0], b[1], b[2], T::Q4_1, T::Q5_0, T::Q8_0, T::Q4_0],
        [T::F16, T::F16, T::F16, T::Q5_K, T::Q3_K, T::IQ4_NL, T::Q2_K],
    ];
    let mut layers = Vec::new();
    for (i, t) in types.iter().enumerate() {
        let global = i == 2;
        let rope = RopeSpec {
            kind: if gemma { RopeType::NeoX } else { RopeType::Normal },
            base: if global { 1_000_000.0 } else { 10_000.0 },
            n_rot: if gemma { hd } else { hd / 2 },
            freq_scale: if global { 0.5 } else { 1.0 },
        };
        let bias = |rng: &mut Rng, n: usize| (!gemma).then(|| f32_row(&rng.normals(n, 0.5)));
        layers.push(LayerSpec {
            n_head: nh,
            n_head_kv: nkv,
            head_dim: hd,
            rope,
            sliding_window: (gemma && !global).then_some(5),
            attn_softcap: (arch == Arch::Gemma2Caps).then_some(20.0),
            attn_scale: 1.0 / (hd as f32).sqrt(),
            attn_norm: norm(&mut rng, e),
            wq: random_weight(&mut rng, t[0], nh * hd, e),
            wk: random_weight(&mut rng, t[1], nkv * hd, e),
            wv: random_weight(&mut rng, t[2], nkv * hd, e),
            wo: random_weight(&mut rng, t[3], e, nh * hd),
            bq: bias(&mut rng, nh * hd),
            bk: bias(&mut rng, nkv * hd),
            bv: bias(&mut rng, nkv * hd),
            q_norm: gemma.then(|| norm(&mut rng, hd)),
            k_norm: gemma.then(|| norm(&mut rng, hd)),
            post_attn_norm: gemma.then(|| norm(&mut rng, e)),
            ffn_norm: norm(&mut rng, e),
            ffn: FfnType::Gated,
            activation: if gemma { Activation::GeluTanh } else { Activation::Silu },
            ffn_gate: Some(random_weight(&mut rng, t[4], n_ff, e)),
            ffn_up: random_weight(&mut rng, t[5], n_ff, e),
            ffn_down: random_weight(&mut rng, t[6], e, n_ff),
            post_ffn_norm: gemma.then(|| norm(&mut rng, e)),
        });
    }
    let rows: Vec<Vec<f32>> = (0..vocab).map(|_| rng.normals(e, 1.0)).collect();
    let token_embd = quantize(GgmlType::Q8_0, e, &rows);
    let output = if gemma { token_embd.clone() } else { random_weight(&mut rng, GgmlType::Q6_K, vocab, e) };
    ModelSpec {
        arch: format!("{arch:?}"),
        n_embd: e,
        n_vocab: vocab,
        n_ctx_train: 4096,
        token_embd,
        embd_scale: if gemma { (e as f32).sqrt() } else { 1.0 },
        layers,
        output_norm: norm(&mut rng, e),
        output,
        final_logit_softcap: (arch == Arch::Gemma2Caps).then_some(30.0),
    }
}

/// `spec` with value channels of uneven size, as real models have
/// (Gemma 3's differ by orders of magnitude): in every layer, row `r` of
/// `wv` (channel `i = r mod head_dim` of its head) times `8^(i / (head_dim
/// − 1))`, stored as f32. A TurboQuant value cache's scale
/// ([`crate::turboquant::ChannelScale::for_values`]) then spans about 8×,
/// so a backend that stores the scaled rows but does not divide the output
/// by the scale fails its bounds.
pub fn with_uneven_values(mut spec: ModelSpec) -> ModelSpec {
    for l in &mut spec.layers {
        let (hd, cols) = (l.head_dim, l.wv.cols);
        let w = l.wv.to_f32().expect("the suite's weight types dequantize");
        let rows: Vec<Vec<f32>> = w
            .chunks_exact(cols)
            .enumerate()
            .map(|(r, row)| {
                let f = 8f32.powf((r % hd) as f32 / (hd - 1).max(1) as f32);
                row.iter().map(|x| x * f).collect()
            })
            .collect();
        l.wv = quantize(GgmlType::F32, cols, &rows);
    }
    spec
}

/// `n` token ids below `vocab`, the same for the same `seed`.
pub fn tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.below(vocab as u64) as u32).collect()
}

/// The reference: the CPU backend with f32 weights and activations.
pub(super) fn reference() -> CpuBackend {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    CpuBackend::with_options(threads, Kernels::detect(), Precision::Exact).expect("CPU backend")
}

/// Prepares `spec` on `b`, or says why the backend cannot run it: only
/// [`Error::UnsupportedModel`] skips (a backend that refuses a valid model
/// as invalid, or fails to prepare it, fails the case).
pub(super) fn prepare(
    b: &dyn ComputeBackend,
    spec: &ModelSpec,
) -> Result<Result<Box<dyn DeviceModel>, Outcome>, String> {
    match b.prepare(spec) {
        Ok(m) => Ok(Ok(m)),
        Err(e @ Error::UnsupportedModel(_)) => Ok(Err(Outcome::Skip(format!("{}: {e}", spec.arch)))),
        Err(e) => Err(format!("prepare: {e}")),
    }
}

/// Positions filled in slot 0 of `kv` (a one-slot cache).
pub(super) fn fill(kv: &dyn KvPool) -> usize {
    kv.seq_len(0).unwrap_or(usize::MAX)
}

pub(super) fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Token by token from position 0, every step against the reference.
fn decode_case(b: &dyn ComputeBackend, arch: Arch) -> Result<Outcome, String> {
    decode_spec(b, &random_model(11, arch))
}

/// [`decode_case`] with q/k/v of two weight types in layers 0 and 1 (GPU
/// backends may run each layer's in one launch): layer 0 in the mix of a
/// Q5_K_M file's `use_more_bits` layers (Q5_K q and k, Q6_K v), layer 1 in
/// that of a Q4_K_M file whose rows are not a multiple of 256 (Q5_0 and
/// Q8_0, llama.cpp's fallbacks for Q4_K and Q6_K); layer 1's input carries
/// the residual add of layer 0's output.
fn mixed_qkv_case(b: &dyn ComputeBackend, arch: Arch) -> Result<Outcome, String> {
    use GgmlType as T;
    let qkv = [[T::Q5_K, T::Q5_K, T::Q6_K], [T::Q5_0, T::Q5_0, T::Q8_0]];
    decode_spec(b, &model_with_qkv(11, arch, (256, 4, 2, 64), qkv))
}

/// [`decode_case`] on a Gemma 3 model of 4352 values per token: past the
/// 4096 that a GPU norm may hold in registers, so its looping path runs
/// (sandwich norms included).
fn wide_embd_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    decode_spec(b, &random_model_heads(13, Arch::Gemma3, 4352, 4, 2, 64))
}

fn decode_spec(b: &dyn ComputeBackend, spec: &ModelSpec) -> Result<Outcome, String> {
    let mut m = match prepare(b, spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let mut r = reference().prepare(spec).map_err(err("reference"))?;
    let toks = tokens(5, 12, spec.n_vocab);
    let (mut kv, mut rkv) = (m.new_kv_cache(16).map_err(err("kv"))?, r.new_kv_cache(16).map_err(err("kv"))?);
    for (pos, &t) in toks.iter().enumerate() {
        let got = m.decode_token(kv.as_mut(), t, pos).map_err(err("decode_token"))?.to_vec();
        let want = r.decode_token(rkv.as_mut(), t, pos).map_err(err("reference"))?;
        check_logits(&format!("pos {pos}"), &got, want)?;
    }
    if fill(kv.as_ref()) != toks.len() {
        return Err(format!("the cache holds {} positions after {} steps", fill(kv.as_ref()), toks.len()));
    }
    Ok(Outcome::Pass(String::new()))
}

/// One prefill, then the same tokens in two chunks, then a decode after it.
fn prefill_case(b: &dyn ComputeBackend, arch: Arch) -> Result<Outcome, String> {
    let spec = random_model(12, arch);
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let mut r = reference().prepare(&spec).map_err(err("reference"))?;
    let toks = tokens(6, 14, spec.n_vocab);
    let mut rkv = r.new_kv_cache(32).map_err(err("kv"))?;
    let want = r.prefill(rkv.as_mut(), &toks[..13], 0).map_err(err("reference"))?.to_vec();
    let want_next = r.decode_token(rkv.as_mut(), toks[13], 13).map_err(err("reference"))?.to_vec();

    let mut kv = m.new_kv_cache(32).map_err(err("kv"))?;
    let got = m.prefill(kv.as_mut(), &toks[..13], 0).map_err(err("prefill"))?.to_vec();
    check_logits("prefill of 13", &got, &want)?;
    let got = m.decode_token(kv.as_mut(), toks[13], 13).map_err(err("decode after prefill"))?.to_vec();
    check_logits("decode after prefill", &got, &want_next)?;

    let mut kv = m.new_kv_cache(32).map_err(err("kv"))?;
    m.prefill(kv.as_mut(), &toks[..5], 0).map_err(err("prefill chunk 1"))?;
    let got = m.prefill(kv.as_mut(), &toks[5..13], 5).map_err(err("prefill chunk 2"))?.to_vec();
    check_logits("prefill in chunks of 5 and 8", &got, &want)?;
    Ok(Outcome::Pass(String::new()))
}

/// Prefills long enough for the tiled attention of GPU backends (several
/// query tiles and key tiles, the sliding window of 5 far behind): 70
/// tokens at once, then as 30 + 40, for head dimensions 64, 96 (Phi-3,
/// without GQA), 128 and 256 over 1 to 4 query heads per KV head.
fn long_prefill_case(b: &dyn ComputeBackend, arch: Arch) -> Result<Outcome, String> {
    for (seed, nh, nkv, hd) in [(20, 4, 2, 64), (23, 8, 8, 96), (21, 8, 2, 128), (22, 4, 1, 256)] {
        let spec = random_model_heads(seed, arch, 256, nh, nkv, hd);
        let mut m = match prepare(b, &spec)? {
            Ok(m) => m,
            Err(skip) => return Ok(skip),
        };
        let mut r = reference().prepare(&spec).map_err(err("reference"))?;
        let toks = tokens(seed, 70, spec.n_vocab);
        let mut rkv = r.new_kv_cache(96).map_err(err("kv"))?;
        let want = r.prefill(rkv.as_mut(), &toks, 0).map_err(err("reference"))?.to_vec();
        let what = |s: &str| format!("head_dim {hd}, {nh}/{nkv} heads: {s}");

        let mut kv = m.new_kv_cache(96).map_err(err("kv"))?;
        let got = m.prefill(kv.as_mut(), &toks, 0).map_err(err("prefill"))?.to_vec();
        check_logits(&what("prefill of 70"), &got, &want)?;

        let mut kv = m.new_kv_cache(96).map_err(err("kv"))?;
        m.prefill(kv.as_mut(), &toks[..30], 0).map_err(err("prefill chunk 1"))?;
        let got = m.prefill(kv.as_mut(), &toks[30..], 30).map_err(err("prefill chunk 2"))?.to_vec();
        check_logits(&what("prefill in chunks of 30 and 40"), &got, &want)?;
    }
    Ok(Outcome::Pass(String::new()))
}

/// Decodes of 70 tokens, every step against the reference: attention over
/// several of a GPU backend's 32-position spans (the sliding window of 5
/// far behind), head dimensions 64, 96, 128 and 256 with 1 to 8 query
/// heads per KV head, and rows of 256 and 768 values (norms in registers
/// or streamed by a small block).
fn long_decode_case(b: &dyn ComputeBackend, arch: Arch) -> Result<Outcome, String> {
    for (seed, e, nh, nkv, hd) in
        [(30, 256, 4, 2, 64), (31, 768, 8, 2, 128), (32, 768, 4, 1, 256), (33, 256, 16, 2, 64), (34, 256, 8, 2, 96)]
    {
        let spec = random_model_heads(seed, arch, e, nh, nkv, hd);
        let mut m = match prepare(b, &spec)? {
            Ok(m) => m,
            Err(skip) => return Ok(skip),
        };
        let mut r = reference().prepare(&spec).map_err(err("reference"))?;
        let toks = tokens(seed, 70, spec.n_vocab);
        let (mut kv, mut rkv) = (m.new_kv_cache(80).map_err(err("kv"))?, r.new_kv_cache(80).map_err(err("kv"))?);
        for (pos, &t) in toks.iter().enumerate() {
            let got = m.decode_token(kv.as_mut(), t, pos).map_err(err("decode_token"))?.to_vec();
            let want = r.decode_token(rkv.as_mut(), t, pos).map_err(err("reference"))?;
            check_logits(&format!("n_embd {e}, head_dim {hd}, {nh}/{nkv} heads: pos {pos}"), &got, want)?;
        }
    }
    Ok(Outcome::Pass(String::new()))
}

/// Two sequences decoded together equal each decoded alone.
fn batch_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let spec = random_model(13, Arch::LlamaBias);
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let n = spec.n_vocab;
    let seqs = [tokens(7, 4, n), tokens(8, 4, n)];
    let mut alone = Vec::new();
    for s in &seqs {
        let mut kv = m.new_kv_cache(8).map_err(err("kv"))?;
        let mut out = Vec::new();
        for (pos, &t) in s.iter().enumerate() {
            out.push(m.decode_token(kv.as_mut(), t, pos).map_err(err("decode_token"))?.to_vec());
        }
        alone.push(out);
    }
    let (mut kv0, mut kv1) = (m.new_kv_cache(8).map_err(err("kv"))?, m.new_kv_cache(8).map_err(err("kv"))?);
    let mut logits = vec![0f32; 2 * n];
    for pos in 0..4 {
        let mut steps = [
            SeqStep { kv: kv0.as_mut(), token: seqs[0][pos], pos },
            SeqStep { kv: kv1.as_mut(), token: seqs[1][pos], pos },
        ];
        m.decode_batch(&mut steps, &mut logits).map_err(err("decode_batch"))?;
        for (i, row) in logits.chunks_exact(n).enumerate() {
            check_logits(&format!("sequence {i} pos {pos}"), row, &alone[i][pos])?;
        }
    }
    let mut bad = [SeqStep { kv: kv0.as_mut(), token: 0, pos: 4 }];
    if !matches!(m.decode_batch(&mut bad, &mut logits), Err(Error::Shape { .. })) {
        return Err("decode_batch with logits for 2 of 1 sequences: want Error::Shape".into());
    }
    let mut gap = [SeqStep { kv: kv0.as_mut(), token: 0, pos: 4 }, SeqStep { kv: kv1.as_mut(), token: 0, pos: 6 }];
    match m.decode_batch(&mut gap, &mut logits) {
        Err(Error::InBatch { index: 1, source }) if matches!(*source, Error::PositionGap { .. }) => {}
        other => return Err(format!("a gap in sequence 1: {other:?}, want InBatch {{ index: 1, PositionGap }}")),
    }
    Ok(Outcome::Pass(String::new()))
}

/// Truncating the cache and stepping again equals never having gone past.
fn truncate_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let spec = random_model(14, Arch::Gemma3);
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let toks = tokens(9, 8, spec.n_vocab);
    let mut kv = m.new_kv_cache(16).map_err(err("kv"))?;
    m.prefill(kv.as_mut(), &toks[..4], 0).map_err(err("prefill"))?;
    let want = m.decode_token(kv.as_mut(), 3, 4).map_err(err("decode"))?.to_vec();
    let mut kv2 = m.new_kv_cache(16).map_err(err("kv"))?;
    m.prefill(kv2.as_mut(), &toks, 0).map_err(err("prefill"))?;
    kv2.truncate(0, 4).map_err(err("truncate"))?;
    if fill(kv2.as_ref()) != 4 {
        return Err(format!("truncate(4) left {} positions", fill(kv2.as_ref())));
    }
    let got = m.decode_token(kv2.as_mut(), 3, 4).map_err(err("decode after truncate"))?.to_vec();
    check_logits("decode after truncate", &got, &want)?;
    if m.decode_token(kv2.as_mut(), 3, 7).is_ok() {
        return Err("a step past the truncated length was accepted".into());
    }
    Ok(Outcome::Pass(String::new()))
}

/// `decode_greedy` returns the first largest logit of the step
/// `decode_token` runs (same backend, same cache history), and advances the
/// cache the same way.
fn greedy_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let spec = random_model(16, Arch::LlamaBias);
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let mut kv = m.new_kv_cache(8).map_err(err("kv"))?;
    let mut kv_greedy = m.new_kv_cache(8).map_err(err("kv"))?;
    let mut token = 1u32;
    for pos in 0..8 {
        let logits = m.decode_token(kv.as_mut(), token, pos).map_err(err("decode_token"))?;
        let want = logits.iter().enumerate().fold(0, |best, (i, &x)| if x > logits[best] { i } else { best }) as u32;
        let got = m.decode_greedy(kv_greedy.as_mut(), token, pos).map_err(err("decode_greedy"))?;
        if got != want {
            return Err(format!("position {pos}: decode_greedy gave {got}, the argmax of decode_token is {want}"));
        }
        token = got;
    }
    if fill(kv_greedy.as_ref()) != 8 {
        return Err(format!("8 greedy steps left a cache of {} positions", fill(kv_greedy.as_ref())));
    }
    Ok(Outcome::Pass(String::new()))
}

/// Decodes `toks` one step at a time into a fresh cache; the last step's
/// logits.
fn decode_all(m: &mut dyn DeviceModel, toks: &[u32]) -> Result<Vec<f32>, String> {
    let mut kv = m.new_kv_cache(toks.len()).map_err(err("kv"))?;
    let mut last = vec![];
    for (pos, &t) in toks.iter().enumerate() {
        last = m.decode_token(kv.as_mut(), t, pos).map_err(err("decode_token"))?.to_vec();
    }
    Ok(last)
}

/// Models of one backend used from several threads at once (a server
/// runs one per request thread) decode as they do alone, and the backend's
/// own ops stay usable meanwhile.
fn concurrent_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let spec = random_model(17, Arch::Gemma3);
    let toks = tokens(17, 12, spec.n_vocab);
    let alone = {
        let mut m = match prepare(b, &spec)? {
            Ok(m) => m,
            Err(skip) => return Ok(skip),
        };
        decode_all(m.as_mut(), &toks)?
    };
    let w = random_weight(&mut Rng::new(17), GgmlType::Q8_0, 64, 32);
    let x: Vec<f32> = (0..32).map(|i| i as f32 / 32.0).collect();
    let results: Vec<Result<Vec<f32>, String>> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..4)
            .map(|i| {
                let (spec, toks, w, x) = (&spec, &toks, &w, &x);
                s.spawn(move || -> Result<Vec<f32>, String> {
                    if i == 3 {
                        // The backend's own ops, while the models decode.
                        let mut y = vec![0f32; 64];
                        for _ in 0..20 {
                            b.matvec(w, x, &mut y).map_err(err("matvec"))?;
                        }
                        return Ok(vec![]);
                    }
                    let mut m = b.prepare(spec).map_err(err("prepare"))?;
                    decode_all(m.as_mut(), toks)
                })
            })
            .collect();
        runs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into()))).collect()
    });
    for (i, r) in results.into_iter().enumerate().take(3) {
        check_logits(&format!("thread {i}"), &r?, &alone)?;
    }
    Ok(Outcome::Pass(String::new()))
}

/// A profiled step times named ops and advances the cache like a decode.
fn profile_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let spec = random_model(15, Arch::Gemma3);
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let mut kv = m.new_kv_cache(8).map_err(err("kv"))?;
    let p = match m.profile_step(kv.as_mut(), 1, 0) {
        Ok(p) => p,
        Err(e @ Error::NotImplemented { .. }) => return Ok(Outcome::Skip(e.to_string())),
        Err(e) => return Err(format!("profile_step: {e}")),
    };
    if p.ops.is_empty() || p.ops.iter().any(|o| o.op.is_empty() || o.calls == 0) {
        return Err(format!("profile without named ops: {:?}", p.ops));
    }
    if p.ops.iter().filter(|o| o.bytes > 0).count() == 0 {
        return Err("no op of the profile reports the weight bytes it read".into());
    }
    if fill(kv.as_ref()) != 1 {
        return Err(format!("after a profiled step the cache holds {} positions", fill(kv.as_ref())));
    }
    let got = m.decode_token(kv.as_mut(), 2, 1).map_err(err("decode after profile"))?.to_vec();
    let mut kv2 = m.new_kv_cache(8).map_err(err("kv"))?;
    m.decode_token(kv2.as_mut(), 1, 0).map_err(err("decode"))?;
    let want = m.decode_token(kv2.as_mut(), 2, 1).map_err(err("decode"))?;
    check_logits("decode after a profiled step", &got, want)?;
    Ok(Outcome::Pass(format!("{} ops", p.ops.len())))
}

/// Bad steps are typed errors that leave the model usable.
fn errors_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let spec = random_model(16, Arch::LlamaBias);
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let n_vocab = spec.n_vocab as u32;
    let mut kv = m.new_kv_cache(4).map_err(err("kv"))?;
    let check = |what: &str, r: crate::Result<&[f32]>, ok: fn(&Error) -> bool| match r {
        Err(e) if ok(&e) => Ok(()),
        Err(e) => Err(format!("{what}: unexpected error {e}")),
        Ok(_) => Err(format!("{what}: accepted")),
    };
    check("token past the vocabulary", m.decode_token(kv.as_mut(), n_vocab, 0), |e| {
        matches!(e, Error::TokenOutOfRange { .. })
    })?;
    check("a gap", m.decode_token(kv.as_mut(), 1, 2), |e| matches!(e, Error::PositionGap { .. }))?;
    check("empty prefill", m.prefill(kv.as_mut(), &[], 0), |e| matches!(e, Error::EmptyBatch))?;
    check("prefill past n_ctx", m.prefill(kv.as_mut(), &[1; 5], 0), |e| matches!(e, Error::ContextOverflow { .. }))?;
    check("position past n_ctx", m.decode_token(kv.as_mut(), 1, usize::MAX), |e| {
        matches!(e, Error::PositionGap { .. } | Error::ContextOverflow { .. })
    })?;
    let other = reference().prepare(&spec).map_err(err("reference"))?;
    let mut foreign = other.new_kv_cache(4).map_err(err("kv"))?;
    check("another model's cache", m.decode_token(foreign.as_mut(), 1, 0), |e| matches!(e, Error::ForeignKvCache))?;
    if !matches!(m.new_kv_cache(0), Err(Error::EmptyKvCache)) {
        return Err("new_kv_cache(0): want Error::EmptyKvCache".into());
    }
    if fill(kv.as_ref()) != 0 {
        return Err(format!("failed steps filled {} positions", fill(kv.as_ref())));
    }
    for pos in 0..4 {
        m.decode_token(kv.as_mut(), 1, pos).map_err(err("decode after errors"))?;
    }
    check("a fifth position in a cache of 4", m.decode_token(kv.as_mut(), 1, 4), |e| {
        matches!(e, Error::ContextOverflow { .. })
    })?;
    let mut bad = spec.clone();
    bad.layers[1].wk = bad.layers[1].wq.clone();
    match b.prepare(&bad) {
        Err(Error::InvalidModel(_)) => {}
        Err(e) => return Err(format!("inconsistent spec: {e}, want Error::InvalidModel")),
        Ok(_) => return Err("a spec whose attn_k has attn_q's shape was prepared".into()),
    }
    Ok(Outcome::Pass(String::new()))
}

/// A NaN in one norm weight reaches the logits (one value of a quantized
/// activation block: quantizers that skip it would hide it) and greedy
/// decoding reports it instead of picking a token.
fn nan_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let mut spec = random_model(18, Arch::LlamaBias);
    let e = spec.n_embd;
    let mut w = vec![1.0f32; e];
    w[5] = f32::NAN;
    spec.layers[0].ffn_norm = Norm { kind: NormType::RmsNorm, eps: 1e-6, weight: f32_row(&w), bias: None };
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let mut kv = m.new_kv_cache(4).map_err(err("kv"))?;
    match m.decode_token(kv.as_mut(), 1, 0) {
        Ok(logits) if logits.iter().any(|v| v.is_nan()) => {}
        Ok(_) => return Err("a NaN norm weight gave logits without a NaN".into()),
        Err(Error::NonFinite(_)) => {}
        Err(e) => return Err(format!("decode_token: unexpected error {e}")),
    }
    match m.decode_greedy(kv.as_mut(), 2, 1) {
        Err(Error::NonFinite(_)) => Ok(Outcome::Pass(String::new())),
        Err(e) => Err(format!("decode_greedy: unexpected error {e}")),
        Ok(t) => Err(format!("decode_greedy picked token {t} from NaN logits")),
    }
}

/// Activations far past f16's range (an attention norm weight of 1e7, as
/// a hostile or broken file may have; keys and values near 1e7) give
/// finite logits on every path: decode, a prefill long enough for the
/// tiled attention, and decode after it. Backends that keep an f16 KV
/// cache saturate it at ±65504 rather than storing infinities.
fn huge_activation_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let mut spec = random_model(19, Arch::LlamaBias);
    let w = vec![1e7f32; spec.n_embd];
    for l in &mut spec.layers {
        l.attn_norm = Norm { kind: NormType::RmsNorm, eps: 1e-6, weight: f32_row(&w), bias: None };
        // Float weights take the activation as f16 (as ggml), which
        // cannot hold it: only the quantized types are under test here.
        for m in [&mut l.wq, &mut l.wk, &mut l.wv] {
            if m.ty == GgmlType::F16 {
                *m = requantize(m, GgmlType::Q8_0)?;
            }
        }
    }
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let toks: Vec<u32> = (0..24).map(|i| (i * 7 % spec.n_vocab) as u32).collect();
    let finite = |what: &str, l: &[f32]| match l.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(format!("{what}: logit {i} is {}", l[i])),
        None => Ok(()),
    };
    let mut kv = m.new_kv_cache(32).map_err(err("kv"))?;
    for (pos, &t) in toks[..4].iter().enumerate() {
        finite(&format!("decode pos {pos}"), m.decode_token(kv.as_mut(), t, pos).map_err(err("decode"))?)?;
    }
    let mut kv = m.new_kv_cache(32).map_err(err("kv"))?;
    finite("prefill of 20", m.prefill(kv.as_mut(), &toks[..20], 0).map_err(err("prefill"))?)?;
    for (pos, &t) in toks.iter().enumerate().skip(20) {
        finite(
            &format!("decode pos {pos} after prefill"),
            m.decode_token(kv.as_mut(), t, pos).map_err(err("decode"))?,
        )?;
    }
    Ok(Outcome::Pass(String::new()))
}

/// `w` dequantized and quantized again as `ty`.
fn requantize(w: &QuantWeight, ty: GgmlType) -> Result<QuantWeight, String> {
    let f = w.to_f32().map_err(err("dequantize"))?;
    let rb = ty.row_bytes(w.cols).map_err(err("row bytes"))?;
    let mut bytes = vec![0u8; w.rows * rb];
    for (row, out) in f.chunks_exact(w.cols).zip(bytes.chunks_exact_mut(rb)) {
        crate::quant::quantize_row(ty, row, out).map_err(err("quantize"))?;
    }
    QuantWeight::new(ty, w.rows, w.cols, bytes.into()).map_err(err("weight"))
}

/// The model cases.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (arch, name) in ARCHES {
        v.push(Case::new(&format!("model::{name}::decode"), move |b| decode_case(b, arch)));
        v.push(Case::new(&format!("model::{name}::prefill"), move |b| prefill_case(b, arch)));
        v.push(Case::new(&format!("model::{name}::long_prefill"), move |b| long_prefill_case(b, arch)));
        v.push(Case::new(&format!("model::{name}::long_decode"), move |b| long_decode_case(b, arch)));
    }
    v.push(Case::new("model::llama_bias::mixed_qkv", |b| mixed_qkv_case(b, Arch::LlamaBias)));
    v.push(Case::new("model::gemma3::mixed_qkv", |b| mixed_qkv_case(b, Arch::Gemma3)));
    v.push(Case::new("model::gemma3::wide_embd", wide_embd_case));
    v.push(Case::new("model::decode_batch", batch_case));
    v.push(Case::new("model::truncate", truncate_case));
    v.push(Case::new("model::profile_step", profile_case));
    v.push(Case::new("model::decode_greedy", greedy_case));
    v.push(Case::new("model::concurrent", concurrent_case));
    v.push(Case::new("model::errors", errors_case));
    v.push(Case::new("model::nan_reported", nan_case));
    v.push(Case::new("model::huge_activations_finite", huge_activation_case));
    v
}
