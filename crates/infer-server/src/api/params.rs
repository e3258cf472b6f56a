//! The fields chat and text completions share: the model name, sampling,
//! `max_tokens`, `stop`, `ignore_eos`, streaming, and the fields that
//! would change the answer but are not implemented (each a 400 naming it,
//! never silently ignored).

use serde_json::Value;

use super::error::{ApiError, ApiResult};
use super::fields::{wrong, Body};
use crate::engine::GenParams;
use infer_model::sampling::{SamplerConfig, SamplingDefaults};

/// What a request may ask for, from the server's configuration.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Positions per slot: the longest prompt.
    pub n_ctx: usize,
    /// Most tokens one request may generate.
    pub max_tokens: usize,
    /// Vocabulary size (token ids of a prompt are below it).
    pub n_vocab: usize,
    /// The model's sampling settings, the defaults of what a request does
    /// not set.
    pub sampling: SamplingDefaults,
}

/// Most stop strings per request (OpenAI allows 4).
pub const MAX_STOP: usize = 16;
/// Most alternatives per token for `top_logprobs` / `logprobs` (OpenAI's
/// chat limit).
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// A 404 unless `model` is absent or the served model's id.
///
/// # Errors
/// Another name, or a non-string.
pub fn check_model(body: &Body, served: &str) -> ApiResult<()> {
    match body.str("model")? {
        Some(m) if m != served => Err(ApiError::model_not_found(m, served)),
        _ => Ok(()),
    }
}

/// A 400 for each field that would change the answer and is not
/// implemented: `tools`, `tool_choice` other than `none`, `functions`,
/// `function_call`, `response_format` other than text, `n` > 1,
/// `logit_bias`, `echo`, `best_of` > 1, `suffix`, audio output.
///
/// # Errors
/// The first such field.
pub fn reject_unsupported(body: &Body) -> ApiResult<()> {
    if body.get("tools").is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(ApiError::unsupported("tools", "tool calling"));
    }
    if body.get("tool_choice").is_some_and(|v| v.as_str() != Some("none")) {
        return Err(ApiError::unsupported("tool_choice", "a tool choice other than \"none\""));
    }
    for f in ["functions", "function_call"] {
        if body.get(f).is_some() {
            return Err(ApiError::unsupported(f, "function calling"));
        }
    }
    if let Some(rf) = body.get("response_format") {
        if rf.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::unsupported("response_format", "a response format other than text"));
        }
    }
    if body.int("n", 1, i64::MAX)?.is_some_and(|n| n > 1) {
        return Err(ApiError::unsupported("n", "more than one choice (n > 1)"));
    }
    if body.get("logit_bias").is_some_and(|v| v.as_object().is_none_or(|o| !o.is_empty())) {
        return Err(ApiError::unsupported("logit_bias", "logit_bias"));
    }
    if body.bool("echo")? == Some(true) {
        return Err(ApiError::unsupported("echo", "echoing the prompt"));
    }
    if body.int("best_of", 1, i64::MAX)?.is_some_and(|n| n > 1) {
        return Err(ApiError::unsupported("best_of", "best_of > 1"));
    }
    if body.str("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "a suffix (insertion)"));
    }
    if body.get("audio").is_some()
        || body.get("modalities").and_then(Value::as_array).is_some_and(|m| m.iter().any(|x| x != "text"))
    {
        return Err(ApiError::unsupported("modalities", "output other than text"));
    }
    Ok(())
}

/// `(stream, stream_options.include_usage)`.
///
/// # Errors
/// Wrong types.
pub fn stream_flags(body: &Body) -> ApiResult<(bool, bool)> {
    let stream = body.bool("stream")?.unwrap_or(false);
    let usage = match body.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(wrong("stream_options.include_usage", "a boolean")),
        },
        Some(_) => return Err(wrong("stream_options", "an object")),
    };
    Ok((stream, usage))
}

/// The generation settings of `body` (defaults as llama-server's: the
/// model's settings in `limits.sampling`, else temperature 0.8, top_k 40,
/// top_p 0.95, min_p 0.05, no penalties; a random seed, up to
/// `limits.max_tokens` tokens); `logprobs` as the endpoint read it.
///
/// # Errors
/// A field of the wrong type or out of range, naming it.
pub fn gen_params(body: &Body, limits: &Limits, logprobs: Option<usize>) -> ApiResult<GenParams> {
    // The model's settings were checked when the server started.
    let d = limits.sampling.apply(SamplerConfig::default(), limits.n_ctx).unwrap_or_default();
    let positive = |name: &str, v: Option<f64>| match v {
        Some(x) if x <= 0.0 => Err(ApiError::invalid(name, format!("{name} is {x}; it must be above 0"))),
        _ => Ok(v),
    };
    let sampler = SamplerConfig {
        temperature: body.number("temperature", 0.0, 2.0)?.map_or(d.temperature, |x| x as f32),
        top_k: body.int("top_k", 0, i64::MAX)?.map_or(d.top_k, |k| usize::try_from(k).unwrap_or(usize::MAX)),
        top_p: positive("top_p", body.number("top_p", 0.0, 1.0)?)?.map_or(d.top_p, |x| x as f32),
        min_p: body.number("min_p", 0.0, 1.0)?.map_or(d.min_p, |x| x as f32),
        repetition_penalty: positive("repeat_penalty", body.number("repeat_penalty", 0.0, 100.0)?)?
            .map_or(d.repetition_penalty, |x| x as f32),
        repeat_last_n: body.int("repeat_last_n", 0, limits.n_ctx as i64)?.map_or(d.repeat_last_n, |n| n as usize),
        presence_penalty: body.number("presence_penalty", -2.0, 2.0)?.map_or(d.presence_penalty, |x| x as f32),
        frequency_penalty: body.number("frequency_penalty", -2.0, 2.0)?.map_or(d.frequency_penalty, |x| x as f32),
        seed: body.u64("seed")?.unwrap_or_else(random_seed),
    };
    sampler.validate().map_err(|e| ApiError::bad_request(e.to_string()))?;
    let cap = limits.max_tokens as i64;
    let max_tokens = match body.int("max_completion_tokens", 1, cap)? {
        Some(n) => Some(n),
        None => body.int("max_tokens", 1, cap)?,
    };
    Ok(GenParams {
        sampler,
        max_tokens: max_tokens.map_or(limits.max_tokens, |n| n as usize),
        stop: stop_strings(body)?,
        ignore_eos: body.bool("ignore_eos")?.unwrap_or(false),
        logprobs,
    })
}

/// `stop`: a string or an array of up to [`MAX_STOP`] strings.
fn stop_strings(body: &Body) -> ApiResult<Vec<String>> {
    match body.get("stop") {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) if a.len() <= MAX_STOP => a
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or_else(|| wrong("stop", "a string or an array of strings")))
            .collect(),
        Some(Value::Array(_)) => Err(ApiError::invalid("stop", format!("stop has more than {MAX_STOP} strings"))),
        Some(_) => Err(wrong("stop", "a string or an array of strings")),
    }
}

/// A seed for a request that names none.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish()
}

/// A 400 when the prompt does not fit a slot (`param` names the field).
///
/// # Errors
/// An empty prompt, or more tokens than a slot holds.
pub fn check_prompt_len(param: &str, n: usize, limits: &Limits) -> ApiResult<()> {
    if n == 0 {
        return Err(ApiError::invalid(param, format!("{param} is empty")));
    }
    if n > limits.n_ctx {
        return Err(ApiError::invalid(
            param,
            format!("the prompt has {n} tokens, more than the {} positions of a slot's context", limits.n_ctx),
        )
        .with_code("context_length_exceeded"));
    }
    Ok(())
}

/// The 400 of a prompt found to have more tokens than a slot holds before
/// all of it was tokenized (`param` names the field).
pub fn prompt_too_long(param: &str, limits: &Limits) -> ApiError {
    ApiError::invalid(
        param,
        format!("the prompt has more tokens than the {} positions of a slot's context", limits.n_ctx),
    )
    .with_code("context_length_exceeded")
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits { n_ctx: 100, max_tokens: 50, n_vocab: 10, sampling: SamplingDefaults::NONE };

    fn params(json: &str) -> ApiResult<GenParams> {
        gen_params(&Body::parse(json.as_bytes()).unwrap(), &L, None)
    }

    #[test]
    fn the_models_sampling_settings_are_the_defaults_of_a_request() {
        let model = SamplingDefaults {
            temperature: Some(0.2),
            top_k: Some(-1),
            repeat_last_n: Some(-1),
            ..SamplingDefaults::NONE
        };
        let limits = Limits { sampling: model, ..L };
        let get = |json: &str| gen_params(&Body::parse(json.as_bytes()).unwrap(), &limits, None).unwrap().sampler;
        let s = get("{}");
        // llama.cpp's readings: top_k -1 off, window -1 the context.
        assert_eq!((s.temperature, s.top_k, s.top_p, s.repeat_last_n), (0.2, 0, 0.95, 100));
        let s = get(r#"{"temperature": 0.9, "top_k": 5}"#);
        assert_eq!((s.temperature, s.top_k), (0.9, 5));
        // Without the model's settings, llama-server's defaults.
        let s = params("{}").unwrap().sampler;
        assert_eq!((s.temperature, s.top_k, s.top_p, s.min_p), (0.8, 40, 0.95, 0.05));
    }

    #[test]
    fn sampling_fields_are_checked_and_named() {
        let p = params(r#"{"temperature": 0, "seed": 7, "max_tokens": 5, "stop": ["a", "b"], "ignore_eos": true}"#)
            .unwrap();
        assert_eq!((p.sampler.temperature, p.sampler.seed, p.max_tokens), (0.0, 7, 5));
        assert_eq!(p.stop, ["a", "b"]);
        assert!(p.ignore_eos);
        assert_eq!(params("{}").unwrap().max_tokens, 50);
        assert_eq!(params(r#"{"max_completion_tokens": 3, "max_tokens": 9}"#).unwrap().max_tokens, 3);
        for (json, field) in [
            (r#"{"temperature": 2.5}"#, "temperature"),
            (r#"{"temperature": "hot"}"#, "temperature"),
            (r#"{"max_tokens": 0}"#, "max_tokens"),
            (r#"{"max_tokens": -1}"#, "max_tokens"),
            (r#"{"max_tokens": 51}"#, "max_tokens"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"stop": 3}"#, "stop"),
            (r#"{"repeat_penalty": 0}"#, "repeat_penalty"),
        ] {
            assert_eq!(params(json).unwrap_err().param.as_deref(), Some(field), "{json}");
        }
    }

    #[test]
    fn unimplemented_fields_are_refused_by_name() {
        let check = |json: &str| reject_unsupported(&Body::parse(json.as_bytes()).unwrap());
        assert!(check(
            r#"{"tools": [], "tool_choice": "none", "n": 1, "response_format": {"type": "text"}, "logit_bias": {}}"#
        )
        .is_ok());
        for (json, field) in [
            (r#"{"tools": [{"type": "function"}]}"#, "tools"),
            (r#"{"tool_choice": "auto"}"#, "tool_choice"),
            (r#"{"response_format": {"type": "json_object"}}"#, "response_format"),
            (r#"{"n": 2}"#, "n"),
            (r#"{"logit_bias": {"5": 1}}"#, "logit_bias"),
            (r#"{"echo": true}"#, "echo"),
            (r#"{"best_of": 3}"#, "best_of"),
            (r#"{"suffix": "x"}"#, "suffix"),
        ] {
            assert_eq!(check(json).unwrap_err().param.as_deref(), Some(field), "{json}");
        }
    }
}
