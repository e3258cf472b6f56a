//! llama-server's `POST /tokenize` (`{"content": "...", "add_special":
//! false, "with_pieces": false}` → `{"tokens": [...]}`) and `POST
//! /detokenize` (`{"tokens": [...]}` → `{"content": "..."}`).

use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};
use super::fields::{wrong, Body};
use super::ModelInfo;

/// The reply to a `/tokenize` body.
///
/// # Errors
/// A missing or non-string `content`, wrong types.
pub fn tokenize(bytes: &[u8], model: &ModelInfo) -> ApiResult<Value> {
    let body = Body::parse(bytes)?;
    let content = body.str("content")?.ok_or_else(|| ApiError::invalid("content", "content is required"))?;
    let add_special = body.bool("add_special")?.unwrap_or(false);
    let with_pieces = body.bool("with_pieces")?.unwrap_or(false);
    let ids = model.tokenizer.encode(content, add_special);
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| {
                let bytes = model.tokenizer.token_bytes(id).unwrap_or_default();
                match std::str::from_utf8(bytes) {
                    Ok(s) => json!({"id": id, "piece": s}),
                    Err(_) => json!({"id": id, "piece": bytes}),
                }
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(json!({"tokens": tokens}))
}

/// The reply to a `/detokenize` body.
///
/// # Errors
/// A missing `tokens`, ids outside the vocabulary.
pub fn detokenize(bytes: &[u8], model: &ModelInfo) -> ApiResult<Value> {
    let body = Body::parse(bytes)?;
    let list = body.get("tokens").ok_or_else(|| ApiError::invalid("tokens", "tokens is required"))?;
    let list = list.as_array().ok_or_else(|| wrong("tokens", "an array of token ids"))?;
    let ids = list
        .iter()
        .map(|v| match v.as_u64() {
            Some(id) if (id as usize) < model.n_vocab => Ok(id as u32),
            _ => {
                Err(ApiError::invalid("tokens", format!("tokens: {v} is not a token id (0 to {})", model.n_vocab - 1)))
            }
        })
        .collect::<ApiResult<Vec<u32>>>()?;
    Ok(json!({"content": model.tokenizer.decode(&ids)}))
}
