//! The CUDA decode pipeline: a [`ModelSpec`] uploaded once ([`CudaModel`]),
//! an f16 KV cache in device memory ([`CudaKvCache`]), and one forward pass
//! per token on one stream, captured once as a CUDA graph and replayed.
//!
//! Per layer (n tokens, all on the device):
//!
//! | step | kernel |
//! | --- | --- |
//! | pre-attention norm (fused with the previous block's residual add and post-norm) | `residual_norm` → h (f32 and q8); one token, quantized weights: run by every block of the q/k/v product, `mvn_<type>` |
//! | q, k, v projections (one launch per run of equal weight types; one token: rows prefetched into L2 before the PDL wait, as every one-token product) | `mv_<type>` (`mvn_<type>` for the first, with the norm; `mvn2_<a>_<b>` for two runs, e.g. a Q6_K v beside Q4_K q and k) |
//! | one token: bias, q/k RMSNorm, RoPE, K/V append at the position read from device memory, split-K attention over 32-position spans, their merge, quantize for `wo` | `attn_decode_hd*` (attention_decode.cu) |
//! | several tokens, or other head sizes: the same in two or three launches (tiled attention in passes of 16 or more tokens) | `qkv_post`, `attn_split`, `attn_combine` (`attn_prefill_hd*`) |
//! | output projection | `mv_<type>` |
//! | post-attention norm + residual add + pre-FFN norm | `residual_norm` |
//! | gate and up with the GLU epilogue (one launch when their types agree) | `mv_<type>` (or two launches + `glu`) |
//! | quantize the activation, down projection | `quantize_q8`, `mv_<type>`; one token, gate/up in one launch: the gate/up product writes the q8 copy itself (`mv_<type>_t1q`); long rows over 2 or 4 warps each (`mv_<type>_t1s`) |
//!
//! then the output norm and the vocabulary projection of the last token
//! (soft-capped in the mat-vec epilogue when the model says so).
//!
//! The token ids and the first position live in device buffers written
//! before each step, so the single-token step is position-independent and
//! is captured once as a CUDA graph (per KV cache and buffer set) and
//! replayed for every token. Prefill runs the same kernels on chunks of up
//! to [`PREFILL_CHUNK`](super::buffers::PREFILL_CHUNK) tokens without a graph. Passes of at least
//! [`GEMM_MIN_TOKENS`](super::buffers::GEMM_MIN_TOKENS) tokens dequantize each projection's weights to bf16
//! (one matrix at a time, into a scratch buffer) and multiply on the tensor
//! cores through cuBLAS (f32 accumulation); shorter ones use the mat-vec kernels,
//! which reuse each decoded weight chunk for 8 tokens. Attention in passes
//! of at least [`ops::FLASH_MIN_TOKENS`] tokens is one tiled tensor-core
//! kernel (`attn_prefill_hd*`, FlashAttention-2); shorter passes run the
//! split-K kernels with one grid layer per token, each causal to its own
//! position. Buffer sizes: `buffers.rs`.
//!
//! KV cache: f16, per layer `[n_ctx, n_head_kv, head_dim]`, position-major
//! (the CPU layout, half the bytes). Attention accumulates in f32.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};

use super::buffers::{prefill_chunk, Buffers, Maxima};
use super::device::{dev_err, Device, PinnedBuf};
use super::ops;
use crate::backend::{checked_cache, DeviceModel, KvCache, KvState, ModelId, StepProfile};
use crate::error::{Error, Result};
use crate::pipeline::{Activation, FfnType, ModelSpec, Norm, NormType, RopeType};
use crate::weight::QuantWeight;
use crate::GgmlType;

mod forward;

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

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
            return Err(Error::InvalidModel(format!("{what}: {}", Error::Unsupported { op: "cuda weight", ty: w.ty })));
        }
        Ok(DevWeight { ty: w.ty, rows: w.rows, cols: w.cols, buf: dev.upload(w.data.as_bytes())?, repacked_stride: 0 })
    }

    /// A matrix for the mat-vec kernels: repacked when the type has a
    /// repacked layout (see `repack.rs`), GGUF rows otherwise.
    fn matrix(dev: &Device, w: &QuantWeight, what: &str) -> Result<Self> {
        if let Some((bytes, stride)) = super::repack::repack_weight(w) {
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
    post_attn_norm: Option<DevNorm>,
    ffn_norm: DevNorm,
    gated: bool,
    gelu: bool,
    gate: Option<DevWeight>,
    up: DevWeight,
    down: DevWeight,
    post_ffn_norm: Option<DevNorm>,
}

/// A captured single-token step.
struct Captured {
    graph: CudaGraph,
    kv_id: usize,
    generation: usize,
}

/// The graph is used only through `&mut CudaModel`, so by one thread at a
/// time; CUDA graph objects may move between threads when access is
/// serialized.
struct SendCaptured(Captured);
// SAFETY: see the type's docs: access is serialized by `&mut CudaModel`.
unsafe impl Send for SendCaptured {}

/// A model prepared on a CUDA device.
pub struct CudaModel {
    id: ModelId,
    dev: Arc<Device>,
    n_embd: usize,
    n_vocab: usize,
    token_embd: DevWeight,
    embd_scale: f32,
    layers: Vec<DevLayer>,
    output_norm: DevNorm,
    output: DevWeight,
    final_softcap: Option<f32>,
    max: Maxima,
    bufs: Option<Buffers>,
    generation: usize,
    /// The captured single-token steps: `[logits out, greedy token out]`.
    graphs: [Option<SendCaptured>; 2],
    use_graph: bool,
    logits: PinnedBuf<f32>,
    /// The greedy token's key (see [`ops::argmax`]) read back by
    /// [`DeviceModel::decode_greedy`].
    token_key: PinnedBuf<u64>,
    weight_bytes: usize,
}

/// The KV cache of a [`CudaModel`]: per layer, K and V as f16
/// `[n_ctx, n_head_kv, head_dim]` in device memory.
pub struct CudaKvCache {
    /// Identity of this cache (a captured graph is bound to its buffers).
    id: usize,
    state: KvState,
    k: Vec<CudaSlice<u16>>,
    v: Vec<CudaSlice<u16>>,
}

impl KvCache for CudaKvCache {
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

impl CudaModel {
    /// Validates `spec` and uploads its weights to `dev`.
    pub(crate) fn new(dev: Arc<Device>, spec: &ModelSpec) -> Result<Self> {
        spec.validate()?;
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
            ops::check_attn_shape(l.n_head, l.n_head_kv, l.head_dim)?;
            max.flash &= ops::has_flash(l.head_dim);
            for (name, n) in [("post_attention_norm", &l.post_attn_norm), ("post_ffw_norm", &l.post_ffn_norm)] {
                if n.as_ref().is_some_and(|n| n.kind != NormType::RmsNorm) {
                    return Err(Error::InvalidModel(format!(
                        "{}: the CUDA backend supports RMSNorm post-norms only",
                        p(name)
                    )));
                }
            }
            for (name, n) in [("attn_q_norm", &l.q_norm), ("attn_k_norm", &l.k_norm)] {
                if n.as_ref().is_some_and(|n| n.kind != NormType::RmsNorm || n.bias.is_some()) {
                    return Err(Error::InvalidModel(format!(
                        "{}: the CUDA backend supports RMSNorm q/k norms only",
                        p(name)
                    )));
                }
            }
            let n_ff = l.ffn_up.rows;
            let (q_dim, kv_dim) = (l.n_head * l.head_dim, l.n_head_kv * l.head_dim);
            max.q_dim = max.q_dim.max(q_dim);
            max.kv_dim = max.kv_dim.max(kv_dim);
            max.n_ff = max.n_ff.max(n_ff);
            max.heads = max.heads.max(l.n_head);
            max.hd = max.hd.max(l.head_dim);
            max.cols = max.cols.max(q_dim).max(n_ff);
            let mut mats = vec![&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_up, &l.ffn_down];
            if let Some(g) = &l.ffn_gate {
                mats.push(g);
            }
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
        d.sync()?;
        Ok(CudaModel {
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
            bufs: None,
            generation: 0,
            graphs: [None, None],
            use_graph: true,
            logits: d.pinned(spec.n_vocab)?,
            token_key: d.pinned(1)?,
            weight_bytes,
            dev,
        })
    }

    /// Whether single-token decode steps replay a captured CUDA graph (the
    /// default) or launch every kernel directly.
    pub fn set_use_graph(&mut self, on: bool) {
        self.use_graph = on;
        if !on {
            self.graphs = [None, None];
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
        self.weight_bytes
    }

    fn ensure_buffers(&mut self, n_tok: usize, n_split: usize) -> Result<()> {
        if let Some(b) = &self.bufs {
            if b.cap >= n_tok && b.n_split == n_split {
                return Ok(());
            }
        }
        let cap = n_tok.max(self.bufs.as_ref().map_or(1, |b| b.cap));
        self.generation += 1;
        self.graphs = [None, None];
        self.bufs = None;
        self.bufs = Some(Buffers::new(&self.dev, &self.max, self.n_embd, self.n_vocab, cap, n_split, self.generation)?);
        Ok(())
    }

    /// Checks the request, then runs `tokens` from `pos0` chunk by chunk
    /// and reads the last token's logits (`greedy`: its greedy token's key
    /// instead).
    fn forward(&mut self, kv: &mut dyn KvCache, tokens: &[u32], pos0: usize, greedy: bool) -> Result<()> {
        let cache = checked_cache::<CudaKvCache>(kv, self.id, self.n_vocab, tokens, pos0)?;
        let n_split = ops::attn_splits(cache.state.n_ctx());
        let mut pos = pos0;
        for chunk in tokens.chunks(prefill_chunk(&self.max, n_split)) {
            self.ensure_buffers(chunk.len(), n_split)?;
            // The previous chunk was synchronized: no copy reads these.
            self.set_params(pos, chunk)?;
            if chunk.len() == 1 && self.use_graph {
                self.step_graph(cache, greedy)?;
            } else {
                self.enqueue_io(cache, chunk.len(), greedy)?;
            }
            self.dev.sync()?;
            cache.state.advance(pos0, pos + chunk.len() - pos0);
            pos += chunk.len();
        }
        Ok(())
    }

    /// Writes the first position and the token ids of a step into the
    /// pinned parameter buffer.
    fn set_params(&mut self, pos: usize, tokens: &[u32]) -> Result<()> {
        let p = i32::try_from(pos).map_err(|_| Error::Device(format!("position {pos} exceeds the kernels' range")))?;
        let b = self.bufs.as_mut().ok_or_else(|| Error::Device("buffers missing".into()))?;
        let params = b.params_host.as_mut_slice();
        params[0] = p;
        for (dst, &t) in params[1..].iter_mut().zip(tokens) {
            *dst = t as i32;
        }
        Ok(())
    }

    /// The whole step on the stream: parameters in, forward pass, logits
    /// out, or with `greedy` the argmax on the device and its 8-byte key
    /// out (what the graph captures).
    fn enqueue_io(&mut self, cache: &CudaKvCache, n: usize, greedy: bool) -> Result<()> {
        let b = self.bufs.as_ref().ok_or_else(|| Error::Device("buffers missing".into()))?;
        self.dev.enqueue_write(&b.params_host, self.dev.ptr(&b.params), n + 1)?;
        self.enqueue(cache, n, &mut |_, _| Ok(()))?;
        let b = self.bufs.as_ref().ok_or_else(|| Error::Device("buffers missing".into()))?;
        let d = &*self.dev;
        if greedy {
            let key = d.ptr(&b.argmax_key);
            ops::argmax(d, d.ptr(&b.logits), self.n_vocab, d.ptr(&b.argmax_part), d.ptr(&b.argmax_count), key)?;
            d.enqueue_read(key, &mut self.token_key)
        } else {
            d.enqueue_read(d.ptr(&b.logits), &mut self.logits)
        }
    }

    /// Replays (capturing first if needed) the single-token step.
    fn step_graph(&mut self, cache: &CudaKvCache, greedy: bool) -> Result<()> {
        let generation = self.bufs.as_ref().map_or(0, |b| b.generation);
        let slot = usize::from(greedy);
        let fresh =
            matches!(&self.graphs[slot], Some(SendCaptured(c)) if c.kv_id == cache.id && c.generation == generation);
        if !fresh {
            self.graphs[slot] = None;
            let stream = self.dev.stream.clone();
            // No device-synchronizing call of another thread may run while
            // this stream captures (see `device_lock`).
            let _device = super::device::device_lock();
            stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(dev_err("begin graph capture"))?;
            let queued = self.enqueue_io(cache, 1, greedy);
            let ended = stream.end_capture(CUgraphInstantiate_flags(0));
            queued?;
            let graph = ended
                .map_err(dev_err("end graph capture"))?
                .ok_or_else(|| Error::Device("graph capture produced no graph".into()))?;
            self.graphs[slot] = Some(SendCaptured(Captured { graph, kv_id: cache.id, generation }));
        }
        match &self.graphs[slot] {
            Some(SendCaptured(c)) => c.graph.launch().map_err(dev_err("graph launch")),
            None => Err(Error::Device("no captured graph".into())),
        }
    }
}

impl DeviceModel for CudaModel {
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn new_kv_cache(&self, n_ctx: usize) -> Result<Box<dyn KvCache>> {
        Ok(Box::new(self.new_cuda_kv_cache(n_ctx)?))
    }

    fn decode_token(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<&[f32]> {
        self.forward(kv, &[token], pos, false)?;
        Ok(self.logits.as_slice())
    }

    /// The argmax runs on the device, after the vocabulary product, and
    /// only its 8-byte key comes back (the logits stay on the device).
    fn decode_greedy(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<u32> {
        self.forward(kv, &[token], pos, true)?;
        ops::argmax_token(self.token_key.as_slice()[0])
    }

    fn prefill(&mut self, kv: &mut dyn KvCache, tokens: &[u32], pos: usize) -> Result<&[f32]> {
        self.forward(kv, tokens, pos, false)?;
        Ok(self.logits.as_slice())
    }

    /// The step's kernels launched directly (not the captured graph), the
    /// stream synchronized after each group of launches so that each group
    /// is timed alone: slower than a graph replay, and PDL overlap between
    /// groups is lost, but the same kernels, arguments and results.
    fn profile_step(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<StepProfile> {
        let cache = checked_cache::<CudaKvCache>(kv, self.id, self.n_vocab, &[token], pos)?;
        let t0 = Instant::now();
        self.ensure_buffers(1, ops::attn_splits(cache.state.n_ctx()))?;
        self.set_params(pos, &[token])?;
        let b = self.bufs.as_ref().ok_or_else(|| Error::Device("buffers missing".into()))?;
        self.dev.enqueue_write(&b.params_host, self.dev.ptr(&b.params), 2)?;
        self.dev.sync()?;
        let mut prof = StepProfile::default();
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
        self.enqueue(cache, 1, &mut mark)?;
        let b = self.bufs.as_ref().ok_or_else(|| Error::Device("buffers missing".into()))?;
        let src = self.dev.ptr(&b.logits);
        self.dev.enqueue_read(src, &mut self.logits)?;
        self.dev.sync()?;
        prof.record("logits to host", "", "", last.elapsed(), 0);
        cache.state.advance(pos, 1);
        prof.total = t0.elapsed();
        Ok(prof)
    }
}

/// The per-group callback of [`CudaModel::enqueue`]: a group's name and the
/// weights it read.
type Mark<'a> = dyn FnMut(&str, &[&DevWeight]) -> Result<()> + 'a;

impl CudaModel {
    /// Creates an empty f16 KV cache for `n_ctx` positions.
    ///
    /// # Errors
    /// `n_ctx == 0`, sizes past the kernels' 32-bit positions, device
    /// allocation failures.
    pub fn new_cuda_kv_cache(&self, n_ctx: usize) -> Result<CudaKvCache> {
        let state = KvState::new(self.id, n_ctx)?;
        if n_ctx > i32::MAX as usize / 2 {
            return Err(Error::InvalidModel(format!("a KV cache of {n_ctx} positions exceeds the kernels' range")));
        }
        let mut k = Vec::with_capacity(self.layers.len());
        let mut v = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let len = n_ctx.checked_mul(l.n_kv * l.hd).ok_or(Error::Overflow("KV cache size"))?;
            k.push(self.dev.zeros::<u16>(len)?);
            v.push(self.dev.zeros::<u16>(len)?);
        }
        self.dev.sync()?;
        Ok(CudaKvCache { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), state, k, v })
    }
}
