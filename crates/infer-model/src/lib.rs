//! # infer-model
//!
//! GGUF files ([`gguf`]), model architectures mapped onto the
//! [`infer_compute::pipeline`] description, the tokenizers, chat templates,
//! sampling and the generation loop.

pub mod chat;
mod chat_budget;
pub mod error;
pub mod fetch;
pub mod generate;
pub mod gguf;
mod memory;
pub mod model;
pub mod prompt;
pub mod reference;
pub mod sampling;
pub mod sequence;
pub mod stop;
pub mod synth;
pub mod tokenizer;

pub use error::{Error, Result};
