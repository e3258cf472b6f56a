//! The backend contract: [`ComputeBackend`] (a device and its single ops),
//! [`DeviceModel`] (a model prepared on it, stepping a [`Batch`]) and
//! [`KvPool`] (the keys and values of many sequences, owned by the
//! backend), with the bookkeeping they all share ([`KvState`],
//! [`check_batch`]) and the profile a model reports ([`StepProfile`]).
//!
//! Two levels:
//! - single ops (`matmul`, `matvec`, `matmul_quant`) for callers that build
//!   their own graphs or test kernels;
//! - the pipeline: [`ComputeBackend::prepare`] takes a device-independent
//!   [`ModelSpec`] and returns a [`DeviceModel`] whose weights live where the
//!   backend wants them (borrowed from the memory map on the CPU, uploaded
//!   once on a GPU). Its KV caches are created and owned by the backend.
//!
//! This module imports only the layers below it ([`crate::weight`],
//! [`crate::pipeline`], [`crate::error`]); backends implement it, and
//! `device.rs` picks one.

mod batch;
mod kv;
mod profile;
mod topk;

use ndarray::{Array2, ArrayView2};

pub use batch::{Batch, Out, Span};
pub use kv::{advance_spans, check_batch, checked_pool, new_states, rollback_spans, KvPool, KvState, ModelId};
pub use profile::{OpTiming, StepProfile};
pub use topk::{check_k, order_key, row_stats, RowStats, TopK, TopKRow, TOP_K_MAX};

use crate::error::{Error, Result};
use crate::kv_type::KvTypes;
use crate::pipeline::ModelSpec;
use crate::weight::QuantWeight;

/// A compute device. Callers program against this trait only.
pub trait ComputeBackend: Send + Sync {
    /// Short name (`"cpu"`, `"cuda"`).
    fn name(&self) -> &'static str;

    /// Human-readable description of the device and the kernels selected
    /// (e.g. CPU model, SIMD path, thread count; GPU name and memory).
    fn device_info(&self) -> String;

    /// Dense f32 matrix product `a · b`: a is m×k, b is k×n, result m×n.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the inner dimensions differ.
    fn matmul(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Result<Array2<f32>>;

    /// Dense f32 product with the second operand transposed, `a · bᵀ`: a is
    /// m×k, b is n×k, result m×n (the layout of weight matrices).
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the k dimensions differ.
    fn matmul_transb(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Result<Array2<f32>>;

    /// Quantized matrix-vector product `y = W·x` (GEMV): `x` has `w.cols`
    /// values, `y` has `w.rows`. The activation is quantized to the weight
    /// type's `vec_dot_type` as ggml does (exact f32 for F32 weights).
    ///
    /// # Errors
    /// Length mismatches; types without a dot product (Q8_1, Q8_K).
    fn matvec(&self, w: &QuantWeight, x: &[f32], y: &mut [f32]) -> Result<()>;

    /// Quantized matrix product for prefill: `x` is n_tokens × w.cols,
    /// result n_tokens × w.rows (`Y = X·Wᵀ`), each weight block reused across
    /// all tokens.
    ///
    /// # Errors
    /// As [`ComputeBackend::matvec`].
    fn matmul_quant(&self, w: &QuantWeight, x: ArrayView2<'_, f32>) -> Result<Array2<f32>>;

    /// Whether this backend can run `spec` (a valid model): its weight
    /// types, norms and shapes have kernels here. [`ComputeBackend::prepare`]
    /// asks this first; callers ask it to choose a backend.
    ///
    /// # Errors
    /// [`crate::Error::UnsupportedModel`] naming the first tensor or
    /// feature this backend lacks.
    fn supports(&self, spec: &ModelSpec) -> Result<()> {
        let _ = spec;
        Ok(())
    }

    /// Prepares a model for this device: validates the spec, repacks or
    /// uploads the weights once, and returns the runnable model.
    ///
    /// Validates the spec once ([`ModelSpec::validate`]); callers need not.
    ///
    /// # Errors
    /// [`crate::Error::InvalidModel`] for inconsistent specs;
    /// [`crate::Error::UnsupportedModel`] for features the backend lacks
    /// (see [`ComputeBackend::supports`]); [`crate::Error::OutOfMemory`]
    /// and device errors.
    fn prepare(&self, spec: &ModelSpec) -> Result<Box<dyn DeviceModel>>;
}

/// One sequence's step in [`DeviceModel::decode_batch`]: `token` at
/// position `pos` of the sequence whose one-slot pool is `kv`.
pub struct SeqStep<'a> {
    pub kv: &'a mut dyn KvPool,
    pub token: u32,
    pub pos: usize,
}

/// A model prepared on one device: weights where the backend wants them
/// and the per-engine state of one caller (scratch buffers, captured
/// graphs, a stream). Each step runs against a [`KvPool`] this model (or a
/// context sharing its weights, [`DeviceModel::new_context`]) created.
///
/// [`DeviceModel::forward`] is the one step every backend implements; the
/// single-sequence methods are provided wrappers over a one-slot pool
/// (slot 0), which a backend may override where it has a faster path.
pub trait DeviceModel: Send {
    /// Vocabulary size (length of a row of logits).
    fn n_vocab(&self) -> usize;

    /// Creates an empty KV pool of `n_slots` sequences of `n_ctx`
    /// positions each on this device (one allocation per layer, sized
    /// once: a serving engine creates it at start), its keys and values
    /// stored as `types` say (llama.cpp's `-ctk`, `-ctv`).
    ///
    /// # Errors
    /// [`Error::EmptyKvCache`] when `n_slots` or `n_ctx` is 0;
    /// [`Error::UnsupportedKvCache`] for a type this backend does not
    /// store, or one whose blocks do not divide the model's `head_dim`;
    /// [`Error::Overflow`], [`Error::OutOfMemory`] or a device error when
    /// it does not fit.
    fn new_kv_pool_typed(&self, n_slots: usize, n_ctx: usize, types: KvTypes) -> Result<Box<dyn KvPool>>;

    /// The cache types of [`DeviceModel::new_kv_pool`]: f16 keys and
    /// values unless the backend says otherwise (the CPU's exact mode: f32).
    fn default_kv_types(&self) -> KvTypes {
        KvTypes::default()
    }

    /// [`DeviceModel::new_kv_pool_typed`] with [`DeviceModel::default_kv_types`].
    ///
    /// # Errors
    /// As [`DeviceModel::new_kv_pool_typed`].
    fn new_kv_pool(&self, n_slots: usize, n_ctx: usize) -> Result<Box<dyn KvPool>> {
        self.new_kv_pool_typed(n_slots, n_ctx, self.default_kv_types())
    }

    /// Runs one forward step over `batch` (any mix of decode steps and
    /// prompt chunks of distinct slots of `pool`; see [`Batch`]) and
    /// returns the logits of the tokens whose logits are wanted: one row of
    /// [`DeviceModel::n_vocab`] values per such token, in batch order
    /// ([`Batch::output_indices`]). Each token is computed as if its
    /// sequence ran alone: its RoPE at its own position, its keys and
    /// values appended to its slot, attention over its slot only.
    ///
    /// The whole batch is checked before anything runs ([`check_batch`]):
    /// a failed check changes no slot. On success each span's slot holds
    /// `pos0 + len` positions; after an error while running (out of memory,
    /// a device error) each span's slot keeps its positions before the span
    /// only.
    ///
    /// # Errors
    /// [`Error::EmptyBatch`]; [`Error::ForeignKvCache`] for a pool of
    /// another model or backend; [`Error::InBatch`] naming the first
    /// offending token ([`Error::SlotOutOfRange`], [`Error::SlotRepeated`],
    /// or an error of [`KvState::check_step`]); out of memory and device
    /// errors.
    fn forward(&mut self, pool: &mut dyn KvPool, batch: &Batch) -> Result<&[f32]>;

    /// Runs one step like [`DeviceModel::forward`] (same checks, same
    /// effect on the pool, same errors) and writes to `out`, instead of the
    /// logits, each output row's `min(k, n_vocab)` most likely tokens and
    /// its whole-row statistics ([`TopK`]: rows in `forward`'s order,
    /// candidates by logit descending, the lower id first on a tie). A NaN
    /// anywhere in a row is reported in its [`RowStats::first_nan`], not as
    /// an error.
    ///
    /// The provided method computes this on the host from `forward`'s
    /// logits ([`TopK::fill_from_logits`]); a backend can select where the
    /// logits are and copy back only `rows × k` candidates. After an error
    /// `out` is unspecified.
    ///
    /// # Errors
    /// [`Error::Shape`] when `k` is 0 or above [`TOP_K_MAX`] (nothing runs);
    /// those of [`DeviceModel::forward`].
    fn forward_top_k(&mut self, pool: &mut dyn KvPool, batch: &Batch, k: usize, out: &mut TopK) -> Result<()> {
        check_k(k)?;
        let n_vocab = self.n_vocab();
        let logits = self.forward(pool, batch)?;
        out.fill_from_logits(logits, n_vocab, k)
    }

    /// Whether [`DeviceModel::forward_top_k`] selects the candidates where
    /// the logits are, so that it is cheaper than [`DeviceModel::forward`]
    /// and sampling the whole rows on the host. The provided method says
    /// `false` (the provided `forward_top_k` is `forward` and a host pass).
    fn top_k_on_device(&self) -> bool {
        false
    }

    /// Another engine over the same prepared weights, with its own scratch
    /// (and, on a GPU, its own stream and graphs): llama.cpp's
    /// `llama_context` beside one `llama_model`. The weights are not
    /// copied; a pool created by either engine serves both.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] and device errors for the new scratch.
    fn new_context(&self) -> Result<Box<dyn DeviceModel>>;

    /// A KV cache of one sequence: a pool of one slot.
    ///
    /// # Errors
    /// As [`DeviceModel::new_kv_pool`].
    fn new_kv_cache(&self, n_ctx: usize) -> Result<Box<dyn KvPool>> {
        self.new_kv_pool(1, n_ctx)
    }

    /// A KV cache of one sequence with `types`: a pool of one slot.
    ///
    /// # Errors
    /// As [`DeviceModel::new_kv_pool_typed`].
    fn new_kv_cache_typed(&self, n_ctx: usize, types: KvTypes) -> Result<Box<dyn KvPool>> {
        self.new_kv_pool_typed(1, n_ctx, types)
    }

    /// Runs one token at position `pos` of slot 0 (0-based; the slot must
    /// hold positions `0..pos`) and returns the logits, `n_vocab` values.
    ///
    /// # Errors
    /// Those of [`KvState::check_step`] ([`Error::ContextOverflow`] when
    /// `pos >= kv.n_ctx()`, a token id past the vocabulary, a cache made by
    /// another model, a gap), not wrapped in [`Error::InBatch`]; device
    /// errors.
    fn decode_token(&mut self, kv: &mut dyn KvPool, token: u32, pos: usize) -> Result<&[f32]> {
        self.forward(kv, &Batch::seq(0, pos, &[token], Out::Last)).map_err(single_error)
    }

    /// Runs `tokens` at positions `pos..pos + tokens.len()` of slot 0
    /// together (batched through each layer) and returns the logits of the
    /// last one.
    ///
    /// # Errors
    /// As [`DeviceModel::decode_token`]; [`Error::EmptyBatch`] for no tokens.
    fn prefill(&mut self, kv: &mut dyn KvPool, tokens: &[u32], pos: usize) -> Result<&[f32]> {
        self.forward(kv, &Batch::seq(0, pos, tokens, Out::Last)).map_err(single_error)
    }

    /// Runs one token like [`DeviceModel::decode_token`] (same checks, same
    /// effect on the cache) and returns the greedy next token: the index of
    /// the largest logit, the lowest among equal ones.
    ///
    /// The provided method takes the argmax of [`DeviceModel::decode_token`]'s
    /// logits on the host; a backend can find it where the logits are and
    /// skip copying them.
    ///
    /// # Errors
    /// As [`DeviceModel::decode_token`]; [`Error::NonFinite`] when a logit
    /// is NaN.
    fn decode_greedy(&mut self, kv: &mut dyn KvPool, token: u32, pos: usize) -> Result<u32> {
        greedy_token(self.decode_token(kv, token, pos)?)
    }

    /// Runs one decode step of several sequences that each have a pool of
    /// their own and writes their logits to `logits`, `steps.len() ×
    /// n_vocab` values, row `i` for `steps[i]`.
    ///
    /// The sequences run one after the other through
    /// [`DeviceModel::decode_token`]; for one step over many sequences,
    /// give them slots of one pool and call [`DeviceModel::forward`].
    ///
    /// # Errors
    /// [`Error::Shape`] when `logits` has the wrong length;
    /// [`Error::InBatch`] wrapping the first sequence's error (the sequences
    /// before it have advanced, the rest have not).
    fn decode_batch(&mut self, steps: &mut [SeqStep<'_>], logits: &mut [f32]) -> Result<()> {
        let n_vocab = self.n_vocab();
        if steps.len().checked_mul(n_vocab) != Some(logits.len()) {
            return Err(crate::error::shape_err(
                "decode_batch",
                format!("{} sequences need {} x {n_vocab} logits, got {}", steps.len(), steps.len(), logits.len()),
            ));
        }
        for (index, (s, out)) in steps.iter_mut().zip(logits.chunks_exact_mut(n_vocab.max(1))).enumerate() {
            let l =
                self.decode_token(s.kv, s.token, s.pos).map_err(|e| Error::InBatch { index, source: Box::new(e) })?;
            out.copy_from_slice(l);
        }
        Ok(())
    }

    /// Runs one decode step like [`DeviceModel::decode_token`] (same checks,
    /// same effect on the cache, same logits) while timing each op, and
    /// returns the timings. Timing serializes the work, so the step is
    /// slower than an unprofiled one.
    ///
    /// # Errors
    /// As [`DeviceModel::decode_token`]; [`Error::NotImplemented`] from a
    /// backend without timing hooks.
    fn profile_step(&mut self, kv: &mut dyn KvPool, token: u32, pos: usize) -> Result<StepProfile> {
        self.profile_forward(kv, &Batch::seq(0, pos, &[token], Out::Last)).map_err(single_error)
    }

    /// Runs `batch` like [`DeviceModel::forward`] (same checks, same effect
    /// on the pool, the same logits left where `forward` leaves them) while
    /// timing each op, summed over the batch's passes, and returns the
    /// timings. Timing serializes the work, so the step is slower than an
    /// unprofiled one.
    ///
    /// # Errors
    /// As [`DeviceModel::forward`]; [`Error::NotImplemented`] from a
    /// backend without timing hooks.
    fn profile_forward(&mut self, pool: &mut dyn KvPool, batch: &Batch) -> Result<StepProfile> {
        let _ = (pool, batch);
        Err(Error::NotImplemented { op: "profile_forward" })
    }
}

/// The error of a one-sequence step as the single-sequence methods report
/// it: the error of its only span, not wrapped in [`Error::InBatch`].
pub fn single_error(e: Error) -> Error {
    match e {
        Error::InBatch { source, .. } => *source,
        e => e,
    }
}

/// The index of the largest of `logits`, the lowest among equal ones;
/// [`Error::NonFinite`] when one is NaN (or there are none). Lane-wise
/// maxima and a NaN flag in one pass (so that it vectorizes), then the
/// first index holding the maximum.
pub fn greedy_token(logits: &[f32]) -> Result<u32> {
    const L: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; L];
    let mut nan = false;
    let chunks = logits.chunks_exact(L);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..L {
            lanes[i] = lanes[i].max(c[i]);
            nan |= c[i].is_nan();
        }
    }
    for &z in tail {
        lanes[0] = lanes[0].max(z);
        nan |= z.is_nan();
    }
    if nan {
        return Err(Error::NonFinite("the logits"));
    }
    let max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    logits.iter().position(|&z| z == max).map(|i| i as u32).ok_or(Error::NonFinite("the logits"))
}
