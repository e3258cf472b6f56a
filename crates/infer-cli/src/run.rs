//! `infer run`: generate text.

use std::io::Write;
use std::time::Instant;

use clap::Args;
use infer_model::chat::{ChatTemplate, Message};
use infer_model::generate::generate;
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
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temp: f32,
    /// Keep the k most likely tokens (0: off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Nucleus sampling threshold (1: off).
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
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

    if a.ctx_size == 0 {
        return Err("--ctx-size must be at least 1".into());
    }
    let ids = if a.chat {
        ChatTemplate::from_gguf(&gguf, &tokenizer)?.encode(&tokenizer, &[Message::user(a.prompt.as_str())], true)?
    } else {
        tokenizer.encode(&a.prompt, true)
    };
    let n_ctx = a.ctx_size.min(spec.n_ctx_train);
    if ids.len() >= n_ctx {
        return Err(format!(
            "the prompt has {} tokens; a context of {n_ctx} positions leaves no room to generate (raise --ctx-size or shorten the prompt)",
            ids.len()
        )
        .into());
    }
    // Validated as given, also when greedy decoding ignores them.
    let given =
        SamplerConfig { temperature: a.temp, top_k: a.top_k, top_p: a.top_p, seed: a.seed, ..SamplerConfig::default() };
    given.validate()?;
    let cfg = if a.temp == 0.0 { SamplerConfig::greedy() } else { given };
    let mut sampler = Sampler::new(cfg)?;

    let mut out = std::io::stdout().lock();
    if !a.chat {
        write!(out, "{}", a.prompt)?;
    }
    out.flush()?;
    // Stop generating at the first failed write (e.g. a closed pipe).
    let mut write_error: Option<std::io::Error> = None;
    let stats = generate(model.as_mut(), &tokenizer, &ids, a.n_predict, n_ctx, &mut sampler, |s| {
        match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                write_error = Some(e);
                false
            }
        }
    })?;
    if let Some(e) = write_error {
        return Err(format!("writing the output: {e}").into());
    }
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
    // The first generated token comes from the prefill's logits, so the
    // decode rate counts the tokens after it.
    eprintln!(
        "decode:   {} tokens ({} decoded after the first) in {:.3} s ({:.1} tokens/s), stop: {:?}",
        stats.generated_tokens,
        stats.generated_tokens.saturating_sub(1),
        stats.decode_time.as_secs_f64(),
        stats.decode_tps(),
        stats.stop
    );
    Ok(())
}
