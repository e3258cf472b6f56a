//! Streaming replies as server-sent events: `data: {chunk}` per piece of
//! text in OpenAI's `chat.completion.chunk` or `text_completion` shape, a
//! last chunk with `finish_reason`, with `stream_options.include_usage` one
//! more with `usage` (and empty `choices`), then `data: [DONE]`. A failure
//! mid-stream is a `data: {"error": ...}` event, and the stream ends.
//!
//! The stream owns the request's receiver: a client that disconnects drops
//! it, and the engine frees the slot at its next step.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, Sse};
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::{chat, completions, usage_json, ApiError, Kind, ReplyMeta};
use crate::engine::{Event, FinishReason, Usage};

/// How one reply's events become chunks.
struct Chunker {
    kind: Kind,
    meta: ReplyMeta,
    logprobs: bool,
    include_usage: bool,
    /// Bytes of text sent so far (completions' `text_offset`).
    offset: usize,
}

impl Chunker {
    /// The chunks of one engine event (`None`: the channel closed).
    fn chunks(&mut self, ev: Option<Event>) -> (Vec<String>, bool) {
        match ev {
            Some(Event::Delta { text, logprobs }) => {
                let lp = self.logprobs.then_some(&logprobs[..]);
                let v = match self.kind {
                    Kind::Chat => chat::chunk(&self.meta, json!({"content": text}), lp, None),
                    Kind::Completion => {
                        let lp = lp.map(|l| completions::logprobs_json(l, self.offset));
                        completions::completion(&self.meta, &text, lp, None, None)
                    }
                };
                self.offset += text.len();
                (vec![v.to_string()], false)
            }
            Some(Event::Done { finish, usage }) => (self.last(finish, &usage), true),
            Some(Event::Error(m)) => (vec![ApiError::internal(m).body().to_string()], true),
            None => (vec![ApiError::internal("the engine stopped").body().to_string()], true),
        }
    }

    /// The finishing chunk, the usage chunk when asked for, `[DONE]`.
    fn last(&self, finish: FinishReason, usage: &Usage) -> Vec<String> {
        let lp = self.logprobs.then_some(&[][..]);
        let mut out = vec![match self.kind {
            Kind::Chat => chat::chunk(&self.meta, json!({}), lp, Some(finish)),
            Kind::Completion => completions::completion(&self.meta, "", None, Some(finish), None),
        }
        .to_string()];
        if self.include_usage {
            let object = match self.kind {
                Kind::Chat => "chat.completion.chunk",
                Kind::Completion => "text_completion",
            };
            let m = &self.meta;
            let v: Value = json!({
                "id": m.id, "object": object, "created": m.created, "model": m.model,
                "system_fingerprint": m.fingerprint, "choices": [], "usage": usage_json(usage),
            });
            out.push(v.to_string());
        }
        out.push("[DONE]".into());
        out
    }
}

/// The SSE response of a streamed request whose events arrive on `rx`.
pub fn stream(
    kind: Kind,
    meta: ReplyMeta,
    logprobs: bool,
    include_usage: bool,
    rx: UnboundedReceiver<Event>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let chunker = Chunker { kind, meta, logprobs, include_usage, offset: 0 };
    // Chat streams open with the assistant's role, as OpenAI's do.
    let mut pending = VecDeque::new();
    if kind == Kind::Chat {
        pending
            .push_back(chat::chunk(&chunker.meta, json!({"role": "assistant", "content": ""}), None, None).to_string());
    }
    let state = (rx, pending, false, chunker);
    let s = stream::unfold(state, |(mut rx, mut pending, mut ended, mut chunker)| async move {
        loop {
            if let Some(data) = pending.pop_front() {
                return Some((Ok(SseEvent::default().data(data)), (rx, pending, ended, chunker)));
            }
            if ended {
                return None;
            }
            let (chunks, last) = chunker.chunks(rx.recv().await);
            pending.extend(chunks);
            ended = last;
        }
    });
    Sse::new(s)
}
