//! The CUDA backend (feature `cuda`).
//!
//! - [`CudaBackend::new`] opens a device through cudarc's dynamically
//!   loaded driver API; a missing driver, library or device is an
//!   [`Error::Device`], never a panic (the loader's panics are caught).
//! - Kernels are the `.cu` files of `kernels/`, embedded with
//!   `include_str!`, compiled by NVRTC to CUBINs for the device's exact
//!   architecture in modules (the common kernels, and each quantized
//!   layout's products when a model needs them; cached on disk,
//!   `compile.rs`), and looked up by typed names (`kernels.rs`).
//! - Which layouts, kernels and fusions run is data: [`CudaOptions`]
//!   (`options.rs`), one per backend ([`CudaBackend::with_options`]), filled
//!   from the `INFER_CUDA_*` variables by [`CudaBackend::new`].
//! - Dense f32 products go to cuBLAS (row-major handled by swapping the
//!   operands: `Cᵀ = Bᵀ·Aᵀ` in cuBLAS's column-major view).
//! - Quantized mat-vecs quantize the activation to q8 chunks on the device
//!   (32 int8 values, f32 scale and sum) and take integer `dp4a` dot
//!   products against the GGUF blocks as they are stored; float weights
//!   (F32, F16, BF16) use the f32 activation. See `kernels/matvec.cu`.
//! - The pipeline ([`CudaModel`]) keeps weights, scratch buffers and an f16
//!   KV cache on the device and replays one captured CUDA graph per token;
//!   prefill passes of 16+ tokens run the projections as cuBLAS tensor-core
//!   GEMMs on weights dequantized to bf16 one matrix at a time.
//!
//! Supported weight types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (Q8_1 and Q8_K are activation
//! formats: [`Error::Unsupported`]).

mod buffers;
mod compile;
mod device;
pub(crate) mod kernels;
mod kv_pool;
mod model;
mod ops;
mod options;
mod repack;

use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use ndarray::{Array2, ArrayView2};

pub use buffers::PREFILL_CHUNK;
use device::Device;
pub use device::DeviceInfo;
use kernels::{AttnArgs, NormArgs, QkvArgs};
pub use kv_pool::CudaKvPool;
pub use model::CudaModel;
use ops::Matvec;
pub use options::{CudaOptions, GemmPrecision};

use crate::backend::{ComputeBackend, DeviceModel};
use crate::error::{shape_err, Error, Result};
use crate::kv_type::{KvCacheType, KvTypes};
use crate::pipeline::{ModelSpec, RopeSpec, RopeType};
use crate::weight::QuantWeight;

/// A CUDA device behind the [`ComputeBackend`] trait.
///
/// Safe to share between threads: each prepared model runs on a stream of
/// its own, and the backend's own ops (`matvec`, `matmul`, ...) take turns
/// on the backend's stream.
pub struct CudaBackend {
    dev: Arc<Device>,
    /// Held by each op on `dev`'s stream, one thread at a time (the stream
    /// and its cuBLAS handle are not for concurrent use).
    ops: std::sync::Mutex<()>,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl CudaBackend {
    /// Opens CUDA device `ordinal` with the options of the `INFER_CUDA_*`
    /// environment variables ([`CudaOptions::from_env`]; the defaults when
    /// none is set).
    ///
    /// # Errors
    /// [`Error::Device`] when the driver library (`libcuda.so`) is missing,
    /// no device `ordinal` exists, cuBLAS or NVRTC are missing, or the
    /// kernels fail to compile or load.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_options(ordinal, CudaOptions::from_env())
    }

    /// Opens CUDA device `ordinal` running the kernels and fusions `opts`
    /// chooses: backends of different options may live in one process
    /// (their models then run different kernels side by side).
    ///
    /// # Errors
    /// As [`CudaBackend::new`].
    pub fn with_options(ordinal: usize, opts: CudaOptions) -> Result<Self> {
        // SAFETY: only probes whether the library can be opened.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Device("no CUDA driver: libcuda.so could not be loaded".into()));
        }
        match std::panic::catch_unwind(|| Device::open(ordinal, opts)) {
            Ok(Ok(dev)) => Ok(CudaBackend { dev: Arc::new(dev), ops: std::sync::Mutex::new(()) }),
            Ok(Err(e)) => Err(e),
            Err(p) => Err(Error::Device(format!("CUDA initialization failed: {}", panic_message(&*p)))),
        }
    }

    /// The kernel modules this backend has loaded so far (`compile.rs`):
    /// `common`, and the products of each quantized layout its models have
    /// (`q4_kr` is Q4_K's repacked layout), in a fixed order.
    pub fn loaded_kernel_modules(&self) -> Vec<&'static str> {
        self.dev.loaded_modules()
    }

    /// The options this backend runs with.
    pub fn options(&self) -> &CudaOptions {
        &self.dev.opts
    }

    /// Name, memory, compute capability of the device.
    pub fn info(&self) -> &DeviceInfo {
        &self.dev.info
    }

    /// `(kernel, registers per thread, local memory bytes per thread)` of
    /// every kernel, for tuning (local memory means spills). Loads every
    /// kernel module first, compiling those not in the cache (see
    /// `compile.rs`: a model loads only the modules of its weight types).
    ///
    /// # Errors
    /// [`Error::Device`] when a module cannot be compiled or loaded.
    pub fn kernel_resources(&self) -> Result<Vec<(&'static str, i32, i32)>> {
        self.dev.kernel_resources()
    }

    /// [`ComputeBackend::prepare`] returning the concrete model (for
    /// [`CudaModel::set_use_graph`] and its byte counts).
    ///
    /// # Errors
    /// As [`ComputeBackend::prepare`]; shapes the kernels do not cover
    /// (head_dim not a multiple of 8 or above 1024, LayerNorm post-norms).
    pub fn prepare_cuda(&self, spec: &ModelSpec) -> Result<CudaModel> {
        CudaModel::new(Arc::new(self.dev.with_own_stream()?), spec)
    }

    /// The backend's stream, for one op (a poisoned lock only means another
    /// op panicked; the stream itself is still usable).
    fn exclusive(&self) -> std::sync::MutexGuard<'_, ()> {
        self.ops.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn upload_f32(&self, x: &[f32]) -> Result<cudarc::driver::CudaSlice<f32>> {
        self.dev.upload(x)
    }

    fn read_f32(&self, buf: &cudarc::driver::CudaSlice<f32>, n: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; n];
        self.dev.read_back(buf, 0, &mut out)?;
        Ok(out)
    }

    /// Fused residual add and normalization over `n_tok = x.len() / n` rows
    /// of `n = weight.len()` values, as the pipeline runs it:
    /// `x += add_norm.map_or(add, |(w, eps)| rms_norm(add, w, eps))`, then
    /// `out = rms_norm(x, weight, eps)` (or LayerNorm with `bias` when
    /// `layer_norm`). Returns `(x, out)`.
    ///
    /// # Errors
    /// Length mismatches; device errors.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_norm(
        &self,
        x: &[f32],
        add: Option<&[f32]>,
        add_norm: Option<(&[f32], f32)>,
        weight: &[f32],
        bias: Option<&[f32]>,
        layer_norm: bool,
        eps: f32,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let _stream = self.exclusive();
        let n = weight.len();
        if n == 0
            || !x.len().is_multiple_of(n)
            || add.is_some_and(|a| a.len() != x.len())
            || bias.is_some_and(|b| b.len() != n)
        {
            return Err(shape_err("cuda residual_norm", format!("x {} values, rows of {n}", x.len())));
        }
        if add_norm.is_some_and(|(w, _)| w.len() != n) || (add_norm.is_some() && add.is_none()) {
            return Err(shape_err("cuda residual_norm", "add norm weights need an addend of the same width"));
        }
        let d = &*self.dev;
        let xb = self.upload_f32(x)?;
        let ab = add.map(|a| self.upload_f32(a)).transpose()?;
        let awb = add_norm.map(|(w, _)| self.upload_f32(w)).transpose()?;
        let wb = self.upload_f32(weight)?;
        let bb = bias.map(|b| self.upload_f32(b)).transpose()?;
        let out = d.zeros::<f32>(x.len())?;
        let args = NormArgs {
            x: d.ptr(&xb),
            add: ab.as_ref().map_or(0, |s| d.ptr(s)),
            add_w: awb.as_ref().map_or(0, |s| d.ptr(s)),
            w: d.ptr(&wb),
            b: bb.as_ref().map_or(0, |s| d.ptr(s)),
            out: d.ptr(&out),
            q: 0,
            ds: 0,
            n: n as i32,
            kind: layer_norm as i32,
            eps,
            add_eps: add_norm.map_or(0.0, |(_, e)| e),
        };
        ops::residual_norm(d, &args, x.len() / n)?;
        Ok((self.read_f32(&xb, x.len())?, self.read_f32(&out, x.len())?))
    }

    /// RoPE (with optional per-head RMSNorm `(weight, eps)` first) of
    /// `x: [n_tokens, n_head, head_dim]`, token `t` at position `pos0 + t`,
    /// through the pipeline's q path.
    ///
    /// # Errors
    /// Shape mismatches; device errors.
    pub fn rope(
        &self,
        x: &[f32],
        n_head: usize,
        head_dim: usize,
        pos0: usize,
        spec: &RopeSpec,
        head_norm: Option<(&[f32], f32)>,
    ) -> Result<Vec<f32>> {
        let _stream = self.exclusive();
        let row = n_head * head_dim;
        if row == 0 || !x.len().is_multiple_of(row) || spec.n_rot > head_dim || !spec.n_rot.is_multiple_of(2) {
            return Err(shape_err(
                "cuda rope",
                format!("{} values, {n_head} heads of {head_dim}, n_rot {}", x.len(), spec.n_rot),
            ));
        }
        let d = &*self.dev;
        let xb = self.upload_f32(x)?;
        let nw = head_norm.map(|(w, _)| self.upload_f32(w)).transpose()?;
        let posb = d.upload(&[pos0 as i32])?;
        let args = QkvArgs {
            q: d.ptr(&xb),
            qn_w: nw.as_ref().map_or(0, |s| d.ptr(s)),
            pos0: d.ptr(&posb),
            n_head: n_head as i32,
            n_kv: 0,
            hd: head_dim as i32,
            n_rot: spec.n_rot as i32,
            neox: (spec.kind == RopeType::NeoX) as i32,
            n_tok: (x.len() / row) as i32,
            theta_scale: spec.base.powf(-2.0f32 / spec.n_rot.max(1) as f32),
            freq_scale: spec.freq_scale,
            qn_eps: head_norm.map_or(0.0, |(_, e)| e),
            ..Default::default()
        };
        ops::qkv_post(d, &args)?;
        self.read_f32(&xb, x.len())
    }

    /// Decode attention of one query `q: [n_head, head_dim]` at `pos`
    /// against f32 caches `[n_ctx, n_head_kv, head_dim]` (stored as f16 on
    /// the device, as the pipeline's cache is), with the pipeline's kernels:
    /// the decode step's q/k/v post-processing and attention with no bias,
    /// norm or rotation, whose KV append stores row `pos` of the caches
    /// again (into the device copy).
    ///
    /// # Errors
    /// Shape mismatches; device errors.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_decode(
        &self,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        pos: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        scale: f32,
        softcap: Option<f32>,
        window: Option<usize>,
    ) -> Result<Vec<f32>> {
        let _stream = self.exclusive();
        ops::check_attn_shape(n_head, n_head_kv, head_dim)?;
        let kv_dim = n_head_kv * head_dim;
        if q.len() != n_head * head_dim || k_cache.len() != v_cache.len() || k_cache.len() < (pos + 1) * kv_dim {
            return Err(shape_err("cuda attention_decode", "q or cache lengths do not match the shape"));
        }
        let d = &*self.dev;
        let n_ctx = k_cache.len() / kv_dim;
        let n_split = ops::attn_splits(n_ctx);
        let to16 = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect::<Vec<u16>>();
        let kb = d.upload(&to16(k_cache))?;
        let vb = d.upload(&to16(v_cache))?;
        let qb = self.upload_f32(q)?;
        let posb = d.upload(&[pos as i32])?;
        let part_o = d.zeros::<f32>(n_head * n_split * head_dim)?;
        let part_ml = d.zeros::<f32>(n_head * n_split * 2)?;
        let out = d.zeros::<f32>(q.len())?;
        let f16 = kv_pool::CacheLayout::new(KvCacheType::F16, n_head_kv, head_dim, true, 1, n_ctx)?;
        let args = AttnArgs {
            q: d.ptr(&qb),
            kc: d.ptr(&kb),
            vc: d.ptr(&vb),
            part_o: d.ptr(&part_o),
            part_ml: d.ptr(&part_ml),
            out: d.ptr(&out),
            oq: 0,
            ods: 0,
            pos0: d.ptr(&posb),
            n_head: n_head as i32,
            n_kv: n_head_kv as i32,
            hd: head_dim as i32,
            n_split: n_split as i32,
            window: window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
            n_tok: 1,
            scale,
            softcap: softcap.unwrap_or(0.0),
            ..Default::default()
        };
        let args = kv_pool::CacheLayout::attn_args(f16, f16, args);
        let row = pos * kv_dim..(pos + 1) * kv_dim;
        let kn = self.upload_f32(&k_cache[row.clone()])?;
        let vn = self.upload_f32(&v_cache[row])?;
        let count = d.zeros::<i32>(n_head_kv)?;
        let qkv = QkvArgs {
            q: d.ptr(&qb),
            k: d.ptr(&kn),
            v: d.ptr(&vn),
            kc: d.ptr(&kb),
            vc: d.ptr(&vb),
            pos0: d.ptr(&posb),
            n_head: n_head as i32,
            n_kv: n_head_kv as i32,
            hd: head_dim as i32,
            n_tok: 1,
            theta_scale: 1.0,
            freq_scale: 1.0,
            ..Default::default()
        };
        let qkv = kv_pool::CacheLayout::qkv_args(f16, f16, qkv);
        let flat = ops::decode_flat(d, &args, 1, pos);
        ops::qkv_attention(d, &qkv, &args, d.ptr(&count), flat)?;
        self.read_f32(&out, q.len())
    }

    /// Appends rows of keys `k` and values `v`, `[n_pos][n_head_kv ·
    /// head_dim]`, at positions `0..n_pos` of a fresh cache of `types`
    /// through the pipeline's append (`qkv_post` with no bias, norm or
    /// RoPE) and returns the bytes stored: `n_pos` rows of each cache in
    /// its device format (`kernels/kv_cache.cuh`: f16; q8_0 or q4_0 codes,
    /// then their f16 scales, padded to 16 bytes), rotated as the type is.
    /// For checking the device's quantization and rotation against the
    /// CPU's.
    ///
    /// # Errors
    /// Shape mismatches, [`Error::UnsupportedKvCache`] (f32, and tq3 and
    /// tq4, whose buffers are not rows); device errors.
    pub fn store_kv_rows(
        &self,
        k: &[f32],
        v: &[f32],
        n_head_kv: usize,
        head_dim: usize,
        types: KvTypes,
    ) -> Result<(Vec<u8>, Vec<u8>)> {
        let _stream = self.exclusive();
        let kv_dim = n_head_kv * head_dim;
        if kv_dim == 0 || k.len() != v.len() || !k.len().is_multiple_of(kv_dim) || k.is_empty() {
            return Err(shape_err("cuda store_kv_rows", "k and v must be whole rows of n_head_kv * head_dim"));
        }
        let n_pos = k.len() / kv_dim;
        let kl = kv_pool::CacheLayout::new(types.k, n_head_kv, head_dim, true, 1, n_pos)?;
        let vl = kv_pool::CacheLayout::new(types.v, n_head_kv, head_dim, false, 1, n_pos)?;
        if let Some(ty) = [kl, vl].iter().find(|l| l.tq.is_some()).map(|l| l.ty) {
            // Their rows are codes of a pass's attention (tq_cache.cu), not
            // what qkv_post stores; the conformance suite checks them.
            return Err(Error::UnsupportedKvCache {
                ty,
                reason: "store_kv_rows reads row formats, not TurboQuant buffers".into(),
            });
        }
        let d = &*self.dev;
        let (kb, vb) = (self.upload_f32(k)?, self.upload_f32(v)?);
        let (kc, vc) = (d.zeros::<u8>(n_pos * kl.row)?, d.zeros::<u8>(n_pos * vl.row)?);
        let posb = d.upload(&[0i32])?;
        let args = QkvArgs {
            k: d.ptr(&kb),
            v: d.ptr(&vb),
            kc: d.ptr(&kc),
            vc: d.ptr(&vc),
            pos0: d.ptr(&posb),
            n_kv: n_head_kv as i32,
            hd: head_dim as i32,
            n_tok: n_pos as i32,
            theta_scale: 1.0,
            freq_scale: 1.0,
            ..Default::default()
        };
        let args = kv_pool::CacheLayout::qkv_args(kl, vl, args);
        ops::qkv_post(d, &args)?;
        let mut out = (vec![0u8; n_pos * kl.row], vec![0u8; n_pos * vl.row]);
        d.read_back(&kc, 0, &mut out.0)?;
        d.read_back(&vc, 0, &mut out.1)?;
        Ok(out)
    }

    /// `act(gate) · up` elementwise (`gelu`: GELU-tanh, else SiLU).
    ///
    /// # Errors
    /// Length mismatch; device errors.
    pub fn glu(&self, gate: &[f32], up: &[f32], gelu: bool) -> Result<Vec<f32>> {
        let _stream = self.exclusive();
        if gate.len() != up.len() {
            return Err(shape_err("cuda glu", "gate and up differ in length"));
        }
        let d = &*self.dev;
        let (g, u) = (self.upload_f32(gate)?, self.upload_f32(up)?);
        let out = d.zeros::<f32>(gate.len())?;
        ops::glu(d, d.ptr(&g), d.ptr(&u), d.ptr(&out), gate.len(), gelu)?;
        self.read_f32(&out, gate.len())
    }

    /// The device top-k of `forward_top_k` on given logits: fills `out`
    /// with the `min(k, n_vocab)` most likely tokens and the statistics of
    /// each row of `n_vocab` values of `logits` (`kernels/topk.cu`; the
    /// contract and host reference are [`crate::backend::TopK`]'s).
    ///
    /// # Errors
    /// [`Error::Shape`] for a `k` of 0 or above
    /// [`crate::backend::TOP_K_MAX`], or `logits` not whole rows; device
    /// errors.
    pub fn top_k_rows(&self, logits: &[f32], n_vocab: usize, k: usize, out: &mut crate::backend::TopK) -> Result<()> {
        let _stream = self.exclusive();
        crate::backend::check_k(k)?;
        if n_vocab == 0 || !logits.len().is_multiple_of(n_vocab) {
            return Err(shape_err("cuda top_k", format!("{} logits are not rows of {n_vocab}", logits.len())));
        }
        let (rows, k) = (logits.len() / n_vocab, k.min(n_vocab));
        let d = &*self.dev;
        let x = self.upload_f32(logits)?;
        let words = d.zeros::<u32>(rows * ops::top_k_stride(k))?;
        let scratch = d.zeros::<u32>(ops::top_k_scratch_words(rows))?;
        ops::top_k(d, d.ptr(&x), n_vocab, rows, k, d.ptr(&scratch), rows, d.ptr(&words))?;
        let mut host = vec![0u32; words.len()];
        d.read_back(&words, 0, &mut host)?;
        ops::unpack_top_k(&host, rows, k, out);
        Ok(())
    }

    /// Dequantizes every row of `w` on the device (the embedding kernel).
    ///
    /// # Errors
    /// Types without a kernel; device errors.
    pub fn dequantize(&self, w: &QuantWeight) -> Result<Vec<f32>> {
        let _stream = self.exclusive();
        if w.rows == 0 || w.cols == 0 {
            return Ok(Vec::new());
        }
        let d = &*self.dev;
        let wb = d.upload(w.data.as_bytes())?;
        let ids: Vec<i32> = (0..w.rows as i32).collect();
        let idb = d.upload(&ids)?;
        let out = d.zeros::<f32>(w.rows * w.cols)?;
        ops::embed_rows(d, d.ptr(&wb), w.ty, w.cols, d.ptr(&idb), w.rows, 1.0, d.ptr(&out))?;
        self.read_f32(&out, w.rows * w.cols)
    }

    /// `Y = X·Wᵀ` for `x: [n_tok, w.cols]` on the device.
    fn matvec_rows(&self, w: &QuantWeight, x: &[f32], n_tok: usize) -> Result<Vec<f32>> {
        let _stream = self.exclusive();
        // The fields are public: a hand-edited weight must not reach a kernel.
        w.check()?;
        let quantized = ops::wants_q8(w.ty)?;
        if x.len() != n_tok * w.cols {
            return Err(shape_err(
                "cuda matvec",
                format!("W is {}x{}, x has {} values for {n_tok} tokens", w.rows, w.cols, x.len()),
            ));
        }
        if w.rows == 0 || n_tok == 0 {
            return Ok(vec![0.0; n_tok * w.rows]);
        }
        let d = &*self.dev;
        // The layout a prepared model uses, so that these calls run the
        // decode kernels as the model does.
        let (wb, stride) = match repack::repack_weight(w, d.opts.repack) {
            Some((bytes, stride)) => (d.upload(&bytes)?, stride),
            None => (d.upload(w.data.as_bytes())?, 0),
        };
        let xb = self.upload_f32(x)?;
        let y = d.zeros::<f32>(n_tok * w.rows)?;
        // The batches a model runs on the tensor cores, as it does.
        let layout = (w.ty, stride != 0);
        if ops::mmq_tokens(d, n_tok) && ops::mmq_kernel(layout.0, layout.1).is_some() {
            let stride = if stride != 0 { stride } else { w.ty.row_bytes(w.cols)? };
            let x16 = d.zeros::<u16>(x.len())?;
            ops::to_bf16(d, d.ptr(&xb), d.ptr(&x16), x.len())?;
            let part = d.zeros::<f32>(ops::mmq_part_len(d, n_tok))?;
            let (yp, pp) = ((d.ptr(&y), w.rows), (d.ptr(&part), part.len()));
            ops::mmq(d, layout, d.ptr(&wb), stride, (w.rows, w.cols), d.ptr(&x16), n_tok, yp, pp)?;
            return self.read_f32(&y, n_tok * w.rows);
        }
        let mut call = Matvec::single(w.ty, d.ptr(&wb), w.rows, w.cols, d.ptr(&y));
        call.repacked_stride = stride;
        call.n_tok = n_tok;
        call.x = d.ptr(&xb);
        let (_q, _ds);
        if quantized {
            let n_chunks = x.len() / 32;
            let q = d.zeros::<i8>(x.len())?;
            let ds = d.zeros::<f32>(2 * n_chunks)?;
            ops::quantize_q8(d, d.ptr(&xb), d.ptr(&q), d.ptr(&ds), n_chunks)?;
            call.aq = d.ptr(&q);
            call.ad = d.ptr(&ds);
            (_q, _ds) = (q, ds);
        }
        ops::matvec(d, &call)?;
        self.read_f32(&y, n_tok * w.rows)
    }

    fn sgemm(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, b_transposed: bool) -> Result<Array2<f32>> {
        let _stream = self.exclusive();
        let (m, k) = a.dim();
        let (n, kb) = if b_transposed { b.dim() } else { (b.dim().1, b.dim().0) };
        if k != kb {
            let op = if b_transposed { "cuda matmul_transb" } else { "cuda matmul" };
            return Err(shape_err(op, format!("a is {m}x{k}, b is {}x{}", b.dim().0, b.dim().1)));
        }
        if m == 0 || n == 0 || k == 0 {
            return Ok(Array2::zeros((m, n)));
        }
        let too_big =
            |v: usize| i32::try_from(v).map_err(|_| Error::Device(format!("dimension {v} exceeds cuBLAS's int range")));
        let (mi, ni, ki) = (too_big(m)?, too_big(n)?, too_big(k)?);
        let a = a.as_standard_layout();
        let b = b.as_standard_layout();
        let d = &*self.dev;
        let ab = d.upload(a.as_slice().ok_or_else(|| shape_err("cuda matmul", "non-contiguous a"))?)?;
        let bb = d.upload(b.as_slice().ok_or_else(|| shape_err("cuda matmul", "non-contiguous b"))?)?;
        let mut c = d.zeros::<f32>(m * n)?;
        // Row-major C (m×n) is column-major Cᵀ (n×m) = op(B)ᵀ-view · Aᵀ-view.
        let cfg = GemmConfig {
            transa: if b_transposed { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N },
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: ni,
            n: mi,
            k: ki,
            alpha: 1.0f32,
            lda: if b_transposed { ki } else { ni },
            ldb: ki,
            beta: 0.0f32,
            ldc: ni,
        };
        // SAFETY: the buffers hold exactly the m·k, k·n (or n·k) and m·n
        // values the leading dimensions above describe.
        unsafe { d.blas.gemm(cfg, &bb, &ab, &mut c) }.map_err(|e| Error::Device(format!("cuBLAS sgemm: {e:?}")))?;
        let out = self.read_f32(&c, m * n)?;
        Array2::from_shape_vec((m, n), out).map_err(|e| shape_err("cuda matmul", e.to_string()))
    }
}

impl ComputeBackend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_info(&self) -> String {
        let i = &self.dev.info;
        format!(
            "CUDA device {}: {}, {:.1} GiB, compute capability {}.{}, {} SMs; NVRTC kernels, cuBLAS, q8 dp4a mat-vecs, CUDA-graph decode",
            i.ordinal,
            i.name,
            i.total_mem as f64 / (1u64 << 30) as f64,
            i.compute_capability.0,
            i.compute_capability.1,
            i.multiprocessors
        )
    }

    fn matmul(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        self.sgemm(a, b, false)
    }

    fn matmul_transb(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        self.sgemm(a, b, true)
    }

    fn matvec(&self, w: &QuantWeight, x: &[f32], y: &mut [f32]) -> Result<()> {
        if x.len() != w.cols || y.len() != w.rows {
            return Err(shape_err(
                "matvec",
                format!("W is {}x{}, x has {}, y has {}", w.rows, w.cols, x.len(), y.len()),
            ));
        }
        let out = self.matvec_rows(w, x, 1)?;
        y.copy_from_slice(&out);
        Ok(())
    }

    fn matmul_quant(&self, w: &QuantWeight, x: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        let (n_tok, cols) = x.dim();
        if cols != w.cols {
            return Err(shape_err("matmul_quant", format!("W is {}x{}, x is {n_tok}x{cols}", w.rows, w.cols)));
        }
        let x = x.as_standard_layout();
        let xs = x.as_slice().ok_or_else(|| shape_err("matmul_quant", "non-contiguous x"))?;
        let out = self.matvec_rows(w, xs, n_tok)?;
        Array2::from_shape_vec((n_tok, w.rows), out).map_err(|e| shape_err("matmul_quant", e.to_string()))
    }

    fn supports(&self, spec: &ModelSpec) -> Result<()> {
        model::supports(spec)
    }

    fn prepare(&self, spec: &ModelSpec) -> Result<Box<dyn DeviceModel>> {
        Ok(Box::new(self.prepare_cuda(spec)?))
    }
}
