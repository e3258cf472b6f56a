//! `infer bench serve`: a load generator for OpenAI-compatible servers
//! (`infer serve`, llama.cpp's `llama-server`, vLLM...).
//!
//! For each count N of `--clients`, N clients run at once, each sending
//! `--requests-per-client` streamed requests one after the other to
//! `/v1/completions` (or `/v1/chat/completions`), with
//! `stream_options.include_usage` and `ignore_eos: true`, so that every
//! reply is `--max-tokens` tokens long and the server reports its token
//! counts in a final usage chunk. A server that sends no usage has its
//! tokens counted from the content chunks instead, and the output says
//! so (`tokens_from`).
//!
//! Prompts are pseudo-random common English words, a different sequence
//! for every request (so a prompt cache shares no prefix between them),
//! about `--prompt-tokens` long: warm-up requests first (at most four, of
//! at most 4 generated tokens each) read how many prompt tokens the server
//! counts for a number of words, and the word count is fitted to the target
//! (within 2 %); the mean prompt tokens the server reported is in the
//! output.
//!
//! Measured per level: its wall time (first request sent to last reply
//! ended), aggregate generated tokens per second (completion tokens of the
//! successful requests over the wall time), requests per second, the time
//! to first token (request sent to first content chunk), the inter-token
//! latency (gaps between consecutive content chunks, each divided by the
//! tokens of the later chunk: when the chunk says, through its logprobs,
//! else the request's mean tokens per chunk) and the end-to-end latency,
//! as mean and percentiles ([`stats`]); failed requests are counted by
//! kind (`http_503`, `connect`, `timeout`, `broken_stream`: the stream
//! ended without `data: [DONE]` or broke off, `stream_error`: an error
//! object in the stream, `bad_chunk`: an event that is not JSON).
//!
//! Each request opens its own connection (none is kept alive between
//! requests: a server may close an idle one just as a request is sent on
//! it), so the time to first token includes a TCP connect, tens of
//! microseconds on the same host.
//!
//! Where the server gives them (`infer serve`'s `/metrics`), its step
//! counters read before and after a level give the engine's steps: their
//! count, tokens per step and milliseconds per step by part
//! (`server_steps`, [`steps`]).
//!
//! Every request has a deadline (`--timeout`), connecting too
//! (`--connect-timeout`), so an unresponsive server ends the run instead of
//! hanging it; an unreachable server is an error before any level runs.

mod prompt;
mod report;
mod sse;
mod stats;
mod steps;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::{json, Value};

use crate::common::{at_least, positive, CliResult};
use crate::output::Out;
use prompt::prompt_text;
use report::{fmt_ms, markdown, summarize, LevelResult};

#[derive(Args, Clone, Debug)]
pub struct ServeBenchArgs {
    /// The server's base URL (`http://HOST:PORT`; a trailing `/v1` is
    /// accepted). Plain HTTP only.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// API key, sent as `Authorization: Bearer KEY`.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Concurrency levels: a comma list of client counts, run in order.
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_value = "1,4,16,64", allow_negative_numbers = true,
          value_parser = at_least::<usize>(1))]
    clients: Vec<usize>,
    /// Requests each client sends, one after the other.
    #[arg(short = 'r', long, value_name = "R", default_value_t = 4, allow_negative_numbers = true,
          value_parser = at_least::<usize>(1))]
    requests_per_client: usize,
    /// Prompt length in tokens (approximate; see the mean the server reports).
    #[arg(short = 'p', long, value_name = "N", default_value_t = 128, allow_negative_numbers = true,
          value_parser = at_least::<usize>(1))]
    prompt_tokens: usize,
    /// Tokens generated per request (`max_tokens`, with `ignore_eos`).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 128, allow_negative_numbers = true,
          value_parser = at_least::<usize>(1))]
    max_tokens: usize,
    /// The API: `completions` (`/v1/completions`, a raw prompt) or `chat`
    /// (`/v1/chat/completions`, one user message in the model's template).
    #[arg(long, value_enum, default_value_t = Endpoint::Completions)]
    endpoint: Endpoint,
    /// Sampling temperature sent with each request.
    #[arg(long, value_name = "T", default_value_t = 0.8)]
    temperature: f64,
    /// Seed: of the prompts' words, and, when given, the sampling seed sent
    /// with each request (SEED plus the request's number).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = at_least::<u64>(0))]
    seed: Option<u64>,
    /// Model name sent in requests [default: the first of the server's `/v1/models`].
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// Output: `md` (a table, after the last level), `json` (an array, after
    /// the last level), `jsonl` (one object per level, as each ends).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = ServeFormat::Md)]
    output: ServeFormat,
    /// A name for the server, copied into the results (`server`) [default: the URL].
    #[arg(long, value_name = "NAME")]
    label: Option<String>,
    /// Deadline of each request, seconds (connecting, waiting and streaming).
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0, allow_negative_numbers = true, value_parser = positive)]
    timeout: f64,
    /// Deadline of each TCP connect, seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, allow_negative_numbers = true, value_parser = positive)]
    connect_timeout: f64,
    /// Send no warm-up request (then the prompt's word count is not fitted
    /// to --prompt-tokens: one word a token is assumed).
    #[arg(long)]
    no_warmup: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServeFormat {
    /// A markdown table.
    Md,
    /// A JSON array, one object per level.
    Json,
    /// One JSON object per level, a line each.
    Jsonl,
}

/// What the clients share.
struct Ctx {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    api_key: Option<String>,
    endpoint: Endpoint,
    model: String,
    temperature: f64,
    seed: Option<u64>,
    max_tokens: usize,
    timeout: Duration,
}

/// A successful request's measurements (seconds from its start).
#[derive(Debug, Clone)]
struct Reply {
    ttft: f64,
    e2e: f64,
    itl: Vec<f64>,
    completion_tokens: usize,
    prompt_tokens: Option<usize>,
    usage: bool,
}

/// A failed request: its kind (the key of `errors`) and a message.
#[derive(Debug, Clone)]
struct Failure {
    kind: String,
    message: String,
}

impl Failure {
    fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Failure { kind: kind.into(), message: message.into() }
    }
}

/// `http://host:port` without a trailing `/` or `/v1`; an error for what
/// this client cannot speak.
pub fn base_url(url: &str) -> CliResult<String> {
    let mut u = url.trim().trim_end_matches('/').to_string();
    if let Some(stripped) = u.strip_suffix("/v1") {
        u = stripped.to_string();
    }
    if u.starts_with("https://") {
        return Err(format!("--url {url}: https is not supported (plain HTTP only)").into());
    }
    if !u.starts_with("http://") {
        u = format!("http://{u}");
    }
    let uri: Uri = format!("{u}/v1/models").parse().map_err(|e| format!("--url {url}: {e}"))?;
    if uri.host().is_none() {
        return Err(format!("--url {url}: no host").into());
    }
    Ok(u)
}

/// The message of an error and of each of its causes (hyper's own message
/// is only "client error (Connect)").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

impl Ctx {
    fn request(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> CliResult<Request<Full<Bytes>>> {
        let mut b = Request::builder().method(method).uri(format!("{}{path}", self.base));
        if let Some(k) = &self.api_key {
            b = b.header(hyper::header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let req = match body {
            Some(body) => {
                b.header(hyper::header::CONTENT_TYPE, "application/json").body(Full::new(Bytes::from(body)))?
            }
            None => b.body(Full::new(Bytes::new()))?,
        };
        Ok(req)
    }

    /// The JSON body of one streamed request.
    fn body(&self, prompt: String, max_tokens: usize, n: u64) -> Vec<u8> {
        let mut v = json!({
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "stream": true,
            "stream_options": {"include_usage": true},
            "ignore_eos": true,
        });
        match self.endpoint {
            Endpoint::Completions => v["prompt"] = Value::String(prompt),
            Endpoint::Chat => v["messages"] = json!([{"role": "user", "content": prompt}]),
        }
        if let Some(s) = self.seed {
            v["seed"] = json!(s.wrapping_add(n));
        }
        serde_json::to_vec(&v).expect("a JSON value serializes")
    }

    fn path(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }

    /// One streamed request, with its deadline.
    async fn stream(&self, body: Vec<u8>) -> Result<Reply, Failure> {
        let start = Instant::now();
        match tokio::time::timeout(self.timeout, self.stream_inner(body, start)).await {
            Ok(r) => r,
            Err(_) => Err(Failure::new("timeout", format!("no complete reply within {:?}", self.timeout))),
        }
    }

    async fn stream_inner(&self, body: Vec<u8>, start: Instant) -> Result<Reply, Failure> {
        let req =
            self.request(Method::POST, self.path(), Some(body)).map_err(|e| Failure::new("request", e.to_string()))?;
        let resp = self.client.request(req).await.map_err(|e| {
            let kind = if e.is_connect() { "connect" } else { "broken_stream" };
            Failure::new(kind, error_chain(&e))
        })?;
        let status = resp.status();
        let mut body = resp.into_body();
        if status != StatusCode::OK {
            // The error body, for the message (bounded).
            let mut text = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                if let Some(d) = frame.data_ref() {
                    text.extend_from_slice(&d[..d.len().min(4096 - text.len().min(4096))]);
                }
                if text.len() >= 4096 {
                    break;
                }
            }
            return Err(Failure::new(
                format!("http_{}", status.as_u16()),
                format!("HTTP {status}: {}", String::from_utf8_lossy(&text).trim()),
            ));
        }
        let mut parser = sse::Parser::new();
        // (arrival, tokens if the chunk says) of each content chunk.
        let mut chunks: Vec<(Instant, Option<usize>)> = Vec::new();
        let mut usage: Option<(Option<usize>, usize)> = None;
        // The first chunk with a choice, text or not: the time to first
        // token of a reply whose tokens all decode to no text (random
        // weights), counted through its usage.
        let mut first_choice: Option<Instant> = None;
        let mut done = false;
        let mut handle =
            |data: String, at: Instant, chunks: &mut Vec<(Instant, Option<usize>)>| -> Result<bool, Failure> {
                if data.trim() == "[DONE]" {
                    return Ok(true);
                }
                let v: Value = serde_json::from_str(&data)
                    .map_err(|e| Failure::new("bad_chunk", format!("{e}: {}", truncate(&data, 200))))?;
                if let Some(err) = v.get("error") {
                    return Err(Failure::new("stream_error", truncate(&err.to_string(), 300)));
                }
                if first_choice.is_none() && v.get("choices").and_then(Value::as_array).is_some_and(|c| !c.is_empty()) {
                    first_choice = Some(at);
                }
                if let Some(c) = content_chunk(&v, self.endpoint) {
                    chunks.push((at, c));
                }
                if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                    let completion = u.get("completion_tokens").and_then(Value::as_u64);
                    let prompt = u.get("prompt_tokens").and_then(Value::as_u64).map(|p| p as usize);
                    if let Some(c) = completion {
                        usage = Some((prompt, c as usize));
                    }
                }
                Ok(false)
            };
        while !done {
            match body.frame().await {
                None => break,
                Some(Err(e)) => return Err(Failure::new("broken_stream", error_chain(&e))),
                Some(Ok(frame)) => {
                    let Some(d) = frame.data_ref() else { continue };
                    let at = Instant::now();
                    for ev in parser.push(d) {
                        if handle(ev, at, &mut chunks)? {
                            done = true;
                            break;
                        }
                    }
                }
            }
        }
        if !done {
            if let Some(ev) = parser.finish() {
                done = handle(ev, Instant::now(), &mut chunks)?;
            }
        }
        let end = Instant::now();
        if !done {
            return Err(Failure::new("broken_stream", "the stream ended without data: [DONE]"));
        }
        let first = match (chunks.first(), first_choice, usage) {
            (Some(&(at, _)), _, _) => at,
            (None, Some(at), Some((_, c))) if c > 0 => at,
            _ => return Err(Failure::new("broken_stream", "the stream had no content")),
        };
        let counted: usize = chunks.iter().map(|c| c.1.unwrap_or(1)).sum();
        let (prompt_tokens, completion_tokens, has_usage) = match usage {
            Some((p, c)) => (p, c, true),
            None => (None, counted, false),
        };
        // Tokens per chunk where a chunk does not say: the mean.
        let mean_per_chunk = (completion_tokens as f64 / chunks.len().max(1) as f64).max(1e-9);
        let itl = chunks
            .windows(2)
            .map(|w| {
                let gap = w[1].0.duration_since(w[0].0).as_secs_f64();
                gap / w[1].1.map_or(mean_per_chunk, |n| n.max(1) as f64)
            })
            .collect();
        Ok(Reply {
            ttft: first.duration_since(start).as_secs_f64(),
            e2e: end.duration_since(start).as_secs_f64(),
            itl,
            completion_tokens,
            prompt_tokens,
            usage: has_usage,
        })
    }
}

/// A chunk's content: `Some(tokens)` (`None` inside: the chunk does not
/// say how many) when it carries text, else `None`.
fn content_chunk(v: &Value, endpoint: Endpoint) -> Option<Option<usize>> {
    let choice = v.get("choices")?.as_array()?.first()?;
    let text = match endpoint {
        Endpoint::Completions => choice.get("text"),
        Endpoint::Chat => choice.get("delta").and_then(|d| d.get("content").or_else(|| d.get("reasoning_content"))),
    }
    .and_then(Value::as_str)
    .unwrap_or("");
    let lp = choice.get("logprobs").filter(|l| !l.is_null());
    let tokens = lp.and_then(|l| match endpoint {
        Endpoint::Completions => l.get("tokens").and_then(Value::as_array).map(Vec::len),
        Endpoint::Chat => l.get("content").and_then(Value::as_array).map(Vec::len),
    });
    if text.is_empty() && tokens.unwrap_or(0) == 0 {
        return None;
    }
    Some(tokens.filter(|&n| n > 0))
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// `GET /v1/models`: the server answers (else the run's error) and its
/// first model's id, if it lists one.
async fn probe(ctx: &Ctx) -> CliResult<Option<String>> {
    let req = ctx.request(Method::GET, "/v1/models", None)?;
    let fut = async {
        let resp = ctx
            .client
            .request(req)
            .await
            .map_err(|e| format!("cannot reach the server at {}: {}", ctx.base, error_chain(&e)))?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{}/v1/models: {}", ctx.base, error_chain(&e)))?
            .to_bytes();
        Ok::<_, String>((status, bytes))
    };
    let limit = ctx.timeout.min(Duration::from_secs(30));
    let (status, bytes) = tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| format!("{}/v1/models: no answer within {:.1} s", ctx.base, limit.as_secs_f64()))??;
    if status == StatusCode::SERVICE_UNAVAILABLE {
        return Err(format!("{}/v1/models: HTTP 503 (is the server still loading the model?)", ctx.base).into());
    }
    if !status.is_success() {
        eprintln!(
            "warning: {}/v1/models: HTTP {status}: {}",
            ctx.base,
            truncate(String::from_utf8_lossy(&bytes).trim(), 200)
        );
        return Ok(None);
    }
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(v.get("data")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(|m| m.get("id"))
        .and_then(Value::as_str)
        .map(str::to_string))
}

pub fn bench_serve(a: ServeBenchArgs) -> CliResult {
    // The counts and seconds are checked by their parsers (at least 1, above 0).
    if a.clients.is_empty() {
        return Err("--clients needs positive counts".into());
    }
    let base = base_url(&a.url)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run(a, base))
}

async fn run(a: ServeBenchArgs, base: String) -> CliResult {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs_f64(a.connect_timeout)));
    // A connection per request, none kept: a server closes an idle
    // keep-alive connection when it likes (llama-server after 5 s), and a
    // request sent on one just closed fails; connecting on the same host
    // costs tens of microseconds, inside the time to first token.
    let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(connector);
    let mut ctx = Ctx {
        client,
        base,
        api_key: a.api_key.clone(),
        endpoint: a.endpoint,
        model: a.model.clone().unwrap_or_default(),
        temperature: a.temperature,
        seed: a.seed,
        max_tokens: a.max_tokens,
        timeout: Duration::from_secs_f64(a.timeout),
    };
    let listed = probe(&ctx).await?;
    if ctx.model.is_empty() {
        ctx.model = listed.ok_or("the server lists no model in /v1/models; name one with --model")?;
    }
    let seed = a.seed.unwrap_or(0);
    let label = a.label.clone().unwrap_or_else(|| ctx.base.clone());

    let words = if a.no_warmup { a.prompt_tokens } else { fit_prompt_words(&ctx, &a, seed).await? };
    eprintln!(
        "bench serve: {label}, model {}, {} endpoint, {} words ≈ {} prompt tokens, {} tokens per reply",
        ctx.model,
        ctx.path(),
        words,
        a.prompt_tokens,
        a.max_tokens
    );

    let ctx = Arc::new(ctx);
    let mut results = Vec::new();
    let mut out = Out::new();
    let mut n_req: u64 = 0;
    for (li, &clients) in a.clients.iter().enumerate() {
        if crate::interrupt::requested() {
            return Err(crate::Interrupted.into());
        }
        let counters = steps::scrape(&ctx).await;
        let t0 = Instant::now();
        let first = n_req;
        n_req += (clients * a.requests_per_client) as u64;
        let replies = run_clients(&ctx, clients, a.requests_per_client, first, |c, r| {
            prompt_text(seed, li as u64, c as u64, r as u64, words)
        })
        .await?;
        let wall = t0.elapsed().as_secs_f64();
        let mut level = summarize(&a, &ctx, &label, words, clients, wall, &replies);
        if let (Some(before), Some(after)) = (counters, steps::scrape(&ctx).await) {
            level.server_steps = before.profile(&after, wall);
        }
        eprintln!(
            "bench serve: {clients} clients: {}/{} ok, {:.1} tokens/s, TTFT p50 {} ms, {:.1} s",
            level.ok,
            level.requests,
            level.tokens_per_s,
            fmt_ms(level.ttft_ms.p50),
            wall
        );
        print_failures(&replies, &level);
        if a.output == ServeFormat::Jsonl {
            writeln!(out, "{}", serde_json::to_string(&level)?)?;
            out.flush()?;
        }
        results.push(level);
    }
    match a.output {
        ServeFormat::Jsonl => {}
        ServeFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(&results)?)?,
        ServeFormat::Md => write!(out, "{}", markdown(&results))?,
    }
    out.flush()?;
    if results.iter().all(|r| r.ok == 0) {
        return Err("no request succeeded".into());
    }
    Ok(())
}

/// The words per prompt that make about `a.prompt_tokens` prompt tokens,
/// found by up to four short warm-up requests. The server's count is taken
/// as linear in the words (a chat template adds a constant): the first
/// guess is one token a word, the second scales by the first count, later
/// ones solve the line through the last two counts.
///
/// # Errors
/// A warm-up request that fails.
async fn fit_prompt_words(ctx: &Ctx, a: &ServeBenchArgs, seed: u64) -> CliResult<usize> {
    let mut words = a.prompt_tokens;
    let target = a.prompt_tokens as f64;
    let mut seen: Vec<(f64, f64)> = Vec::new();
    for i in 0..4u64 {
        let body = ctx.body(prompt_text(seed, u64::MAX, i, 0, words), a.max_tokens.min(4), 0);
        let r = ctx.stream(body).await.map_err(|f| format!("warm-up request: {} ({})", f.message, f.kind))?;
        let Some(p) = r.prompt_tokens.filter(|&p| p > 0) else { break };
        if (p as f64 - target).abs() <= (0.02 * target).max(1.0) || i == 3 {
            break;
        }
        seen.push((words as f64, p as f64));
        let next = match seen[..] {
            [.., (w1, q1), (w2, q2)] if w1 != w2 && q1 != q2 => {
                let slope = (q2 - q1) / (w2 - w1);
                w2 + (target - q2) / slope
            }
            [.., (w, q)] => w * target / q,
            [] => unreachable!(),
        };
        words = (next.round().max(1.0) as usize).min(a.prompt_tokens * 8);
    }
    Ok(words)
}

/// `clients` concurrent clients, each sending `per_client` streamed
/// requests one after another (request `r` of client `c`: prompt
/// `prompt(c, r)`, seed offset `first + c · per_client + r`); every reply
/// or failure.
///
/// # Errors
/// A client task that panicked or was cancelled.
async fn run_clients(
    ctx: &Arc<Ctx>,
    clients: usize,
    per_client: usize,
    first: u64,
    prompt: impl Fn(usize, usize) -> String,
) -> CliResult<Vec<Result<Reply, Failure>>> {
    let mut set = tokio::task::JoinSet::new();
    for c in 0..clients {
        let ctx = Arc::clone(ctx);
        let first = first + (c * per_client) as u64;
        let prompts: Vec<String> = (0..per_client).map(|r| prompt(c, r)).collect();
        set.spawn(async move {
            let mut out = Vec::with_capacity(prompts.len());
            for (r, text) in prompts.into_iter().enumerate() {
                let body = ctx.body(text, ctx.max_tokens, first + r as u64);
                out.push(ctx.stream(body).await);
            }
            out
        });
    }
    let mut replies = Vec::new();
    while let Some(j) = set.join_next().await {
        replies.extend(j.map_err(|e| format!("a client task failed: {e}"))?);
    }
    Ok(replies)
}

/// One line per kind of failure on stderr: its count and its first message.
fn print_failures(replies: &[Result<Reply, Failure>], level: &LevelResult) {
    let mut first_msgs: BTreeMap<&str, &str> = BTreeMap::new();
    for f in replies.iter().filter_map(|r| r.as_ref().err()) {
        first_msgs.entry(&f.kind).or_insert(&f.message);
    }
    for (k, m) in first_msgs {
        eprintln!("bench serve:   {k} ({}×), e.g.: {m}", level.errors[k]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_forms() {
        assert_eq!(base_url("http://127.0.0.1:8080/").unwrap(), "http://127.0.0.1:8080");
        assert_eq!(base_url("http://h:1/v1").unwrap(), "http://h:1");
        assert_eq!(base_url("localhost:9000").unwrap(), "http://localhost:9000");
        assert!(base_url("https://example.com").is_err());
    }

    #[test]
    fn content_chunks_of_both_endpoints() {
        let c: Value = serde_json::from_str(r#"{"choices":[{"text":"hi","index":0}]}"#).unwrap();
        assert_eq!(content_chunk(&c, Endpoint::Completions), Some(None));
        let c: Value = serde_json::from_str(r#"{"choices":[{"text":"","finish_reason":"length"}]}"#).unwrap();
        assert_eq!(content_chunk(&c, Endpoint::Completions), None);
        let c: Value = serde_json::from_str(r#"{"choices":[{"text":"ab","logprobs":{"tokens":["a","b"]}}]}"#).unwrap();
        assert_eq!(content_chunk(&c, Endpoint::Completions), Some(Some(2)));
        let c: Value = serde_json::from_str(r#"{"choices":[{"delta":{"role":"assistant","content":null}}]}"#).unwrap();
        assert_eq!(content_chunk(&c, Endpoint::Chat), None);
        let c: Value = serde_json::from_str(r#"{"choices":[{"delta":{"content":"x"}}]}"#).unwrap();
        assert_eq!(content_chunk(&c, Endpoint::Chat), Some(None));
        let c: Value = serde_json::from_str(r#"{"choices":[],"usage":{"completion_tokens":3}}"#).unwrap();
        assert_eq!(content_chunk(&c, Endpoint::Chat), None);
    }
}
