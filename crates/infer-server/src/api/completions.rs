//! `POST /v1/completions`: a string prompt or an array of token ids (as
//! OpenAI takes them), `logprobs` as a count, and the `text_completion`
//! shape.

use serde_json::{json, Map, Value};

use super::error::{ApiError, ApiResult};
use super::fields::{wrong, Body};
use super::params::{self, MAX_TOP_LOGPROBS};
use super::{ModelInfo, ReplyMeta};
use crate::engine::{FinishReason, TokenLogprob, Usage};

/// The prompt tokens: a string (tokenized with the model's BOS rule, only
/// until it is known to pass a slot's context), an array of token ids, or
/// an array of one of either.
///
/// # Errors
/// A missing prompt, several prompts, ids outside the vocabulary, a string
/// of more tokens than a slot holds, other types.
pub fn prompt(body: &Body, model: &ModelInfo) -> ApiResult<Vec<u32>> {
    let Some(p) = body.get("prompt") else { return Err(ApiError::invalid("prompt", "prompt is required")) };
    match p {
        Value::String(s) => text(s, model),
        Value::Array(a) if a.iter().all(Value::is_number) => ids(a, model.n_vocab),
        Value::Array(a) if a.len() == 1 => match &a[0] {
            Value::String(s) => text(s, model),
            Value::Array(inner) => ids(inner, model.n_vocab),
            _ => Err(shape()),
        },
        Value::Array(a) if a.len() > 1 && a.iter().all(|x| x.is_string() || x.is_array()) => {
            Err(ApiError::unsupported("prompt", "more than one prompt per request"))
        }
        _ => Err(shape()),
    }
}

/// The tokens of a string prompt, with the model's BOS rule.
fn text(s: &str, model: &ModelInfo) -> ApiResult<Vec<u32>> {
    let n_ctx = model.limits.n_ctx;
    let too_long = || params::prompt_too_long("prompt", &model.limits);
    if s.len() > infer_model::prompt::byte_limit(n_ctx) {
        return Err(too_long());
    }
    model.tokenizer.encode_at_most(s, true, true, n_ctx).ok_or_else(too_long)
}

fn shape() -> ApiError {
    wrong("prompt", "a string, an array of token ids, or an array of one of either")
}

/// Token ids below `n_vocab`.
fn ids(a: &[Value], n_vocab: usize) -> ApiResult<Vec<u32>> {
    a.iter()
        .map(|v| match v.as_u64() {
            Some(id) if (id as usize) < n_vocab => Ok(id as u32),
            _ => Err(ApiError::invalid("prompt", format!("prompt: {v} is not a token id (0 to {})", n_vocab - 1))),
        })
        .collect()
}

/// `logprobs`: the number of alternatives per token (0 to
/// [`MAX_TOP_LOGPROBS`]), `None` when absent.
///
/// # Errors
/// Another type or out of range.
pub fn logprobs(body: &Body) -> ApiResult<Option<usize>> {
    Ok(body.int("logprobs", 0, MAX_TOP_LOGPROBS)?.map(|n| n as usize))
}

/// OpenAI's completion `logprobs` object of `tokens`, whose text starts at
/// byte `offset` of the reply.
pub fn logprobs_json(tokens: &[TokenLogprob], mut offset: usize) -> Value {
    let mut text_offset = Vec::new();
    for t in tokens {
        text_offset.push(offset);
        offset += t.token.len();
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| Value::Object(t.top.iter().map(|(s, _, lp)| (s.clone(), json!(lp))).collect::<Map<_, _>>()))
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| t.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

/// A whole `text_completion`, or one chunk of a stream (then `usage` is
/// left out).
pub fn completion(
    meta: &ReplyMeta,
    text: &str,
    logprobs: Option<Value>,
    finish: Option<FinishReason>,
    usage: Option<&Usage>,
) -> Value {
    let mut v = json!({
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.fingerprint,
        "choices": [{
            "text": text,
            "index": 0,
            "logprobs": logprobs,
            "finish_reason": finish.map(FinishReason::as_str),
        }],
    });
    if let Some(u) = usage {
        v["usage"] = super::usage_json(u);
    }
    v
}
