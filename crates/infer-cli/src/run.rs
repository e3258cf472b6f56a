//! `infer run`: generate text.

use std::io::Write;
use std::time::Instant;

use clap::Args;
use infer_model::generate::{chat_prompt, generate};
use infer_model::sampling::{Sampler, SamplerConfig};
use infer_model::tokenizer::Tokenizer;

use crate::common::{with_spinner, CliResult, ModelArgs};

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 64)]
    n_predict: usize,
    /// Sampling temperature; 0 is greedy (deterministic).
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    /// Keep the k most likely tokens (0: off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Nucleus sampling threshold (1: off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Context length (KV cache positions).
    #[arg(short = 'c', long, default_value_t = 4096)]
    ctx_size: usize,
    /// Wrap the prompt in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// The prompt.
    prompt: String,
}

pub fn run(a: RunArgs) -> CliResult {
    let t0 = Instant::now();
    let gguf = a.model.open()?;
    let backend = a.model.backend()?;
    let spec = infer_model::model::load_spec(&gguf)?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let mut model = with_spinner("loading model", || backend.prepare(&spec))?;
    let load_time = t0.elapsed();

    let text = if a.chat { chat_prompt(&spec.arch, &a.prompt)? } else { a.prompt.clone() };
    let ids = tokenizer.encode(&text, true);
    let n_ctx = a.ctx_size.min(spec.n_ctx_train);
    if ids.len() >= n_ctx {
        return Err(format!("the prompt has {} tokens, more than the context length {n_ctx} allows", ids.len()).into());
    }
    let cfg = if a.temp == 0.0 {
        SamplerConfig::greedy()
    } else {
        SamplerConfig { temperature: a.temp, top_k: a.top_k, top_p: a.top_p, seed: a.seed, ..SamplerConfig::default() }
    };
    let mut sampler = Sampler::new(cfg)?;

    let mut out = std::io::stdout().lock();
    if !a.chat {
        write!(out, "{}", a.prompt)?;
    }
    out.flush()?;
    let stats = generate(model.as_mut(), &tokenizer, &ids, a.n_predict, n_ctx, &mut sampler, |s| {
        let _ = out.write_all(s.as_bytes());
        let _ = out.flush();
    })?;
    writeln!(out)?;
    eprintln!();
    eprintln!("backend:  {}", backend.device_info());
    eprintln!("load:     {:.2} s", load_time.as_secs_f64());
    eprintln!(
        "prefill:  {} tokens in {:.3} s ({:.1} tokens/s)",
        stats.prompt_tokens,
        stats.prefill_time.as_secs_f64(),
        stats.prefill_tps()
    );
    eprintln!(
        "decode:   {} tokens in {:.3} s ({:.1} tokens/s), stop: {:?}",
        stats.generated_tokens,
        stats.decode_time.as_secs_f64(),
        stats.decode_tps(),
        stats.stop
    );
    Ok(())
}
