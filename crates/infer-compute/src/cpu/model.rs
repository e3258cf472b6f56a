//! The CPU decode pipeline: a [`ModelSpec`] run layer by layer, with an f32
//! KV cache. Layer matrices are prepared once ([`CpuWeight`]: repacked for
//! the x86-64 packed kernels where they apply, else the memory-mapped GGUF
//! rows); the output projection reads the mapped rows.
//!
//! One forward function serves decode (1 token) and prefill (n tokens
//! batched through each layer with [`products`]), through the same kernel
//! per (row, token), so the two agree bit for bit. Buffers are kept between
//! calls, so decoding allocates nothing once warm.

use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use super::kernels::Kernels;
use super::ops;
use super::team::{Par, Team};
use super::weight::{products, CpuWeight, ProductScratch, Stacked};
use super::Precision;
use crate::backend::{checked_cache, DeviceModel, KvCache, KvState, ModelId, StepProfile};
use crate::error::{Error, Result};
use crate::pipeline::{Activation, FfnType, LayerSpec, ModelSpec, Norm, NormType};
use crate::weight::QuantWeight;
use crate::GgmlType;

/// A norm with its weights dequantized to f32 once (`weight`, `bias`: the
/// normalized dimension's length).
pub struct PreparedNorm {
    pub kind: NormType,
    pub eps: f32,
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

impl PreparedNorm {
    /// Dequantizes `n`'s weights.
    ///
    /// # Errors
    /// Weights of a type without a dequantizer, or inconsistent weights.
    pub fn new(n: &Norm) -> Result<Self> {
        Ok(Self {
            kind: n.kind,
            eps: n.eps,
            weight: n.weight.to_f32()?,
            bias: n.bias.as_ref().map(|b| b.to_f32()).transpose()?,
        })
    }

    /// Normalizes each `weight.len()`-long row of `x` into `out`.
    pub fn apply(&self, x: &[f32], out: &mut [f32]) {
        let dim = self.weight.len();
        for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
            match self.kind {
                NormType::RmsNorm => ops::rms_norm(xr, &self.weight, self.eps, or),
                NormType::LayerNorm => ops::layer_norm(xr, &self.weight, self.bias.as_deref(), self.eps, or),
            }
        }
    }

    /// Normalizes each `dim`-long row of `x` in place (uses `tmp`).
    fn apply_inplace(&self, x: &mut [f32], tmp: &mut Vec<f32>) {
        tmp.clear();
        tmp.extend_from_slice(x);
        self.apply(tmp, x);
    }
}

struct PreparedLayer {
    /// Shapes and options; its weights are not used (see the fields below).
    spec: LayerSpec,
    /// q, k, v: parts 0, 1, 2.
    qkv: Stacked,
    wo: CpuWeight,
    /// Gated FFNs: gate and up (parts 0, 1); otherwise up alone.
    ffn_in: Stacked,
    ffn_down: CpuWeight,
    attn_norm: PreparedNorm,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<PreparedNorm>,
    k_norm: Option<PreparedNorm>,
    post_attn_norm: Option<PreparedNorm>,
    ffn_norm: PreparedNorm,
    post_ffn_norm: Option<PreparedNorm>,
}

/// Per-token work buffers, grown to the largest batch seen.
#[derive(Default)]
struct Buffers {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    /// Stacked products before they are split.
    stacked: Vec<f32>,
    tmp: Vec<f32>,
    scores: Vec<f32>,
    prod: ProductScratch,
}

/// `v` resized to `n` values (a scratch buffer of the forward pass).
fn fit(v: &mut Vec<f32>, n: usize) -> Result<&mut [f32]> {
    crate::memory::resize(v, n, 0.0, "a scratch buffer")?;
    Ok(&mut v[..n])
}

/// A model prepared for the CPU.
pub struct CpuModel {
    id: ModelId,
    n_embd: usize,
    n_vocab: usize,
    token_embd: QuantWeight,
    embd_scale: f32,
    layers: Vec<PreparedLayer>,
    output_norm: PreparedNorm,
    output: CpuWeight,
    final_logit_softcap: Option<f32>,
    kernels: Kernels,
    /// Runs the parallel loops (products, attention) of decode and prefill.
    team: Arc<Team>,
    buf: Buffers,
    logits: Vec<f32>,
}

fn to_f32_weight(w: &QuantWeight) -> Result<QuantWeight> {
    if w.ty == GgmlType::F32 {
        return Ok(w.clone());
    }
    QuantWeight::new(GgmlType::F32, w.rows, w.cols, w.to_f32()?.into())
}

impl CpuModel {
    /// Prepares `spec` (already validated). In [`Precision::Exact`] every
    /// matrix is dequantized to f32 here, once.
    pub fn new(spec: &ModelSpec, kernels: Kernels, team: Arc<Team>, precision: Precision) -> Result<Self> {
        let conv = |w: &QuantWeight| -> Result<QuantWeight> {
            match precision {
                Precision::Quantized => Ok(w.clone()),
                Precision::Exact => to_f32_weight(w),
            }
        };
        let prep = |w: &QuantWeight| CpuWeight::prepare(&kernels, conv(w)?);
        let stack =
            |ws: &[&QuantWeight]| Stacked::prepare(&kernels, ws.iter().map(|w| conv(w)).collect::<Result<_>>()?);
        let opt_f32 = |w: &Option<QuantWeight>| w.as_ref().map(|w| w.to_f32()).transpose();
        let opt_norm = |n: &Option<Norm>| n.as_ref().map(PreparedNorm::new).transpose();
        let mut layers = Vec::with_capacity(spec.layers.len());
        for l in &spec.layers {
            layers.push(PreparedLayer {
                qkv: stack(&[&l.wq, &l.wk, &l.wv])?,
                wo: prep(&l.wo)?,
                ffn_in: match (l.ffn, &l.ffn_gate) {
                    (FfnType::Gated, Some(g)) => stack(&[g, &l.ffn_up])?,
                    _ => stack(&[&l.ffn_up])?,
                },
                ffn_down: prep(&l.ffn_down)?,
                attn_norm: PreparedNorm::new(&l.attn_norm)?,
                bq: opt_f32(&l.bq)?,
                bk: opt_f32(&l.bk)?,
                bv: opt_f32(&l.bv)?,
                q_norm: opt_norm(&l.q_norm)?,
                k_norm: opt_norm(&l.k_norm)?,
                post_attn_norm: opt_norm(&l.post_attn_norm)?,
                ffn_norm: PreparedNorm::new(&l.ffn_norm)?,
                post_ffn_norm: opt_norm(&l.post_ffn_norm)?,
                spec: l.clone(),
            });
        }
        Ok(CpuModel {
            id: ModelId::next(),
            n_embd: spec.n_embd,
            n_vocab: spec.n_vocab,
            token_embd: spec.token_embd.clone(),
            embd_scale: spec.embd_scale,
            layers,
            output_norm: PreparedNorm::new(&spec.output_norm)?,
            // The row dots (four streams per task) read the 49152x576 Q8_0
            // output of SmolLM2-135M at ~30 GB/s, the packed kernel at ~22;
            // and a packed copy would double the memory of a tied embedding.
            output: CpuWeight::unpacked(conv(&spec.output)?)?,
            final_logit_softcap: spec.final_logit_softcap,
            kernels,
            team,
            buf: Buffers::default(),
            logits: crate::memory::zeroed(spec.n_vocab, "the logits")?,
        })
    }

    /// Checks the step, runs `tokens` at positions `pos0..` (timing each
    /// op into `prof` when given), leaves the last position's logits in
    /// `self.logits`.
    fn forward(
        &mut self,
        kv: &mut dyn KvCache,
        tokens: &[u32],
        pos0: usize,
        prof: Option<&mut StepProfile>,
    ) -> Result<()> {
        let cache = checked_cache::<CpuKvCache>(kv, self.id, self.n_vocab, tokens, pos0)?;
        self.forward_inner(cache, tokens, pos0, prof)?;
        cache.state.advance(pos0, tokens.len());
        Ok(())
    }

    fn forward_inner(
        &mut self,
        cache: &mut CpuKvCache,
        tokens: &[u32],
        pos0: usize,
        mut prof: Option<&mut StepProfile>,
    ) -> Result<()> {
        let n = tokens.len();
        let e = self.n_embd;
        let n_ctx = cache.state.n_ctx();
        let k = &self.kernels;
        let par = Par::Team(&self.team);
        let b = &mut self.buf;
        let prof = &mut prof;
        let x = fit(&mut b.x, n * e)?;
        timed(prof, "token_embd", "", || -> Result<()> {
            for (t, &tok) in tokens.iter().enumerate() {
                let row = &mut x[t * e..(t + 1) * e];
                crate::quant::dequantize_row(self.token_embd.ty, self.token_embd.row(tok as usize), row)?;
                if self.embd_scale != 1.0 {
                    ops::scale(row, self.embd_scale);
                }
            }
            Ok(())
        })?;
        for (li, layer) in self.layers.iter().enumerate() {
            let l = &layer.spec;
            let (qd, kvd) = (l.n_head * l.head_dim, l.n_head_kv * l.head_dim);
            let h = fit(&mut b.h, n * e)?;
            timed(prof, "attn_norm", "", || layer.attn_norm.apply(x, h));
            let q = fit(&mut b.q, n * qd)?;
            let kk = fit(&mut b.k, n * kvd)?;
            let v = fit(&mut b.v, n * kvd)?;
            timed_products(prof, "attn_qkv", layer.qkv.mats(), || {
                layer.qkv.products(k, par, &mut [&mut *q, &mut *kk, &mut *v], h, n, &mut b.prod, &mut b.stacked)
            })?;
            if layer.bq.is_some() || layer.bk.is_some() || layer.bv.is_some() {
                timed(prof, "attn_qkv bias", "", || {
                    for (bias, out, d) in
                        [(&layer.bq, &mut *q, qd), (&layer.bk, &mut *kk, kvd), (&layer.bv, &mut *v, kvd)]
                    {
                        if let Some(bias) = bias {
                            out.chunks_exact_mut(d).for_each(|r| ops::add(r, bias));
                        }
                    }
                });
            }
            if layer.q_norm.is_some() || layer.k_norm.is_some() {
                timed(prof, "attn_q_norm, attn_k_norm", "", || {
                    if let Some(nq) = &layer.q_norm {
                        nq.apply_inplace(q, &mut b.tmp);
                    }
                    if let Some(nk) = &layer.k_norm {
                        nk.apply_inplace(kk, &mut b.tmp);
                    }
                });
            }
            timed(prof, "rope, kv append", "", || {
                for t in 0..n {
                    ops::rope(&mut q[t * qd..(t + 1) * qd], l.n_head, l.head_dim, pos0 + t, &l.rope);
                    ops::rope(&mut kk[t * kvd..(t + 1) * kvd], l.n_head_kv, l.head_dim, pos0 + t, &l.rope);
                    ops::kv_append(
                        &mut cache.k[li],
                        &mut cache.v[li],
                        &kk[t * kvd..(t + 1) * kvd],
                        &v[t * kvd..(t + 1) * kvd],
                        pos0 + t,
                        kvd,
                    );
                }
            });
            let p = ops::AttnParams::from_layer(l);
            let attn = fit(&mut b.attn, n * qd)?;
            let scores = fit(&mut b.scores, if n == 1 { l.n_head * n_ctx } else { 0 })?;
            timed(prof, "attention", "", || {
                if n == 1 {
                    ops::attention_decode_on(par, q, &cache.k[li], &cache.v[li], pos0, &p, scores, attn);
                } else {
                    ops::attention_prefill_on(par, q, &cache.k[li], &cache.v[li], pos0, n, &p, attn);
                }
            });
            let o = fit(&mut b.o, n * e)?;
            timed_products(prof, "attn_output", std::slice::from_ref(&layer.wo), || {
                products(k, par, &mut [(&layer.wo, o)], attn, n, &mut b.prod)
            })?;
            if let Some(pn) = &layer.post_attn_norm {
                timed(prof, "post_attention_norm", "", || pn.apply_inplace(o, &mut b.tmp));
            }
            timed(prof, "residual add", "", || ops::add(x, o));

            let h = fit(&mut b.h, n * e)?;
            timed(prof, "ffn_norm", "", || layer.ffn_norm.apply(x, h));
            let n_ff = layer.ffn_in.rows(0);
            let up = fit(&mut b.up, n * n_ff)?;
            let act = fit(&mut b.act, n * n_ff)?;
            let act_name = match l.activation {
                Activation::GeluTanh => "gelu_tanh",
                Activation::Silu => "silu",
            };
            if layer.ffn_in.parts() == 2 {
                let gate = fit(&mut b.gate, n * n_ff)?;
                timed_products(prof, "ffn_gate_up", layer.ffn_in.mats(), || {
                    layer.ffn_in.products(k, par, &mut [&mut *gate, &mut *up], h, n, &mut b.prod, &mut b.stacked)
                })?;
                timed(prof, act_name, "gated", || match l.activation {
                    Activation::GeluTanh => ops::geglu(gate, up, act),
                    Activation::Silu => ops::swiglu(gate, up, act),
                });
            } else {
                timed_products(prof, "ffn_up", layer.ffn_in.mats(), || {
                    layer.ffn_in.products(k, par, &mut [&mut *up], h, n, &mut b.prod, &mut b.stacked)
                })?;
                timed(prof, act_name, "", || {
                    act.copy_from_slice(up);
                    match l.activation {
                        Activation::GeluTanh => ops::gelu_tanh(act),
                        Activation::Silu => ops::silu(act),
                    }
                });
            }
            let o = fit(&mut b.o, n * e)?;
            timed_products(prof, "ffn_down", std::slice::from_ref(&layer.ffn_down), || {
                products(k, par, &mut [(&layer.ffn_down, o)], act, n, &mut b.prod)
            })?;
            if let Some(pn) = &layer.post_ffn_norm {
                timed(prof, "post_ffw_norm", "", || pn.apply_inplace(o, &mut b.tmp));
            }
            timed(prof, "residual add", "", || ops::add(x, o));
        }
        let last = &x[(n - 1) * e..n * e];
        let h = fit(&mut b.h, e)?;
        timed(prof, "output_norm", "", || self.output_norm.apply(last, h));
        let out = &self.output;
        timed_products(prof, "output", std::slice::from_ref(out), || {
            products(k, par, &mut [(out, &mut self.logits[..])], h, 1, &mut b.prod)
        })?;
        if let Some(c) = self.final_logit_softcap {
            timed(prof, "final_logit_softcap", "", || self.logits.iter_mut().for_each(|z| *z = c * (*z / c).tanh()));
        }
        Ok(())
    }
}

/// Runs `f`; when profiling, adds its time to `prof` under `op`.
fn timed<R>(prof: &mut Option<&mut StepProfile>, op: &str, ty: &str, f: impl FnOnce() -> R) -> R {
    timed_with(prof, op, ty, "", 0, f)
}

/// [`timed`] with a shape and the bytes read.
fn timed_with<R>(
    prof: &mut Option<&mut StepProfile>,
    op: &str,
    ty: &str,
    shape: &str,
    bytes: u64,
    f: impl FnOnce() -> R,
) -> R {
    match prof {
        None => f(),
        Some(p) => {
            let t0 = Instant::now();
            let r = f();
            p.record(op, ty, shape, t0.elapsed(), bytes);
            r
        }
    }
}

/// [`timed`] for the products of `ws` sharing one input (named by their
/// types, shapes and bytes).
fn timed_products<R>(prof: &mut Option<&mut StepProfile>, op: &str, ws: &[CpuWeight], f: impl FnOnce() -> R) -> R {
    if prof.is_none() {
        return f();
    }
    let mut tys: Vec<String> = ws.iter().map(|w| w.label()).collect();
    tys.dedup();
    let shape = ws.iter().map(|w| format!("{}x{}", w.rows(), w.cols())).collect::<Vec<_>>().join(",");
    let bytes = ws.iter().map(|w| w.bytes() as u64).sum();
    timed_with(prof, &format!("matvec {op}"), &tys.join(","), &shape, bytes, f)
}

impl DeviceModel for CpuModel {
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn new_kv_cache(&self, n_ctx: usize) -> Result<Box<dyn KvCache>> {
        let state = KvState::new(self.id, n_ctx)?;
        let mut k = Vec::new();
        let mut v = Vec::new();
        for l in &self.layers {
            let kvd = l.spec.n_head_kv * l.spec.head_dim;
            let len = n_ctx.checked_mul(kvd).ok_or(Error::Overflow("KV cache size"))?;
            k.push(crate::memory::zeroed(len, "a KV cache layer (K)")?);
            v.push(crate::memory::zeroed(len, "a KV cache layer (V)")?);
        }
        Ok(Box::new(CpuKvCache { state, k, v }))
    }

    fn decode_token(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<&[f32]> {
        self.forward(kv, &[token], pos, None)?;
        Ok(&self.logits)
    }

    fn prefill(&mut self, kv: &mut dyn KvCache, tokens: &[u32], pos: usize) -> Result<&[f32]> {
        self.forward(kv, tokens, pos, None)?;
        Ok(&self.logits)
    }

    fn profile_step(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<StepProfile> {
        let mut prof = StepProfile::default();
        let t0 = Instant::now();
        self.forward(kv, &[token], pos, Some(&mut prof))?;
        prof.total = t0.elapsed();
        Ok(prof)
    }
}

/// The CPU's KV cache: per layer, K and V as `[n_ctx, n_head_kv, head_dim]`
/// f32.
pub struct CpuKvCache {
    state: KvState,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache for CpuKvCache {
    fn state(&self) -> &KvState {
        &self.state
    }
    fn state_mut(&mut self) -> &mut KvState {
        &mut self.state
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
