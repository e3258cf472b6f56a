//! `infer run`: generate text.

use std::io::{IsTerminal, Write};

use clap::Args;
use infer_compute::pipeline::ModelSpec;
use infer_compute::DeviceModel;
use infer_model::chat::{ChatTemplate, Message};
use infer_model::generate::{generate_cached_with_progress, CachedContext, GenerationStats, StopReason};
use infer_model::gguf::GgufFile;
use infer_model::sampling::{Sampler, SamplerConfig, SamplingDefaults};
use infer_model::stop::StopMatcher;
use infer_model::tokenizer::Tokenizer;
use serde::Serialize;

use crate::cache_type::CacheTypeArgs;
use crate::common::{context_size, n_predict_limit, CliResult, Loaded, ModelArgs, ThreadArgs};
use crate::context_shift::ContextShiftArgs;
use crate::ignore_eos::IgnoreEos;
use crate::output::Out;
use crate::prompt::{PromptArgs, PromptSource, TextArgs};
use crate::sampling::SamplingArgs;

/// Prompt tokens per prefill pass: progress is shown and Ctrl-C is honoured
/// between passes.
const PREFILL_CHUNK: usize = 512;

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    threads: ThreadArgs,
    /// Tokens to generate (-1: until the end of generation, shifting a full context; llama.cpp's -2: until the end
    /// of generation or a full context).
    #[arg(
        short = 'n',
        long,
        visible_alias = "predict",
        value_name = "N",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    n_predict: i64,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Context length in positions (KV cache) [default: 4096, or the model's
    /// training context when shorter]; 0 or more than the training context:
    /// the training context (with a warning when more).
    #[arg(short = 'c', long, value_name = "N", allow_negative_numbers = true)]
    ctx_size: Option<i64>,
    /// Wrap the prompt in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// System prompt, sent before the prompt; turns --chat on, as llama.cpp's conversation mode (also -sys).
    #[arg(long = "system-prompt", value_name = "TEXT", allow_hyphen_values = true)]
    system_prompt: Option<String>,
    #[command(flatten)]
    text: TextArgs,
    #[command(flatten)]
    shift: ContextShiftArgs,
    /// Do not print the prompt before the generated text.
    #[arg(long)]
    no_display_prompt: bool,
    /// Never end at an end-of-generation token (llama.cpp: their logits become minus infinity); generate to -n or a
    /// full context.
    #[arg(long)]
    ignore_eos: bool,
    /// Print the prompt's token ids and pieces on stderr before generating, as llama.cpp.
    #[arg(long)]
    verbose_prompt: bool,
    /// Print one JSON object on stdout at the end instead of the text and statistics: the text, the token counts,
    /// the stop reason and the timings.
    #[arg(long)]
    json: bool,
    /// Print the effective settings (sampler chain, context, model) before
    /// generating.
    #[arg(short = 'v', long)]
    verbose: bool,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    cache: CacheTypeArgs,
}

/// What `run --json` prints.
#[derive(Serialize)]
struct RunJson {
    model: String,
    backend: String,
    prompt: String,
    text: String,
    prompt_tokens: usize,
    generated_tokens: usize,
    /// `max tokens`, `end of generation`, `stop string`, `context full`,
    /// `interrupted`.
    stop: &'static str,
    stop_string: Option<String>,
    /// Context shifts (each dropped the oldest half of the tokens after
    /// `--keep`).
    context_shifts: usize,
    seed: u64,
    sampler: String,
    timings: Timings,
}

/// Timings of `run --json`, with llama-server's names and meanings: the
/// first predicted token comes from the prompt's logits (its time is the
/// prompt's), so `predicted_ms` spans the `predicted_n - 1` decode steps
/// after it, and the rates count those steps (llama-server's
/// `n_gen_steps`).
#[derive(Serialize)]
struct Timings {
    load_ms: f64,
    prompt_n: usize,
    prompt_ms: f64,
    prompt_per_token_ms: f64,
    prompt_per_second: f64,
    predicted_n: usize,
    predicted_ms: f64,
    predicted_per_token_ms: f64,
    predicted_per_second: f64,
}

impl Timings {
    fn new(stats: &GenerationStats, load_time: std::time::Duration) -> Timings {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        // 0 when there is nothing to divide by, as llama-server.
        let per = |t: f64, n: usize| if n > 0 { t / n as f64 } else { 0.0 };
        let steps = stats.generated_tokens.saturating_sub(1);
        Timings {
            load_ms: ms(load_time),
            prompt_n: stats.prompt_tokens,
            prompt_ms: ms(stats.prefill_time),
            prompt_per_token_ms: per(ms(stats.prefill_time), stats.prompt_tokens),
            prompt_per_second: stats.prefill_tps(),
            predicted_n: stats.generated_tokens,
            predicted_ms: ms(stats.decode_time),
            predicted_per_token_ms: per(ms(stats.decode_time), steps),
            predicted_per_second: stats.decode_tps(),
        }
    }
}

/// llama.cpp's `--verbose-prompt` lines: the prompt, its token count and
/// one `id -> 'piece'` line per token.
pub fn print_verbose_prompt(prompt: &str, ids: &[u32], tokenizer: &Tokenizer) {
    eprintln!("prompt: '{prompt}'");
    eprintln!("number of tokens in prompt = {}", ids.len());
    for &id in ids {
        // The token's own bytes, as llama.cpp's `common_token_to_piece`
        // (a space where SentencePiece has `▁`; part of a character shown
        // as U+FFFD).
        let piece = tokenizer.token_bytes(id).map(String::from_utf8_lossy).unwrap_or_default();
        eprintln!("{id:6} -> '{piece}'");
    }
}

/// What `-v` names besides the sampling: the model, where it runs, its context.
pub struct Settings<'a> {
    pub path: &'a std::path::Path,
    pub backend: &'a dyn infer_compute::ComputeBackend,
    pub n_ctx: usize,
    pub n_ctx_train: usize,
}

/// The lines of `-v` (`run`, `chat`): model, backend, context, the token
/// limit (`max_tokens`, `-n`), the prompt's tokens when known, the sampler
/// chain and its parameters.
pub fn print_settings(
    s: &Settings,
    max_tokens: usize,
    prompt_tokens: Option<usize>,
    cfg: &infer_model::sampling::SamplerConfig,
    from_model: &infer_model::sampling::SamplingDefaults,
) {
    eprintln!("model:    {}", s.path.display());
    eprintln!("backend:  {}", s.backend.device_info());
    eprintln!("context:  {} positions (training context {})", s.n_ctx, s.n_ctx_train);
    eprintln!(
        "predict:  {}",
        if max_tokens == usize::MAX { "until end of generation or a full context".into() } else { tokens(max_tokens) }
    );
    if let Some(n) = prompt_tokens {
        eprintln!("prompt:   {}", tokens(n));
    }
    eprintln!("sampler chain: {}", cfg.chain());
    eprintln!("sampler params: {cfg}");
    if !from_model.is_empty() {
        eprintln!("sampler params from the model (not given here): {from_model}");
    }
}

/// A decode rate for `n` generated tokens: `n/a` for fewer than two (the
/// first comes from the prefill, so no step is timed).
pub fn decode_rate(n: usize, tps: f64) -> String {
    if n < 2 || !tps.is_finite() || tps <= 0.0 {
        "n/a".to_string()
    } else {
        format!("{tps:.1}")
    }
}

/// "1 token", "2 tokens".
pub fn tokens(n: usize) -> String {
    if n == 1 {
        "1 token".to_string()
    } else {
        format!("{n} tokens")
    }
}

/// The error of a prompt that leaves no position to generate in a context
/// of `n_ctx` positions (it has more than `n_ctx - 1` tokens).
fn no_room(n_ctx: usize) -> String {
    if n_ctx <= 1 {
        // Any prompt takes a position: "more than 0 tokens" would say nothing.
        return format!(
            "a context of {n_ctx} position leaves no room to generate after the prompt, which takes at least 1 \
             (raise --ctx-size above the prompt's token count)"
        );
    }
    format!(
        "the prompt has more than {} token{}; a context of {n_ctx} positions leaves no room to generate (raise \
         --ctx-size or shorten the prompt)",
        n_ctx - 1,
        if n_ctx == 2 { "" } else { "s" }
    )
}

pub fn run(a: RunArgs) -> CliResult {
    let max_tokens = n_predict_limit(a.n_predict)?;
    // Where the prompt comes from is checked now; it is read once the
    // context size is known, only as far as the context can hold it.
    let source = a.prompt.source()?;
    let stops = a.text.stop_strings()?;
    // A first use fetches the model: its download time is reported on its
    // own line, not counted as load time.
    let path = a.model.resolve_model()?;
    // The prompt before the weights: a bad chat template or a prompt too
    // long for the context is reported at once (and a slow template can be
    // stopped by Ctrl-C like any step before the model loads).
    let (loaded, p) = a.model.load(&path, a.threads.get(), |gguf, spec| prepare(&a, source, gguf, spec))?;
    let Loaded { backend, spec, model, load_time, .. } = loaded;
    let mut model: Box<dyn DeviceModel> =
        if a.ignore_eos { Box::new(IgnoreEos::new(model, p.tokenizer.eog_ids())) } else { model };
    // From here on, Ctrl-C stops the prefill or the generation at the next
    // step and the statistics are still printed (a second one exits).
    crate::interrupt::graceful();
    if a.verbose {
        let settings =
            Settings { path: &path, backend: backend.as_ref(), n_ctx: p.n_ctx, n_ctx_train: spec.n_ctx_train };
        print_settings(&settings, max_tokens, Some(p.ids.len()), &p.cfg, &p.from_model);
    }
    if a.verbose_prompt {
        // As llama.cpp: what the model is given, the chat template's
        // rendering with --chat.
        print_verbose_prompt(p.rendered.as_deref().unwrap_or(&p.prompt), &p.ids, &p.tokenizer);
    }
    let mut sampler = Sampler::new(p.cfg.clone())?;
    let mut text =
        TextOut { out: Out::new(), text: String::new(), matcher: StopMatcher::new(stops), error: None, json: a.json };
    if !p.chat && !a.no_display_prompt && !a.json {
        write!(text.out, "{}", p.prompt)?;
    }
    text.out.flush()?;
    let show_progress = p.ids.len() > PREFILL_CHUNK && std::io::stderr().is_terminal();
    let on_prefill = |done: usize, total: usize| {
        if show_progress {
            eprint!("\r\x1b[2Kprefill {done}/{total} tokens");
            if done == total {
                eprint!("\r\x1b[2K");
            }
        }
        !crate::interrupt::requested()
    };
    let mut ctx = CachedContext::with_types(model.as_ref(), p.n_ctx, a.cache.types_for(model.as_ref()))?;
    // llama.cpp's -2 stops at a full context; anything else shifts it.
    ctx.set_context_shift(if a.n_predict == -2 { None } else { a.shift.n_keep(&p.ids, &p.tokenizer) });
    let stats = generate_cached_with_progress(
        model.as_mut(),
        &mut ctx,
        &p.tokenizer,
        &p.ids,
        max_tokens,
        &mut sampler,
        PREFILL_CHUNK,
        on_prefill,
        |s| !crate::interrupt::requested() && text.push(s),
    );
    if show_progress {
        eprint!("\r\x1b[2K");
    }
    // An error after the echoed prompt starts on a line of its own.
    let stats = stats.inspect_err(|_| {
        let _ = writeln!(text.out).and_then(|_| text.out.flush());
    })?;
    text.finish()?;
    let interrupted = crate::interrupt::requested() && stats.stop == StopReason::Stopped && !text.matcher.is_stopped();
    let stop = match stats.stop {
        _ if interrupted => "interrupted",
        _ if text.matcher.is_stopped() => "stop string",
        StopReason::MaxTokens => "max tokens",
        StopReason::EndOfGeneration => "end of generation",
        StopReason::ContextFull => "context full",
        StopReason::Stopped => "stopped",
    };
    let mut out = text.out;
    if a.json {
        let j = RunJson {
            model: path.display().to_string(),
            backend: backend.device_info(),
            prompt: p.prompt,
            text: text.text,
            prompt_tokens: stats.prompt_tokens,
            generated_tokens: stats.generated_tokens,
            stop,
            stop_string: text.matcher.matched().map(str::to_string),
            context_shifts: stats.context_shifts,
            seed: p.cfg.seed,
            sampler: p.cfg.chain(),
            timings: Timings::new(&stats, load_time),
        };
        writeln!(out, "{}", serde_json::to_string_pretty(&j)?)?;
        out.flush()?;
    } else {
        writeln!(out)?;
        out.flush()?;
        print_report(&a, &p, backend.as_ref(), &stats, load_time, stop);
    }
    if interrupted {
        return Err(crate::Interrupted.into());
    }
    Ok(())
}

/// What `run` reads and checks before the weights load: the tokenizer,
/// the context, the sampler settings and the prompt's tokens.
struct Prepared {
    tokenizer: Tokenizer,
    n_ctx: usize,
    cfg: SamplerConfig,
    /// Sampling settings the model's file gave (not the command line).
    from_model: SamplingDefaults,
    /// Whether the prompt goes through the chat template.
    chat: bool,
    /// The prompt's tokens: at least one, at most `n_ctx - 1`.
    ids: Vec<u32>,
    /// The prompt as given (after `-e`'s escapes).
    prompt: String,
    /// With `--chat`, the prompt as the chat template renders it.
    rendered: Option<String>,
}

/// Reads the prompt from `source` (only as much as the context can hold)
/// and turns it into tokens, through the chat template with `--chat` or a
/// system prompt.
///
/// # Errors
/// A bad context size or sampling flag, an unreadable or too long prompt,
/// a chat template that fails, an empty prompt for a model without BOS.
fn prepare(a: &RunArgs, source: PromptSource, gguf: &GgufFile, spec: &ModelSpec) -> CliResult<Prepared> {
    let tokenizer = Tokenizer::from_gguf(gguf)?;
    let n_ctx = context_size(a.ctx_size, spec.n_ctx_train)?;
    // Validated as given, also when greedy decoding ignores them; at
    // temperature 0 the penalties still apply (as in llama.cpp), and the
    // filters cannot change the most likely token.
    let (cfg, from_model) = a.sampling.config(n_ctx, gguf)?;
    let limit = crate::prompt::byte_limit(n_ctx);
    let mut prompt = source.read(limit, n_ctx)?;
    if a.prompt.is_flag_text() {
        prompt = a.text.process(prompt, "-p")?;
    }
    // llama.cpp: a system prompt turns the conversation mode on. An empty
    // one is none (llama.cpp checks for an empty system prompt).
    let system_prompt = a.system_prompt.as_deref().filter(|s| !s.is_empty());
    let chat = a.chat || system_prompt.is_some();
    let mut rendered = None;
    let ids = if chat {
        let mut messages: Vec<Message> = system_prompt.iter().map(|s| Message::system(*s)).collect();
        messages.push(Message::user(prompt.as_str()));
        let text = ChatTemplate::from_gguf(gguf, &tokenizer)?.render(&messages, true)?;
        // A template can make a short prompt long: checked as the prompt is.
        if text.len() > limit {
            return Err(crate::prompt::too_long(n_ctx, limit).into());
        }
        let ids = ChatTemplate::encode_rendered_at_most(&tokenizer, &text, n_ctx.saturating_sub(1));
        rendered = Some(text);
        ids
    } else {
        // Tokenized only until it is known not to fit.
        tokenizer.encode_at_most(&prompt, true, true, n_ctx.saturating_sub(1))
    };
    let Some(ids) = ids else { return Err(no_room(n_ctx).into()) };
    // llama.cpp: an empty input starts from BOS when the model adds one,
    // else is refused ("input is empty"), before any output.
    if ids.is_empty() {
        return Err("the prompt is empty and the model adds no BOS token to start from; give a prompt".into());
    }
    if prompt.is_empty() && !chat {
        eprintln!("warning: the prompt is empty: generating from the BOS token alone");
    }
    Ok(Prepared { tokenizer, n_ctx, cfg, from_model, chat, ids, prompt, rendered })
}

/// The generated text on its way to stdout: held back while it could be
/// the start of a stop string, kept for `--json`, and stopped at a stop
/// string, at the first failed write (e.g. a closed pipe) or at Ctrl-C.
struct TextOut {
    out: Out,
    /// The generated text (a stop string, printed, is not part of it).
    text: String,
    matcher: StopMatcher,
    /// The first write that failed; nothing is written after it.
    error: Option<std::io::Error>,
    /// `--json`: the text is kept, not printed.
    json: bool,
}

impl TextOut {
    /// Takes a token's text; false once generation should stop.
    fn push(&mut self, s: &str) -> bool {
        let step = self.matcher.push(s);
        if !self.emit(&step.text, true) {
            return false;
        }
        // llama.cpp prints the reverse prompt it stops at; `--json`'s
        // `text` leaves it out, as llama-server's `content` does.
        if let Some(stop) = self.matcher.matched().filter(|_| step.stopped).map(str::to_string) {
            self.emit(&stop, false);
        }
        !step.stopped
    }

    /// Prints `s` (kept in `text` when `in_text`); false after a failed write.
    fn emit(&mut self, s: &str, in_text: bool) -> bool {
        if in_text {
            self.text.push_str(s);
        }
        if self.json || s.is_empty() || self.error.is_some() {
            return self.error.is_none();
        }
        match self.out.write_all(s.as_bytes()).and_then(|_| self.out.flush()) {
            Ok(()) => true,
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }

    /// The end of generation: releases what was held back.
    ///
    /// # Errors
    /// The first write that failed.
    fn finish(&mut self) -> CliResult {
        let tail = self.matcher.finish();
        self.emit(&tail, true);
        match self.error.take() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// The statistics `run` prints on stderr after the text.
fn print_report(
    a: &RunArgs,
    p: &Prepared,
    backend: &dyn infer_compute::ComputeBackend,
    stats: &GenerationStats,
    load_time: std::time::Duration,
    stop: &str,
) {
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
    eprintln!(
        "decode:   {} ({} after the first) in {:.3} s ({} tokens/s), stop: {stop}",
        tokens(stats.generated_tokens),
        stats.generated_tokens.saturating_sub(1),
        stats.decode_time.as_secs_f64(),
        decode_rate(stats.generated_tokens, stats.decode_tps()),
    );
    // With shifting on, a full context ends the generation only when
    // --keep keeps (nearly) all of it: nothing is left to drop.
    if stats.stop == StopReason::ContextFull && a.n_predict != -2 && !a.shift.no_context_shift {
        let keep = a.shift.keep.map_or_else(|| "0".to_string(), |k| k.to_string());
        eprintln!(
            "context:  full and not shifted: --keep {keep} keeps {} of the {} positions (at most the prompt), \
             leaving too few to drop; lower --keep or raise -c",
            tokens(a.shift.n_keep(&p.ids, &p.tokenizer).unwrap_or(0)),
            p.n_ctx
        );
    }
    if stats.context_shifts > 0 {
        eprintln!(
            "context:  shifted {} time{} ({} fed again after the kept start)",
            stats.context_shifts,
            if stats.context_shifts == 1 { "" } else { "s" },
            tokens(stats.shift_tokens)
        );
    }
    eprintln!(
        "sampling: seed {}, {}{}",
        p.cfg.seed,
        p.cfg.chain(),
        crate::sampling::model_settings_note(&p.from_model)
    );
}
