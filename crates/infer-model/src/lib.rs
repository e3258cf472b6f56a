//! # infer-model
//!
//! GGUF files ([`gguf`]), model architectures mapped onto the
//! [`infer_compute::pipeline`] description, the tokenizer, sampling and the
//! generation loop.

pub mod error;
pub mod gguf;

pub use error::{Error, Result};
