//! The CPU decode pipeline: a [`ModelSpec`] run layer by layer over a
//! [`Batch`], with a KV pool of any [`KvTypes`] (f16 by default). Layer matrices and the output are prepared once
//! ([`CpuWeight`]: repacked for the x86-64 packed kernels where they apply,
//! else the memory-mapped GGUF rows) into [`Weights`], shared by every
//! context of the model; the embedding lookups read the mapped rows.
//!
//! One forward function serves every batch: a decode step (1 token),
//! prefill (n tokens of one sequence) and any mix of sequences, all batched
//! through each layer's products with [`products`] (the same kernel per
//! (row, token)), each token's RoPE at its own position, its K/V appended
//! to its slot, and attention per token over its slot (the same per-head
//! code in decode and prefill), so a token's logits have the same bits
//! whatever else is in its batch. Buffers are kept between calls, so
//! decoding allocates nothing once warm.

use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use super::kernels::Kernels;
use super::kv_cache::{KvBuf, KvData};
use super::kv_rotation::KvRotation;
use super::ops;
use super::team::{Par, Team};
use super::weight::{products, CpuWeight, ProductScratch, Stacked};
use super::Precision;
use crate::backend::{
    advance_spans, checked_pool, new_states, rollback_spans, Batch, DeviceModel, KvPool, KvState, ModelId, Span,
    StepProfile,
};
use crate::error::Result;
use crate::kv_type::KvTypes;
use crate::pipeline::{Activation, FfnType, LayerSpec, ModelSpec, Norm, NormType};
use crate::turboquant::ChannelScale;
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

/// A model's prepared weights, shared (read-only) by all its contexts.
struct Weights {
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
    /// The pool types of [`DeviceModel::new_kv_pool`]: f16, or f32 in
    /// [`Precision::Exact`] (so the exact forward pass stays exact).
    default_kv: KvTypes,
}

/// A model prepared for the CPU: shared weights and one context's
/// scratch.
pub struct CpuModel {
    w: Arc<Weights>,
    /// Runs the parallel loops (products, attention) of decode and prefill
    /// (shared by the backend's models; one loop at a time).
    team: Arc<Team>,
    /// The residual stream, `[n_tokens][n_embd]`.
    x: Vec<f32>,
    buf: Buffers,
    /// The step's output rows, `n_outputs × n_vocab`.
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
        let w = Weights {
            id: ModelId::next(),
            n_embd: spec.n_embd,
            n_vocab: spec.n_vocab,
            token_embd: spec.token_embd.clone(),
            embd_scale: spec.embd_scale,
            layers,
            output_norm: PreparedNorm::new(&spec.output_norm)?,
            // Packed like the layers: a step with several output rows (a
            // batch of sequences) shares each unpacked weight vector among
            // its tokens (the row dots take one row and one token at a
            // time, which made the vocabulary product 60% of a 16-sequence
            // step of Gemma 3 270M). A tied embedding keeps its GGUF rows
            // for the lookups, so the packed copy adds its size in memory.
            output: prep(&spec.output)?,
            final_logit_softcap: spec.final_logit_softcap,
            kernels,
            default_kv: match precision {
                Precision::Quantized => KvTypes::default(),
                Precision::Exact => KvTypes::both(crate::KvCacheType::F32),
            },
        };
        Ok(CpuModel {
            logits: crate::memory::zeroed(spec.n_vocab, "the logits")?,
            w: Arc::new(w),
            team,
            x: Vec::new(),
            buf: Buffers::default(),
        })
    }

    /// Checks the step, runs `batch` (timing each op into `prof` when
    /// given), leaves the wanted rows' logits in `self.logits`, and returns
    /// how many rows there are.
    fn step(&mut self, pool: &mut dyn KvPool, batch: &Batch, prof: Option<&mut StepProfile>) -> Result<usize> {
        let (pool, spans) = checked_pool::<CpuKvPool>(pool, self.w.id, self.w.n_vocab, batch)?;
        match self.run(pool, batch, &spans, prof) {
            Ok(n_out) => {
                advance_spans(&mut pool.states, &spans);
                Ok(n_out)
            }
            Err(e) => {
                rollback_spans(&mut pool.states, &spans);
                Err(e)
            }
        }
    }

    fn run(
        &mut self,
        pool: &mut CpuKvPool,
        batch: &Batch,
        spans: &[Span],
        mut prof: Option<&mut StepProfile>,
    ) -> Result<usize> {
        let tokens = batch.tokens();
        let n = tokens.len();
        let wt = &*self.w;
        let e = wt.n_embd;
        let k = &wt.kernels;
        let par = Par::Team(&self.team);
        let b = &mut self.buf;
        let prof = &mut prof;
        let x = fit(&mut self.x, n * e)?;
        timed(prof, "token_embd", "", || -> Result<()> {
            for (t, &tok) in tokens.iter().enumerate() {
                let row = &mut x[t * e..(t + 1) * e];
                crate::quant::dequantize_row(wt.token_embd.ty, wt.token_embd.row(tok as usize), row)?;
                if wt.embd_scale != 1.0 {
                    ops::scale(row, wt.embd_scale);
                }
            }
            Ok(())
        })?;
        for (li, layer) in wt.layers.iter().enumerate() {
            attention_half(layer, li, x, b, pool, batch, spans, k, par, prof)?;
            ffn_half(layer, x, b, n, k, par, prof)?;
        }
        // The wanted rows only: normed into consecutive rows of `h`.
        let n_out = batch.n_outputs();
        if n_out == 0 {
            return Ok(0);
        }
        let nv = wt.n_vocab;
        let h = fit(&mut b.h, n_out * e)?;
        timed(prof, "output_norm", "", || {
            for (r, t) in batch.output_indices().enumerate() {
                wt.output_norm.apply(&x[t * e..(t + 1) * e], &mut h[r * e..(r + 1) * e]);
            }
        });
        let logits = fit(&mut self.logits, n_out * nv)?;
        let out = &wt.output;
        timed_products(prof, "output", std::slice::from_ref(out), || {
            products(k, par, &mut [(out, &mut *logits)], h, n_out, &mut b.prod)
        })?;
        if let Some(c) = wt.final_logit_softcap {
            timed(prof, "final_logit_softcap", "", || logits.iter_mut().for_each(|z| *z = c * (*z / c).tanh()));
        }
        Ok(n_out)
    }
}
/// One layer's attention half over the batch's `n` tokens (`x`: `[n][n_embd]`
/// rows, updated in place): `x += post_norm(W_o · attention(rope(W_qkv ·
/// norm(x))))`, each token's k and v appended to its slot of `pool` at its
/// position before the attention of its span reads them.
#[allow(clippy::too_many_arguments)]
fn attention_half(
    layer: &PreparedLayer,
    li: usize,
    x: &mut [f32],
    b: &mut Buffers,
    pool: &mut CpuKvPool,
    batch: &Batch,
    spans: &[Span],
    k: &Kernels,
    par: Par,
    prof: &mut Option<&mut StepProfile>,
) -> Result<()> {
    let (pos, slot) = (batch.positions(), batch.slots());
    let n = batch.tokens().len();
    // n_embd: the length of the norm's weights.
    let e = layer.attn_norm.weight.len();
    let n_ctx = pool.n_ctx;
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
            for (bias, out, d) in [(&layer.bq, &mut *q, qd), (&layer.bk, &mut *kk, kvd), (&layer.bv, &mut *v, kvd)] {
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
    let slot_len = n_ctx * kvd;
    timed(prof, "rope, kv append", "", || {
        for t in 0..n {
            let q = &mut q[t * qd..(t + 1) * qd];
            let (kr, vr) = (&mut kk[t * kvd..(t + 1) * kvd], &mut v[t * kvd..(t + 1) * kvd]);
            ops::rope(q, l.n_head, l.head_dim, pos[t], &l.rope);
            ops::rope(kr, l.n_head_kv, l.head_dim, pos[t], &l.rope);
            pool.append(li, q, kr, vr, slot[t], pos[t]);
        }
    });
    let p = ops::AttnParams::from_layer(l);
    let attn = fit(&mut b.attn, n * qd)?;
    let scores = fit(&mut b.scores, if n == 1 { l.n_head * n_ctx } else { 0 })?;
    let windowed = pool.k[li].window() > 0 || pool.v[li].window() > 0;
    let (kl, vl) = (&mut pool.k[li], &mut pool.v[li]);
    timed(prof, "attention", "", || {
        if windowed {
            let fresh = (&kk[..n * kvd], &v[..n * kvd]);
            super::tq_window::attend_windowed(par, q, (kl, vl), fresh, n_ctx, spans, &p, attn);
        } else {
            attend(par, q, (kl.view(), vl.view()), slot_len, (slot, pos), spans, &p, scores, attn);
        }
        // Rotated values sum to a rotated output: back to the model's basis.
        if let Some(r) = &pool.v_rot[li] {
            r.unrotate_output(attn);
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

    Ok(())
}

/// One layer's feed-forward half over `n` tokens: `x += post_norm(W_down ·
/// act(W_gate · norm(x)) ⊙ (W_up · norm(x)))` (ungated: `act(W_up · h)`).
fn ffn_half(
    layer: &PreparedLayer,
    x: &mut [f32],
    b: &mut Buffers,
    n: usize,
    k: &Kernels,
    par: Par,
    prof: &mut Option<&mut StepProfile>,
) -> Result<()> {
    let l = &layer.spec;
    let e = layer.ffn_norm.weight.len();
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
    Ok(())
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
        self.w.n_vocab
    }

    /// f16 keys and values, or f32 in [`Precision::Exact`].
    fn default_kv_types(&self) -> KvTypes {
        self.w.default_kv
    }

    fn new_kv_pool_typed(&self, n_slots: usize, n_ctx: usize, types: KvTypes) -> Result<Box<dyn KvPool>> {
        for l in &self.w.layers {
            types.k.check_head_dim(l.spec.head_dim)?;
            types.v.check_head_dim(l.spec.head_dim)?;
        }
        let heads = self.w.layers.iter().map(|l| (l.spec.n_head_kv, l.spec.head_dim));
        let states = new_states(self.w.id, n_slots, n_ctx, heads.clone().map(|(n, d)| n * d).max().unwrap_or(0))?;
        let bytes_per_token = types.bytes_per_token(heads)?;
        let (mut k, mut v, mut k_rot, mut v_rot) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for l in &self.w.layers {
            let (hd, nh) = (l.spec.head_dim, l.spec.n_head_kv);
            let (kb, vb) = (
                KvBuf::zeroed_slots(types.k, n_slots, n_ctx, (nh, hd), "a KV cache layer (K)")?,
                KvBuf::zeroed_slots(types.v, n_slots, n_ctx, (nh, hd), "a KV cache layer (V)")?,
            );
            let (lq, lk) = (&l.q_norm, &l.k_norm);
            let scale = lq.as_ref().zip(lk.as_ref()).and_then(|(q, k)| {
                ChannelScale::from_qk_norms(&q.weight, &k.weight, &l.spec.rope)
                    .filter(|_| q.bias.is_none() && k.bias.is_none())
            });
            k_rot.push(KvRotation::for_keys(types.k, hd, kb.turboquant()).map(|r| r.with_scale(scale)));
            let v_scale = match vb.turboquant() {
                Some(_) => ChannelScale::for_values(&l.spec.wv, &l.attn_norm.weight, hd)?,
                None => None,
            };
            v_rot.push(KvRotation::for_values(types.v, hd, vb.turboquant()).map(|r| r.with_scale(v_scale)));
            k.push(kb);
            v.push(vb);
        }
        Ok(Box::new(CpuKvPool { states, n_ctx, types, bytes_per_token, k, v, k_rot, v_rot }))
    }

    fn forward(&mut self, pool: &mut dyn KvPool, batch: &Batch) -> Result<&[f32]> {
        let n_out = self.step(pool, batch, None)?;
        Ok(&self.logits[..n_out * self.w.n_vocab])
    }

    fn new_context(&self) -> Result<Box<dyn DeviceModel>> {
        Ok(Box::new(CpuModel {
            w: self.w.clone(),
            team: self.team.clone(),
            x: Vec::new(),
            buf: Buffers::default(),
            logits: crate::memory::zeroed(self.w.n_vocab, "the logits")?,
        }))
    }

    fn profile_forward(&mut self, pool: &mut dyn KvPool, batch: &Batch) -> Result<StepProfile> {
        let mut prof = StepProfile::default();
        let t0 = Instant::now();
        self.step(pool, batch, Some(&mut prof))?;
        prof.total = t0.elapsed();
        Ok(prof)
    }
}

/// The CPU's KV pool: per layer, K and V as `[n_slots][n_ctx][n_head_kv]
/// [head_dim]` values of `types.k`, `types.v` (slot `s` at value
/// `s · n_ctx · kv_dim`; see [`KvBuf`] for the types' layouts), the rows
/// of a quantized type stored rotated ([`KvRotation`]).
pub struct CpuKvPool {
    states: Vec<KvState>,
    n_ctx: usize,
    types: KvTypes,
    bytes_per_token: u64,
    k: Vec<KvBuf>,
    v: Vec<KvBuf>,
    /// Per layer, how K and V rows are rotated before they are stored.
    k_rot: Vec<Option<KvRotation>>,
    v_rot: Vec<Option<KvRotation>>,
}

impl CpuKvPool {
    /// Stores one token's key and value rows (after RoPE) at `pos` of
    /// `slot` in layer `li`, in the cache's basis: rotated for a quantized
    /// type, with the query that meets them (`q`, rotated in place too). A
    /// TurboQuant cache keeps the slot's first positions exact and codes
    /// the others less the slot's centre, which reading adds back
    /// ([`KvBuf`]'s module docs).
    fn append(&mut self, li: usize, q: &mut [f32], k: &mut [f32], v: &mut [f32], slot: usize, pos: usize) {
        if let Some(r) = &self.k_rot[li] {
            r.rotate_queries(q);
            r.rotate_stored(k);
        }
        if let Some(r) = &self.v_rot[li] {
            r.rotate_stored(v);
        }
        let kvd = k.len();
        let at = (slot * self.n_ctx + pos) * kvd;
        self.k[li].write_row(at, k);
        self.v[li].write_row(at, v);
    }
}

impl KvPool for CpuKvPool {
    fn states(&self) -> &[KvState] {
        &self.states
    }
    fn states_mut(&mut self) -> &mut [KvState] {
        &mut self.states
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn copy_positions(&mut self, from: usize, to: usize, n: usize) -> Result<()> {
        let n_slots = self.states.len();
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            let slot_len = layer.view().len() / n_slots;
            let row = slot_len / self.n_ctx;
            layer.copy_within(from * slot_len, n * row, to * slot_len);
        }
        Ok(())
    }
    fn types(&self) -> KvTypes {
        self.types
    }
    fn bytes_per_token(&self) -> u64 {
        self.bytes_per_token
    }
}

/// Attention of a batch over the pool's caches `kv` (`slot_len` values per
/// slot). One token not deep in its cache runs the decode kernel (no
/// allocation; `scores` holds its logits). A prompt chunk, or a token deep
/// in its cache ([`ops::attn_tiled::runs_tiled`]), runs the tiled kernel,
/// which reads each key block once for all its tokens and the heads of a kv
/// group; the other tokens run the per-token code of
/// [`ops::attention_batch_on`] (the decode kernel's per-head code), all
/// together when no span runs tiled.
#[allow(clippy::too_many_arguments)]
fn attend(
    par: Par<'_>,
    q: &[f32],
    kv: (KvData<'_>, KvData<'_>),
    slot_len: usize,
    (slot, pos): (&[usize], &[usize]),
    spans: &[Span],
    p: &ops::AttnParams,
    scores: &mut [f32],
    attn: &mut [f32],
) {
    let (kp, vp) = kv;
    let long = |s: &Span| ops::attn_tiled::runs_tiled(p, s.pos0, s.len);
    if let [s] = spans {
        if s.len == 1 && !long(s) {
            let (kc, vc) = (kp.sub(s.slot * slot_len, slot_len), vp.sub(s.slot * slot_len, slot_len));
            ops::attention_decode_on(par, q, kc, vc, s.pos0, p, scores, attn);
            return;
        }
    }
    if !spans.iter().any(long) {
        ops::attention_batch_on(par, q, kp, vp, slot_len, slot, pos, p, attn);
        return;
    }
    let qd = p.q_dim();
    for s in spans {
        let (t0, t1) = (s.start, s.start + s.len);
        let (q, out) = (&q[t0 * qd..t1 * qd], &mut attn[t0 * qd..t1 * qd]);
        if long(s) {
            let (kc, vc) = (kp.sub(s.slot * slot_len, slot_len), vp.sub(s.slot * slot_len, slot_len));
            ops::attention_tiled_on(par, q, kc, vc, s.pos0, s.len, p, out);
        } else {
            ops::attention_batch_on(par, q, kp, vp, slot_len, &slot[t0..t1], &pos[t0..t1], p, out);
        }
    }
}

#[cfg(test)]
mod tq_cache_tests {
    use super::*;
    use crate::backend::ComputeBackend;
    use crate::conformance::model::{random_model, Arch};
    use crate::cpu::CpuBackend;
    use crate::kv_type::{KvCacheType, TQ_EXACT_POSITIONS};

    fn toks(seed: u32, n: usize, vocab: usize) -> Vec<u32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                (s >> 8) % vocab as u32
            })
            .collect()
    }

    /// Every value of every layer's K and V in slot 0, positions `0..n`,
    /// as attention reads it.
    fn contents(kv: &mut dyn KvPool, n: usize) -> Vec<u32> {
        let pool = kv.as_any_mut().downcast_mut::<CpuKvPool>().expect("a CPU pool");
        let mut out = Vec::new();
        for b in pool.k.iter().chain(&pool.v) {
            let mut x = vec![0.0f32; b.view().len() / pool.n_ctx * n];
            b.view().to_f32(0, &mut x);
            out.extend(x.iter().map(|v| v.to_bits()));
        }
        out
    }

    /// Prefills `toks` from `pos` in chunks of `chunks` (cycled; 1 is
    /// token by token) and returns the last logits.
    fn feed(m: &mut dyn DeviceModel, kv: &mut dyn KvPool, toks: &[u32], pos: usize, chunks: &[usize]) -> Vec<f32> {
        let (mut i, mut last) = (0, Vec::new());
        for &c in chunks.iter().cycle() {
            if i == toks.len() {
                break;
            }
            let n = c.min(toks.len() - i);
            last = m.prefill(kv, &toks[i..i + n], pos + i).unwrap().to_vec();
            i += n;
        }
        last
    }

    /// A prompt prefilled into a TurboQuant cache at once, in uneven
    /// chunks (one ending inside the exact positions, one at their end)
    /// and token by token stores the same bits, on the Llama, Gemma 3 and
    /// Gemma 2 (soft-capped) shapes; the last token's logits then differ
    /// only by the attention kernels' rounding (each chunking runs other
    /// kernels: 2.4e-7 at most seen, on the single-token one). 40
    /// positions are all inside the recent window; the merge of recent and
    /// older rows is `cpu::tq_window`'s test (past the window, a chunking's
    /// rounding can move one value across a code boundary, and such a
    /// flip carries through the later layers of a random model).
    #[test]
    fn a_turboquant_cache_stores_the_same_bits_in_any_chunks() {
        let b = CpuBackend::new();
        for arch in [Arch::LlamaBias, Arch::Gemma3, Arch::Gemma2Caps] {
            let spec = random_model(41, arch);
            let mut m = b.prepare(&spec).unwrap();
            let t = toks(7, 40, spec.n_vocab);
            for types in [KvTypes::both(KvCacheType::Tq4), KvTypes { k: KvCacheType::Tq3, v: KvCacheType::Tq4 }] {
                let mut runs = Vec::new();
                for chunks in [&[40usize][..], &[5, 11, 3, 21], &[TQ_EXACT_POSITIONS, 7], &[1]] {
                    let mut kv = m.new_kv_cache_typed(48, types).unwrap();
                    let logits = feed(m.as_mut(), kv.as_mut(), &t, 0, chunks);
                    runs.push((chunks, logits, contents(kv.as_mut(), 40)));
                }
                let (_, l0, c0) = &runs[0];
                let big = l0.iter().fold(1.0f32, |a, v| a.max(v.abs()));
                for (chunks, l, c) in &runs[1..] {
                    assert!(c == c0, "{arch:?} {types}: chunks {chunks:?} stored other bits than one chunk");
                    let d = l.iter().zip(l0).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                    assert!(d <= 1e-5 * big, "{arch:?} {types}: chunks {chunks:?}: logits differ by {d}");
                }
            }
        }
    }

    /// Truncating a TurboQuant slot below its exact positions (its centre
    /// is then set again from the new rows) or past them, then going on
    /// with other tokens, stores what a fresh cache of those tokens does.
    #[test]
    fn a_turboquant_cache_truncated_across_its_exact_positions_equals_a_fresh_one() {
        let b = CpuBackend::new();
        let spec = random_model(43, Arch::LlamaBias);
        let mut m = b.prepare(&spec).unwrap();
        let (a, other) = (toks(1, 40, spec.n_vocab), toks(2, 40, spec.n_vocab));
        let types = KvTypes { k: KvCacheType::Tq4, v: KvCacheType::Tq3 };
        for keep in [0, 3, TQ_EXACT_POSITIONS - 1, TQ_EXACT_POSITIONS, 25] {
            let mut kv = m.new_kv_cache_typed(48, types).unwrap();
            feed(m.as_mut(), kv.as_mut(), &a, 0, &[40]);
            kv.truncate(0, keep).unwrap();
            let mut want_toks = a[..keep].to_vec();
            want_toks.extend_from_slice(&other[keep..]);
            let got = feed(m.as_mut(), kv.as_mut(), &want_toks[keep..], keep, &[40]);
            let mut fresh = m.new_kv_cache_typed(48, types).unwrap();
            let want = feed(m.as_mut(), fresh.as_mut(), &want_toks[..keep], 0, &[40]);
            let want = if keep < 40 { feed(m.as_mut(), fresh.as_mut(), &want_toks[keep..], keep, &[40]) } else { want };
            assert!(
                contents(kv.as_mut(), 40) == contents(fresh.as_mut(), 40),
                "kept {keep}: other bits than a fresh cache"
            );
            assert_eq!(got, want, "kept {keep}");
        }
    }
}
