//! `infer`: generate text with a GGUF model, inspect it, and benchmark it.

mod bench;
mod common;
mod info;
mod interrupt;
mod output;
mod profile;
mod prompt;
mod run;
mod sampling;
mod synth;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Measure prefill and decode tokens per second (llama-bench's tests and table).
    Bench(bench::BenchArgs),
    /// Write a GGUF with random weights and a real model's shapes, metadata and tensor types.
    Synth(synth::SynthArgs),
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
    let cli = Cli::parse();
    interrupt::install();
    let result = output::check_open().map_err(Into::into).and_then(|()| match cli.command {
        Command::Run(a) => run::run(a),
        Command::Info(a) => info::info(a),
        Command::Bench(a) => bench::bench(a),
        Command::Synth(a) => synth::synth(a),
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
