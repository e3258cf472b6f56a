//! Starting and stopping a server ([`start`], [`Server`]): the KV pool is
//! allocated and the address bound before anything runs, so that a bad
//! setting is an error at start; then the engine thread and the HTTP
//! runtime's thread.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::thread::JoinHandle;

use infer_compute::DeviceModel;
use infer_model::chat::ChatTemplate;
use infer_model::gguf::GgufFile;
use infer_model::tokenizer::Tokenizer;
use tokio::sync::oneshot;

use crate::api::params::Limits;
use crate::api::ModelInfo;
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::routes::{router, unix_now, AppState};

/// The model a server serves.
pub struct ServedModel {
    /// The id clients name it by (`--alias`, else the file's name).
    pub id: String,
    /// The prepared model; the engine thread owns it.
    pub model: Box<dyn DeviceModel>,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its chat template.
    pub template: ChatTemplate,
}

impl ServedModel {
    /// `model` (prepared from `gguf`) with the file's tokenizer and chat
    /// template (or the documented default template).
    ///
    /// # Errors
    /// The tokenizer's or the template's errors.
    pub fn from_gguf(id: impl Into<String>, gguf: &GgufFile, model: Box<dyn DeviceModel>) -> infer_model::Result<Self> {
        let tokenizer = Tokenizer::from_gguf(gguf)?;
        let template = ChatTemplate::from_gguf(gguf, &tokenizer)?;
        Ok(ServedModel { id: id.into(), model, tokenizer, template })
    }
}

/// A running server. Dropping it (or [`Server::shutdown`]) stops accepting
/// connections; requests in flight are finished first.
pub struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    http: Option<JoinHandle<std::io::Result<()>>>,
    engine: Option<JoinHandle<()>>,
    metrics: Arc<Metrics>,
}

/// Starts serving `served` as `cfg` says and returns once the address is
/// bound (requests are answered from then on).
///
/// # Errors
/// An invalid configuration, a KV pool that does not fit, an address that
/// cannot be bound, threads that cannot be started; each as a message.
pub fn start(cfg: ServerConfig, served: ServedModel) -> Result<Server, String> {
    cfg.validate()?;
    let ServedModel { id, model, tokenizer, template } = served;
    let pool = model.new_kv_pool_typed(cfg.parallel, cfg.n_ctx, cfg.kv_types).map_err(|e| {
        format!("a KV pool of {} slots x {} positions ({}): {e}", cfg.parallel, cfg.n_ctx, cfg.kv_types)
    })?;
    let listener =
        TcpListener::bind((cfg.host, cfg.port)).map_err(|e| format!("binding {}:{}: {e}", cfg.host, cfg.port))?;
    listener.set_nonblocking(true).map_err(|e| format!("the listening socket: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("the listening socket: {e}"))?;
    let metrics = Arc::new(Metrics::default());
    let tokenizer = Arc::new(tokenizer);
    let limits =
        Limits { n_ctx: cfg.n_ctx, max_tokens: cfg.max_tokens, n_vocab: model.n_vocab(), sampling: cfg.sampling };
    let info =
        ModelInfo { id, tokenizer: tokenizer.clone(), template: Arc::new(template), n_vocab: model.n_vocab(), limits };
    let (engine, engine_thread) =
        crate::engine::spawn(model, pool, tokenizer, cfg.n_batch, cfg.max_queue, metrics.clone())
            .map_err(|e| format!("starting the engine thread: {e}"))?;
    let state = AppState {
        model: Arc::new(info),
        engine,
        metrics: metrics.clone(),
        started: unix_now(),
        next_id: Arc::new(AtomicU64::new(1)),
    };
    let app = router(state, cfg.api_key.as_deref().map(Arc::from), cfg.max_body);
    let header_timeout = cfg.header_timeout;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.http_threads)
        .thread_name("infer-http")
        .enable_all()
        .build()
        .map_err(|e| format!("starting the HTTP runtime: {e}"))?;
    let (stop, stopped) = oneshot::channel::<()>();
    let http = std::thread::Builder::new()
        .name("infer-server".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                accept_loop(listener, app, header_timeout, stopped).await
            })
        })
        .map_err(|e| format!("starting the HTTP thread: {e}"))?;
    Ok(Server { addr, stop: Some(stop), http: Some(http), engine: Some(engine_thread), metrics })
}

impl Server {
    /// The address it listens on (the port chosen when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Whether the HTTP side has ended (an error while serving).
    pub fn is_finished(&self) -> bool {
        self.http.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stops accepting connections, waits for the requests in flight and
    /// for the engine to end.
    ///
    /// # Errors
    /// The HTTP side's error, if it failed.
    pub fn shutdown(mut self) -> Result<(), String> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let mut result = Ok(());
        if let Some(h) = self.http.take() {
            result = match h.join() {
                Ok(r) => r.map_err(|e| format!("serving: {e}")),
                Err(_) => Err("the HTTP thread panicked".into()),
            };
        }
        if let Some(h) = self.engine.take() {
            if h.join().is_err() && result.is_ok() {
                result = Err("the engine thread panicked".into());
            }
        }
        result
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

/// Serves `app` on every connection `listener` accepts until `stop`, then
/// waits for the connections' requests in flight. Each connection is
/// hyper's HTTP/1 with a deadline on its request headers, so that a client
/// that never finishes them (slowloris) is dropped instead of holding a
/// task, and a shutdown, forever (`axum::serve` has no such deadline).
async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    header_timeout: std::time::Duration,
    mut stop: oneshot::Receiver<()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                // Out of file descriptors and the like: the listener is
                // still good; try again shortly.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new()).header_read_timeout(header_timeout);
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A client's broken connection ends only that connection.
            let _ = conn.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
