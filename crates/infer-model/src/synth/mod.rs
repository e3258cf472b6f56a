//! Synthetic GGUF models: random weights with the shapes, metadata and
//! tensor-type mix of real models, so that speed can be measured (by us and
//! by llama.cpp, on the same file) on model sizes we do not download.
//!
//! A synthetic file is a valid model of its architecture: every tensor a
//! loader requires is present with the real shape, the hyper-parameter keys
//! are those of the real model's GGUF, and the tokenizer metadata is either
//! copied from a real file (Gemma 3: the default model's vocabulary) or a
//! small generated SentencePiece vocabulary padded to the real size
//! (Llama). The weights are random, so the text it generates is noise.
//!
//! - **Shapes**: [`SynthShape::preset`] (Gemma 3 270M/1B/4B/12B, Llama 3.2
//!   1B, Llama 3 8B, and a `tiny` shape of each architecture for tests).
//! - **Types**: [`tensor_type`] reproduces llama.cpp's choice for the file
//!   types Q4_K_M, Q5_K_M, Q8_0 and Q4_0 (`llama_tensor_get_type_impl` and
//!   `tensor_type_fallback` in llama.cpp's `src/llama-quant.cpp`): Q4_K_M
//!   quantizes most matrices to Q4_K, promotes `attn_v` and `ffn_down` to
//!   Q6_K in the layers [`use_more_bits`] selects, writes the output matrix
//!   (and the embeddings when they are tied to it) as Q6_K, and falls back
//!   to Q5_0 / Q8_0 for rows that are not whole 256-value super-blocks.
//!   Applied to Gemma 3 270M this gives exactly the types of the published
//!   Q4_K_M file.
//! - **Values**: each matrix row is drawn from a seeded generator
//!   (approximately normal, standard deviation `1/sqrt(cols)`, so that a
//!   mat-vec of a normalized activation stays of order one) and quantized
//!   with ggml's reference quantizer ([`infer_compute::quant::quantize_row`]);
//!   the block scales are therefore finite and small. Norm weights are
//!   `1 ± 0.1`. The file is a pure function of the shape, the file type and
//!   the seed, whatever the number of threads.
//! - **Writing** ([`write_synthetic`]) streams: one tensor is generated at a
//!   time (in parallel over row chunks) and written before the next, so a
//!   7 GB file needs only its largest tensor in memory.
//!
//! Files by idea: `shapes.rs` (the presets of every architecture in the
//! registry), `types.rs` (llama.cpp's type rules), `plan.rs` (the tensors of
//! each architecture), `meta.rs` (metadata and vocabulary), `values.rs`
//! (random values), `write.rs` (streaming the file).
//!
//! A file can also hold the *same weights as F32* ([`SynthOptions::dequantized`]):
//! every matrix is rounded through the type the file type gives it and
//! stored dequantized, so that a run on the F32 file is the exact forward
//! pass of the quantized one (what `testdata/*/logits-f32` are made from).

mod meta;
mod plan;
mod shapes;
mod types;
mod values;
mod write;

pub use crate::model::Arch as SynthArch;
pub use meta::{generated_vocab, metadata, SynthVocab};
pub use plan::{dequantized_plan, plan_tensors, summarize, TensorPlan};
pub use shapes::{SynthShape, UnknownPreset};
pub use types::{fallback_type, file_type_name, tensor_type, use_more_bits, SynthQuant, TensorRole};
pub use values::fill_tensor;
pub use write::{write_synthetic, SynthOptions, SynthSummary};
