//! `infer chat`: an interactive multi-turn conversation.
//!
//! Each turn renders the whole conversation with the model's chat template
//! (`tokenizer.chat_template`, or the documented default) and hands it to
//! `generate_cached`, which keeps the KV cache between turns and prefills
//! only the tokens past what the cache already holds. Replies stream to
//! stdout and end at the model's end-of-generation tokens (`<|im_end|>`,
//! `<end_of_turn>`, EOS...) or at `-n`. After each reply a stats line on
//! stderr gives the tokens reused and prefilled and the tokens/s.
//!
//! Commands: `/reset` forgets the conversation (the system prompt stays),
//! `/exit` or end of input leaves. Ctrl-C stops the current reply and keeps
//! the session (the process's signal handler, `interrupt`, only sets a flag
//! that the streaming callback reads, cleared before each reply); a second
//! Ctrl-C before the flag is cleared ends the process.

use std::io::{BufRead, Write};
use std::time::Instant;

use clap::Args;
use infer_model::chat::{ChatTemplate, Message};
use infer_model::generate::{generate_cached, CachedContext, StopReason};
use infer_model::sampling::{Sampler, SamplerConfig};
use infer_model::tokenizer::Tokenizer;

use crate::common::{with_spinner, CliResult, ModelArgs};

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// System prompt, sent first in every conversation.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long, default_value_t = 512)]
    n_predict: usize,
    /// Sampling temperature; 0 is greedy (deterministic).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
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
    /// Context length (KV cache positions) of the whole conversation.
    #[arg(short = 'c', long, default_value_t = 4096)]
    ctx_size: usize,
}

pub fn chat(a: ChatArgs) -> CliResult {
    if a.ctx_size == 0 {
        return Err("--ctx-size must be at least 1".into());
    }
    let path = a.model.resolve_model()?;
    let t0 = Instant::now();
    let gguf = a.model.open_at(&path)?;
    let backend = a.model.backend()?;
    let spec = infer_model::model::load_spec(&gguf)?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let template = ChatTemplate::from_gguf(&gguf, &tokenizer)?;
    let mut model = with_spinner("loading model", || backend.prepare(&spec))?;
    let n_ctx = a.ctx_size.min(spec.n_ctx_train);
    let mut ctx = CachedContext::new(model.as_ref(), n_ctx)?;
    let given =
        SamplerConfig { temperature: a.temp, top_k: a.top_k, top_p: a.top_p, seed: a.seed, ..SamplerConfig::default() };
    given.validate()?;
    let cfg = if a.temp == 0.0 { SamplerConfig::greedy() } else { given };
    let mut sampler = Sampler::new(cfg.clone())?;
    eprintln!(
        "{} on {}, loaded in {:.2} s; context {n_ctx} tokens. /reset starts over, /exit (or end of input) leaves, \
         Ctrl-C stops a reply.",
        path.display(),
        backend.device_info(),
        t0.elapsed().as_secs_f64()
    );
    crate::interrupt::graceful();

    let system: Vec<Message> = a.system.iter().map(|s| Message::system(s.as_str())).collect();
    let mut messages = system.clone();
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    // Checked writes: a failed one is an error naming standard output.
    let mut out = crate::output::Out::new();
    loop {
        write!(out, "> ")?;
        out.flush()?;
        let mut line = String::new();
        match input.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading the input: {e}").into()),
        }
        let text = line.trim();
        match text {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = system.clone();
                ctx.reset();
                sampler = Sampler::new(cfg.clone())?;
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        messages.push(Message::user(text));
        let ids = template.encode(&tokenizer, &messages, true)?;
        if ids.len() >= n_ctx {
            messages.pop();
            eprintln!(
                "the conversation would take {} of the {n_ctx} context positions; /reset to start over (or raise \
                 --ctx-size)",
                ids.len()
            );
            continue;
        }
        crate::interrupt::clear();
        let mut reply = String::new();
        let mut write_error: Option<std::io::Error> = None;
        let max_tokens = a.n_predict.min(n_ctx - ids.len());
        let stats = generate_cached(model.as_mut(), &mut ctx, &tokenizer, &ids, max_tokens, &mut sampler, |s| {
            reply.push_str(s);
            if let Err(e) = out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
                write_error = Some(e);
                return false;
            }
            !crate::interrupt::requested()
        })?;
        if let Some(e) = write_error {
            return Err(format!("writing the output: {e}").into());
        }
        writeln!(out)?;
        let stop = match stats.stop {
            StopReason::EndOfGeneration => "end of turn",
            StopReason::MaxTokens => "-n reached",
            StopReason::ContextFull => "context full",
            StopReason::Stopped => "interrupted",
        };
        eprintln!(
            "[prefill {} new tokens ({} reused) at {:.1} tokens/s; {} tokens at {:.1} tokens/s; {stop}]",
            stats.prompt_tokens,
            stats.reused_tokens,
            stats.prefill_tps(),
            stats.generated_tokens,
            stats.decode_tps()
        );
        messages.push(Message::assistant(reply.trim()));
    }
    Ok(())
}
