//! # infer-compute
//!
//! Hardware-accelerated compute for LLM inference: GGUF block formats
//! bit-exact with ggml ([`quant`]), a [`ComputeBackend`] trait that hides the
//! device, a CPU backend with run-time-selected SIMD kernels ([`cpu`]), a
//! CUDA backend (feature `cuda`), the decode pipeline description
//! ([`pipeline`]) and f64 linear algebra for weight editing ([`linalg`]).
//!
//! Layers, each importing only those above it in this list:
//! [`ggml_type`], [`error`] → [`quant`] (block formats) → [`weight`]
//! (weight tensors) → [`pipeline`] (model description) → [`backend`] (the
//! contract) → [`cpu`], `cuda` (the backends) → [`device`] (choosing one).
//! [`linalg`] and [`conformance`] stand beside them.

pub mod backend;
pub mod cache_dir;
pub mod conformance;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod error;
pub mod ggml_type;
pub mod kv_type;
pub mod linalg;
mod memory;
pub mod pipeline;
pub mod quant;
pub mod reserve_alloc;
pub mod turboquant;
pub mod weight;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use backend::{greedy_token, Batch, ComputeBackend, DeviceModel, KvPool, Out, SeqStep, Span, StepProfile};
pub use device::{backend_by_name, default_backend};
pub use error::{Error, Result};
pub use ggml_type::GgmlType;
pub use kv_type::{KvCacheType, KvTypes};
pub use weight::{QuantWeight, WeightBytes};
