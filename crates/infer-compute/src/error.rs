//! The error type of infer-compute.

use crate::kv_type::KvCacheType;
use crate::GgmlType;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a compute call. Bad input is reported,
/// never panicked on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A ggml type id this library does not know or support.
    #[error("unknown or unsupported ggml type id {0}")]
    UnknownType(u32),
    /// The operation is not available for this type (e.g. dequantizing an
    /// activation-only type, or a backend lacking a kernel).
    #[error("{op} is not supported for type {ty}")]
    Unsupported { op: &'static str, ty: GgmlType },
    /// A row length that is not a whole number of blocks.
    #[error("row of {cols} values is not a multiple of the {ty} block size {block_size}")]
    RowNotBlockMultiple { ty: GgmlType, cols: usize, block_size: usize },
    /// Operand shapes or buffer lengths that do not agree.
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    /// A byte buffer whose address is not aligned for its block type.
    #[error("buffer for {ty} blocks is misaligned")]
    Misaligned { ty: GgmlType },
    /// An arithmetic overflow while computing a size.
    #[error("size overflow computing {0}")]
    Overflow(&'static str),
    /// A position at or past the KV cache's capacity.
    #[error("context overflow: position {pos} with {n_tokens} token(s) exceeds the context length {n_ctx}")]
    ContextOverflow { pos: usize, n_tokens: usize, n_ctx: usize },
    /// A KV cache made by another model or backend.
    #[error("the KV cache was created by another model or backend")]
    ForeignKvCache,
    /// A step that starts past the positions the KV cache holds.
    #[error("position {pos} leaves a gap: the KV cache holds {len} position(s)")]
    PositionGap { pos: usize, len: usize },
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {n_vocab}")]
    TokenOutOfRange { token: u32, n_vocab: usize },
    /// A step with no tokens.
    #[error("a step needs at least one token")]
    EmptyBatch,
    /// A KV cache type name that is not one of [`KvCacheType::ALL`].
    #[error("unknown KV cache type '{0}' (expected f32, f16, q8_0, q4_0, tq4 or tq3)")]
    UnknownKvCacheType(String),
    /// A KV cache type this backend, or this model's head size, cannot
    /// store.
    #[error("KV cache type {ty} is not supported: {reason}")]
    UnsupportedKvCache { ty: KvCacheType, reason: String },
    /// A KV cache of zero positions.
    #[error("a KV cache needs at least one position")]
    EmptyKvCache,
    /// One token (or sequence) of a batched step failed: `index` is the
    /// first offending token of a [`crate::backend::Batch`] (the sequence,
    /// for [`crate::backend::DeviceModel::decode_batch`]).
    #[error("token {index} of the batch: {source}")]
    InBatch { index: usize, source: Box<Error> },
    /// A KV pool slot that the pool does not have.
    #[error("slot {slot} is outside the KV pool of {n_slots} slot(s)")]
    SlotOutOfRange { slot: usize, n_slots: usize },
    /// A slot that appears in two spans of one batch (each sequence's
    /// tokens must be one run of consecutive positions).
    #[error("slot {slot} appears in more than one span of the batch")]
    SlotRepeated { slot: usize },
    /// An operation this backend does not implement.
    #[error("{op} is not implemented by this backend")]
    NotImplemented { op: &'static str },
    /// A model description that cannot run anywhere (inconsistent head
    /// counts, ...): a bad file.
    #[error("invalid model: {0}")]
    InvalidModel(String),
    /// A valid model this backend cannot run (a weight type, norm or head
    /// size it has no kernel for): another backend may
    /// ([`crate::ComputeBackend::supports`]).
    #[error("not supported by this backend: {0}")]
    UnsupportedModel(String),
    /// A device (GPU driver, library) that is missing or failed.
    #[error("device error: {0}")]
    Device(String),
    /// Linear algebra: the matrix is not positive definite at this pivot.
    #[error("matrix is not positive definite (pivot {pivot} is {value})")]
    NotPositiveDefinite { pivot: usize, value: f64 },
    /// Linear algebra: input is not symmetric within tolerance.
    #[error("matrix is not symmetric: |a[{i},{j}] - a[{j},{i}]| = {diff} exceeds tolerance")]
    NotSymmetric { i: usize, j: usize, diff: f64 },
    /// An allocation the allocator refused (a model, cache or buffer
    /// larger than the memory available): what it was for and its size.
    #[error("out of memory: {what} needs {bytes} bytes ({:.1} MiB)", *bytes as f64 / (1u64 << 20) as f64)]
    OutOfMemory { what: String, bytes: u64 },
    /// NaN or infinity in an input that must be finite.
    #[error("non-finite value in {0}")]
    NonFinite(&'static str),
}

/// Builds an [`Error::Shape`].
pub(crate) fn shape_err(op: &'static str, detail: impl Into<String>) -> Error {
    Error::Shape { op, detail: detail.into() }
}
