//! `infer`: generate text with a GGUF model, inspect it, and benchmark it.

mod common;
mod info;
mod run;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Info(a) => info::info(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
