//! The OpenAI-compatible API: reading requests ([`prepare`], with
//! OpenAI's field names, every field checked and named in errors) and the
//! response shapes ([`chat`], [`completions`]); errors in OpenAI's shape
//! ([`error`]).

pub mod chat;
pub mod completions;
pub mod error;
pub mod fields;
pub mod params;
pub mod tokens;

use std::sync::Arc;

use infer_model::chat::ChatTemplate;
use infer_model::tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::engine::{GenParams, Usage};
pub use error::{ApiError, ApiResult};
use fields::Body;
use params::Limits;

/// What the API needs of the served model.
pub struct ModelInfo {
    /// The id clients name it by (`/v1/models`).
    pub id: String,
    /// Its tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Its chat template.
    pub template: Arc<ChatTemplate>,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// The limits on a request.
    pub limits: Limits,
}

/// Which endpoint a generation request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// A checked generation request, ready for the engine.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The endpoint.
    pub kind: Kind,
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// Settings.
    pub params: GenParams,
    /// Reply as server-sent events.
    pub stream: bool,
    /// A last stream chunk with `usage`.
    pub include_usage: bool,
}

/// Reads a `kind` request body: the model name, unsupported fields,
/// sampling, the prompt (rendered and tokenized: CPU work, run it off the
/// async runtime's threads).
///
/// # Errors
/// The first problem, naming its field.
pub fn prepare(kind: Kind, bytes: &[u8], model: &ModelInfo) -> ApiResult<Prepared> {
    let body = Body::parse(bytes)?;
    params::check_model(&body, &model.id)?;
    params::reject_unsupported(&body)?;
    let (stream, include_usage) = params::stream_flags(&body)?;
    let (logprobs, field) = match kind {
        Kind::Chat => (chat::logprobs(&body)?, "messages"),
        Kind::Completion => (completions::logprobs(&body)?, "prompt"),
    };
    let params = params::gen_params(&body, &model.limits, logprobs)?;
    let prompt = match kind {
        Kind::Chat => chat::prompt(&body, model)?,
        Kind::Completion => completions::prompt(&body, model)?,
    };
    params::check_prompt_len(field, prompt.len(), &model.limits)?;
    Ok(Prepared { kind, prompt, params, stream, include_usage })
}

/// Identity of one reply, repeated in each of its chunks.
#[derive(Clone, Debug)]
pub struct ReplyMeta {
    /// `chatcmpl-N` or `cmpl-N`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model's id.
    pub model: String,
    /// OpenAI's `system_fingerprint`: this server's name and version.
    pub fingerprint: &'static str,
}

/// The `system_fingerprint` of every reply.
pub const FINGERPRINT: &str = concat!("infer-", env!("CARGO_PKG_VERSION"));

/// OpenAI's `usage` object.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}
