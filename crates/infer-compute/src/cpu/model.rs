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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::kernels::{AlignedBytes, Kernels};
use super::matvec;
use super::ops;
use super::weight::{products, CpuWeight, ProductScratch};
use super::Precision;
use crate::backend::{DeviceModel, KvCache, QuantWeight};
use crate::error::{Error, Result};
use crate::pipeline::{Activation, FfnType, LayerSpec, ModelSpec, Norm, NormType};
use crate::GgmlType;

static NEXT_MODEL_ID: AtomicUsize = AtomicUsize::new(1);

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
    wq: CpuWeight,
    wk: CpuWeight,
    wv: CpuWeight,
    wo: CpuWeight,
    ffn_gate: Option<CpuWeight>,
    ffn_up: CpuWeight,
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
    tmp: Vec<f32>,
    scores: Vec<f32>,
    qbuf: AlignedBytes,
    prod: ProductScratch,
}

/// `v` resized to `n` values (a scratch buffer of the forward pass).
fn fit(v: &mut Vec<f32>, n: usize) -> Result<&mut [f32]> {
    crate::memory::resize(v, n, 0.0, "a scratch buffer")?;
    Ok(&mut v[..n])
}

/// A model prepared for the CPU.
pub struct CpuModel {
    id: usize,
    n_embd: usize,
    n_vocab: usize,
    token_embd: QuantWeight,
    embd_scale: f32,
    layers: Vec<PreparedLayer>,
    output_norm: PreparedNorm,
    output: QuantWeight,
    final_logit_softcap: Option<f32>,
    kernels: Kernels,
    pool: Arc<rayon::ThreadPool>,
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
    pub fn new(spec: &ModelSpec, kernels: Kernels, pool: Arc<rayon::ThreadPool>, precision: Precision) -> Result<Self> {
        let conv = |w: &QuantWeight| -> Result<QuantWeight> {
            match precision {
                Precision::Quantized => Ok(w.clone()),
                Precision::Exact => to_f32_weight(w),
            }
        };
        let prep = |w: &QuantWeight| CpuWeight::prepare(&kernels, conv(w)?);
        let opt_f32 = |w: &Option<QuantWeight>| w.as_ref().map(|w| w.to_f32()).transpose();
        let opt_norm = |n: &Option<Norm>| n.as_ref().map(PreparedNorm::new).transpose();
        let mut layers = Vec::with_capacity(spec.layers.len());
        for l in &spec.layers {
            layers.push(PreparedLayer {
                wq: prep(&l.wq)?,
                wk: prep(&l.wk)?,
                wv: prep(&l.wv)?,
                wo: prep(&l.wo)?,
                ffn_gate: l.ffn_gate.as_ref().map(prep).transpose()?,
                ffn_up: prep(&l.ffn_up)?,
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
            id: NEXT_MODEL_ID.fetch_add(1, Ordering::Relaxed),
            n_embd: spec.n_embd,
            n_vocab: spec.n_vocab,
            token_embd: spec.token_embd.clone(),
            embd_scale: spec.embd_scale,
            layers,
            output_norm: PreparedNorm::new(&spec.output_norm)?,
            output: conv(&spec.output)?,
            final_logit_softcap: spec.final_logit_softcap,
            kernels,
            pool,
            buf: Buffers::default(),
            logits: crate::memory::zeroed(spec.n_vocab, "the logits")?,
        })
    }

    /// Runs `tokens` at positions `pos0..`, leaves the last position's
    /// logits in `self.logits`.
    fn forward(&mut self, kv: &mut dyn KvCache, tokens: &[u32], pos0: usize) -> Result<()> {
        let n = tokens.len();
        if n == 0 {
            return Err(crate::error::shape_err("prefill", "no tokens"));
        }
        let cache = match kv.as_any_mut().downcast_mut::<CpuKvCache>() {
            Some(c) if c.model_id == self.id => c,
            _ => return Err(Error::InvalidModel("KV cache was created by another model or backend".into())),
        };
        if pos0 > cache.len {
            return Err(Error::InvalidModel(format!(
                "position {pos0} leaves a gap: the KV cache holds {} position(s)",
                cache.len
            )));
        }
        if pos0 + n > cache.n_ctx {
            return Err(Error::ContextOverflow { pos: pos0, n_tokens: n, n_ctx: cache.n_ctx });
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
            return Err(crate::error::shape_err(
                "decode",
                format!("token id {t} is outside the vocabulary of {}", self.n_vocab),
            ));
        }
        let pool = self.pool.clone();
        pool.install(|| self.forward_inner(cache, tokens, pos0))?;
        cache.len = pos0 + n;
        Ok(())
    }

    fn forward_inner(&mut self, cache: &mut CpuKvCache, tokens: &[u32], pos0: usize) -> Result<()> {
        let n = tokens.len();
        let e = self.n_embd;
        let k = &self.kernels;
        let b = &mut self.buf;
        let x = fit(&mut b.x, n * e)?;
        for (t, &tok) in tokens.iter().enumerate() {
            let row = &mut x[t * e..(t + 1) * e];
            crate::quant::dequantize_row(self.token_embd.ty, self.token_embd.row(tok as usize), row)?;
            if self.embd_scale != 1.0 {
                ops::scale(row, self.embd_scale);
            }
        }
        for (li, layer) in self.layers.iter().enumerate() {
            let l = &layer.spec;
            let (qd, kvd) = (l.n_head * l.head_dim, l.n_head_kv * l.head_dim);
            let h = fit(&mut b.h, n * e)?;
            layer.attn_norm.apply(x, h);
            let q = fit(&mut b.q, n * qd)?;
            let kk = fit(&mut b.k, n * kvd)?;
            let v = fit(&mut b.v, n * kvd)?;
            products(k, &mut [(&layer.wq, &mut *q), (&layer.wk, &mut *kk), (&layer.wv, &mut *v)], h, n, &mut b.prod)?;
            for (bias, out, d) in [(&layer.bq, &mut *q, qd), (&layer.bk, &mut *kk, kvd), (&layer.bv, &mut *v, kvd)] {
                if let Some(bias) = bias {
                    out.chunks_exact_mut(d).for_each(|r| ops::add(r, bias));
                }
            }
            if let Some(nq) = &layer.q_norm {
                nq.apply_inplace(q, &mut b.tmp);
            }
            if let Some(nk) = &layer.k_norm {
                nk.apply_inplace(kk, &mut b.tmp);
            }
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
            let p = ops::AttnParams::from_layer(l);
            let attn = fit(&mut b.attn, n * qd)?;
            if n == 1 {
                let scores = fit(&mut b.scores, l.n_head * cache.n_ctx)?;
                ops::attention_decode(q, &cache.k[li], &cache.v[li], pos0, &p, scores, attn);
            } else {
                ops::attention_prefill(q, &cache.k[li], &cache.v[li], pos0, n, &p, attn);
            }
            let o = fit(&mut b.o, n * e)?;
            products(k, &mut [(&layer.wo, o)], attn, n, &mut b.prod)?;
            if let Some(pn) = &layer.post_attn_norm {
                pn.apply_inplace(o, &mut b.tmp);
            }
            ops::add(x, o);

            let h = fit(&mut b.h, n * e)?;
            layer.ffn_norm.apply(x, h);
            let n_ff = layer.ffn_up.rows();
            let up = fit(&mut b.up, n * n_ff)?;
            let act = fit(&mut b.act, n * n_ff)?;
            match (l.ffn, &layer.ffn_gate) {
                (FfnType::Gated, Some(wg)) => {
                    let gate = fit(&mut b.gate, n * n_ff)?;
                    products(k, &mut [(wg, &mut *gate), (&layer.ffn_up, &mut *up)], h, n, &mut b.prod)?;
                    match l.activation {
                        Activation::GeluTanh => ops::geglu(gate, up, act),
                        Activation::Silu => ops::swiglu(gate, up, act),
                    }
                }
                _ => {
                    products(k, &mut [(&layer.ffn_up, &mut *up)], h, n, &mut b.prod)?;
                    act.copy_from_slice(up);
                    match l.activation {
                        Activation::GeluTanh => ops::gelu_tanh(act),
                        Activation::Silu => ops::silu(act),
                    }
                }
            }
            let o = fit(&mut b.o, n * e)?;
            products(k, &mut [(&layer.ffn_down, o)], act, n, &mut b.prod)?;
            if let Some(pn) = &layer.post_ffn_norm {
                pn.apply_inplace(o, &mut b.tmp);
            }
            ops::add(x, o);
        }
        let last = &x[(n - 1) * e..n * e];
        let h = fit(&mut b.h, e)?;
        self.output_norm.apply(last, h);
        matvec::matvec(k, &self.output, h, &mut self.logits, &mut b.qbuf)?;
        if let Some(c) = self.final_logit_softcap {
            self.logits.iter_mut().for_each(|z| *z = c * (*z / c).tanh());
        }
        Ok(())
    }
}

impl DeviceModel for CpuModel {
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn new_kv_cache(&self, n_ctx: usize) -> Result<Box<dyn KvCache>> {
        if n_ctx == 0 {
            return Err(Error::InvalidModel("a KV cache needs at least one position".into()));
        }
        let mut k = Vec::with_capacity(self.layers.len());
        let mut v = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let kvd = l.spec.n_head_kv * l.spec.head_dim;
            let len = n_ctx.checked_mul(kvd).ok_or(Error::Overflow("KV cache size"))?;
            k.push(crate::memory::zeroed(len, "a KV cache layer (K)")?);
            v.push(crate::memory::zeroed(len, "a KV cache layer (V)")?);
        }
        Ok(Box::new(CpuKvCache { model_id: self.id, n_ctx, len: 0, k, v }))
    }

    fn decode_token(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<&[f32]> {
        self.forward(kv, &[token], pos)?;
        Ok(&self.logits)
    }

    fn prefill(&mut self, kv: &mut dyn KvCache, tokens: &[u32], pos: usize) -> Result<&[f32]> {
        self.forward(kv, tokens, pos)?;
        Ok(&self.logits)
    }
}

/// The CPU's KV cache: per layer, K and V as `[n_ctx, n_head_kv, head_dim]`
/// f32.
pub struct CpuKvCache {
    model_id: usize,
    n_ctx: usize,
    /// Positions filled so far.
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache for CpuKvCache {
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
