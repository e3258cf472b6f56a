//! `infer serve`: the model behind an OpenAI-compatible HTTP server
//! (`infer-server`), llama-server's flags where it has them (`-np`, `-c`
//! per slot, `-b`, `--host`, `--port`, `--api-key`, `-a/--alias`).
//!
//! It prints `listening on http://ADDR` to stderr once requests are
//! answered (`--port 0` picks a free port, which the line gives). Ctrl-C
//! (or SIGTERM) stops accepting connections and finishes the requests in
//! flight; a second one ends the process at once.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use clap::Args;
use infer_server::config as defaults;
use infer_server::{ServedModel, ServerConfig};

use crate::common::{at_least, context_size, CliResult, Loaded, ModelArgs, ThreadArgs};

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    threads: ThreadArgs,
    /// Address to listen on; anything but a loopback address exposes the server to the network.
    #[arg(long, default_value = "127.0.0.1", value_parser = host_address)]
    host: IpAddr,
    /// Port to listen on (0: a free port, printed).
    #[arg(long, default_value_t = defaults::DEFAULT_PORT)]
    port: u16,
    /// Sequences generated at once: KV pool slots (also -np; -1, as llama-server's: the default).
    #[arg(long, value_name = "N", default_value_t = defaults::DEFAULT_PARALLEL, allow_negative_numbers = true,
          value_parser = parallel_slots)]
    parallel: usize,
    /// Positions per slot (the longest prompt plus reply) [default: 4096, or the model's training context when
    /// shorter]; 0: the training context.
    #[arg(short = 'c', long, value_name = "N", allow_negative_numbers = true)]
    ctx_size: Option<i64>,
    /// Most tokens per forward step: every decoding sequence's next token plus chunks of waiting prompts.
    #[arg(short = 'b', long, value_name = "N", default_value_t = defaults::DEFAULT_BATCH, allow_negative_numbers = true,
          value_parser = at_least::<usize>(1))]
    batch_size: usize,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Requests that may wait for a slot; past that, 503.
    #[arg(long, value_name = "N", default_value_t = defaults::DEFAULT_MAX_QUEUE, allow_negative_numbers = true,
          value_parser = at_least::<usize>(1))]
    max_queue: usize,
    /// Most tokens one request may generate (a request asking for more gets 400).
    #[arg(long, value_name = "N", default_value_t = defaults::DEFAULT_MAX_TOKENS, allow_negative_numbers = true,
          value_parser = at_least::<usize>(1))]
    max_tokens: usize,
    /// Largest request body in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = defaults::DEFAULT_MAX_BODY, allow_negative_numbers = true,
          value_parser = at_least::<usize>(1))]
    max_body: usize,
    /// The model's id in the API (`/v1/models`, the `model` field) [default: a known model's name, else the file name without .gguf].
    #[arg(short = 'a', long, value_name = "NAME")]
    alias: Option<String>,
    #[command(flatten)]
    cache: crate::cache_type::CacheTypeArgs,
}

/// The model id of `path`: a known model's name when it is that model's
/// cache file, else the file name without `.gguf`.
/// `--parallel`: llama-server's `-np`, whose -1 is its default (auto); 0
/// is left to the server's check of its settings.
fn parallel_slots(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(-1) => Ok(defaults::DEFAULT_PARALLEL),
        Ok(n) if n >= 0 => usize::try_from(n).map_err(|_| "too large".to_string()),
        _ => Err(format!("must be at least 1, or -1 for the default ({})", defaults::DEFAULT_PARALLEL)),
    }
}

/// `--host`: an IP address, or a host name resolved to its first address
/// (`localhost`), as llama-server takes it.
fn host_address(s: &str) -> Result<IpAddr, String> {
    if let Ok(ip) = s.trim().parse::<IpAddr>() {
        return Ok(ip);
    }
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(s.trim(), 0))
        .map_err(|e| format!("cannot resolve {s}: {e}"))?
        .collect();
    // IPv4 first: `localhost` is 127.0.0.1, as clients try it first too.
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .map(|a| a.ip())
        .ok_or_else(|| format!("{s} resolves to no address"))
}

fn model_id(path: &Path) -> String {
    let cache = infer_model::fetch::cache_dir();
    if let Some(m) = infer_model::fetch::KNOWN_MODELS.iter().find(|m| path == cache.join(m.file)) {
        return m.name.to_string();
    }
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    name.strip_suffix(".gguf").map(str::to_string).unwrap_or(name)
}

pub fn serve(a: ServeArgs) -> CliResult {
    let path = a.model.resolve_model_or(infer_model::fetch::DEFAULT_CHAT_MODEL_NAME)?;
    let mut cfg = ServerConfig {
        host: a.host,
        port: a.port,
        parallel: a.parallel,
        n_batch: a.batch_size,
        max_queue: a.max_queue,
        max_body: a.max_body,
        max_tokens: a.max_tokens,
        api_key: a.api_key.clone(),
        ..ServerConfig::default()
    };
    let (loaded, (n_ctx, tokenizer, template)) = a.model.load(&path, a.threads.get(), |gguf, spec| {
        let n_ctx = context_size(a.ctx_size, spec.n_ctx_train)?;
        if n_ctx < 2 {
            return Err(format!(
                "-c {n_ctx}: a slot of {n_ctx} position leaves no room to generate after a prompt, which takes at \
                 least 1 (give at least 2, or 0 for the training context)"
            )
            .into());
        }
        let tokenizer = infer_model::tokenizer::Tokenizer::from_gguf(gguf)?;
        let template = infer_model::chat::ChatTemplate::from_gguf(gguf, &tokenizer)?;
        cfg.n_ctx = n_ctx;
        cfg.sampling = infer_model::sampling::SamplingDefaults::from_gguf(gguf);
        // Every size is checked before the weights are prepared.
        cfg.validate()?;
        Ok((n_ctx, tokenizer, template))
    })?;
    let Loaded { backend, model, load_time, .. } = loaded;
    cfg.kv_types = a.cache.types_for(model.as_ref());
    let id = a.alias.clone().unwrap_or_else(|| model_id(&path));
    let served = ServedModel { id: id.clone(), model, tokenizer, template };
    let server = infer_server::start(cfg.clone(), served)?;
    eprintln!(
        "{} as `{id}` on {}, loaded in {:.2} s; {} slots x {n_ctx} positions, steps of up to {} tokens{}{}",
        path.display(),
        backend.device_info(),
        load_time.as_secs_f64(),
        cfg.parallel,
        cfg.n_batch,
        if cfg.sampling.is_empty() {
            String::new()
        } else {
            format!("; sampling defaults from the model: {}", cfg.sampling)
        },
        if cfg.api_key.is_some() { "; API key required" } else { "" }
    );
    eprintln!("listening on {}", server.url());
    crate::interrupt::graceful();
    while !crate::interrupt::requested() && !server.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    if crate::interrupt::requested() {
        eprintln!("shutting down: finishing the requests in flight (Ctrl-C again to stop at once)");
    }
    server.shutdown()?;
    Ok(())
}
