//! What the HTTP side hands the engine ([`GenRequest`]) and what comes back
//! on the request's channel ([`Event`]).

use std::time::Instant;

use infer_model::sampling::SamplerConfig;
use tokio::sync::mpsc::UnboundedSender;

/// How one request generates, validated by the API layer.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Stop strings (the reply ends before the first one and never shows
    /// any part of it).
    pub stop: Vec<String>,
    /// End-of-generation tokens are never sampled (generation goes on to
    /// `max_tokens` or a full context).
    pub ignore_eos: bool,
    /// `Some(n)`: report each token's log-probability and the `n` most
    /// likely alternatives.
    pub logprobs: Option<usize>,
}

/// One request for the engine: a tokenized prompt, its settings, and the
/// channel its events go to. Dropping the receiver cancels the request
/// (its slot is freed at the next step).
#[derive(Debug)]
pub struct GenRequest {
    /// Prompt tokens (at least one, at most a slot's context).
    pub prompt: Vec<u32>,
    /// Settings.
    pub params: GenParams,
    /// Where the request's [`Event`]s go.
    pub events: UnboundedSender<Event>,
    /// When the request arrived (its time to first token counts from here).
    pub arrived: Instant,
}

/// A token's log-probability and its alternatives (OpenAI's `logprobs`).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (lossy UTF-8 of its bytes).
    pub token: String,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Natural log of its probability under the model's distribution
    /// (softmax of the raw logits, end-of-generation tokens masked when
    /// `ignore_eos`).
    pub logprob: f32,
    /// The most likely tokens at this position, most likely first:
    /// (text, bytes, log-probability).
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// Why a reply ended, with OpenAI's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string (`"stop"`).
    Stop,
    /// `max_tokens` or a full context (`"length"`).
    Length,
}

impl FinishReason {
    /// `"stop"` or `"length"`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, computed and cached.
    pub prompt_tokens: usize,
    /// Of those, the tokens reused from a slot's cache.
    pub cached_tokens: usize,
    /// Tokens generated (an end-of-generation token is not counted).
    pub completion_tokens: usize,
}

/// What the engine sends on a request's channel: any number of
/// [`Event::Delta`], then one [`Event::Done`] or [`Event::Error`].
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New text, never part of a stop string, and the log-probabilities
    /// of the tokens sampled since the last delta (when asked for).
    Delta {
        /// Text released.
        text: String,
        /// One entry per token.
        logprobs: Vec<TokenLogprob>,
    },
    /// The reply is complete.
    Done {
        /// Why it ended.
        finish: FinishReason,
        /// Its token counts.
        usage: Usage,
    },
    /// The request failed (its text so far stands; nothing follows).
    Error(String),
}
