//! The wgpu pipeline: a [`ModelSpec`] uploaded once ([`Weights`], shared by
//! every context), a KV pool on the device ([`WgpuKvPool`]), and one
//! command buffer per pass of a forward step (`forward.rs`).
//!
//! A [`Batch`] runs in passes of at most the scratch capacity (256 tokens,
//! fewer where a binding would pass the adapter's limit); each token
//! carries its own position and slot into the kernels, so decode steps and
//! prompt chunks of different slots mix freely in one pass. Per layer:
//!
//! | step | kernel |
//! | --- | --- |
//! | residual add (+ post-norm) fused with the next norm | `residual_norm` |
//! | q, k, v projections | `matvec` (per weight type; tiles of 4 tokens, or `matvec_tiled` from 8 tokens) |
//! | bias, q/k RMSNorm, RoPE, K/V append | `rope` |
//! | TurboQuant K or V: the slots' centres, the codes | `tq_centre`, `tq_encode` |
//! | GQA attention over the slot (softcap, sliding window) | `attention` |
//! | TurboQuant K or V: the ring of recent rows | `tq_keep` |
//! | output projection | `matvec` |
//! | gate and up, gated activation | `matvec_glu` on the stacked gate/up matrix (decode); its two row ranges by `matvec`, then `glu` (prefill, or gate and up of two types); `matvec`, `act` (plain FFN) |
//! | down projection | `matvec` |
//!
//! then the wanted rows gathered (`gather`) and the vocabulary product
//! (`matvec` over the row blocks of the output matrix, soft-capped in its
//! epilogue). KV pool ([`WgpuKvPool`]): K and V each f32, f16 (the
//! default), q8_0, q4_0, tq3 or tq4, `[n_slots][n_ctx]` rows of a
//! position's `n_head_kv · head_dim` values per layer; `rope` stores a
//! quantized type's rows rotated (with the queries that meet them) and
//! `attention` rotates the output of rotated values back. A TurboQuant
//! cache takes three more kernels (`tq_cache.wgsl`): after `rope`, its
//! slots' centres (`tq_centre`) and its codes (`tq_encode`); after
//! `attention`, its ring of recent rows (`tq_keep`).

use std::sync::Arc;

use super::context::Gpu;
use super::kv_pool::WgpuKvPool;
use super::weights::{binding_limit, check_type, DevWeight};
use crate::backend::{advance_spans, checked_pool, rollback_spans, Batch, DeviceModel, KvPool, ModelId, StepProfile};
use crate::error::{Error, Result};
use crate::pipeline::{Activation, FfnType, ModelSpec, Norm, NormType, RopeType};
use crate::turboquant::ChannelScale;
use crate::{GgmlType, KvCacheType, KvTypes};

mod forward;

/// Tokens per pass at most (fewer when a scratch binding would not fit):
/// enough workgroups of the tiled product (16 rows × 16 tokens each) to
/// fill a large GPU; 64 left most of the H200's 132 SMs idle.
pub const PASS_TOKENS: usize = 256;
/// Largest head_dim of the kernels (`MAX_HD` in `rope.wgsl`).
const MAX_HEAD_DIM: usize = 512;

/// A norm's weights (and bias) in f32 on the device.
pub(super) struct DevNorm {
    pub layer_norm: bool,
    pub eps: f32,
    pub w: wgpu::Buffer,
    pub b: Option<wgpu::Buffer>,
}

impl DevNorm {
    fn new(gpu: &Gpu, n: &Norm, what: &str) -> Result<Self> {
        let b = n.bias.as_ref().map(|b| gpu.upload_f32(what, &b.to_f32()?)).transpose()?;
        Ok(DevNorm {
            layer_norm: n.kind == NormType::LayerNorm,
            eps: n.eps,
            w: gpu.upload_f32(what, &n.weight.to_f32()?)?,
            b,
        })
    }
}

pub(super) struct DevLayer {
    pub n_head: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub n_rot: usize,
    pub neox: bool,
    pub theta_scale: f32,
    pub freq_scale: f32,
    /// 0: global attention.
    pub window: u32,
    /// 0: none.
    pub softcap: f32,
    pub scale: f32,
    pub attn_norm: DevNorm,
    pub wq: DevWeight,
    pub wk: DevWeight,
    pub wv: DevWeight,
    pub wo: DevWeight,
    /// q, k and v biases end to end (zeros for an absent one).
    pub bias: Option<wgpu::Buffer>,
    pub q_norm: Option<DevNorm>,
    pub k_norm: Option<DevNorm>,
    pub post_attn_norm: Option<DevNorm>,
    pub ffn_norm: DevNorm,
    pub gelu: bool,
    pub ffn_in: FfnIn,
    pub down: DevWeight,
    pub post_ffn_norm: Option<DevNorm>,
    /// The per-channel scale of TurboQuant keys from the q and k norms'
    /// gains, as the CPU's (`ChannelScale`).
    pub key_scale: Option<ChannelScale>,
    /// The per-channel scale of TurboQuant values from `wv` and the
    /// attention norm's gain, as the CPU's.
    pub value_scale: Option<ChannelScale>,
}

/// The products of a layer's FFN input.
pub(super) enum FfnIn {
    /// Gate and up of one type and width, stacked (`n_ff` gate rows, then
    /// `n_ff` up rows): one `main_glu` dispatch in decode, two row ranges
    /// of one matrix in prefill.
    Stacked { w: DevWeight, n_ff: usize },
    /// Gate (when gated) and up apart.
    Apart { gate: Option<DevWeight>, up: DevWeight },
}

impl FfnIn {
    /// Bytes uploaded.
    fn bytes(&self) -> usize {
        match self {
            FfnIn::Stacked { w, .. } => w.bytes,
            FfnIn::Apart { gate, up } => up.bytes + gate.as_ref().map_or(0, |g| g.bytes),
        }
    }
}

/// A model's weights on the device, shared (read-only) by every context.
pub(super) struct Weights {
    pub id: ModelId,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub token_embd: DevWeight,
    pub embd_scale: f32,
    pub layers: Vec<DevLayer>,
    pub output_norm: DevNorm,
    pub output: DevWeight,
    /// 0: none.
    pub final_softcap: f32,
    pub max_q: usize,
    pub max_kv: usize,
    pub max_ff: usize,
    pub max_heads: usize,
    /// Bytes of the matrices one token reads.
    pub weight_bytes: usize,
}

/// Whether the kernels can run `spec` on `gpu` (see
/// [`crate::ComputeBackend::supports`]): every matrix's type has a kernel,
/// post-norms and q/k norms are RMSNorms without bias, head_dim is at most
/// 512, and a row of logits fits one binding.
///
/// # Errors
/// [`Error::UnsupportedModel`] naming the first tensor or limit.
pub(super) fn supports(gpu: &Gpu, spec: &ModelSpec) -> Result<()> {
    let unsupported = |t: &str, what: &str| Err(Error::UnsupportedModel(format!("{t}: the wgpu backend {what}")));
    let typed = |name: &str, ty| match check_type(ty) {
        Ok(()) => Ok(()),
        Err(_) => unsupported(name, &format!("has no kernel for {}", GgmlType::name(ty))),
    };
    for (i, l) in spec.layers.iter().enumerate() {
        let p = |s: &str| format!("blk.{i}.{s}");
        if l.head_dim > MAX_HEAD_DIM || l.head_dim % 2 == 1 {
            // The cache holds values in pairs (`shaders/kv/`).
            return unsupported(&p("attn_q"), &format!("supports even head_dim up to {MAX_HEAD_DIM}"));
        }
        for (name, n) in [("post_attention_norm", &l.post_attn_norm), ("post_ffw_norm", &l.post_ffn_norm)] {
            if n.as_ref().is_some_and(|n| n.kind != NormType::RmsNorm || n.bias.is_some()) {
                return unsupported(&p(name), "supports RMSNorm post-norms only");
            }
        }
        for (name, n) in [("attn_q_norm", &l.q_norm), ("attn_k_norm", &l.k_norm)] {
            if n.as_ref().is_some_and(|n| n.kind != NormType::RmsNorm || n.bias.is_some()) {
                return unsupported(&p(name), "supports RMSNorm q/k norms only");
            }
        }
        let mats =
            [("attn_q", Some(&l.wq)), ("attn_k", Some(&l.wk)), ("attn_v", Some(&l.wv)), ("attn_output", Some(&l.wo))];
        let ffn = [("ffn_up", Some(&l.ffn_up)), ("ffn_down", Some(&l.ffn_down)), ("ffn_gate", l.ffn_gate.as_ref())];
        for (name, w) in mats.into_iter().chain(ffn) {
            if let Some(w) = w {
                typed(&p(name), w.ty)?;
            }
        }
    }
    typed("token_embd", spec.token_embd.ty)?;
    typed("output", spec.output.ty)?;
    if (spec.n_vocab as u64) * 4 > binding_limit(gpu) {
        return Err(Error::UnsupportedModel(format!(
            "a row of {} logits exceeds the adapter's max_storage_buffer_binding_size of {} bytes",
            spec.n_vocab, gpu.caps.max_storage_binding
        )));
    }
    Ok(())
}

/// A model prepared on a wgpu device: shared weights and one context's
/// scratch and logits.
pub struct WgpuModel {
    pub(super) gpu: Arc<Gpu>,
    pub(super) w: Arc<Weights>,
    pub(super) scratch: Option<forward::Scratch>,
    /// The last pass's bind groups, reused by the next identical pass.
    pub(super) binds: super::step::BindCache,
    /// The next decode pass, encoded while the last one ran
    /// (`forward::Ahead`).
    pub(super) ahead: Option<forward::Ahead>,
    pub(super) logits: Vec<f32>,
}

fn opt_norm(gpu: &Gpu, n: &Option<Norm>, what: &str) -> Result<Option<DevNorm>> {
    n.as_ref().map(|n| DevNorm::new(gpu, n, what)).transpose()
}

impl WgpuModel {
    /// Validates `spec` and uploads its weights.
    pub(super) fn new(gpu: Arc<Gpu>, spec: &ModelSpec) -> Result<Self> {
        spec.validate()?;
        supports(&gpu, spec)?;
        let g = &*gpu;
        let mut layers = Vec::with_capacity(spec.layers.len());
        let (mut max_q, mut max_kv, mut max_ff, mut max_heads) = (0, 0, 0, 0);
        let mut weight_bytes = 0;
        for (i, l) in spec.layers.iter().enumerate() {
            let p = |s: &str| format!("blk.{i}.{s}");
            let (q_dim, kv_dim) = (l.n_head * l.head_dim, l.n_head_kv * l.head_dim);
            max_q = max_q.max(q_dim);
            max_kv = max_kv.max(kv_dim);
            max_ff = max_ff.max(l.ffn_up.rows);
            max_heads = max_heads.max(l.n_head);
            let bias = if l.bq.is_some() || l.bk.is_some() || l.bv.is_some() {
                let mut b = Vec::with_capacity(q_dim + 2 * kv_dim);
                for (bias, n) in [(&l.bq, q_dim), (&l.bk, kv_dim), (&l.bv, kv_dim)] {
                    match bias {
                        Some(w) => b.extend(w.to_f32()?),
                        None => b.resize(b.len() + n, 0.0),
                    }
                }
                Some(g.upload_f32(&p("attn_qkv.bias"), &b)?)
            } else {
                None
            };
            let mat = |w, name: &str| DevWeight::upload(g, w, &p(name));
            let key_scale = match (&l.q_norm, &l.k_norm) {
                (Some(q), Some(k)) if q.bias.is_none() && k.bias.is_none() => {
                    ChannelScale::from_qk_norms(&q.weight.to_f32()?, &k.weight.to_f32()?, &l.rope)
                }
                _ => None,
            };
            let gated = l.ffn == FfnType::Gated;
            let layer = DevLayer {
                n_head: l.n_head,
                n_kv: l.n_head_kv,
                hd: l.head_dim,
                n_rot: l.rope.n_rot,
                neox: l.rope.kind == RopeType::NeoX,
                theta_scale: l.rope.base.powf(-2.0f32 / l.rope.n_rot.max(1) as f32),
                freq_scale: l.rope.freq_scale,
                window: l.sliding_window.map_or(0, |w| w.min(u32::MAX as usize) as u32),
                softcap: l.attn_softcap.unwrap_or(0.0),
                scale: l.attn_scale,
                attn_norm: DevNorm::new(g, &l.attn_norm, &p("attn_norm"))?,
                wq: mat(&l.wq, "attn_q")?,
                wk: mat(&l.wk, "attn_k")?,
                wv: mat(&l.wv, "attn_v")?,
                wo: mat(&l.wo, "attn_output")?,
                bias,
                q_norm: opt_norm(g, &l.q_norm, &p("attn_q_norm"))?,
                k_norm: opt_norm(g, &l.k_norm, &p("attn_k_norm"))?,
                post_attn_norm: opt_norm(g, &l.post_attn_norm, &p("post_attention_norm"))?,
                ffn_norm: DevNorm::new(g, &l.ffn_norm, &p("ffn_norm"))?,
                gelu: l.activation == Activation::GeluTanh,
                ffn_in: match (gated, &l.ffn_gate) {
                    (true, Some(gate)) => match DevWeight::upload_stacked(g, gate, &l.ffn_up, &p("ffn_gate_up"))? {
                        Some(w) => FfnIn::Stacked { w, n_ff: l.ffn_up.rows },
                        None => FfnIn::Apart { gate: Some(mat(gate, "ffn_gate")?), up: mat(&l.ffn_up, "ffn_up")? },
                    },
                    _ => FfnIn::Apart { gate: None, up: mat(&l.ffn_up, "ffn_up")? },
                },
                down: mat(&l.ffn_down, "ffn_down")?,
                post_ffn_norm: opt_norm(g, &l.post_ffn_norm, &p("post_ffw_norm"))?,
                key_scale,
                value_scale: ChannelScale::for_values(&l.wv, &l.attn_norm.weight.to_f32()?, l.head_dim)?,
            };
            weight_bytes +=
                [&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.down].iter().map(|w| w.bytes).sum::<usize>()
                    + layer.ffn_in.bytes();
            layers.push(layer);
        }
        let output = DevWeight::upload(g, &spec.output, "output")?;
        weight_bytes += output.bytes;
        let w = Weights {
            id: ModelId::next(),
            n_embd: spec.n_embd,
            n_vocab: spec.n_vocab,
            token_embd: DevWeight::upload(g, &spec.token_embd, "token_embd")?,
            embd_scale: spec.embd_scale,
            layers,
            output_norm: DevNorm::new(g, &spec.output_norm, "output_norm")?,
            output,
            final_softcap: spec.final_logit_softcap.unwrap_or(0.0),
            max_q,
            max_kv,
            max_ff,
            max_heads,
            weight_bytes,
        };
        Ok(WgpuModel { gpu, w: Arc::new(w), scratch: None, binds: Default::default(), ahead: None, logits: Vec::new() })
    }

    /// Bytes of weight matrices one decode step reads.
    pub fn weight_bytes_per_token(&self) -> usize {
        self.w.weight_bytes
    }

    /// Creates an empty KV pool of `n_slots` sequences of `n_ctx`
    /// positions, keys and values stored as `types` say (f32, f16, q8_0,
    /// q4_0, tq3 or tq4 each; layouts in [`WgpuKvPool`]'s module).
    ///
    /// # Errors
    /// `n_slots` or `n_ctx` of 0; [`Error::UnsupportedKvCache`] for a head
    /// size the type cannot store;
    /// [`Error::UnsupportedModel`] naming `max_storage_buffer_binding_size`
    /// when one layer's K or V does not fit one binding; out of memory.
    pub fn new_wgpu_kv_pool(&self, n_slots: usize, n_ctx: usize, types: KvTypes) -> Result<WgpuKvPool> {
        let heads: Vec<(usize, usize)> = self.w.layers.iter().map(|l| (l.n_kv, l.hd)).collect();
        let scales: Vec<[Option<ChannelScale>; 2]> =
            self.w.layers.iter().map(|l| [l.key_scale.clone(), l.value_scale.clone()]).collect();
        WgpuKvPool::new(&self.gpu, self.w.id, &heads, &scales, n_slots, n_ctx, types)
    }

    /// Checks the step, runs it pass by pass, and records the outcome in the
    /// pool (advanced on success, rolled back on error).
    fn run(&mut self, pool: &mut dyn KvPool, batch: &Batch, prof: Option<&mut StepProfile>) -> Result<usize> {
        let (pool, spans) = checked_pool::<WgpuKvPool>(pool, self.w.id, self.w.n_vocab, batch)?;
        let r = self.run_passes(pool, batch, prof);
        match r {
            Ok(_) => advance_spans(&mut pool.states, &spans),
            Err(_) => rollback_spans(&mut pool.states, &spans),
        }
        r
    }
}

impl DeviceModel for WgpuModel {
    fn n_vocab(&self) -> usize {
        self.w.n_vocab
    }

    /// Keys and values each f32, f16, q8_0, q4_0, tq3 or tq4 (rotated and
    /// quantized or coded as on the CPU).
    fn new_kv_pool_typed(&self, n_slots: usize, n_ctx: usize, types: KvTypes) -> Result<Box<dyn KvPool>> {
        Ok(Box::new(self.new_wgpu_kv_pool(n_slots, n_ctx, types)?))
    }

    /// f16, as the CPU and CUDA backends.
    fn default_kv_types(&self) -> KvTypes {
        KvTypes::both(KvCacheType::F16)
    }

    fn forward(&mut self, pool: &mut dyn KvPool, batch: &Batch) -> Result<&[f32]> {
        let n_out = self.run(pool, batch, None)?;
        Ok(&self.logits[..n_out * self.w.n_vocab])
    }

    /// Each dispatch timed (device timestamps where the adapter has
    /// `timestamp-query`, else the wall time of submitting it alone),
    /// named by op and weight; the same kernels and results.
    fn profile_forward(&mut self, pool: &mut dyn KvPool, batch: &Batch) -> Result<StepProfile> {
        let t0 = std::time::Instant::now();
        let mut prof = StepProfile::default();
        self.run(pool, batch, Some(&mut prof))?;
        prof.total = t0.elapsed();
        Ok(prof)
    }

    fn new_context(&self) -> Result<Box<dyn DeviceModel>> {
        Ok(Box::new(WgpuModel {
            gpu: self.gpu.clone(),
            w: self.w.clone(),
            scratch: None,
            binds: Default::default(),
            ahead: None,
            logits: Vec::new(),
        }))
    }
}
