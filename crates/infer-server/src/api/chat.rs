//! `POST /v1/chat/completions`: the messages (rendered with the model's
//! chat template, system messages included), `logprobs`/`top_logprobs`,
//! and the `chat.completion` / `chat.completion.chunk` shapes.

use infer_model::chat::{ChatTemplate, Message, Role};
use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};
use super::fields::{wrong, Body};
use super::params::{self, MAX_TOP_LOGPROBS};
use super::{ModelInfo, ReplyMeta};
use crate::engine::{FinishReason, TokenLogprob, Usage};

/// The prompt tokens of `messages`.
///
/// # Errors
/// A missing or empty `messages`, a message of the wrong shape, a role or
/// content this server does not take (tools, images), a template that
/// refuses the conversation, or a conversation of more tokens than a slot
/// holds.
pub fn prompt(body: &Body, model: &ModelInfo) -> ApiResult<Vec<u32>> {
    let Some(list) = body.get("messages") else { return Err(ApiError::invalid("messages", "messages is required")) };
    let list = list.as_array().ok_or_else(|| wrong("messages", "an array of messages"))?;
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "messages is empty"));
    }
    let messages = list.iter().enumerate().map(|(i, m)| message(i, m)).collect::<ApiResult<Vec<_>>>()?;
    let text = model.template.render(&messages, true).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    // Tokenized only while it may fit a slot (`infer_model::prompt`).
    let n_ctx = model.limits.n_ctx;
    let too_long = || params::prompt_too_long("messages", &model.limits);
    if text.len() > infer_model::prompt::byte_limit(n_ctx) {
        return Err(too_long());
    }
    ChatTemplate::encode_rendered_at_most(&model.tokenizer, &text, n_ctx).ok_or_else(too_long)
}

/// Message `i` of `messages`.
fn message(i: usize, m: &Value) -> ApiResult<Message> {
    let at = |f: &str| format!("messages[{i}].{f}");
    let m = m.as_object().ok_or_else(|| wrong(&format!("messages[{i}]"), "an object"))?;
    let role = match m.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some(r @ ("tool" | "function")) => return Err(ApiError::unsupported(&at("role"), &format!("the role `{r}`"))),
        Some(r) => return Err(ApiError::invalid(&at("role"), format!("unknown role `{r}`"))),
        None => return Err(wrong(&at("role"), "a string (system, user or assistant)")),
    };
    if m.get("tool_calls").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::unsupported(&at("tool_calls"), "tool calls"));
    }
    let content = match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(&at("content"), parts)?,
        Some(Value::Null) | None => return Err(wrong(&at("content"), "a string or an array of text parts")),
        Some(_) => return Err(wrong(&at("content"), "a string or an array of text parts")),
    };
    Ok(Message::new(role, content))
}

/// The text of content parts, joined (only `{"type": "text"}` parts).
fn text_parts(param: &str, parts: &[Value]) -> ApiResult<String> {
    let mut text = String::new();
    for p in parts {
        match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => text.push_str(t),
            (Some("text"), None) => return Err(wrong(param, "text parts with a `text` string")),
            (Some(kind), _) => return Err(ApiError::unsupported(param, &format!("content of type `{kind}`"))),
            (None, _) => return Err(wrong(param, "an array of parts with a `type`")),
        }
    }
    Ok(text)
}

/// `Some(n)` when `logprobs` is true: `n` = `top_logprobs` (0 by default).
///
/// # Errors
/// Wrong types, `top_logprobs` out of range or without `logprobs`.
pub fn logprobs(body: &Body) -> ApiResult<Option<usize>> {
    let on = body.bool("logprobs")?.unwrap_or(false);
    let top = body.int("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
    match (on, top) {
        (false, Some(_)) => Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true")),
        (false, None) => Ok(None),
        (true, n) => Ok(Some(n.unwrap_or(0) as usize)),
    }
}

/// OpenAI's chat `logprobs` object of `tokens`.
pub fn logprobs_json(tokens: &[TokenLogprob]) -> Value {
    let entry = |t: &str, b: &[u8], lp: f32| json!({"token": t, "logprob": lp, "bytes": b});
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(&t.token, &t.bytes, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|(s, b, lp)| entry(s, b, *lp)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// A whole `chat.completion`.
pub fn completion(
    meta: &ReplyMeta,
    text: &str,
    logprobs: Option<&[TokenLogprob]>,
    finish: FinishReason,
    usage: &Usage,
) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.fingerprint,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": null},
            "logprobs": logprobs.map(logprobs_json),
            "finish_reason": finish.as_str(),
        }],
        "usage": super::usage_json(usage),
    })
}

/// A `chat.completion.chunk` with `delta`, and `logprobs` when asked for.
pub fn chunk(meta: &ReplyMeta, delta: Value, logprobs: Option<&[TokenLogprob]>, finish: Option<FinishReason>) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.fingerprint,
        "choices": [{
            "index": 0,
            "delta": delta,
            "logprobs": logprobs.map(logprobs_json),
            "finish_reason": finish.map(FinishReason::as_str),
        }],
    })
}
