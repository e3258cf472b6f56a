//! Where `infer run` takes its prompt from, as llama.cpp's and Ollama's
//! users expect: words on the command line (joined by spaces), `-p/--prompt
//! TEXT`, `-f/--file FILE`, or standard input (`-` as the prompt or the
//! file, or no prompt at all while standard input is not a terminal).

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use clap::Args;

use crate::common::CliResult;

/// The prompt options of `infer run`.
#[derive(Args, Clone, Debug, Default)]
pub struct PromptArgs {
    /// The prompt text.
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", conflicts_with_all = ["file", "words"])]
    pub prompt: Option<String>,
    /// Read the prompt from FILE (`-`: standard input); one final newline is
    /// dropped.
    #[arg(short = 'f', long = "file", value_name = "FILE", conflicts_with = "words")]
    pub file: Option<PathBuf>,
    /// The prompt, as one or several words (joined by spaces); `-` reads
    /// standard input. Without any prompt, standard input is read when it is
    /// not a terminal.
    #[arg(value_name = "PROMPT")]
    pub words: Vec<String>,
}

impl PromptArgs {
    /// Whether the prompt comes from `-p` or `-f`, whose text llama.cpp
    /// processes escapes in (`-e`).
    pub fn is_flag_text(&self) -> bool {
        self.prompt.is_some() || self.file.is_some()
    }

    /// The prompt text.
    ///
    /// # Errors
    /// No prompt given on a terminal; an unreadable file or standard input;
    /// text that is not UTF-8.
    pub fn text(&self) -> CliResult<String> {
        if let Some(p) = &self.prompt {
            return Ok(p.clone());
        }
        if let Some(f) = &self.file {
            if f.as_os_str() == "-" {
                return read_stdin();
            }
            let bytes = std::fs::read(f).map_err(|e| format!("cannot read the prompt file {}: {e}", f.display()))?;
            let text = String::from_utf8(bytes)
                .map_err(|e| format!("the prompt file {} is not UTF-8 text: {e}", f.display()))?;
            return Ok(drop_final_newline(text));
        }
        match self.words.as_slice() {
            [one] if one == "-" => read_stdin(),
            [] if !std::io::stdin().is_terminal() => read_stdin(),
            [] => Err("no prompt: give it as words, with -p TEXT, with -f FILE, or on standard input".into()),
            words => Ok(words.join(" ")),
        }
    }
}

fn read_stdin() -> CliResult<String> {
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes).map_err(|e| format!("cannot read the prompt from standard input: {e}"))?;
    let text = String::from_utf8(bytes).map_err(|e| format!("the prompt on standard input is not UTF-8 text: {e}"))?;
    Ok(drop_final_newline(text))
}

/// `echo hello | infer run` gives `hello`, not `hello\n`.
fn drop_final_newline(mut s: String) -> String {
    if s.ends_with('\n') {
        s.pop();
        if s.ends_with('\r') {
            s.pop();
        }
    }
    s
}

/// llama.cpp's stop strings and escape processing, shared by `run` and
/// `chat`.
#[derive(Args, Clone, Debug, Default)]
pub struct TextArgs {
    /// Stop when the model writes TEXT (llama.cpp's reverse prompt, a stop string; repeatable): the text before it
    /// is printed, the stop string is not.
    #[arg(short = 'r', long = "reverse-prompt", value_name = "TEXT")]
    pub reverse_prompt: Vec<String>,
    /// Process escapes (\n, \r, \t, \', \", \\, \xHH) in -p, -f, -r and chat input, as llama.cpp [default: on].
    #[arg(short = 'e', long = "escape", overrides_with = "no_escape")]
    pub escape: bool,
    /// Take -p, -f, -r and chat input as written (no escape processing).
    #[arg(long = "no-escape", overrides_with = "escape")]
    pub no_escape: bool,
}

impl TextArgs {
    /// Whether escapes are processed (`-e`, the default, unless `--no-escape`).
    pub fn escapes(&self) -> bool {
        !self.no_escape
    }

    /// `text` with its escapes processed when they are on; `what` names it
    /// in errors.
    ///
    /// # Errors
    /// `\xHH` escapes that do not form UTF-8.
    pub fn process(&self, text: String, what: &str) -> CliResult<String> {
        if self.escapes() {
            Ok(crate::llama_args::process_escapes(&text, what)?)
        } else {
            Ok(text)
        }
    }

    /// The stop strings of `-r`, escapes processed.
    ///
    /// # Errors
    /// An empty stop string; bad escapes.
    pub fn stop_strings(&self) -> CliResult<Vec<String>> {
        self.reverse_prompt
            .iter()
            .map(|r| {
                let s = self.process(r.clone(), "-r")?;
                if s.is_empty() {
                    return Err("-r: a stop string cannot be empty".into());
                }
                Ok(s)
            })
            .collect()
    }
}
