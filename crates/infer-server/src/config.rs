//! What a server is started with ([`ServerConfig`]) and its documented
//! defaults: where it listens, how many sequences run at once, how large a
//! step is, and the caps on what one request may ask for.

use std::net::IpAddr;

/// Sequences served at once (`--parallel`, llama-server's `-np`).
pub const DEFAULT_PARALLEL: usize = 4;
/// Positions of each slot's KV cache (`-c`), when the model's training
/// context is not shorter.
pub const DEFAULT_CTX: usize = 4096;
/// Most tokens of one step (`-b`, llama-server's `--batch-size`): every
/// decoding sequence's next token plus chunks of waiting prompts.
pub const DEFAULT_BATCH: usize = 512;
/// Requests waiting for a slot before new ones get 503 (`--max-queue`).
pub const DEFAULT_MAX_QUEUE: usize = 64;
/// Largest request body in bytes (`--max-body`).
pub const DEFAULT_MAX_BODY: usize = 1 << 20;
/// Most tokens one request may generate (`--max-tokens`); a request that
/// asks for more gets 400, one that names no limit gets this many (or
/// stops earlier at a full context).
pub const DEFAULT_MAX_TOKENS: usize = 4096;
/// The port of llama-server.
pub const DEFAULT_PORT: u16 = 8080;
/// Seconds a connection may take to send a request's headers (a client
/// that sends them slowly, or never finishes, is dropped after it).
pub const DEFAULT_HEADER_TIMEOUT_S: u64 = 30;

/// How a server runs. [`ServerConfig::default`] gives the documented
/// defaults above, bound to `127.0.0.1:8080`, with no API key.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to bind (`127.0.0.1` unless `--host` says otherwise).
    pub host: IpAddr,
    /// Port to bind; 0 picks a free one.
    pub port: u16,
    /// KV pool slots: sequences generated at once.
    pub parallel: usize,
    /// Positions per slot (the longest prompt plus reply).
    pub n_ctx: usize,
    /// Most tokens per forward step.
    pub n_batch: usize,
    /// Element types of the KV pool's keys and values (`-ctk`, `-ctv`).
    pub kv_types: infer_compute::KvTypes,
    /// Requests that may wait for a slot (at least 1: a request is queued
    /// until the engine's next step admits it).
    pub max_queue: usize,
    /// Largest request body in bytes.
    pub max_body: usize,
    /// Most tokens one request may generate.
    pub max_tokens: usize,
    /// A Bearer key that every `/v1` route (and `/tokenize`,
    /// `/detokenize`, `/metrics`) requires; `None`: no key.
    pub api_key: Option<String>,
    /// Longest time to receive a request's headers
    /// ([`DEFAULT_HEADER_TIMEOUT_S`]).
    pub header_timeout: std::time::Duration,
    /// Threads of the async runtime that parses requests and streams
    /// replies (the model runs on a thread of its own).
    pub http_threads: usize,
    /// The model's sampling settings (its GGUF's `general.sampling.*`
    /// keys): the defaults of what a request does not set, in place of
    /// llama-server's built-in ones, as llama-server does.
    pub sampling: infer_model::sampling::SamplingDefaults,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: IpAddr::from([127, 0, 0, 1]),
            port: DEFAULT_PORT,
            parallel: DEFAULT_PARALLEL,
            n_ctx: DEFAULT_CTX,
            n_batch: DEFAULT_BATCH,
            kv_types: infer_compute::KvTypes::default(),
            max_queue: DEFAULT_MAX_QUEUE,
            max_body: DEFAULT_MAX_BODY,
            max_tokens: DEFAULT_MAX_TOKENS,
            api_key: None,
            header_timeout: std::time::Duration::from_secs(DEFAULT_HEADER_TIMEOUT_S),
            http_threads: 2,
            sampling: infer_model::sampling::SamplingDefaults::NONE,
        }
    }
}

impl ServerConfig {
    /// Checks that every size is usable.
    ///
    /// # Errors
    /// A message naming the first setting that is 0 or too small (the
    /// batch must hold one token of every slot), or an empty API key.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("--parallel", self.parallel),
            ("--ctx-size", self.n_ctx),
            ("--batch-size", self.n_batch),
            ("--max-queue", self.max_queue),
            ("--max-body", self.max_body),
            ("--max-tokens", self.max_tokens),
            ("the HTTP thread count", self.http_threads),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be at least 1"));
        }
        if self.n_batch < self.parallel {
            return Err(format!(
                "--batch-size {} is smaller than --parallel {}: a step must hold one token of every slot",
                self.n_batch, self.parallel
            ));
        }
        if self.api_key.as_deref() == Some("") {
            return Err("--api-key is empty".into());
        }
        if let Err(e) = self.sampling.apply(infer_model::sampling::SamplerConfig::default(), self.n_ctx) {
            return Err(format!("the model's sampling settings ({}): {e}", self.sampling));
        }
        Ok(())
    }
}
