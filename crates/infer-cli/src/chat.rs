//! `infer chat`: an interactive multi-turn conversation.
//!
//! Without `-m`, chat talks to an instruction-tuned model
//! ([`infer_model::fetch::DEFAULT_CHAT_MODEL_NAME`]); a model without a
//! chat template, or a known base model, is loaded with a warning.
//!
//! Each turn renders the whole conversation with the model's chat template
//! (`tokenizer.chat_template`, or the documented default) and hands it to
//! `generate_cached`, which keeps the KV cache between turns and prefills
//! only the tokens past what the cache already holds. Replies stream to
//! stdout and end at the model's end-of-generation tokens (`<|im_end|>`,
//! `<end_of_turn>`, EOS...) or at `-n`. After each reply a stats line on
//! stderr gives the tokens reused and prefilled and the tokens/s.
//!
//! A system prompt that leaves no room in the context for a conversation is
//! an error before the model loads; a line longer than the context can hold
//! is refused unread past that length (see `prompt::byte_limit`).
//!
//! Commands: `/reset` forgets the conversation (the system prompt stays),
//! `/exit` or end of input leaves. Ctrl-C stops the current reply and keeps
//! the session (the process's signal handler, `interrupt`, only sets a flag
//! that the streaming callback reads, cleared before each reply); a second
//! Ctrl-C before the flag is cleared ends the process.

use std::io::{BufRead, Write};
use std::path::Path;

use clap::Args;
use infer_model::chat::{ChatTemplate, Message, TemplateSource};
use infer_model::fetch::KNOWN_MODELS;
use infer_model::generate::{generate_cached, CachedContext, StopReason};
use infer_model::gguf::GgufFile;
use infer_model::sampling::Sampler;
use infer_model::stop::StopMatcher;
use infer_model::tokenizer::Tokenizer;

use crate::cache_type::CacheTypeArgs;
use crate::common::{context_size, n_predict_limit, CliResult, Loaded, ModelArgs, ThreadArgs};
use crate::prompt::TextArgs;
use crate::sampling::SamplingArgs;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    threads: ThreadArgs,
    /// System prompt, sent first in every conversation (also -sys, --system).
    #[arg(long = "system-prompt", visible_alias = "system", value_name = "TEXT")]
    system: Option<String>,
    /// Most tokens per reply (-1: until the end of the turn or a full
    /// context).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 512, allow_negative_numbers = true)]
    n_predict: i64,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    text: TextArgs,
    /// Context length in positions (KV cache) of the whole conversation
    /// [default: 4096, or the model's training context when shorter]; 0 or
    /// more than the training context: the training context (with a
    /// warning when more).
    #[arg(short = 'c', long, value_name = "N", allow_negative_numbers = true)]
    ctx_size: Option<i64>,
    #[command(flatten)]
    cache: CacheTypeArgs,
}

/// Whether the model at `path` is instruction-tuned, as far as can be
/// told: a known model by its cache file, else the file's
/// `general.finetune` or `general.name` (`Instruct`, `-it`, `chat`).
fn instruct_tuned(path: &Path, gguf: &GgufFile) -> Option<bool> {
    let cache = infer_model::fetch::cache_dir();
    if let Some(m) = KNOWN_MODELS.iter().find(|m| path == cache.join(m.file)) {
        return Some(m.instruct);
    }
    let says_instruct = |s: &str| {
        let s = s.to_ascii_lowercase();
        s.contains("instruct") || s.contains("chat") || s.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| w == "it")
    };
    if let Ok(f) = gguf.get_str("general.finetune") {
        return Some(says_instruct(f));
    }
    gguf.get_str("general.name").ok().filter(|n| says_instruct(n)).map(|_| true)
}

pub fn chat(a: ChatArgs) -> CliResult {
    let max_tokens = n_predict_limit(a.n_predict)?;
    let stops = a.text.stop_strings()?;
    // Without -m (or $INFER_MODEL), an instruction-tuned model: the default
    // model of `run` is a base model, which continues text.
    let path = a.model.resolve_model_or(infer_model::fetch::DEFAULT_CHAT_MODEL_NAME)?;
    let (loaded, (tokenizer, template, n_ctx, cfg)) = a.model.load(&path, a.threads.threads, |gguf, spec| {
        let tokenizer = Tokenizer::from_gguf(gguf)?;
        let template = ChatTemplate::from_gguf(gguf, &tokenizer)?;
        let n_ctx = context_size(a.ctx_size, spec.n_ctx_train)?;
        let cfg = a.sampling.config(n_ctx)?;
        // A system prompt that leaves no room fails before the weights load.
        if let Some(system) = &a.system {
            check_system_prompt(&template, &tokenizer, system, n_ctx, crate::prompt::byte_limit(n_ctx))?;
        }
        if template.source() != TemplateSource::Gguf {
            eprintln!("warning: {} has no chat template; using {}", path.display(), template.source());
        }
        if instruct_tuned(&path, gguf) == Some(false) {
            eprintln!(
                "warning: {} is a pre-trained (base) model: it continues text rather than answering (`infer chat` \
                 without -m uses {}, an instruction-tuned model)",
                path.display(),
                infer_model::fetch::DEFAULT_CHAT_MODEL_NAME
            );
        }
        Ok((tokenizer, template, n_ctx, cfg))
    })?;
    let Loaded { backend, mut model, load_time, .. } = loaded;
    let limit = crate::prompt::byte_limit(n_ctx);
    let mut ctx = CachedContext::with_types(model.as_ref(), n_ctx, a.cache.types_for(model.as_ref()))?;
    let mut sampler = Sampler::new(cfg.clone())?;
    eprintln!(
        "{} on {}, loaded in {:.2} s; context {n_ctx} tokens; sampling: seed {}, {}. /reset starts over, /exit (or \
         end of input) leaves, Ctrl-C stops a reply.",
        path.display(),
        backend.device_info(),
        load_time.as_secs_f64(),
        cfg.seed,
        cfg.chain()
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
        let bytes = match read_line_at_most(&mut input, limit) {
            Ok(Line::End) => break,
            Ok(Line::Text(bytes)) => bytes,
            Ok(Line::TooLong) => {
                eprintln!("that line has more than {limit} bytes, more than the {n_ctx} context positions can hold; it was not sent");
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading the input: {e}").into()),
        };
        // A line that is not UTF-8 is refused; the conversation goes on.
        let Ok(line) = String::from_utf8(bytes) else {
            eprintln!("that line is not valid UTF-8; it was not sent");
            continue;
        };
        let text = match a.text.process(line.trim().to_string(), "the input line") {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{e}; it was not sent");
                continue;
            }
        };
        let text = text.as_str();
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
        let rendered = template.render(&messages, true)?;
        // Past the byte limit the conversation cannot fit: not tokenized.
        let n_ids =
            if rendered.len() > limit { None } else { Some(ChatTemplate::encode_rendered(&tokenizer, &rendered)) };
        let ids = match n_ids {
            Some(ids) if ids.len() < n_ctx => ids,
            _ => {
                let took = n_ids.as_ref().map_or(format!("more than {n_ctx}"), |ids| ids.len().to_string());
                messages.pop();
                if messages.len() == system.len() {
                    // Nothing to forget: /reset cannot help.
                    eprintln!(
                        "this message would take {took} of the {n_ctx} context positions on its own; it was not sent \
                         (shorten it or raise --ctx-size)"
                    );
                } else {
                    eprintln!(
                        "the conversation would take {took} of the {n_ctx} context positions; /reset to start over \
                         (or raise --ctx-size)"
                    );
                }
                continue;
            }
        };
        crate::interrupt::clear();
        let mut reply = String::new();
        let mut write_error: Option<std::io::Error> = None;
        // A stop string ends the reply; it is not shown, nor kept in the
        // conversation.
        let mut matcher = StopMatcher::new(stops.iter().cloned());
        let mut emit = |s: &str, out: &mut crate::output::Out| -> bool {
            reply.push_str(s);
            if let Err(e) = out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
                write_error = Some(e);
                return false;
            }
            true
        };
        let stats = generate_cached(model.as_mut(), &mut ctx, &tokenizer, &ids, max_tokens, &mut sampler, |s| {
            let step = matcher.push(s);
            emit(&step.text, &mut out) && !step.stopped && !crate::interrupt::requested()
        })?;
        let tail = matcher.finish();
        emit(&tail, &mut out);
        if let Some(e) = write_error {
            return Err(format!("writing the output: {e}").into());
        }
        writeln!(out)?;
        let stop = match stats.stop {
            _ if matcher.is_stopped() => "stop string",
            StopReason::EndOfGeneration => "end of turn",
            StopReason::MaxTokens => "-n reached",
            StopReason::ContextFull => "context full",
            StopReason::Stopped => "interrupted",
        };
        eprintln!(
            "[prefill {} ({} reused) at {:.1} tokens/s; {} at {:.1} tokens/s; {stop}]",
            crate::run::tokens(stats.prompt_tokens),
            stats.reused_tokens,
            stats.prefill_tps(),
            crate::run::tokens(stats.generated_tokens),
            stats.decode_tps()
        );
        messages.push(Message::assistant(reply.trim()));
    }
    Ok(())
}

/// Fails when the system prompt alone (with an empty first user message and
/// the opening of the reply) takes the whole context: no turn could be
/// sent. A template that refuses the empty message is not checked here;
/// each turn is checked as it comes.
fn check_system_prompt(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    system: &str,
    n_ctx: usize,
    limit: usize,
) -> CliResult {
    let too_long = |took: String| {
        format!(
            "the system prompt takes {took} of the {n_ctx} context positions, leaving none for the conversation \
             (shorten --system or raise --ctx-size)"
        )
    };
    if system.len() > limit {
        return Err(too_long(format!("more than {n_ctx}")).into());
    }
    let Ok(text) = template.render(&[Message::system(system), Message::user("")], true) else { return Ok(()) };
    if text.len() > limit {
        return Err(too_long(format!("more than {n_ctx}")).into());
    }
    let n = ChatTemplate::encode_rendered(tokenizer, &text).len();
    if n >= n_ctx {
        return Err(too_long(n.to_string()).into());
    }
    Ok(())
}

/// A line of input, as [`read_line_at_most`] reads it.
enum Line {
    /// The line's bytes, with its newline.
    Text(Vec<u8>),
    /// A line of more than the limit, skipped up to its newline.
    TooLong,
    /// The end of the input.
    End,
}

/// Reads one line of at most `limit` bytes (without its newline); a longer
/// one is read no further than that and skipped to its end, in chunks.
fn read_line_at_most(input: &mut impl BufRead, limit: usize) -> std::io::Result<Line> {
    let mut bytes = Vec::new();
    let n = std::io::Read::take(&mut *input, limit.saturating_add(2) as u64).read_until(b'\n', &mut bytes)?;
    if n == 0 {
        return Ok(Line::End);
    }
    let body = bytes.strip_suffix(b"\n").map_or(bytes.len(), |b| b.strip_suffix(b"\r").unwrap_or(b).len());
    if body <= limit {
        return Ok(Line::Text(bytes));
    }
    if !bytes.ends_with(b"\n") {
        // Skip the rest of the line.
        loop {
            let buf = input.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            match buf.iter().position(|&b| b == b'\n') {
                Some(pos) => {
                    input.consume(pos + 1);
                    break;
                }
                None => {
                    let len = buf.len();
                    input.consume(len);
                }
            }
        }
    }
    Ok(Line::TooLong)
}
