//! The CUDA decode pipeline: a [`ModelSpec`] uploaded once ([`Weights`],
//! shared by every context), a KV pool in device memory
//! ([`CudaKvPool`]), and one forward pass per [`Batch`] on a context's
//! stream; a one-token step is captured once as a CUDA graph and replayed.
//!
//! Per layer (n tokens of a batch, all on the device):
//!
//! | step | kernel |
//! | --- | --- |
//! | pre-attention norm (fused with the previous block's residual add and post-norm) | `residual_norm` → h (f32 and q8); one token, quantized weights: run by every block of the q/k/v product, `mvn_<type>` |
//! | q, k, v projections (one launch per run of equal weight types; one token: rows prefetched into L2 before the PDL wait, as every one-token product) | `mv_<type>` (`mvn_<type>` for the first, with the norm; `mvn2_<a>_<b>` for two runs, e.g. a Q6_K v beside Q4_K q and k) |
//! | per span (a run of one slot's tokens), one token: bias, q/k RMSNorm, RoPE, K/V append at the position read from device memory, split-K attention over 32-position spans, their merge, quantize for `wo` | `attn_decode_hd*` (attention_decode.cu) |
//! | several tokens, or other head sizes: the same in two or three launches (tiled attention in passes of 16 or more tokens) | `qkv_post`, `attn_split`, `attn_combine` (`attn_prefill_hd*`) |
//! | output projection | `mv_<type>` |
//! | post-attention norm + residual add + pre-FFN norm | `residual_norm` |
//! | gate and up with the GLU epilogue (one launch when their types agree) | `mv_<type>` (or two launches + `glu`) |
//! | quantize the activation, down projection | `quantize_q8`, `mv_<type>`; one token, gate/up in one launch: the gate/up product writes the q8 copy itself (`mv_<type>_t1q`); long rows over 2 or 4 warps each (`mv_<type>_t1s`) |
//!
//! then the output norm and the vocabulary projection of the wanted rows
//! (gathered into consecutive rows first unless it is the last token alone;
//! soft-capped in the mat-vec epilogue when the model says so; from
//! [`CudaOptions::mmq_min_tokens`](super::CudaOptions::mmq_min_tokens) rows
//! the `mmq_*` kernels, from
//! [`CudaOptions::gemm_min_tokens`](super::CudaOptions::gemm_min_tokens) rows on, tensor-core
//! GEMMs over blocks of the matrix dequantized in turn, then the soft-cap).
//!
//! The token ids, each span's first position and the wanted rows live in
//! device buffers written before each pass ([`Params`]), so a step of one
//! token per sequence (a one-token decode, or decode steps of several
//! sequences in one batch below the GEMM path) is position-independent: it
//! is captured once as a CUDA graph per slot list, wanted rows and buffer
//! set ([`GraphKey`]; the [`MAX_GRAPHS`] most recently used kept) and
//! replayed. Other batches (prompt chunks) run the same kernels in passes
//! of up to [`PREFILL_CHUNK`](super::buffers::PREFILL_CHUNK) tokens
//! launched from the host: the products see all the pass's tokens at
//! once, attention runs per span against the span's slot. Passes of at least
//! [`CudaOptions::gemm_min_tokens`](super::CudaOptions::gemm_min_tokens) tokens (65) dequantize each
//! projection's weights to bf16 (one matrix at a time, into a scratch
//! buffer) and multiply on the tensor cores through cuBLAS (f32
//! accumulation); passes of
//! [`CudaOptions::mmq_min_tokens`](super::CudaOptions::mmq_min_tokens) (24)
//! to 64 tokens multiply on the tensor cores straight from the quantized
//! blocks (`mmq_<type>`: each 128-row × 64-value tile decoded to bf16 in
//! shared memory once for 64 tokens); shorter ones use the mat-vec kernels,
//! which reuse each decoded weight chunk for 8 tokens and each activation
//! chunk for 4 rows (`mv_<type>_tr`). On an H200 (synthetic llama 1B) the
//! `mmq` kernels beat the dequantize + GEMM path by 17–44% at 24–64
//! sequences and lose to the `tr` mat-vecs by 15% at 16. Attention in passes
//! of at least [`ops::FLASH_MIN_TOKENS`] tokens is one tiled tensor-core
//! kernel (`attn_prefill_hd*`, FlashAttention-2); shorter passes run the
//! split-K kernels with one grid layer per token, each causal to its own
//! position. Buffer sizes: `buffers.rs`.
//!
//! KV pool (`kv_pool.rs`): per layer `[n_slots][n_ctx]` rows of
//! `n_head_kv · head_dim` values, position-major as on the CPU, in f16,
//! q8_0 or q4_0 (the quantized types rotated as the CPU stores them).
//! Attention accumulates in f32.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};

use super::buffers::{prefill_chunk, Buffers, Maxima, Params};
use super::device::{dev_err, Device, PinnedBuf};
use super::kv_pool::CudaKvPool;
use super::ops;
use crate::backend::{
    advance_spans, checked_pool, rollback_spans, single_error, Batch, DeviceModel, KvPool, ModelId, Out, Span,
    StepProfile,
};
use crate::backend::{TopK, TOP_K_MAX};
use crate::error::{Error, Result};
use crate::kv_type::KvTypes;
use crate::pipeline::{Activation, FfnType, ModelSpec, Norm, NormType, RopeType};
use crate::turboquant::ChannelScale;
use crate::weight::QuantWeight;
use crate::GgmlType;

mod forward;

/// A weight matrix in device memory, GGUF blocks as they are.
struct DevWeight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    buf: CudaSlice<u8>,
    /// Row stride of the repacked layout, 0 for GGUF rows.
    repacked_stride: usize,
}

impl DevWeight {
    fn new(dev: &Device, w: &QuantWeight, what: &str) -> Result<Self> {
        if ops::wants_q8(w.ty).is_err() {
            return Err(Error::UnsupportedModel(format!(
                "{what}: {}",
                Error::Unsupported { op: "cuda weight", ty: w.ty }
            )));
        }
        Ok(DevWeight { ty: w.ty, rows: w.rows, cols: w.cols, buf: dev.upload(w.data.as_bytes())?, repacked_stride: 0 })
    }

    /// A matrix for the mat-vec kernels: repacked when the type has a
    /// repacked layout (see `repack.rs`), GGUF rows otherwise.
    fn matrix(dev: &Device, w: &QuantWeight, what: &str) -> Result<Self> {
        if let Some((bytes, stride)) = super::repack::repack_weight(w, dev.opts.repack) {
            return Ok(DevWeight {
                ty: w.ty,
                rows: w.rows,
                cols: w.cols,
                buf: dev.upload(&bytes)?,
                repacked_stride: stride,
            });
        }
        Self::new(dev, w, what)
    }
}

/// A norm's weights (and bias) in f32 on the device.
struct DevNorm {
    kind: NormType,
    eps: f32,
    w: CudaSlice<f32>,
    b: Option<CudaSlice<f32>>,
}

impl DevNorm {
    fn new(dev: &Device, n: &Norm) -> Result<Self> {
        let b = match &n.bias {
            Some(b) => Some(dev.upload(&b.to_f32()?)?),
            None => None,
        };
        Ok(DevNorm { kind: n.kind, eps: n.eps, w: dev.upload(&n.weight.to_f32()?)?, b })
    }

    fn kind_id(&self) -> i32 {
        match self.kind {
            NormType::RmsNorm => 0,
            NormType::LayerNorm => 1,
        }
    }
}

struct DevLayer {
    n_head: usize,
    n_kv: usize,
    hd: usize,
    rope_neox: bool,
    n_rot: usize,
    theta_scale: f32,
    freq_scale: f32,
    window: Option<usize>,
    softcap: Option<f32>,
    scale: f32,
    attn_norm: DevNorm,
    wq: DevWeight,
    wk: DevWeight,
    wv: DevWeight,
    wo: DevWeight,
    bq: Option<CudaSlice<f32>>,
    bk: Option<CudaSlice<f32>>,
    bv: Option<CudaSlice<f32>>,
    q_norm: Option<DevNorm>,
    k_norm: Option<DevNorm>,
    /// The TurboQuant keys' per-channel scale, from the q and k norm gains
    /// (as the CPU's and wgpu's).
    key_scale: Option<ChannelScale>,
    /// The TurboQuant values' per-channel scale, from `wv` and the
    /// attention norm's gain (as the CPU's and wgpu's).
    value_scale: Option<ChannelScale>,
    post_attn_norm: Option<DevNorm>,
    ffn_norm: DevNorm,
    gated: bool,
    gelu: bool,
    gate: Option<DevWeight>,
    up: DevWeight,
    down: DevWeight,
    post_ffn_norm: Option<DevNorm>,
}

impl DevLayer {
    /// The layer's matrices in [`crate::pipeline::LayerSpec::matrices`]'s
    /// order.
    fn matrices(&self) -> impl Iterator<Item = &DevWeight> {
        [&self.wq, &self.wk, &self.wv, &self.wo].into_iter().chain(self.gate.as_ref()).chain([&self.up, &self.down])
    }
}

/// Whether the CUDA kernels can run `spec` (see
/// [`crate::ComputeBackend::supports`]): attention shapes, RMSNorm post- and
/// q/k norms, and a mat-vec kernel for every matrix's weight type.
///
/// # Errors
/// [`Error::UnsupportedModel`] naming the first tensor the kernels lack.
pub(super) fn supports(spec: &ModelSpec) -> Result<()> {
    let unsupported = |t: &str, what: &str| Err(Error::UnsupportedModel(format!("{t}: the CUDA backend {what}")));
    for (i, l) in spec.layers.iter().enumerate() {
        let p = |s: &str| format!("blk.{i}.{s}");
        ops::check_attn_shape(l.n_head, l.n_head_kv, l.head_dim)?;
        for (name, n) in [("post_attention_norm", &l.post_attn_norm), ("post_ffw_norm", &l.post_ffn_norm)] {
            if n.as_ref().is_some_and(|n| n.kind != NormType::RmsNorm) {
                return unsupported(&p(name), "supports RMSNorm post-norms only");
            }
        }
        for (name, n) in [("attn_q_norm", &l.q_norm), ("attn_k_norm", &l.k_norm)] {
            if n.as_ref().is_some_and(|n| n.kind != NormType::RmsNorm || n.bias.is_some()) {
                return unsupported(&p(name), "supports RMSNorm q/k norms only");
            }
        }
        let mats = [("attn_q", &l.wq), ("attn_k", &l.wk), ("attn_v", &l.wv), ("attn_output", &l.wo)];
        let ffn = [("ffn_up", Some(&l.ffn_up)), ("ffn_down", Some(&l.ffn_down)), ("ffn_gate", l.ffn_gate.as_ref())];
        for (name, w) in mats.into_iter().map(|(n, w)| (n, Some(w))).chain(ffn) {
            if let Some(w) = w.filter(|w| ops::wants_q8(w.ty).is_err()) {
                return unsupported(&p(name), &format!("has no kernel for {}", w.ty.name()));
            }
        }
    }
    for (name, w) in [("token_embd", &spec.token_embd), ("output", &spec.output)] {
        if ops::wants_q8(w.ty).is_err() {
            return unsupported(name, &format!("has no kernel for {}", w.ty.name()));
        }
    }
    Ok(())
}

/// What a captured step runs: everything the launches take from the host.
/// Positions and token ids are not part of it (the kernels read them from
/// the parameter buffer, copied in by the graph's first node); the slots
/// are (the one-token kernels take a slot's K/V pointers).
#[derive(Clone, Debug, PartialEq, Eq)]
struct GraphKey {
    pool_id: usize,
    /// The buffers' generation (reallocated buffers drop every graph).
    generation: usize,
    /// Each token's slot, one token per slot (a one-token step, or a pass
    /// of decode steps of several sequences).
    slots: Vec<usize>,
    /// The rows whose logits are wanted.
    outputs: Vec<usize>,
    /// The greedy token's key read back instead of the logits.
    greedy: bool,
    /// Candidates per row read back instead of the logits (0: the logits).
    top_k: usize,
    /// Each layer's choice of the flat decode attention kernel, which
    /// depends on the positions (`forward::attn_flat`).
    flat: Vec<bool>,
}

/// A captured step and its key.
struct Captured {
    graph: CudaGraph,
    key: GraphKey,
}

/// Captured steps a context keeps, the least recently used replaced first:
/// a steady batch replays one; a server whose batch changes as requests
/// come and go, or a caller alternating sequences, finds recent ones.
const MAX_GRAPHS: usize = 8;

/// The graph is used only through `&mut CudaModel`, so by one thread at a
/// time; CUDA graph objects may move between threads when access is
/// serialized.
struct SendCaptured(Captured);
// SAFETY: see the type's docs: access is serialized by `&mut CudaModel`.
unsafe impl Send for SendCaptured {}

/// A model's weights on the device, shared (read-only) by every context
/// ([`DeviceModel::new_context`]): uploaded once, on the first context's
/// stream, which is synchronized before any other context reads them.
struct Weights {
    id: ModelId,
    n_embd: usize,
    n_vocab: usize,
    token_embd: DevWeight,
    embd_scale: f32,
    layers: Vec<DevLayer>,
    output_norm: DevNorm,
    output: DevWeight,
    final_softcap: Option<f32>,
    max: Maxima,
    weight_bytes: usize,
    /// Every layer matrix has an `mmq_*` kernel: passes of
    /// [`ops::mmq_tokens`] run their projections on it.
    mmq_layers: bool,
}

/// A model prepared on a CUDA device: shared weights and one context
/// (a stream and cuBLAS handle of its own, scratch buffers, captured
/// graphs, pinned host buffers).
pub struct CudaModel {
    w: Arc<Weights>,
    dev: Arc<Device>,
    bufs: Option<Buffers>,
    generation: usize,
    /// The captured steps, the most recently used last.
    graphs: Vec<SendCaptured>,
    use_graph: bool,
    /// The step's wanted rows of logits, `n_outputs × n_vocab`.
    logits: PinnedBuf<f32>,
    /// The greedy token's key (see [`ops::argmax`]) read back by
    /// [`DeviceModel::decode_greedy`].
    token_key: PinnedBuf<u64>,
    /// Candidates per row that the running step reads back instead of the
    /// logits ([`DeviceModel::forward_top_k`]; 0: the logits).
    top_k: usize,
    /// The rows' candidates on the device, rows of [`ops::top_k_stride`]
    /// u32 words, with the selection's scratch for as many rows
    /// ([`ops::top_k_scratch_words`]), and their pinned copy (a captured
    /// graph holds all three).
    top_k_dev: Option<(CudaSlice<u32>, CudaSlice<u32>)>,
    top_k_host: PinnedBuf<u32>,
    /// Graphs captured so far ([`CudaModel::captures`]).
    captures: usize,
}

/// One pass of a forward step on the device: at most
/// [`prefill_chunk`] consecutive tokens of a [`Batch`], as spans whose
/// `start` counts from the pass's first token, and the pass-relative
/// indices of its wanted rows.
struct Pass {
    pub spans: Vec<Span>,
    pub n: usize,
    pub outputs: Vec<usize>,
    /// The deepest position of its tokens.
    pub max_pos: usize,
}

impl Pass {
    /// Tokens `range` of `batch`, whose spans are `spans`.
    fn of(batch: &Batch, spans: &[Span], range: std::ops::Range<usize>) -> Self {
        let mut pass_spans: Vec<Span> = Vec::new();
        for s in spans {
            let (a, b) = (s.start.max(range.start), (s.start + s.len).min(range.end));
            if a < b {
                pass_spans.push(Span {
                    slot: s.slot,
                    pos0: s.pos0 + (a - s.start),
                    start: a - range.start,
                    len: b - a,
                });
            }
        }
        let outputs = batch.output_indices().filter(|i| range.contains(i)).map(|i| i - range.start).collect();
        let max_pos = pass_spans.iter().map(|s| s.pos0 + s.len.saturating_sub(1)).max().unwrap_or(0);
        Pass { spans: pass_spans, n: range.len(), outputs, max_pos }
    }

    /// Where its integers lie in the parameter buffer.
    fn params(&self) -> Params {
        Params { n_spans: self.spans.len(), n: self.n }
    }
}

impl CudaModel {
    /// Validates `spec` and uploads its weights to `dev` (whose stream the
    /// model then runs on).
    pub(crate) fn new(dev: Arc<Device>, spec: &ModelSpec) -> Result<Self> {
        spec.validate()?;
        supports(spec)?;
        let d = &*dev;
        let e = spec.n_embd;
        let mut layers = Vec::with_capacity(spec.layers.len());
        let mut max = Maxima { cols: e, flash: true, ..Default::default() };
        let mut weight_bytes = 0usize;
        let opt_norm = |n: &Option<Norm>| n.as_ref().map(|n| DevNorm::new(d, n)).transpose();
        let opt_vec = |b: &Option<QuantWeight>| -> Result<Option<CudaSlice<f32>>> {
            b.as_ref().map(|b| d.upload(&b.to_f32()?)).transpose()
        };
        for (i, l) in spec.layers.iter().enumerate() {
            let p = |s: &str| format!("blk.{i}.{s}");
            max.flash &= ops::has_flash(d, l.head_dim);
            let n_ff = l.ffn_up.rows;
            let (q_dim, kv_dim) = (l.n_head * l.head_dim, l.n_head_kv * l.head_dim);
            max.q_dim = max.q_dim.max(q_dim);
            max.kv_dim = max.kv_dim.max(kv_dim);
            max.n_ff = max.n_ff.max(n_ff);
            max.heads = max.heads.max(l.n_head);
            max.hd = max.hd.max(l.head_dim);
            max.cols = max.cols.max(q_dim).max(n_ff);
            let mats: Vec<_> = l.matrices().collect();
            weight_bytes += mats.iter().map(|w| w.data.as_bytes().len()).sum::<usize>();
            max.mat = max.mat.max(mats.iter().map(|w| w.rows * w.cols).max().unwrap_or(0));
            let gated = matches!((l.ffn, &l.ffn_gate), (FfnType::Gated, Some(_)));
            layers.push(DevLayer {
                n_head: l.n_head,
                n_kv: l.n_head_kv,
                hd: l.head_dim,
                rope_neox: l.rope.kind == RopeType::NeoX,
                n_rot: l.rope.n_rot,
                theta_scale: l.rope.base.powf(-2.0f32 / l.rope.n_rot.max(1) as f32),
                freq_scale: l.rope.freq_scale,
                window: l.sliding_window,
                softcap: l.attn_softcap,
                scale: l.attn_scale,
                attn_norm: DevNorm::new(d, &l.attn_norm)?,
                wq: DevWeight::matrix(d, &l.wq, &p("attn_q"))?,
                wk: DevWeight::matrix(d, &l.wk, &p("attn_k"))?,
                wv: DevWeight::matrix(d, &l.wv, &p("attn_v"))?,
                wo: DevWeight::matrix(d, &l.wo, &p("attn_output"))?,
                bq: opt_vec(&l.bq)?,
                bk: opt_vec(&l.bk)?,
                bv: opt_vec(&l.bv)?,
                q_norm: opt_norm(&l.q_norm)?,
                k_norm: opt_norm(&l.k_norm)?,
                key_scale: match (&l.q_norm, &l.k_norm) {
                    (Some(q), Some(k)) if q.bias.is_none() && k.bias.is_none() => {
                        ChannelScale::from_qk_norms(&q.weight.to_f32()?, &k.weight.to_f32()?, &l.rope)
                    }
                    _ => None,
                },
                value_scale: ChannelScale::for_values(&l.wv, &l.attn_norm.weight.to_f32()?, l.head_dim)?,
                post_attn_norm: opt_norm(&l.post_attn_norm)?,
                ffn_norm: DevNorm::new(d, &l.ffn_norm)?,
                gated,
                gelu: l.activation == Activation::GeluTanh,
                gate: if gated {
                    l.ffn_gate.as_ref().map(|g| DevWeight::matrix(d, g, &p("ffn_gate"))).transpose()?
                } else {
                    None
                },
                up: DevWeight::matrix(d, &l.ffn_up, &p("ffn_up"))?,
                down: DevWeight::matrix(d, &l.ffn_down, &p("ffn_down"))?,
                post_ffn_norm: opt_norm(&l.post_ffn_norm)?,
            });
        }
        let token_embd = DevWeight::new(d, &spec.token_embd, "token_embd")?;
        // A tied output shares the embedding's bytes; upload once anyway
        // (separate allocation keeps the code simple).
        let output = DevWeight::matrix(d, &spec.output, "output")?;
        weight_bytes += spec.output.data.as_bytes().len();
        let output_norm = DevNorm::new(d, &spec.output_norm)?;
        // The products of the layouts this model has, compiled (or taken
        // from the cache) now rather than at a first launch inside a graph
        // capture.
        let layer_mats = || layers.iter().flat_map(DevLayer::matrices);
        let mmq_layers = layer_mats().all(|w| ops::mmq_kernel(w.ty, w.repacked_stride != 0).is_some());
        let layouts: Vec<_> = layer_mats().chain([&output]).map(|w| (w.ty, w.repacked_stride != 0)).collect();
        d.load_products(&layouts)?;
        d.sync()?;
        let w = Weights {
            id: ModelId::next(),
            n_embd: e,
            n_vocab: spec.n_vocab,
            token_embd,
            embd_scale: spec.embd_scale,
            layers,
            output_norm,
            output,
            final_softcap: spec.final_logit_softcap,
            max,
            weight_bytes,
            mmq_layers,
        };
        Self::context(Arc::new(w), dev)
    }

    /// A context over `w` on `dev`'s stream.
    fn context(w: Arc<Weights>, dev: Arc<Device>) -> Result<Self> {
        Ok(CudaModel {
            bufs: None,
            generation: 0,
            graphs: Vec::new(),
            use_graph: dev.opts.graphs,
            logits: dev.pinned(w.n_vocab)?,
            token_key: dev.pinned(1)?,
            top_k: 0,
            top_k_dev: None,
            top_k_host: dev.pinned(1)?,
            captures: 0,
            w,
            dev,
        })
    }

    /// Whether steps of one token per sequence replay captured CUDA graphs
    /// (the default unless `CudaOptions::graphs` is off) or launch every
    /// kernel directly.
    pub fn set_use_graph(&mut self, on: bool) {
        self.use_graph = on;
        if !on {
            self.graphs.clear();
        }
    }

    /// Per-kernel times of the steps run between `on = true` and
    /// `on = false` (returned then, slowest first). Profiling launches
    /// kernels one by one with a synchronization around each, so it turns
    /// graph replay off while on.
    pub fn profile(&mut self, on: bool) -> Vec<(&'static str, f64, usize)> {
        if on {
            self.set_use_graph(false);
        }
        self.dev.set_profiling(on)
    }

    /// Bytes of weight matrices one decode step reads (every projection of
    /// every layer and the vocabulary projection; norms and the one
    /// embedding row are negligible).
    pub fn weight_bytes_per_token(&self) -> usize {
        self.w.weight_bytes
    }

    /// Buffers for passes of `n_tok` tokens with `n_out` wanted rows over a
    /// pool of `n_split` attention splits (reallocated, and the captured
    /// graphs dropped, only when they are too small or the splits differ).
    /// They grow to the next power of two: a server's prompts of varying
    /// lengths would otherwise reallocate every buffer (and capture its
    /// graphs again) at each longest prompt so far, inside that request's
    /// time to first token.
    fn ensure_buffers(&mut self, max: &Maxima, n_tok: usize, n_out: usize, n_split: usize) -> Result<()> {
        if let Some(b) = &self.bufs {
            if b.cap >= n_tok && b.out_cap >= n_out && b.n_split == n_split && b.flash == max.flash {
                return Ok(());
            }
        }
        let cap = n_tok.next_power_of_two().max(self.bufs.as_ref().map_or(1, |b| b.cap));
        let out_cap = n_out.next_power_of_two().max(self.bufs.as_ref().map_or(1, |b| b.out_cap));
        self.generation += 1;
        self.graphs.clear();
        self.bufs = None;
        let w = &*self.w;
        self.bufs = Some(Buffers::new(&self.dev, max, w.n_embd, w.n_vocab, cap, out_cap, n_split, self.generation)?);
        Ok(())
    }

    /// Checks the step, runs `batch` in passes of at most
    /// [`prefill_chunk`] tokens and reads the wanted rows' logits into
    /// `self.logits` (`greedy`, for a one-token batch: its greedy token's
    /// key instead); returns the number of rows. With `prof`, each pass
    /// runs as [`CudaModel::profile_pass`] and its ops' times add up there.
    fn run(
        &mut self,
        pool: &mut dyn KvPool,
        batch: &Batch,
        greedy: bool,
        prof: Option<&mut StepProfile>,
    ) -> Result<usize> {
        let (pool, spans) = checked_pool::<CudaKvPool>(pool, self.w.id, self.w.n_vocab, batch)?;
        let r = self.run_passes(pool, batch, &spans, greedy, prof);
        match r {
            Ok(_) => advance_spans(pool.states_mut(), &spans),
            Err(_) => rollback_spans(pool.states_mut(), &spans),
        }
        r
    }

    /// [`CudaModel::run`] after the check: the passes, the logits read
    /// back.
    fn run_passes(
        &mut self,
        pool: &CudaKvPool,
        batch: &Batch,
        spans: &[Span],
        greedy: bool,
        mut prof: Option<&mut StepProfile>,
    ) -> Result<usize> {
        let nv = self.w.n_vocab;
        let n_out = batch.n_outputs();
        let rows = n_out.checked_mul(nv).ok_or(Error::Overflow("logits size"))?;
        if self.logits.as_slice().len() < rows {
            // The captured graphs copy into the old buffer.
            self.graphs.clear();
            self.logits = self.dev.pinned(rows)?;
        }
        let max = self.w.max.for_pool(pool);
        let chunk = prefill_chunk(&max, pool.n_split);
        let mut done = 0;
        for start in (0..batch.len()).step_by(chunk) {
            let pass = Pass::of(batch, spans, start..(start + chunk).min(batch.len()));
            self.ensure_buffers(&max, pass.n, pass.outputs.len(), pool.n_split)?;
            // The previous pass was synchronized: no copy reads these.
            self.set_params(batch, start, &pass)?;
            // A graph writes the logits from row 0: a batch of one pass.
            match (prof.as_deref_mut(), self.graph_key(pool, batch, &pass, greedy)) {
                (Some(p), _) => self.profile_pass(pool, &pass, done, p)?,
                (None, Some(key)) => self.step_graph(pool, key, &pass)?,
                (None, None) => self.enqueue_io(pool, &pass, greedy, done)?,
            }
            self.dev.sync()?;
            done += pass.outputs.len();
        }
        Ok(n_out)
    }

    /// A pass as [`CudaModel::enqueue_io`] runs it without the greedy
    /// argmax, its kernels launched directly and the stream synchronized
    /// after each group of launches, so that each group is timed alone into
    /// `prof` (slower than a graph replay, and PDL overlap between groups is
    /// lost, but the same kernels, arguments and results).
    fn profile_pass(&mut self, pool: &CudaKvPool, pass: &Pass, row0: usize, prof: &mut StepProfile) -> Result<()> {
        let nv = self.w.n_vocab;
        let b = self.bufs.as_ref().ok_or_else(|| Error::Device("buffers missing".into()))?;
        self.dev.enqueue_write(&b.params_host, self.dev.ptr(&b.params), pass.params().end())?;
        self.dev.sync()?;
        let mut last = Instant::now();
        let dev = self.dev.clone();
        let mut mark = |op: &str, ws: &[&DevWeight]| -> Result<()> {
            dev.sync()?;
            let now = Instant::now();
            let mut tys: Vec<&str> = ws.iter().map(|w| w.ty.name()).collect();
            tys.dedup();
            let shape = ws.iter().map(|w| format!("{}x{}", w.rows, w.cols)).collect::<Vec<_>>().join(",");
            let bytes = ws.iter().map(|w| w.buf.len() as u64).sum();
            prof.record(op, &tys.join(","), &shape, now - last, bytes);
            last = now;
            Ok(())
        };
        self.enqueue(pool, pass, &mut mark)?;
        let b = self.bufs.as_ref().ok_or_else(|| Error::Device("buffers missing".into()))?;
        let src = self.dev.ptr(&b.logits);
        self.dev.enqueue_read_at(src, &mut self.logits, row0 * nv, pass.outputs.len() * nv)?;
        self.dev.sync()?;
        prof.record("logits to host", "", "", last.elapsed(), 0);
        Ok(())
    }

    /// Writes a pass's spans' first positions, token ids and wanted rows
    /// into the pinned parameter buffer (see [`Params`]).
    fn set_params(&mut self, batch: &Batch, start: usize, pass: &Pass) -> Result<()> {
        let b = self.bufs.as_mut().ok_or_else(|| Error::Device("buffers missing".into()))?;
        let at = pass.params();
        let params = b.params_host.as_mut_slice();
        for (i, s) in pass.spans.iter().enumerate() {
            params[at.pos(i)] = i32::try_from(s.pos0)
                .map_err(|_| Error::Device(format!("position {} exceeds the kernels' range", s.pos0)))?;
        }
        for (dst, &t) in params[at.tokens()..].iter_mut().zip(&batch.tokens()[start..start + pass.n]) {
            *dst = t as i32;
        }
        for (dst, &r) in params[at.outputs()..].iter_mut().zip(&pass.outputs) {
            *dst = r as i32;
        }
        for (i, s) in pass.spans.iter().enumerate() {
            params[at.slot(i)] = i32::try_from(s.slot)
                .map_err(|_| Error::Device(format!("slot {} exceeds the kernels' range", s.slot)))?;
        }
        Ok(())
    }

    /// The whole pass on the stream: parameters in, forward pass, the
    /// wanted rows' logits out (into `self.logits` from row `row0`), or
    /// with `greedy` the argmax of the one row on the device and its 8-byte
    /// key out (what the graph captures).
    fn enqueue_io(&mut self, pool: &CudaKvPool, pass: &Pass, greedy: bool, row0: usize) -> Result<()> {
        let b = self.bufs.as_ref().ok_or_else(|| Error::Device("buffers missing".into()))?;
        let at = pass.params();
        self.dev.enqueue_write(&b.params_host, self.dev.ptr(&b.params), at.end())?;
        self.enqueue(pool, pass, &mut |_, _| Ok(()))?;
        let b = self.bufs.as_ref().ok_or_else(|| Error::Device("buffers missing".into()))?;
        let d = &*self.dev;
        let nv = self.w.n_vocab;
        if greedy {
            let key = d.ptr(&b.argmax_key);
            ops::argmax(d, d.ptr(&b.logits), nv, d.ptr(&b.argmax_part), d.ptr(&b.argmax_count), key)?;
            d.enqueue_read(key, &mut self.token_key)
        } else if self.top_k > 0 {
            let (k, rows) = (self.top_k.min(nv), pass.outputs.len());
            let stride = ops::top_k_stride(k);
            let (out, scratch) =
                self.top_k_dev.as_ref().ok_or_else(|| Error::Device("top-k buffers missing".into()))?;
            let dst = d.ptr(out);
            let max_rows = out.len() / ops::top_k_stride(TOP_K_MAX);
            ops::top_k(d, d.ptr(&b.logits), nv, rows, k, d.ptr(scratch), max_rows, dst)?;
            d.enqueue_read_at(dst, &mut self.top_k_host, row0 * stride, rows * stride)
        } else {
            d.enqueue_read_at(d.ptr(&b.logits), &mut self.logits, row0 * nv, pass.outputs.len() * nv)
        }
    }

    /// The key of `pass` as a captured graph would run it, or `None` where
    /// it runs from the host: graphs off, a batch of several passes, a
    /// prompt chunk (a span of several tokens), or cuBLAS GEMMs (not
    /// captured).
    fn graph_key(&self, pool: &CudaKvPool, batch: &Batch, pass: &Pass, greedy: bool) -> Option<GraphKey> {
        let gemm = self.dev.opts.prefill_gemm.is_some() && pass.n >= self.dev.opts.gemm_min_tokens;
        (self.use_graph && pass.n == batch.len() && pass.spans.iter().all(|s| s.len == 1) && !gemm).then(|| GraphKey {
            pool_id: pool.id,
            generation: self.bufs.as_ref().map_or(0, |b| b.generation),
            slots: pass.spans.iter().map(|s| s.slot).collect(),
            outputs: pass.outputs.clone(),
            greedy,
            top_k: self.top_k,
            flat: self.w.layers.iter().map(|l| forward::attn_flat(&self.dev, l, pool.n_split, pass)).collect(),
        })
    }

    /// Replays the captured step of `key` (capturing `pass` first if no
    /// graph has that key).
    fn step_graph(&mut self, pool: &CudaKvPool, key: GraphKey, pass: &Pass) -> Result<()> {
        let i = match self.graphs.iter().position(|g| g.0.key == key) {
            Some(i) => i,
            None => {
                let stream = self.dev.stream.clone();
                // No device-synchronizing call of another thread may run
                // while this stream captures (see `device_lock`).
                let _device = super::device::CaptureGuard::new();
                stream
                    .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .map_err(dev_err("begin graph capture"))?;
                let queued = self.enqueue_io(pool, pass, key.greedy, 0);
                let ended = stream.end_capture(CUgraphInstantiate_flags(0));
                queued?;
                let graph = ended
                    .map_err(dev_err("end graph capture"))?
                    .ok_or_else(|| Error::Device("graph capture produced no graph".into()))?;
                self.captures += 1;
                if self.graphs.len() >= MAX_GRAPHS {
                    self.graphs.remove(0);
                }
                self.graphs.push(SendCaptured(Captured { graph, key }));
                self.graphs.len() - 1
            }
        };
        // The most recently used last.
        let g = self.graphs.remove(i);
        self.graphs.push(g);
        self.graphs[self.graphs.len() - 1].0.graph.launch().map_err(dev_err("graph launch"))
    }

    /// CUDA graphs this context has captured so far (a steady decode
    /// replays one instead of capturing again).
    pub fn captures(&self) -> usize {
        self.captures
    }

    /// Creates an empty KV pool of `n_slots` sequences of `n_ctx`
    /// positions stored as `types` say (f16, q8_0, q4_0, tq3 or tq4 keys and
    /// values).
    ///
    /// # Errors
    /// `n_slots` or `n_ctx` of 0, [`Error::UnsupportedKvCache`] for another
    /// type or a head size its blocks do not divide, sizes past the
    /// kernels' 32-bit positions, device allocation failures.
    pub fn new_cuda_kv_pool(&self, n_slots: usize, n_ctx: usize, types: KvTypes) -> Result<CudaKvPool> {
        let heads: Vec<_> =
            self.w.layers.iter().map(|l| (l.n_kv, l.hd, [l.key_scale.as_ref(), l.value_scale.as_ref()])).collect();
        CudaKvPool::new(&self.dev, self.w.id, &heads, n_slots, n_ctx, types)
    }
}

/// The per-group callback of [`CudaModel::enqueue`]: a group's name and the
/// weights it read.
type Mark<'a> = dyn FnMut(&str, &[&DevWeight]) -> Result<()> + 'a;

impl DeviceModel for CudaModel {
    fn n_vocab(&self) -> usize {
        self.w.n_vocab
    }

    /// f16, q8_0, q4_0, tq3 and tq4 keys and values (`kv_pool.rs`); f32 is
    /// [`Error::UnsupportedKvCache`].
    fn new_kv_pool_typed(&self, n_slots: usize, n_ctx: usize, types: KvTypes) -> Result<Box<dyn KvPool>> {
        Ok(Box::new(self.new_cuda_kv_pool(n_slots, n_ctx, types)?))
    }

    fn forward(&mut self, pool: &mut dyn KvPool, batch: &Batch) -> Result<&[f32]> {
        let n_out = self.run(pool, batch, false, None)?;
        Ok(&self.logits.as_slice()[..n_out * self.w.n_vocab])
    }

    fn new_context(&self) -> Result<Box<dyn DeviceModel>> {
        Ok(Box::new(Self::context(self.w.clone(), Arc::new(self.dev.with_own_stream()?))?))
    }

    fn top_k_on_device(&self) -> bool {
        true
    }

    /// The selection runs on the device after the vocabulary product
    /// (`kernels/topk.cu`, also inside the captured graphs) and only each
    /// row's candidates and statistics come back, `2k + 3` words a row.
    fn forward_top_k(&mut self, pool: &mut dyn KvPool, batch: &Batch, k: usize, out: &mut TopK) -> Result<()> {
        crate::backend::check_k(k)?;
        let k = k.min(self.w.n_vocab);
        let stride = ops::top_k_stride(k);
        let need = batch.n_outputs().checked_mul(stride).ok_or(Error::Overflow("top-k size"))?;
        // Room for at least 64 rows of the largest k (66 KiB), so that a
        // batch growing one sequence at a time, or another k, does not
        // drop the captured graphs, which copy into the old buffers.
        let room = batch.n_outputs().max(64).next_power_of_two().saturating_mul(ops::top_k_stride(TOP_K_MAX));
        if self.top_k_host.as_slice().len() < need {
            self.graphs.clear();
            self.top_k_host = self.dev.pinned(room)?;
        }
        if self.top_k_dev.as_ref().is_none_or(|(b, _)| b.len() < need) {
            self.graphs.clear();
            let rows = room / ops::top_k_stride(TOP_K_MAX);
            self.top_k_dev = Some((self.dev.zeros(room)?, self.dev.zeros(ops::top_k_scratch_words(rows))?));
        }
        self.top_k = k;
        let r = self.run(pool, batch, false, None);
        self.top_k = 0;
        let rows = r?;
        ops::unpack_top_k(self.top_k_host.as_slice(), rows, k, out);
        Ok(())
    }

    /// The argmax runs on the device, after the vocabulary product, and
    /// only its 8-byte key comes back (the logits stay on the device).
    fn decode_greedy(&mut self, kv: &mut dyn KvPool, token: u32, pos: usize) -> Result<u32> {
        self.run(kv, &Batch::seq(0, pos, &[token], Out::Last), true, None).map_err(single_error)?;
        ops::argmax_token(self.token_key.as_slice()[0])
    }

    /// The step's kernels launched directly (not the captured graph), the
    /// stream synchronized after each group of launches so that each group
    /// is timed alone: slower than a graph replay, and PDL overlap between
    /// groups is lost, but the same kernels, arguments and results.
    fn profile_forward(&mut self, kv: &mut dyn KvPool, batch: &Batch) -> Result<StepProfile> {
        let t0 = Instant::now();
        let mut prof = StepProfile::default();
        self.run(kv, batch, false, Some(&mut prof))?;
        prof.total = t0.elapsed();
        Ok(prof)
    }
}
