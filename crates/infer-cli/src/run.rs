//! `infer run`: generate text.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use clap::Args;
use infer_model::chat::{ChatTemplate, Message};
use infer_model::generate::{generate_with_progress, StopReason};
use infer_model::sampling::Sampler;
use infer_model::tokenizer::Tokenizer;

use crate::common::{context_size, n_predict_limit, with_spinner, CliResult, ModelArgs};
use crate::output::Out;
use crate::prompt::PromptArgs;
use crate::sampling::SamplingArgs;

/// Prompt tokens per prefill pass: progress is shown and Ctrl-C is honoured
/// between passes.
const PREFILL_CHUNK: usize = 512;

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Tokens to generate (-1: until the end of generation or a full context).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 64, allow_negative_numbers = true)]
    n_predict: i64,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Context length in positions (KV cache) [default: 4096, or the model's
    /// training context when shorter]; 0 or more than the training context:
    /// the training context (with a warning when more).
    #[arg(short = 'c', long, value_name = "N")]
    ctx_size: Option<usize>,
    /// Wrap the prompt in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Print the effective settings (sampler chain, context, model) before
    /// generating.
    #[arg(short = 'v', long)]
    verbose: bool,
    #[command(flatten)]
    prompt: PromptArgs,
}

/// "1 token", "2 tokens".
pub fn tokens(n: usize) -> String {
    if n == 1 {
        "1 token".to_string()
    } else {
        format!("{n} tokens")
    }
}

pub fn run(a: RunArgs) -> CliResult {
    let max_tokens = n_predict_limit(a.n_predict)?;
    // Where the prompt comes from is checked now; it is read once the
    // context size is known, only as far as the context can hold it.
    let source = a.prompt.source()?;
    // A first use fetches the model: its download time is reported on its
    // own line, not counted as load time.
    let path = a.model.resolve_model()?;
    let t0 = Instant::now();
    let gguf = a.model.open_at(&path)?;
    let backend = a.model.backend()?;
    let spec = infer_model::model::load_spec(&gguf)?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let n_ctx = context_size(a.ctx_size, spec.n_ctx_train);
    // Validated as given, also when greedy decoding ignores them; at
    // temperature 0 the penalties still apply (as in llama.cpp), and the
    // filters cannot change the most likely token.
    let cfg = a.sampling.config(n_ctx)?;
    let limit = crate::prompt::byte_limit(n_ctx);
    let prompt = source.read(limit, n_ctx)?;
    // The prompt before the weights: a bad chat template or a prompt too
    // long for the context is reported at once (and a slow template can be
    // stopped by Ctrl-C like any step before the model loads).
    let ids = if a.chat {
        let text = ChatTemplate::from_gguf(&gguf, &tokenizer)?.render(&[Message::user(prompt.as_str())], true)?;
        // A template can make a short prompt long: checked as the prompt is.
        if text.len() > limit {
            return Err(crate::prompt::too_long(n_ctx, limit).into());
        }
        ChatTemplate::encode_rendered(&tokenizer, &text)
    } else {
        tokenizer.encode(&prompt, true)
    };
    if ids.len() >= n_ctx {
        return Err(format!(
            "the prompt has {} token{}; a context of {n_ctx} position{} leaves no room to generate (raise --ctx-size or shorten the prompt)",
            ids.len(),
            if ids.len() == 1 { "" } else { "s" },
            if n_ctx == 1 { "" } else { "s" }
        )
        .into());
    }
    let mut model = with_spinner("loading model", || backend.prepare(&spec))?;
    let load_time = t0.elapsed();
    // From here on, Ctrl-C stops the prefill or the generation at the next
    // step and the statistics are still printed (a second one exits).
    crate::interrupt::graceful();
    if a.verbose {
        eprintln!("model:    {}", path.display());
        eprintln!("backend:  {}", backend.device_info());
        eprintln!("context:  {n_ctx} positions (training context {})", spec.n_ctx_train);
        eprintln!(
            "predict:  {}",
            if max_tokens == usize::MAX {
                "until end of generation or a full context".into()
            } else {
                tokens(max_tokens)
            }
        );
        eprintln!("prompt:   {}", tokens(ids.len()));
        eprintln!("sampler chain: {}", cfg.chain());
        eprintln!("sampler params: {cfg}");
    }
    let mut sampler = Sampler::new(cfg.clone())?;

    let mut out = Out::new();
    if !a.chat {
        write!(out, "{prompt}")?;
    }
    out.flush()?;
    let show_progress = ids.len() > PREFILL_CHUNK && std::io::stderr().is_terminal();
    let on_prefill = |done: usize, total: usize| {
        if show_progress {
            eprint!("\r\x1b[2Kprefill {done}/{total} tokens");
            if done == total {
                eprint!("\r\x1b[2K");
            }
        }
        !crate::interrupt::requested()
    };
    // Stop generating at the first failed write (e.g. a closed pipe) or at
    // Ctrl-C.
    let mut write_error: Option<std::io::Error> = None;
    let stats = generate_with_progress(
        model.as_mut(),
        &tokenizer,
        &ids,
        max_tokens,
        n_ctx,
        &mut sampler,
        PREFILL_CHUNK,
        on_prefill,
        |s| {
            if crate::interrupt::requested() {
                return false;
            }
            match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
                Ok(()) => true,
                Err(e) => {
                    write_error = Some(e);
                    false
                }
            }
        },
    );
    if show_progress {
        eprint!("\r\x1b[2K");
    }
    // An error after the echoed prompt starts on a line of its own.
    let stats = stats.inspect_err(|_| {
        let _ = writeln!(out).and_then(|_| out.flush());
    })?;
    if let Some(e) = write_error {
        return Err(e.into());
    }
    writeln!(out)?;
    out.flush()?;
    let interrupted = crate::interrupt::requested() && stats.stop == StopReason::Stopped;
    eprintln!();
    eprintln!("backend:  {}", backend.device_info());
    eprintln!("load:     {:.2} s", load_time.as_secs_f64());
    eprintln!(
        "prefill:  {} in {:.3} s ({:.1} tokens/s)",
        tokens(stats.prompt_tokens),
        stats.prefill_time.as_secs_f64(),
        stats.prefill_tps()
    );
    // The first generated token comes from the prefill's logits, so the
    // decode rate counts the tokens after it.
    let stop = match stats.stop {
        _ if interrupted => "interrupted",
        StopReason::MaxTokens => "max tokens",
        StopReason::EndOfGeneration => "end of generation",
        StopReason::ContextFull => "context full",
        StopReason::Stopped => "stopped",
    };
    eprintln!(
        "decode:   {} ({} after the first) in {:.3} s ({:.1} tokens/s), stop: {stop}",
        tokens(stats.generated_tokens),
        stats.generated_tokens.saturating_sub(1),
        stats.decode_time.as_secs_f64(),
        stats.decode_tps(),
    );
    eprintln!("sampling: seed {}, {}", cfg.seed, cfg.chain());
    if interrupted {
        return Err(crate::Interrupted.into());
    }
    Ok(())
}
