//! The backend contract: [`ComputeBackend`] (a device and its single ops),
//! [`DeviceModel`] (a model prepared on it) and [`KvCache`] (a sequence's
//! keys and values, owned by the backend), with the bookkeeping they all
//! share ([`KvState`], [`checked_cache`]) and the profile a model reports
//! ([`StepProfile`]).
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

mod kv;
mod profile;

use std::any::Any;

use ndarray::{Array2, ArrayView2};

pub use kv::{checked_cache, KvState, ModelId};
pub use profile::{OpTiming, StepProfile};

use crate::error::{Error, Result};
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

    /// Prepares a model for this device: validates the spec, repacks or
    /// uploads the weights once, and returns the runnable model.
    ///
    /// Validates the spec once ([`ModelSpec::validate`]); callers need not.
    ///
    /// # Errors
    /// [`crate::Error::InvalidModel`] for inconsistent specs; features the
    /// backend lacks; [`crate::Error::OutOfMemory`] and device errors.
    fn prepare(&self, spec: &ModelSpec) -> Result<Box<dyn DeviceModel>>;
}

/// One sequence's step in [`DeviceModel::decode_batch`]: `token` at
/// position `pos` of the sequence whose cache is `kv`.
pub struct SeqStep<'a> {
    pub kv: &'a mut dyn KvCache,
    pub token: u32,
    pub pos: usize,
}

/// A model prepared on one device. Each call runs one step of one or more
/// sequences, each against a KV cache this model created.
pub trait DeviceModel: Send {
    /// Vocabulary size (length of the logits).
    fn n_vocab(&self) -> usize;

    /// Creates an empty KV cache for `n_ctx` positions on this device.
    ///
    /// # Errors
    /// [`Error::EmptyKvCache`] for `n_ctx == 0`; [`Error::OutOfMemory`] or
    /// a device error when it does not fit.
    fn new_kv_cache(&self, n_ctx: usize) -> Result<Box<dyn KvCache>>;

    /// Runs one token at position `pos` (0-based; the cache must hold
    /// positions `0..pos`) and returns the logits, `n_vocab` values.
    ///
    /// # Errors
    /// Those of [`KvState::check_step`] ([`Error::ContextOverflow`] when
    /// `pos >= kv.n_ctx()`, a token id past the vocabulary, a cache made by
    /// another model, a gap); device errors.
    fn decode_token(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<&[f32]>;

    /// Runs `tokens` at positions `pos..pos + tokens.len()` together (batched
    /// through each layer) and returns the logits of the last one.
    ///
    /// # Errors
    /// As [`DeviceModel::decode_token`]; [`Error::EmptyBatch`] for no tokens.
    fn prefill(&mut self, kv: &mut dyn KvCache, tokens: &[u32], pos: usize) -> Result<&[f32]>;

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
    fn decode_greedy(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<u32> {
        greedy_token(self.decode_token(kv, token, pos)?)
    }

    /// Runs one decode step of several independent sequences (continuous
    /// batching) and writes their logits to `logits`, `steps.len() ×
    /// n_vocab` values, row `i` for `steps[i]`.
    ///
    /// The provided method runs the sequences one after the other through
    /// [`DeviceModel::decode_token`]; a backend with batched kernels
    /// overrides it. Results equal those of single-sequence decodes.
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
    fn profile_step(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<StepProfile> {
        let _ = (kv, token, pos);
        Err(Error::NotImplemented { op: "profile_step" })
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

/// A KV cache owned by a backend: opaque to callers except for its
/// bookkeeping ([`KvState`]).
pub trait KvCache: Send {
    /// Owner, capacity and fill.
    fn state(&self) -> &KvState;
    /// For the owning backend: record steps (see [`KvState::advance`]).
    fn state_mut(&mut self) -> &mut KvState;
    /// For the owning backend to recover its concrete type.
    fn as_any_mut(&mut self) -> &mut dyn Any;

    /// Capacity in positions.
    fn n_ctx(&self) -> usize {
        self.state().n_ctx()
    }
    /// Positions filled so far.
    fn len(&self) -> usize {
        self.state().len()
    }
    /// Whether no position is filled.
    fn is_empty(&self) -> bool {
        self.state().is_empty()
    }
    /// Forgets every position from `len` on, so that the next step may start
    /// at `len` (a chat turn that diverges from what the cache holds).
    fn truncate(&mut self, len: usize) {
        self.state_mut().truncate(len);
    }
}
