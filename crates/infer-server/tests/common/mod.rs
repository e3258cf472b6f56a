//! Helpers of the server tests: a tiny synthetic model written once per
//! test binary, a real server on a free port, and a real HTTP client.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::ComputeBackend;
use infer_model::gguf::GgufFile;
use infer_model::synth::{self, SynthArch, SynthOptions, SynthQuant, SynthShape, SynthVocab};
use infer_server::{ServedModel, Server, ServerConfig};
use serde_json::Value;

/// The tiny synthetic Llama of these tests (written on first use).
pub fn model_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("infer-server-tiny-llama.gguf");
        let shape = SynthShape::preset(SynthArch::Llama, "tiny").unwrap();
        let opts = SynthOptions { shape, quant: SynthQuant::Q8_0, seed: 11, threads: 1, dequantized: false };
        synth::write_synthetic(&path, &opts, SynthVocab::Generated, Arc::new(|_| {})).unwrap();
        path
    })
}

/// Test settings: a free port, 2 slots of 512 positions.
pub fn config() -> ServerConfig {
    ServerConfig { port: 0, parallel: 2, n_ctx: 512, n_batch: 64, max_tokens: 4096, ..ServerConfig::default() }
}

/// A server of the tiny model (id `tiny`) on the CPU.
pub fn server(cfg: ServerConfig) -> Server {
    let gguf = GgufFile::read(model_path()).unwrap();
    let spec = infer_model::model::load_spec(&gguf).unwrap();
    let backend = CpuBackend::with_options(1, Kernels::detect(), Precision::Quantized).unwrap();
    let served = ServedModel::from_gguf("tiny", &gguf, backend.prepare(&spec).unwrap()).unwrap();
    infer_server::start(cfg, served).unwrap()
}

/// A response: status and body.
pub struct Reply {
    pub status: u16,
    pub text: String,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }

    /// The `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        self.text.split("\n\n").filter_map(|e| e.trim().strip_prefix("data:").map(|d| d.trim().to_string())).collect()
    }
}

/// A client of one server.
#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub http: reqwest::Client,
    pub key: Option<String>,
}

impl Client {
    pub fn new(server: &Server) -> Client {
        Client { base: server.url(), http: reqwest::Client::new(), key: None }
    }

    fn auth(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.key {
            Some(k) => r.header("authorization", format!("Bearer {k}")),
            None => r,
        }
    }

    /// POSTs `body` (sent as is) to `path`.
    pub async fn post(&self, path: &str, body: impl Into<String>) -> Reply {
        let r = self.http.post(format!("{}{path}", self.base)).header("content-type", "application/json");
        let resp = self.auth(r).body(body.into()).send().await.unwrap();
        Reply { status: resp.status().as_u16(), text: resp.text().await.unwrap() }
    }

    /// GETs `path`.
    pub async fn get(&self, path: &str) -> Reply {
        let resp = self.auth(self.http.get(format!("{}{path}", self.base))).send().await.unwrap();
        Reply { status: resp.status().as_u16(), text: resp.text().await.unwrap() }
    }

    /// The text of a successful non-streamed completion of `body`.
    pub async fn complete(&self, path: &str, body: &Value) -> Value {
        let r = self.post(path, body.to_string()).await;
        assert_eq!(r.status, 200, "{}", r.text);
        r.json()
    }

    /// Waits (up to 10 s) until `/health` reports no busy slot: the engine
    /// frees a slot in the step that sends its last event.
    pub async fn wait_idle(&self) {
        let t0 = std::time::Instant::now();
        while self.busy_slots().await != 0 {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "a slot stayed busy");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// `/health`'s busy slot count.
    pub async fn busy_slots(&self) -> u64 {
        self.get("/health").await.json()["slots_processing"].as_u64().unwrap()
    }
}

/// The reply text of a chat or text completion.
pub fn text_of(v: &Value) -> String {
    let c = &v["choices"][0];
    c["message"]["content"].as_str().or(c["text"].as_str()).unwrap().to_string()
}

/// The text of a stream's chunks put together, its finish reason and its
/// usage chunk.
pub fn stream_text(events: &[String]) -> (String, Option<String>, Option<Value>) {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let (mut text, mut finish, mut usage) = (String::new(), None, None);
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        assert!(v.get("error").is_none(), "{e}");
        if let Some(c) = v["choices"].get(0) {
            text.push_str(c["delta"]["content"].as_str().or(c["text"].as_str()).unwrap_or(""));
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
        if !v["usage"].is_null() {
            usage = Some(v["usage"].clone());
        }
    }
    (text, finish, usage)
}
