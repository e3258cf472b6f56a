//! # infer-server
//!
//! An OpenAI-compatible HTTP server (`infer serve`) with continuous
//! batching: axum on tokio for the HTTP side, one engine thread that owns
//! the model and a KV pool of `parallel` slots and runs one
//! [`infer_compute::DeviceModel::forward`] per step over every running
//! sequence ([`engine`]), a prompt cache per slot ([`slots`]).
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models`, `GET /health`, `POST /tokenize`, `POST /detokenize`,
//! `GET /metrics` ([`routes`]). Requests and replies use OpenAI's field
//! names and error shapes ([`api`]); streaming is server-sent events
//! ([`sse`]).
//!
//! ```no_run
//! # fn served() -> infer_server::ServedModel { unimplemented!() }
//! let server = infer_server::start(infer_server::ServerConfig::default(), served()).unwrap();
//! eprintln!("listening on {}", server.url());
//! server.shutdown().unwrap();
//! ```
//!
//! This crate uses only the backend contract of `infer-compute`
//! ([`infer_compute::DeviceModel`], [`infer_compute::KvPool`],
//! [`infer_compute::Batch`]); the caller picks and prepares the backend.

pub mod api;
pub mod auth;
pub mod config;
pub mod engine;
pub mod metrics;
pub mod routes;
mod server;
pub mod slots;
pub mod sse;

pub use config::ServerConfig;
pub use server::{start, ServedModel, Server};
