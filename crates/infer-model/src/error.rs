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
