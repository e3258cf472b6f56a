//! # infer-compute
//!
//! Hardware-accelerated compute for LLM inference: GGUF block formats
//! bit-exact with ggml ([`quant`]), a [`ComputeBackend`] trait that hides the
//! device, a CPU backend with run-time-selected SIMD kernels ([`cpu`]), a
//! CUDA backend (feature `cuda`), the decode pipeline description
//! ([`pipeline`]) and f64 linear algebra for weight editing ([`linalg`]).

pub mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod error;
pub mod ggml_type;
pub mod linalg;
mod memory;
pub mod pipeline;
pub mod quant;

pub use backend::{default_backend, ComputeBackend, DeviceModel, KvCache, QuantWeight};
pub use error::{Error, Result};
pub use ggml_type::GgmlType;
