//! One conformance suite for every backend, in the spirit of ggml's
//! `test-backend-ops`: each [`Case`] takes a `&dyn ComputeBackend` and checks
//! one behaviour of the contract against a reference that does not depend
//! on the backend under test (scalar ggml semantics, f64 sums, or the CPU
//! backend computing exactly in f32).
//!
//! - [`ops`]: f32 GEMM, quantized GEMV and prefill products of every weight
//!   type on awkward shapes (each output within 1% of its row's `Σ|w·x|`,
//!   and NMSE ≤ 5e-4 over a case's outputs as `test-backend-ops`; 1e-7 for
//!   f32), the same products with activations past f16's range (finite,
//!   within the same row bound, where ggml gives NaN), and the errors of
//!   bad operands;
//! - [`model`]: decode, whole and chunked prefill, batched decode, cache
//!   truncation and profiling of small random models of three architecture
//!   shapes (cosine ≥ 0.999 and the same top token unless the reference has a
//!   near-tie), and the errors of bad steps;
//! - [`batch`]: the batched step over a KV pool: a mixed batch equals the
//!   same work one sequence at a time (bit for bit on the CPU), slot reset
//!   and reuse, prefix copies, rows without logits, the typed errors of bad
//!   tokens (leaving the other slots untouched), and contexts sharing one
//!   model's weights;
//! - [`kv_types`]: decodes and prefills over caches of every
//!   [`crate::KvCacheType`] within each type's bound of the f16 cache, and
//!   the typed errors of caches that do not fit or that a backend lacks.
//!
//! A backend runs the suite by adding one line to
//! `crates/infer-compute/tests/conformance.rs`. A case that meets a feature
//! the backend reports as unsupported (an [`crate::Error::Unsupported`] type,
//! a model it reports as [`crate::Error::UnsupportedModel`]) returns [`Outcome::Skip`] with the reason, which the
//! test harness reports as ignored, never as passed.

pub mod batch;
mod compare;
pub mod kv_types;
pub mod model;
pub mod ops;
mod rng;

pub use compare::{check_logits, cosine, nmse};
pub use rng::Rng;

use crate::backend::ComputeBackend;

/// What a case found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every check held (with a short summary, possibly empty).
    Pass(String),
    /// The backend does not support what the case needs (the reason).
    Skip(String),
}

type CaseFn = dyn Fn(&dyn ComputeBackend) -> Result<Outcome, String> + Send + Sync;

/// One named check of a backend.
pub struct Case {
    /// `area::what` (`ops::matvec::Q4_K`, `model::gemma3::decode`).
    pub name: String,
    run: Box<CaseFn>,
}

impl Case {
    fn new(name: &str, run: impl Fn(&dyn ComputeBackend) -> Result<Outcome, String> + Send + Sync + 'static) -> Self {
        Case { name: name.to_string(), run: Box::new(run) }
    }

    /// Runs the case on `backend`.
    ///
    /// # Errors
    /// A message naming the first check that failed.
    pub fn run(&self, backend: &dyn ComputeBackend) -> Result<Outcome, String> {
        (self.run)(backend)
    }
}

/// Every case of the suite.
pub fn cases() -> Vec<Case> {
    let mut v = ops::cases();
    v.extend(model::cases());
    v.extend(batch::cases());
    v.extend(kv_types::cases());
    v
}
