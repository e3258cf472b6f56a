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
//! Input comes through [`crate::chat_input`] (a line editor on a terminal,
//! multi-line messages with a trailing `\`); lines that begin with `/` are
//! commands ([`crate::chat_commands`]: `/help`, `/reset`, `/save`, `/load`,
//! `/exit`), never sent to the model. Ctrl-C during a reply stops it and
//! keeps the session (the process's signal handler, `interrupt`, only sets
//! a flag that the streaming callback reads, cleared around each reply; a
//! second Ctrl-C within one reply ends the process). At the prompt Ctrl-C
//! is a key of the line editor: the first asks, a second in a row leaves;
//! Ctrl-D or the end of the input leaves with the line ended, and so do
//! SIGTERM and SIGHUP, at the prompt or during a reply (which stops first).
//! `/reset` keeps the system prompt's part of the KV cache.

use std::io::Write;
use std::path::Path;

use clap::Args;
use infer_compute::pipeline::ModelSpec;
use infer_compute::DeviceModel;
use infer_model::chat::{ChatTemplate, Message, Role, TemplateSource};
use infer_model::fetch::KNOWN_MODELS;
use infer_model::generate::{generate_cached, CachedContext, StopReason};
use infer_model::gguf::GgufFile;
use infer_model::sampling::{Sampler, SamplerConfig, SamplingDefaults};
use infer_model::stop::StopMatcher;
use infer_model::tokenizer::Tokenizer;

use crate::cache_type::CacheTypeArgs;
use crate::chat_commands::{self, Command};
use crate::chat_input::{ChatInput, Input};
use crate::common::{context_size, n_predict_limit, CliResult, Loaded, ModelArgs, ThreadArgs};
use crate::context_shift::ContextShiftArgs;
use crate::ignore_eos::IgnoreEos;
use crate::prompt::TextArgs;
use crate::sampling::SamplingArgs;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    threads: ThreadArgs,
    /// System prompt, sent first in every conversation (also -sys, --system).
    #[arg(long = "system-prompt", visible_alias = "system", value_name = "TEXT", allow_hyphen_values = true)]
    system: Option<String>,
    /// Most tokens per reply (-1: until the end of the turn or a full
    /// context).
    #[arg(
        short = 'n',
        long,
        visible_alias = "predict",
        value_name = "N",
        default_value_t = 512,
        allow_negative_numbers = true
    )]
    n_predict: i64,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    text: TextArgs,
    #[command(flatten)]
    shift: ContextShiftArgs,
    /// Context length in positions (KV cache) of the whole conversation
    /// [default: 4096, or the model's training context when shorter]; 0 or
    /// more than the training context: the training context (with a
    /// warning when more).
    #[arg(short = 'c', long, value_name = "N", allow_negative_numbers = true)]
    ctx_size: Option<i64>,
    #[command(flatten)]
    cache: CacheTypeArgs,
    /// Never end a reply at an end-of-generation token (llama.cpp: their logits become minus infinity); each reply
    /// goes on to -n, a stop string or a full context.
    #[arg(long)]
    ignore_eos: bool,
    /// Print each turn's prompt (the whole conversation as rendered), its token count and one `id -> 'piece'` line
    /// per token on stderr before the reply, as llama.cpp.
    #[arg(long)]
    verbose_prompt: bool,
    /// Print the effective settings (sampler chain, context, model) when the session starts.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Taken as llama.cpp's conversation mode takes it: the chat echoes no prompt (only the replies are printed;
    /// neither the system prompt nor the rendered conversation is shown), so it changes nothing.
    #[arg(long)]
    no_display_prompt: bool,
}

/// Whether the model at `path` is instruction-tuned, as far as can be
/// told: a known model by its file (its cache file however reached: a
/// relative path, a link; or a copy under the known file name), else
/// `Some(true)` when the file's `general.name`, `general.finetune` or
/// `general.basename` says so (`Instruct`, `-it`, `chat`), else `None`
/// (unknown: no warning; only a known base model is warned about).
fn instruct_tuned(path: &Path, gguf: &GgufFile) -> Option<bool> {
    let cache = infer_model::fetch::cache_dir();
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    let here = canonical(path);
    let name = path.file_name();
    if let Some(m) = KNOWN_MODELS.iter().find(|m| {
        let known = cache.join(m.file);
        path == known || (here.is_some() && here == canonical(&known)) || name == Some(std::ffi::OsStr::new(m.file))
    }) {
        return Some(m.instruct);
    }
    let says_instruct = |s: &str| {
        let s = s.to_ascii_lowercase();
        s.contains("instruct") || s.contains("chat") || s.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| w == "it")
    };
    ["general.name", "general.finetune", "general.basename"]
        .iter()
        .any(|k| gguf.get_str(k).is_ok_and(says_instruct))
        .then_some(true)
}

pub fn chat(a: ChatArgs) -> CliResult {
    let max_tokens = n_predict_limit(a.n_predict)?;
    // Nothing to hide: see the flag's help.
    let _ = a.no_display_prompt;
    let stops = a.text.stop_strings()?;
    // Without -m (or $INFER_MODEL), an instruction-tuned model: the default
    // model of `run` is a base model, which continues text.
    let path = a.model.resolve_model_or(infer_model::fetch::DEFAULT_CHAT_MODEL_NAME)?;
    // An empty -sys is no system prompt (llama.cpp checks for an empty one).
    let system_prompt = a.system.as_deref().filter(|s| !s.is_empty());
    let (loaded, setup) =
        a.model.load(&path, a.threads.get(), |gguf, spec| prepare(&a, &path, system_prompt, gguf, spec))?;
    let Loaded { backend, spec, model, load_time, .. } = loaded;
    let mut model: Box<dyn DeviceModel> =
        if a.ignore_eos { Box::new(IgnoreEos::new(model, setup.tokenizer.eog_ids())) } else { model };
    let ctx = CachedContext::with_types(model.as_ref(), setup.n_ctx, a.cache.types_for(model.as_ref()))?;
    let sampler = Sampler::new(setup.cfg.clone())?;
    let (cfg, from_model) = (&setup.cfg, &setup.from_model);
    eprintln!(
        "{} on {}, loaded in {:.2} s; context {} tokens; sampling: seed {}, {}{}. /reset starts over, /exit \
         (or end of input) leaves, Ctrl-C stops a reply.",
        path.display(),
        backend.device_info(),
        load_time.as_secs_f64(),
        setup.n_ctx,
        cfg.seed,
        cfg.chain(),
        crate::sampling::model_settings_note(from_model)
    );
    if a.verbose {
        let settings = crate::run::Settings {
            path: &path,
            backend: backend.as_ref(),
            n_ctx: setup.n_ctx,
            n_ctx_train: spec.n_ctx_train,
        };
        crate::run::print_settings(&settings, max_tokens, None, cfg, from_model);
    }
    crate::interrupt::graceful();
    // SIGTERM and SIGHUP end the session as the end of the input does.
    crate::interrupt::session();

    let system: Vec<Message> = system_prompt.iter().map(|s| Message::system(*s)).collect();
    let mut input = ChatInput::new(setup.limit);
    if input.is_terminal() {
        eprintln!("/help lists the commands; a line that ends in \\ continues on the next.");
    }
    let mut session = Session {
        a: &a,
        sampler,
        conv: Conversation::new(system, &setup),
        setup,
        ctx,
        stops,
        max_tokens,
        // Checked writes: a failed one is an error naming standard output.
        out: crate::output::Out::new(),
    };
    // Ctrl-C at an empty prompt asks first; a second one in a row leaves.
    let mut asked_to_leave = false;
    loop {
        // A termination signal during the last reply or command ends the session.
        if !crate::interrupt::at_prompt() {
            break;
        }
        let read = input.read(&mut session.out);
        crate::interrupt::left_prompt();
        let raw = match read {
            Ok(Input::Text(t)) => t,
            Ok(Input::Interrupted) if asked_to_leave => break,
            Ok(Input::Interrupted) => {
                eprintln!("(Ctrl-C again, Ctrl-D or /exit leaves)");
                asked_to_leave = true;
                continue;
            }
            Ok(Input::End) => {
                // The shell's prompt starts on a line of its own.
                if !input.is_terminal() {
                    writeln!(session.out)?;
                }
                break;
            }
            Ok(Input::Refused(why)) => {
                eprintln!("{why}; it was not sent");
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        asked_to_leave = false;
        let text = match a.text.process(raw.trim().to_string(), "the input line") {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{e}; it was not sent");
                continue;
            }
        };
        match chat_commands::parse(&text) {
            Command::Send(t) if t.is_empty() => {}
            Command::Send(t) => session.send(model.as_mut(), t)?,
            Command::Exit => break,
            command => session.command(command, &mut input)?,
        }
    }
    Ok(())
}

/// What `chat` reads and checks before the weights load.
struct Setup {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    /// Context positions.
    n_ctx: usize,
    /// The longest text the context can hold, in bytes (`prompt::byte_limit`).
    limit: usize,
    cfg: SamplerConfig,
    /// Sampling settings the model's file gave (not the command line).
    from_model: SamplingDefaults,
}

/// The tokenizer, chat template, context and sampler settings of the model
/// at `path`; warns of a missing chat template or a base model.
///
/// # Errors
/// A bad context size or sampling flag; a system prompt (or the template's
/// own) that leaves no room for a message.
fn prepare(
    a: &ChatArgs,
    path: &Path,
    system_prompt: Option<&str>,
    gguf: &GgufFile,
    spec: &ModelSpec,
) -> CliResult<Setup> {
    let tokenizer = Tokenizer::from_gguf(gguf)?;
    let template = ChatTemplate::from_gguf(gguf, &tokenizer)?;
    let n_ctx = context_size(a.ctx_size, spec.n_ctx_train)?;
    let (cfg, from_model) = a.sampling.config(n_ctx, gguf)?;
    let limit = crate::prompt::byte_limit(n_ctx);
    // A system prompt that leaves no room fails before the weights load.
    // So does the template's own default system prompt (used without -sys).
    check_system_prompt(&template, &tokenizer, system_prompt, n_ctx, limit)?;
    if template.source() != TemplateSource::Gguf {
        // The source's own "(the file has none)" would say it twice.
        let source = template.source().to_string();
        let source = source.trim_end_matches(" (the file has none)");
        eprintln!("warning: {} has no chat template; using {source}", path.display());
    }
    if instruct_tuned(path, gguf) == Some(false) {
        eprintln!(
            "warning: {} is a pre-trained (base) model: it continues text rather than answering (`infer chat` \
             without -m uses {}, an instruction-tuned model)",
            path.display(),
            infer_model::fetch::DEFAULT_CHAT_MODEL_NAME
        );
    }
    Ok(Setup { tokenizer, template, n_ctx, limit, cfg, from_model })
}

/// The messages of a conversation and the start that a context shift and
/// `/reset` keep: its leading system messages (-sys, or a loaded file's),
/// which dropping old turns never removes, and their tokens.
struct Conversation {
    /// The -sys messages `/reset` starts again from.
    system: Vec<Message>,
    messages: Vec<Message>,
    /// The leading system messages of `messages`.
    n_system: usize,
    /// Their tokens ([`system_tokens`]).
    system_ids: Vec<u32>,
}

impl Conversation {
    fn new(system: Vec<Message>, s: &Setup) -> Conversation {
        let mut c = Conversation { messages: Vec::new(), n_system: 0, system_ids: Vec::new(), system };
        c.replace(c.system.clone(), s);
        c
    }

    /// The conversation becomes `messages`; its leading system messages
    /// are the new start.
    fn replace(&mut self, messages: Vec<Message>, s: &Setup) {
        self.messages = messages;
        self.n_system = self.messages.iter().take_while(|m| m.role == Role::System).count();
        self.system_ids = system_tokens(&s.template, &s.tokenizer, &self.messages[..self.n_system]);
    }
}

/// A chat session's state between turns.
struct Session<'a> {
    a: &'a ChatArgs,
    setup: Setup,
    conv: Conversation,
    ctx: CachedContext,
    sampler: Sampler,
    stops: Vec<String>,
    max_tokens: usize,
    out: crate::output::Out,
}

impl Session<'_> {
    /// Sends the user's `text` and streams the reply, which joins the
    /// conversation; a turn that cannot fit is refused on stderr.
    fn send(&mut self, model: &mut dyn DeviceModel, text: String) -> CliResult {
        let (s, a) = (&self.setup, self.a);
        self.conv.messages.push(Message::user(text));
        let shift = !a.shift.no_context_shift;
        let Some((rendered, ids, dropped)) = fit_conversation(
            &mut self.conv.messages,
            self.conv.n_system,
            &s.template,
            &s.tokenizer,
            s.n_ctx,
            s.limit,
            shift,
        ) else {
            return Ok(());
        };
        match dropped {
            0 => {}
            1 => eprintln!("(context full: the oldest message was dropped)"),
            n => eprintln!("(context full: the {n} oldest messages were dropped)"),
        }
        if a.verbose_prompt {
            crate::run::print_verbose_prompt(&rendered, &ids, &s.tokenizer);
        }
        // A full context during the reply keeps the system prompt (and
        // --keep more) and drops the oldest half of the rest.
        let system_len = self.conv.system_ids.iter().zip(&ids).take_while(|(x, y)| x == y).count();
        let keep = a.shift.n_keep(&ids, &s.tokenizer).map(|k| k.max(system_len));
        self.ctx.set_context_shift(keep);
        let reply = reply(
            model,
            &mut self.ctx,
            &s.tokenizer,
            &ids,
            self.max_tokens,
            &mut self.sampler,
            &self.stops,
            &mut self.out,
        )?;
        self.conv.messages.push(Message::assistant(reply.trim()));
        Ok(())
    }

    /// Runs a command other than sending and `/exit`; what fails is said
    /// on stderr and the session goes on.
    fn command(&mut self, command: Command, input: &mut ChatInput) -> CliResult {
        let s = &self.setup;
        match command {
            // Sent or ended by the caller, never passed here.
            Command::Send(_) | Command::Exit => {}
            Command::Help => eprintln!("{}", chat_commands::HELP),
            Command::Invalid(why) => eprintln!("{why}"),
            Command::Reset => {
                self.conv.replace(self.conv.system.clone(), s);
                // The system prompt's positions stay: the next turn starts with them.
                self.ctx.keep_common_prefix(&self.conv.system_ids);
                self.sampler = Sampler::new(s.cfg.clone())?;
                eprintln!("(conversation reset)");
            }
            Command::Save(file) => {
                match chat_commands::save(&file, &self.conv.messages, &mut |question| input.confirm(question)) {
                    Ok(()) => eprintln!(
                        "(conversation of {} saved to {})",
                        messages_count(self.conv.messages.len()),
                        file.display()
                    ),
                    Err(e) => eprintln!("{e}"),
                }
            }
            Command::Load(file) => match chat_commands::load(&file, s.limit) {
                Ok(loaded) => {
                    self.conv.replace(loaded, s);
                    eprintln!(
                        "(conversation of {} loaded from {})",
                        messages_count(self.conv.messages.len()),
                        file.display()
                    );
                }
                Err(e) => eprintln!("{e}"),
            },
        }
        Ok(())
    }
}

/// The tokens of the system messages `system` rendered alone (none when
/// the template refuses them). Without system messages, the start that
/// every conversation's rendering shares: the template's own default
/// system prompt, when it has one (what `/reset` keeps in the cache).
fn system_tokens(template: &ChatTemplate, tokenizer: &Tokenizer, system: &[Message]) -> Vec<u32> {
    if system.is_empty() {
        let render = |text: &str| {
            template.render(&[Message::user(text)], false).map(|t| ChatTemplate::encode_rendered(tokenizer, &t))
        };
        let (Ok(a), Ok(b)) = (render("a"), render("b")) else { return Vec::new() };
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        return a[..common].to_vec();
    }
    template.render(system, false).map(|t| ChatTemplate::encode_rendered(tokenizer, &t)).unwrap_or_default()
}

/// The conversation `messages` (its last message the new user turn)
/// rendered for a reply, its tokens, and how many of its oldest messages
/// were dropped to fit: with `shift`, the oldest turns after the
/// `n_system` system messages go until the conversation takes at most half
/// the context (Ollama's and llama.cpp's way of going on in a full
/// context). `None`, with the reason on stderr and the new turn taken back,
/// when the turn cannot be sent: too long, or refused by the template (the
/// conversation is then kept as it was).
fn fit_conversation(
    messages: &mut Vec<Message>,
    n_system: usize,
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    n_ctx: usize,
    limit: usize,
    shift: bool,
) -> Option<(String, Vec<u32>, usize)> {
    // Restored when the template refuses the turn.
    let original = messages.clone();
    let mut dropped = 0;
    loop {
        let rendered = match template.render(messages, true) {
            Ok(r) => r,
            Err(e) => {
                *messages = original;
                messages.pop();
                let why = e.to_string().replace('\n', " ");
                eprintln!("the chat template refused this turn ({why}); it was not sent");
                return None;
            }
        };
        // Past the byte limit the conversation cannot fit: not tokenized;
        // else tokenized only until it is known not to fit.
        let ids = if rendered.len() > limit {
            None
        } else {
            ChatTemplate::encode_rendered_at_most(tokenizer, &rendered, n_ctx.saturating_sub(1))
        };
        let fits = ids.is_some();
        let roomy = ids.as_ref().is_some_and(|ids| ids.len() <= n_ctx / 2);
        // The new turn alone is always kept.
        let can_drop = shift && messages.len() > n_system + 1;
        match ids {
            Some(ids) if fits && (roomy || dropped == 0 || !can_drop) => return Some((rendered, ids, dropped)),
            _ if can_drop => {
                // The oldest turn: a user message and the reply after it.
                let n = if messages.get(n_system + 1).is_some_and(|m| m.role == Role::Assistant) { 2 } else { 1 };
                let n = n.min(messages.len() - n_system - 1);
                messages.drain(n_system..n_system + n);
                dropped += n;
            }
            _ => {
                messages.pop();
                if messages.len() == n_system {
                    // Nothing to forget: /reset cannot help.
                    eprintln!(
                        "this message would take all of the {n_ctx} context positions on its own; it was not sent \
                         (shorten it or raise --ctx-size)"
                    );
                } else {
                    eprintln!(
                        "the conversation would take all of the {n_ctx} context positions; /reset to start over \
                         (or raise --ctx-size)"
                    );
                }
                return None;
            }
        }
    }
}

/// "1 message", "2 messages".
fn messages_count(n: usize) -> String {
    if n == 1 {
        "1 message".into()
    } else {
        format!("{n} messages")
    }
}

/// Generates and streams one reply to the conversation `ids`, then its
/// stats line on stderr; returns its text (without a stop string).
/// Ctrl-C stops it (the session goes on).
#[allow(clippy::too_many_arguments)]
fn reply(
    model: &mut dyn DeviceModel,
    ctx: &mut CachedContext,
    tokenizer: &Tokenizer,
    ids: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stops: &[String],
    out: &mut crate::output::Out,
) -> CliResult<String> {
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
    let stats = generate_cached(model, ctx, tokenizer, ids, max_tokens, sampler, |s| {
        let step = matcher.push(s);
        emit(&step.text, out) && !step.stopped && !crate::interrupt::requested()
    })?;
    let tail = matcher.finish();
    emit(&tail, out);
    if let Some(e) = write_error {
        return Err(format!("writing the output: {e}").into());
    }
    writeln!(out)?;
    out.flush()?;
    let stop = match stats.stop {
        _ if matcher.is_stopped() => "stop string",
        StopReason::EndOfGeneration => "end of turn",
        StopReason::MaxTokens => "-n reached",
        StopReason::ContextFull => "context full",
        StopReason::Stopped => "interrupted",
    };
    let shifted = match stats.context_shifts {
        0 => String::new(),
        1 => "; context shifted once".to_string(),
        n => format!("; context shifted {n} times"),
    };
    eprintln!(
        "[prefill {} ({} reused) at {:.1} tokens/s; {} at {} tokens/s{shifted}; {stop}]",
        crate::run::tokens(stats.prompt_tokens),
        stats.reused_tokens,
        stats.prefill_tps(),
        crate::run::tokens(stats.generated_tokens),
        crate::run::decode_rate(stats.generated_tokens, stats.decode_tps())
    );
    // A Ctrl-C that stopped this reply is spent.
    crate::interrupt::clear();
    Ok(reply)
}

/// Fails when the system prompt alone (with an empty first user message and
/// the opening of the reply) takes the whole context: no turn could be
/// sent. A template that refuses the empty message is not checked here;
/// each turn is checked as it comes.
fn check_system_prompt(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    system: Option<&str>,
    n_ctx: usize,
    limit: usize,
) -> CliResult {
    let too_long = || match system {
        Some(_) => format!(
            "the system prompt takes all of the {n_ctx} context positions, leaving none for the conversation \
             (shorten -sys/--system-prompt or raise -c/--ctx-size)"
        ),
        None => format!(
            "the chat template alone (with its own default system prompt, if it has one) takes all of the {n_ctx} \
             context positions, leaving none for a message (raise -c/--ctx-size)"
        ),
    };
    if system.is_some_and(|s| s.len() > limit) {
        return Err(too_long().into());
    }
    let mut messages: Vec<Message> = system.iter().map(|s| Message::system(*s)).collect();
    messages.push(Message::user(""));
    let Ok(text) = template.render(&messages, true) else { return Ok(()) };
    if text.len() > limit || ChatTemplate::encode_rendered_at_most(tokenizer, &text, n_ctx.saturating_sub(1)).is_none()
    {
        return Err(too_long().into());
    }
    Ok(())
}
