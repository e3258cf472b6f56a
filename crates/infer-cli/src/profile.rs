//! `infer bench --profile`: where a decode step's time goes.
//!
//! The CPU decode path (`infer_compute::cpu::model`) has no timing hooks,
//! so this module **replays** a decode step op by op with the same public
//! pieces it is built from (`infer_compute::cpu::{matvec, kernels, ops}`),
//! on the same weights, shapes and thread pool, and times each op on its
//! own. The replay follows the decode path's order and arithmetic
//! (the activation quantized with the level's quantizer, once for the
//! matrices that share an input and its pair type: q/k/v, gate/up; then
//! the row-parallel mat-vecs;
//! norms, RoPE, KV append, attention, activation, residual adds; output
//! projection; argmax), but it is a replay: per-op timing adds a little
//! overhead, and its total is compared with the real `decode_token` time
//! in the printed report.

use std::collections::HashMap;
use std::time::Instant;

use infer_compute::cpu::kernels::AlignedBytes;
use infer_compute::cpu::model::PreparedNorm;
use infer_compute::cpu::packed::{self, PackedActs};
use infer_compute::cpu::weight::CpuWeight;
use infer_compute::cpu::{matvec, ops, CpuBackend, Kernels, Precision};
use infer_compute::pipeline::{Activation, FfnType, ModelSpec, Norm, NormType};
use infer_compute::GgmlType;

use crate::common::CliResult;

/// Results inside the thread pool, whose errors must be `Send`.
type SendResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Time spent in one kind of op over the replayed steps.
#[derive(Clone, Debug)]
pub struct OpTime {
    /// What ran (`matvec blk.*.attn_q`, `rms_norm`, `attention` ...).
    pub op: String,
    /// Weight type for mat-vecs (`q4_K`), else empty.
    pub ty: String,
    /// Shape (`1024x640` for a weight of 1024 rows of 640 values).
    pub shape: String,
    /// Calls per decode step.
    pub calls_per_step: f64,
    /// Total nanoseconds over all steps.
    pub ns: u64,
    /// Weight bytes read per step (mat-vecs only).
    pub bytes_per_step: u64,
    /// First position in the replay order, for stable printing.
    order: usize,
}

/// The result of a replay.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Decode steps replayed.
    pub steps: usize,
    /// CPU threads.
    pub threads: usize,
    /// SIMD kernel level.
    pub kernels: String,
    /// Time per op kind, in replay order.
    pub ops: Vec<OpTime>,
}

impl Profile {
    /// Sum of all ops, nanoseconds per step.
    pub fn step_ns(&self) -> f64 {
        self.ops.iter().map(|o| o.ns).sum::<u64>() as f64 / self.steps.max(1) as f64
    }
}

/// Accumulates op timings keyed by (op, type, shape).
#[derive(Default)]
struct Recorder {
    index: HashMap<(String, String, String), usize>,
    ops: Vec<OpTime>,
    calls: Vec<u64>,
}

impl Recorder {
    fn add(&mut self, op: &str, ty: &str, shape: &str, ns: u64, bytes: u64) {
        let key = (op.to_string(), ty.to_string(), shape.to_string());
        let n = self.ops.len();
        let i = *self.index.entry(key).or_insert(n);
        if i == n {
            self.ops.push(OpTime {
                op: op.to_string(),
                ty: ty.to_string(),
                shape: shape.to_string(),
                calls_per_step: 0.0,
                ns: 0,
                bytes_per_step: 0,
                order: n,
            });
            self.calls.push(0);
        }
        self.ops[i].ns += ns;
        self.ops[i].bytes_per_step += bytes;
        self.calls[i] += 1;
    }

    /// Times `f` as one call of `op`.
    fn time<R>(&mut self, op: &str, f: impl FnOnce() -> R) -> R {
        let t0 = Instant::now();
        let r = f();
        self.add(op, "", "", t0.elapsed().as_nanos() as u64, 0);
        r
    }
}

/// Name of a norm kind in the profile table.
fn norm_name(kind: NormType) -> &'static str {
    match kind {
        NormType::RmsNorm => "rms_norm",
        NormType::LayerNorm => "layer_norm",
    }
}

/// Quantized activations kept between products that share an input.
#[derive(Default)]
struct ActCache {
    /// Row-dot activation bytes.
    rows: AlignedBytes,
    /// Packed-product activations.
    packed: PackedActs,
    tmp: AlignedBytes,
    /// What `rows` / `packed` now hold: (packed?, activation type).
    holds: Option<(bool, GgmlType)>,
}

/// `y = W·x` as the decode path does it (`cpu::weight`), timed in two
/// parts: quantizing the activation (skipped when `shared` says the cache
/// already holds `x` in this weight's form, as for k/v after q and up after
/// gate), then the product itself (recorded under `name` with the weight's
/// type, shape and bytes read).
#[allow(clippy::too_many_arguments)]
fn timed_matvec(
    rec: &mut Recorder,
    k: &Kernels,
    name: &str,
    w: &CpuWeight,
    x: &[f32],
    y: &mut [f32],
    cache: &mut ActCache,
    shared: bool,
) -> infer_compute::Result<()> {
    let ty = w.ty();
    let act_ty = ty.vec_dot_type().ok_or(infer_compute::Error::Unsupported { op: "matvec", ty })?;
    let form = (matches!(w, CpuWeight::Packed(_)), act_ty);
    if !shared || cache.holds != Some(form) {
        let t0 = Instant::now();
        match w {
            CpuWeight::Rows(_) => k.quantize_activation(ty, x, &mut cache.rows)?,
            CpuWeight::Packed(p) => cache.packed.quantize(k, ty, x, 1, p.cols(), &mut cache.tmp)?,
        }
        rec.add(
            &format!("quantize activation -> {}", act_ty.name()),
            "",
            &format!("{}", w.cols()),
            t0.elapsed().as_nanos() as u64,
            0,
        );
        cache.holds = Some(form);
    }
    let t1 = Instant::now();
    let (bytes, layout) = match w {
        CpuWeight::Rows(q) => {
            matvec::matvec_quantized(k, q, cache.rows.as_bytes(), y);
            (q.data.as_bytes().len() as u64, "")
        }
        CpuWeight::Packed(p) => {
            packed::matmul(k, p, &cache.packed, y)?;
            (p.bytes() as u64, " packed")
        }
    };
    rec.add(
        &format!("matvec {name}"),
        &format!("{}{layout}", ty.name()),
        &format!("{}x{}", w.rows(), w.cols()),
        t1.elapsed().as_nanos() as u64,
        bytes,
    );
    Ok(())
}

/// Replays `steps` decode steps of `spec` from position 0 (first token
/// `bos`, then the argmax of each step's logits) on `threads` CPU threads,
/// timing each op.
///
/// # Errors
/// Weight types without a CPU kernel; NaN logits.
pub fn profile_decode(spec: &ModelSpec, threads: usize, bos: u32, steps: usize) -> CliResult<Profile> {
    let backend = CpuBackend::with_options(threads, Kernels::detect(), Precision::Quantized)?;
    let k = *backend.kernels();
    let e = spec.n_embd;
    let n_ctx = steps.max(1);
    let layers: Vec<_> = spec
        .layers
        .iter()
        .map(|l| -> CliResult<_> {
            let opt = |n: &Option<Norm>| n.as_ref().map(PreparedNorm::new).transpose();
            Ok((
                PreparedNorm::new(&l.attn_norm)?,
                opt(&l.q_norm)?,
                opt(&l.k_norm)?,
                opt(&l.post_attn_norm)?,
                PreparedNorm::new(&l.ffn_norm)?,
                opt(&l.post_ffn_norm)?,
                [&l.bq, &l.bk, &l.bv].map(|b| b.as_ref().map(|b| b.to_f32())),
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_up, &l.ffn_down]
                    .map(|w| CpuWeight::prepare(&k, w.clone()))
                    .into_iter()
                    .collect::<infer_compute::Result<Vec<_>>>()?,
                l.ffn_gate.as_ref().map(|w| CpuWeight::prepare(&k, w.clone())).transpose()?,
            ))
        })
        .collect::<CliResult<_>>()?;
    let output_norm = PreparedNorm::new(&spec.output_norm)?;
    let mut kcache: Vec<Vec<f32>> = spec.layers.iter().map(|l| vec![0f32; n_ctx * l.n_head_kv * l.head_dim]).collect();
    let mut vcache = kcache.clone();
    let mut rec = Recorder::default();
    let mut logits = vec![0f32; spec.n_vocab];
    let mut act = ActCache::default();
    let output = CpuWeight::Rows(spec.output.clone());

    backend
        .install(|| -> SendResult<()> {
            let mut token = bos;
            let mut x = vec![0f32; e];
            let mut h = vec![0f32; e];
            let mut o = vec![0f32; e];
            for pos in 0..steps {
                rec.time("embedding lookup (1 row)", || -> SendResult<()> {
                    let row = spec.token_embd.row(token as usize);
                    infer_compute::quant::dequantize_row(spec.token_embd.ty, row, &mut x)?;
                    if spec.embd_scale != 1.0 {
                        ops::scale(&mut x, spec.embd_scale);
                    }
                    Ok(())
                })?;
                for (li, (l, pl)) in spec.layers.iter().zip(&layers).enumerate() {
                    let (attn_norm, q_norm, k_norm, post_attn, ffn_norm, post_ffn, biases, ws, gate_w) = pl;
                    let [wq, wk, wv, wo, w_up, w_down] = [0, 1, 2, 3, 4, 5].map(|i| &ws[i]);
                    let (qd, kvd) = (l.n_head * l.head_dim, l.n_head_kv * l.head_dim);
                    rec.time(norm_name(attn_norm.kind), || attn_norm.apply(&x, &mut h));
                    let mut q = vec![0f32; qd];
                    let mut kk = vec![0f32; kvd];
                    let mut v = vec![0f32; kvd];
                    timed_matvec(&mut rec, &k, "attn_q", wq, &h, &mut q, &mut act, false)?;
                    timed_matvec(&mut rec, &k, "attn_k", wk, &h, &mut kk, &mut act, true)?;
                    timed_matvec(&mut rec, &k, "attn_v", wv, &h, &mut v, &mut act, true)?;
                    for (b, out) in biases.iter().zip([&mut q, &mut kk, &mut v]) {
                        if let Some(b) = b {
                            let b = b.as_ref().map_err(|e| e.to_string())?;
                            rec.time("bias add", || ops::add(out, b));
                        }
                    }
                    if let Some(n) = q_norm {
                        rec.time("q/k norm (per head)", || ops::rms_norm_heads(&mut q, l.head_dim, &n.weight, n.eps));
                    }
                    if let Some(n) = k_norm {
                        rec.time("q/k norm (per head)", || ops::rms_norm_heads(&mut kk, l.head_dim, &n.weight, n.eps));
                    }
                    rec.time("rope (q and k)", || {
                        ops::rope(&mut q, l.n_head, l.head_dim, pos, &l.rope);
                        ops::rope(&mut kk, l.n_head_kv, l.head_dim, pos, &l.rope);
                    });
                    rec.time("kv append", || ops::kv_append(&mut kcache[li], &mut vcache[li], &kk, &v, pos, kvd));
                    let p = ops::AttnParams::from_layer(l);
                    let mut scores = vec![0f32; l.n_head * n_ctx];
                    let mut attn = vec![0f32; qd];
                    rec.time("attention (scores, softmax, values)", || {
                        ops::attention_decode(&q, &kcache[li], &vcache[li], pos, &p, &mut scores, &mut attn)
                    });
                    timed_matvec(&mut rec, &k, "attn_output", wo, &attn, &mut o, &mut act, false)?;
                    if let Some(n) = post_attn {
                        let tmp = o.clone();
                        rec.time(norm_name(n.kind), || n.apply(&tmp, &mut o));
                    }
                    rec.time("residual add", || ops::add(&mut x, &o));

                    rec.time(norm_name(ffn_norm.kind), || ffn_norm.apply(&x, &mut h));
                    let n_ff = w_up.rows();
                    let mut up = vec![0f32; n_ff];
                    let mut a = vec![0f32; n_ff];
                    match (l.ffn, gate_w) {
                        (FfnType::Gated, Some(wg)) => {
                            let mut gate = vec![0f32; n_ff];
                            timed_matvec(&mut rec, &k, "ffn_gate", wg, &h, &mut gate, &mut act, false)?;
                            timed_matvec(&mut rec, &k, "ffn_up", w_up, &h, &mut up, &mut act, true)?;
                            match l.activation {
                                Activation::GeluTanh => {
                                    rec.time("activation (geglu)", || ops::geglu(&gate, &up, &mut a))
                                }
                                Activation::Silu => rec.time("activation (swiglu)", || ops::swiglu(&gate, &up, &mut a)),
                            }
                        }
                        _ => {
                            timed_matvec(&mut rec, &k, "ffn_up", w_up, &h, &mut up, &mut act, false)?;
                            rec.time("activation", || {
                                a.copy_from_slice(&up);
                                match l.activation {
                                    Activation::GeluTanh => ops::gelu_tanh(&mut a),
                                    Activation::Silu => ops::silu(&mut a),
                                }
                            })
                        }
                    }
                    timed_matvec(&mut rec, &k, "ffn_down", w_down, &a, &mut o, &mut act, false)?;
                    if let Some(n) = post_ffn {
                        let tmp = o.clone();
                        rec.time(norm_name(n.kind), || n.apply(&tmp, &mut o));
                    }
                    rec.time("residual add", || ops::add(&mut x, &o));
                }
                rec.time(norm_name(output_norm.kind), || output_norm.apply(&x, &mut h));
                timed_matvec(&mut rec, &k, "output (logits)", &output, &h, &mut logits, &mut act, false)?;
                if let Some(c) = spec.final_logit_softcap {
                    rec.time("logit softcap", || ops::softcap(&mut logits, c));
                }
                token = rec.time("argmax", || crate::bench::argmax(&logits))?;
            }
            Ok(())
        })
        .map_err(|e| e as Box<dyn std::error::Error>)?;

    let steps_f = steps.max(1) as f64;
    let mut out = rec.ops;
    for (o, c) in out.iter_mut().zip(&rec.calls) {
        o.calls_per_step = *c as f64 / steps_f;
        o.bytes_per_step = (o.bytes_per_step as f64 / steps_f) as u64;
    }
    Ok(Profile { steps, threads, kernels: k.level().name().to_string(), ops: out })
}

/// Prints the profile as a markdown table, most expensive op first, with
/// the real decode time per token (`tg_ms`, from the tg test) to compare.
pub fn print_profile(p: &Profile, tg_ms: Option<f64>) {
    let step = p.step_ns();
    println!(
        "decode profile: a replay of {} decode step(s) from position 0, op by op, with infer_compute::cpu's public kernels \
         ({} thread(s), {} kernels); not the fused decode_token path itself",
        p.steps, p.threads, p.kernels
    );
    println!();
    println!(
        "| {:<40} | {:<11} | {:>11} | {:>9} | {:>11} | {:>7} | {:>8} |",
        "op", "type", "shape", "calls/tok", "µs/token", "% step", "GB/s"
    );
    println!("| {:-<40} | {:-<11} | {:->10}: | {:->8}: | {:->10}: | {:->6}: | {:->7}: |", "", "", "", "", "", "", "");
    let mut ops = p.ops.clone();
    ops.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.order.cmp(&b.order)));
    for o in &ops {
        let per_step = o.ns as f64 / p.steps.max(1) as f64;
        let gbps = if o.bytes_per_step > 0 && per_step > 0.0 {
            format!("{:.1}", o.bytes_per_step as f64 / per_step)
        } else {
            "-".into()
        };
        println!(
            "| {:<40} | {:<11} | {:>11} | {:>9} | {:>11.1} | {:>7.1} | {:>8} |",
            o.op,
            o.ty,
            o.shape,
            format!("{:.0}", o.calls_per_step),
            per_step / 1e3,
            100.0 * per_step / step.max(1.0),
            gbps
        );
    }
    println!();
    let matvec_ns: u64 = p.ops.iter().filter(|o| o.op.starts_with("matvec")).map(|o| o.ns).sum();
    println!(
        "replay total: {:.3} ms/token (mat-vecs {:.1} %){}",
        step / 1e6,
        100.0 * matvec_ns as f64 / p.steps.max(1) as f64 / step.max(1.0),
        match tg_ms {
            Some(ms) => format!("; decode_token in the tg test: {ms:.3} ms/token"),
            None => String::new(),
        }
    );
}
