//! The HTTP routes ([`router`]) and their handlers. Generation requests are
//! read and tokenized on the blocking pool, queued with the engine, and
//! answered whole or streamed ([`crate::sse`]).
//!
//! | route | key |
//! | --- | --- |
//! | `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models` | required when `--api-key` is set |
//! | `POST /tokenize`, `POST /detokenize`, `GET /metrics` | required when `--api-key` is set |
//! | `GET /health` | never (load balancers and scripts poll it) |

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api::{self, chat, completions, ApiError, ApiResult, Kind, ModelInfo, ReplyMeta};
use crate::engine::{EngineHandle, Event, GenRequest, SubmitError, TokenLogprob};
use crate::metrics::{get as read, Metrics};

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The served model's tokenizer, template, id and limits.
    pub model: Arc<ModelInfo>,
    /// The engine's queue.
    pub engine: EngineHandle,
    /// Counters and gauges.
    pub metrics: Arc<Metrics>,
    /// When the server started (Unix seconds; `/v1/models`' `created`).
    pub started: u64,
    /// Reply ids.
    pub next_id: Arc<AtomicU64>,
}

/// The routes (see the module docs), a body limit of `max_body` bytes, and
/// `api_key` checked where the table says.
pub fn router(state: AppState, api_key: Option<Arc<str>>, max_body: usize) -> Router {
    let guarded = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(text_completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .route_layer(axum::middleware::from_fn_with_state(api_key, crate::auth::require_key));
    Router::new()
        .merge(guarded)
        .route("/health", get(health))
        .fallback(|uri: Uri| async move { ApiError::no_route(uri.path()) })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::method_not_allowed(method.as_str(), uri.path())
        })
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn_with_state(max_body, declared_size))
        .with_state(state)
}

/// A request whose declared `Content-Length` passes `max` bytes is refused
/// at once (413), instead of waiting for a body it will refuse anyway. The
/// unread body makes the connection unusable for a next request, so the
/// answer says `Connection: close`: a client's pool would otherwise send
/// its next request on a connection the server is closing.
async fn declared_size(
    State(max): State<usize>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        let message = "the request body is larger than the server's limit (--max-body)".to_string();
        let mut r =
            ApiError { status: StatusCode::PAYLOAD_TOO_LARGE, ..ApiError::bad_request(message) }.into_response();
        r.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
        return r;
    }
    next.run(req).await
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A body that could not be read (too large: 413) as an OpenAI error.
fn body_error(e: BytesRejection) -> ApiError {
    let status = e.status();
    let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
        "the request body is larger than the server's limit (--max-body)".to_string()
    } else {
        format!("cannot read the request body: {e}")
    };
    ApiError { status, ..ApiError::bad_request(message) }
}

async fn chat_completions(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(s, Kind::Chat, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn text_completions(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(s, Kind::Completion, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// Runs `f` on the blocking pool (tokenizing and rendering are CPU work).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> ApiResult<T> + Send + 'static) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(format!("a worker failed: {e}")))?
}

/// Checks, queues and answers one generation request.
async fn generate(s: AppState, kind: Kind, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let arrived = Instant::now();
    let bytes = body.map_err(body_error)?;
    let model = s.model.clone();
    let p = blocking(move || api::prepare(kind, &bytes, &model)).await?;
    let (tx, rx) = unbounded_channel();
    let logprobs = p.params.logprobs.is_some();
    let req = GenRequest { prompt: p.prompt, params: p.params, events: tx, arrived };
    s.engine.submit(req).map_err(|e| match e {
        SubmitError::QueueFull => ApiError::overloaded(),
        SubmitError::Stopped => ApiError::internal("the engine has stopped"),
    })?;
    let n = s.next_id.fetch_add(1, Ordering::Relaxed);
    let id = match kind {
        Kind::Chat => format!("chatcmpl-{n}"),
        Kind::Completion => format!("cmpl-{n}"),
    };
    let meta = ReplyMeta { id, created: unix_now(), model: s.model.id.clone(), fingerprint: api::FINGERPRINT };
    if p.stream {
        return Ok(crate::sse::stream(kind, meta, logprobs, p.include_usage, rx).into_response());
    }
    Ok(Json(collect(kind, &meta, logprobs, rx).await?).into_response())
}

/// Waits for a whole reply and builds its JSON.
async fn collect(kind: Kind, meta: &ReplyMeta, logprobs: bool, mut rx: UnboundedReceiver<Event>) -> ApiResult<Value> {
    let mut text = String::new();
    let mut lps: Vec<TokenLogprob> = Vec::new();
    loop {
        match rx.recv().await {
            Some(Event::Delta { text: t, logprobs: l }) => {
                text.push_str(&t);
                lps.extend(l);
            }
            Some(Event::Done { finish, usage }) => {
                let lp = logprobs.then_some(&lps[..]);
                return Ok(match kind {
                    Kind::Chat => chat::completion(meta, &text, lp, finish, &usage),
                    Kind::Completion => {
                        let lp = lp.map(|l| completions::logprobs_json(l, 0));
                        completions::completion(meta, &text, lp, Some(finish), Some(&usage))
                    }
                });
            }
            Some(Event::Error(m)) => return Err(ApiError::internal(m)),
            None => return Err(ApiError::internal("the engine stopped")),
        }
    }
}

async fn models(State(s): State<AppState>) -> Json<Value> {
    let m = &s.model;
    Json(json!({
        "object": "list",
        "data": [{
            "id": m.id,
            "object": "model",
            "created": s.started,
            "owned_by": "infer",
            "meta": {"n_ctx_slot": m.limits.n_ctx, "n_vocab": m.n_vocab, "max_tokens": m.limits.max_tokens},
        }],
    }))
}

async fn health(State(s): State<AppState>) -> Json<Value> {
    let total = read(&s.metrics.slots_total);
    let busy = read(&s.metrics.slots_busy);
    Json(json!({
        "status": "ok",
        "slots_idle": total.saturating_sub(busy),
        "slots_processing": busy,
        "queue_length": s.engine.queued(),
    }))
}

async fn metrics(State(s): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render()).into_response()
}

async fn tokenize(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    token_route(s, body, api::tokens::tokenize).await
}

async fn detokenize(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    token_route(s, body, api::tokens::detokenize).await
}

async fn token_route(
    s: AppState,
    body: Result<Bytes, BytesRejection>,
    f: fn(&[u8], &ModelInfo) -> ApiResult<Value>,
) -> Response {
    let run = async {
        let bytes = body.map_err(body_error)?;
        let model = s.model.clone();
        blocking(move || f(&bytes, &model)).await
    };
    match run.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}
