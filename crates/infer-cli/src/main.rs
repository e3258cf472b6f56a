//! `infer`: generate text with a GGUF model, inspect it, and benchmark it.

// Diagnostics go to stderr through these, which replace the standard
// macros in every module below: a full or closed stderr
// (`2>/dev/full`) must not panic the process; the command's own output and
// exit status still tell the outcome.
macro_rules! eprintln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}
macro_rules! eprint {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($t)*);
    }};
}

mod bench;
mod bench_batched;
mod bench_serve;
mod cache_type;
mod chat;
mod chat_commands;
mod chat_input;
mod common;
mod context_shift;
mod ignore_eos;
mod info;
mod interrupt;
mod llama_args;
mod models;
mod output;
mod perplexity;
mod profile;
mod prompt;
mod pull;
mod run;
mod sampling;
mod serve;
mod synth;

use std::process::ExitCode;

use infer_compute::reserve_alloc::ReserveAllocator;

use clap::{Parser, Subcommand};

// Out of memory ends in the command's error, not the allocator's abort:
// a small allocation that finds memory gone is served from a reserve,
// and the next large (fallible) one reports the shortage.
#[global_allocator]
static ALLOC: ReserveAllocator = ReserveAllocator::system();

/// Hardware-accelerated LLM inference on GGUF models.
#[derive(Parser)]
#[command(name = "infer", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Run(run::RunArgs),
    /// Show a model's architecture, shapes, tensor types and the backend in use.
    Info(info::InfoArgs),
    /// Measure prefill and decode tokens per second (llama-bench's tests and table); `bench serve` loads an
    /// OpenAI-compatible server.
    Bench(bench::BenchArgs),
    /// Chat with a model (by default the instruction-tuned smollm2-135m): multi-turn, the KV cache kept between
    /// turns, replies streamed.
    Chat(chat::ChatArgs),
    /// List the models known by name (size, family, quantization, base or instruct, whether each is cached) and the
    /// Hugging Face models in the cache.
    Models(models::ModelsArgs),
    /// Download a model from Hugging Face (`user/repo[:QUANT]`, default Q4_K_M) or a known model into the cache,
    /// and print its path.
    Pull(pull::PullArgs),
    /// Remove models from the cache (`user/repo[:QUANT]`, `user/repo`, or a known name).
    Rm(pull::RmArgs),
    /// Serve the model over HTTP with the OpenAI API (chat and text completions, streaming), many requests at once
    /// (continuous batching over `--parallel` slots).
    Serve(serve::ServeArgs),
    /// Perplexity of a model over a text file, computed as llama.cpp's llama-perplexity (chunks of -c tokens, each
    /// scored over its second half).
    Perplexity(perplexity::PerplexityArgs),
    /// Write a GGUF with random weights and a real model's shapes, metadata and tensor types.
    Synth(synth::SynthArgs),
}

/// Mesa's Vulkan drivers install an implicit loader layer
/// (`VK_LAYER_MESA_device_select`) that, where `XDG_RUNTIME_DIR` is unset
/// or not a directory (containers, services, `su` shells), prints
/// "error: XDG_RUNTIME_DIR is invalid or not set in the environment." twice
/// whenever a Vulkan instance is made, which `--backend auto` does to look
/// for a GPU. The layer only orders devices, and infer picks its adapter
/// itself, so there it is turned off (`NODEVICE_SELECT=1`, Mesa's switch),
/// unless the user set that variable. Runs before any other thread exists.
fn quiet_mesa_device_select() {
    #[cfg(all(unix, feature = "wgpu"))]
    {
        let runtime_dir_ok = std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir());
        if !runtime_dir_ok && std::env::var_os("NODEVICE_SELECT").is_none() {
            // Before any other thread exists: nothing reads the
            // environment concurrently.
            std::env::set_var("NODEVICE_SELECT", "1");
        }
    }
}

fn main() -> ExitCode {
    // Writing into a closed pipe (`infer info | head -1`) ends the process
    // quietly, as command-line tools do, instead of panicking in `println!`.
    #[cfg(unix)]
    // SAFETY: runs first, before any other thread exists; it only restores
    // the default action of SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    quiet_mesa_device_select();
    // llama.cpp's multi-letter flags (`-ngl 99`) before clap, which would
    // read them as a short flag and its value (`-n gl`).
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cmd = llama_args::subcommand(&args).map(str::to_string);
    let args = match llama_args::rewrite_args(args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // As llama.cpp, a flag given twice takes the last value.
    fn override_self(c: clap::Command) -> clap::Command {
        c.args_override_self(true).mut_subcommands(override_self)
    }
    use clap::{CommandFactory, FromArgMatches};
    let parsed = override_self(Cli::command()).try_get_matches_from(args).and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            // A llama.cpp flag this command lacks: what to do instead.
            if e.kind() == clap::error::ErrorKind::UnknownArgument {
                if let Some(clap::error::ContextValue::String(arg)) = e.get(clap::error::ContextKind::InvalidArg) {
                    let hint = llama_args::hint(cmd.as_deref(), arg)
                        .or_else(|| llama_args::unsupported_long(cmd.as_deref(), arg));
                    if let Some(h) = hint {
                        eprintln!("error: {h}");
                        return ExitCode::from(2);
                    }
                }
            }
            return parse_error(e);
        }
    };
    interrupt::install();
    let list_devices = model_args(&cli.command).is_some_and(|m| m.list_devices);
    let result = output::check_open().map_err(Into::into).and_then(|()| match cli.command {
        // llama.cpp's --list-devices prints them and runs nothing else.
        _ if list_devices => common::list_devices(),
        Command::Run(a) => run::run(a),
        Command::Info(a) => info::info(a),
        Command::Bench(mut a) => match a.command.take() {
            Some(bench::BenchCommand::Serve(s)) => bench_serve::bench_serve(s),
            None => bench::bench(a),
        },
        Command::Synth(a) => synth::synth(a),
        Command::Models(a) => models::models(a),
        Command::Chat(a) => chat::chat(a),
        Command::Serve(a) => serve::serve(a),
        Command::Pull(a) => pull::pull(a),
        Command::Rm(a) => pull::rm(a),
        Command::Perplexity(a) => perplexity::perplexity(a),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Interrupted>() => {
            eprintln!("interrupted");
            ExitCode::from(interrupt::EXIT_INTERRUPTED)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The model options of a command that loads a model.
fn model_args(c: &Command) -> Option<&common::ModelArgs> {
    match c {
        Command::Run(a) => Some(&a.model),
        Command::Info(a) => Some(&a.model),
        Command::Bench(a) => Some(&a.model),
        Command::Chat(a) => Some(&a.model),
        Command::Serve(a) => Some(&a.model),
        Command::Perplexity(a) => Some(&a.model),
        Command::Models(_) | Command::Pull(_) | Command::Rm(_) | Command::Synth(_) => None,
    }
}

/// Prints what clap has to say (help, version, or a usage error) and gives
/// the exit status. Unlike `clap::Error::exit`, a failed write of the help
/// text (`infer --help > /dev/full`) is reported and exits 1; a usage error
/// is one line, as every other error.
fn parse_error(e: clap::Error) -> ExitCode {
    use std::io::IsTerminal;
    use std::io::Write;
    let is_output = !e.use_stderr();
    let terminal = if is_output { std::io::stdout().is_terminal() } else { std::io::stderr().is_terminal() };
    let colour = terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    // Help asked for, or shown for a missing subcommand: as clap writes it.
    let help = is_output || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand;
    let text = if !help {
        format!("{}\n", one_line(&e.render().to_string()))
    } else if colour {
        e.render().ansi().to_string()
    } else {
        e.render().to_string()
    };
    let written = if is_output {
        // Rust's stdout takes writes to a closed descriptor as done.
        output::check_open().and_then(|()| {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).and_then(|()| out.flush())
        })
    } else {
        let mut err = std::io::stderr().lock();
        err.write_all(text.as_bytes()).and_then(|()| err.flush())
    };
    match written {
        Err(w) if w.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("error: writing the {}: {w}", if is_output { "help or version text" } else { "usage error" });
            ExitCode::FAILURE
        }
        _ => ExitCode::from(e.exit_code() as u8),
    }
}

/// clap's usage error (`error: ...`, the lines that detail it, a tip, the
/// usage, a pointer to `--help`) as one line: the message with its details
/// (the values an option takes, the missing arguments) and its tip after
/// `; `, without the usage and the pointer.
fn one_line(text: &str) -> String {
    let mut line = String::new();
    for l in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if l.starts_with("Usage:") || l.starts_with("For more information") {
            break;
        }
        if !line.is_empty() {
            line.push_str(if l.starts_with("tip:") { "; " } else { " " });
        }
        line.push_str(l);
    }
    line
}

/// A command stopped early by Ctrl-C (or SIGTERM) after a clean stop; the
/// process exits with status 130.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}
