//! The error type of infer-model.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors from reading GGUF files, loading models, tokenizing and
/// generating.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O error, with the path involved.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A malformed or unsupported GGUF file.
    #[error("invalid GGUF: {0}")]
    Gguf(String),
    /// A required metadata key is absent.
    #[error("missing metadata key `{0}`")]
    MissingKey(String),
    /// A metadata key holds a value of another type.
    #[error("metadata key `{key}` has type {found}, expected {expected}")]
    KeyType { key: String, expected: &'static str, found: &'static str },
    /// A required tensor is absent.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    /// The file's architecture is not supported.
    #[error("unsupported architecture `{0}`")]
    UnsupportedArch(String),
    /// A hyper-parameter from metadata outside its valid range (zero, too
    /// large, not finite), or two that contradict each other (`n_head` not a
    /// multiple of `n_head_kv`); `key` names the metadata key (or keys).
    #[error("metadata `{key}` = {value}: {reason}")]
    HyperParameter { key: String, value: String, reason: String },
    /// A count from metadata that disagrees with the tensors it describes
    /// (`block_count` with the `blk.N` tensors, the vocabulary with
    /// `token_embd`).
    #[error("metadata `{key}` = {value} disagrees with the tensors: {detail}")]
    CountMismatch { key: String, value: u64, detail: String },
    /// A tensor whose shape is not the one the hyper-parameters give;
    /// `because` names the metadata keys the expected shape comes from.
    /// Shapes are in ggml order (values per row first).
    #[error("tensor `{tensor}` has shape {found:?}, expected {expected:?} (from {because})")]
    TensorShape { tensor: String, found: Vec<u64>, expected: Vec<u64>, because: String },
    /// A feature of a supported architecture that this crate does not run
    /// (mixture of experts, YaRN RoPE, biases of other projections); the
    /// model is refused rather than run wrongly.
    #[error("{arch}: {feature} is not supported")]
    UnsupportedFeature { arch: String, feature: String },
    /// A tokenizer that cannot be built or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A chat template that does not parse or fails to render (including
    /// the template's own `raise_exception`).
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// An error from the compute layer.
    #[error(transparent)]
    Compute(#[from] infer_compute::Error),
    /// Locating or fetching a model failed (`$INFER_MODEL` or `--model` not
    /// a file nor a known name, or the fetch or its verification failed).
    #[error("model: {0}")]
    Download(String),
    /// A sampling setting or logits that cannot be sampled.
    #[error(transparent)]
    Sampling(#[from] crate::sampling::SamplingError),
}
