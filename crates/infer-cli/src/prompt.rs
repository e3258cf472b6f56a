//! Where `infer run` takes its prompt from, as llama.cpp's and Ollama's
//! users expect: words on the command line (joined by spaces), `-p/--prompt
//! TEXT`, `-f/--file FILE`, or standard input (`-` as the prompt or the
//! file, or no prompt at all while standard input is not a terminal).
//!
//! A prompt is read only as far as the context can hold it
//! ([`byte_limit`], [`infer_model::prompt`]): a longer file or standard
//! input is refused after that many bytes, before anything is tokenized, so
//! that its size costs neither memory nor time.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;

use crate::common::CliResult;

/// The prompt options of `infer run`.
#[derive(Args, Clone, Debug, Default)]
pub struct PromptArgs {
    /// The prompt text.
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", conflicts_with_all = ["file", "words"],
          allow_hyphen_values = true)]
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

pub use infer_model::prompt::{byte_limit, BYTES_PER_POSITION};

/// The error for a prompt of more than `limit` bytes: longer than the
/// context of `n_ctx` positions can hold.
pub fn too_long(n_ctx: usize, limit: usize) -> String {
    format!(
        "the prompt is longer than the context ({n_ctx} positions): it has more than {limit} bytes, {BYTES_PER_POSITION} \
         per position (raise --ctx-size or shorten the prompt)"
    )
}

/// Where the prompt comes from, known before anything is read.
#[derive(Clone, Debug)]
pub enum PromptSource {
    /// Given on the command line.
    Text(String),
    /// A file.
    File(PathBuf),
    /// Standard input.
    Stdin,
}

impl PromptArgs {
    /// Whether the prompt comes from `-p` or `-f`, whose text llama.cpp
    /// processes escapes in (`-e`).
    pub fn is_flag_text(&self) -> bool {
        self.prompt.is_some() || self.file.is_some()
    }

    /// Where the prompt comes from.
    ///
    /// # Errors
    /// No prompt given on a terminal.
    pub fn source(&self) -> CliResult<PromptSource> {
        if let Some(p) = &self.prompt {
            return Ok(PromptSource::Text(p.clone()));
        }
        if let Some(f) = &self.file {
            if f.as_os_str() == "-" {
                return Ok(PromptSource::Stdin);
            }
            return Ok(PromptSource::File(f.clone()));
        }
        match self.words.as_slice() {
            [one] if one == "-" => Ok(PromptSource::Stdin),
            [] if !std::io::stdin().is_terminal() => Ok(PromptSource::Stdin),
            [] => Err("no prompt: give it as words, with -p TEXT, with -f FILE, or on standard input".into()),
            words => Ok(PromptSource::Text(words.join(" "))),
        }
    }
}

impl PromptSource {
    /// The prompt text, read up to `limit` bytes ([`byte_limit`]); `n_ctx`
    /// is named in the error for a longer one.
    ///
    /// # Errors
    /// A prompt of more than `limit` bytes (the rest is not read); an
    /// unreadable file or standard input; text that is not UTF-8.
    pub fn read(self, limit: usize, n_ctx: usize) -> CliResult<String> {
        let (bytes, what) = match self {
            PromptSource::Text(t) => {
                if t.len() > limit {
                    return Err(too_long(n_ctx, limit).into());
                }
                return Ok(t);
            }
            PromptSource::File(f) => {
                let file =
                    std::fs::File::open(&f).map_err(|e| format!("cannot read the prompt file {}: {e}", f.display()))?;
                let bytes = infer_model::prompt::read_at_most(file, limit)
                    .map_err(|e| format!("cannot read the prompt file {}: {e}", f.display()))?;
                (bytes, format!("the prompt file {}", f.display()))
            }
            PromptSource::Stdin => {
                let bytes = infer_model::prompt::read_at_most(std::io::stdin().lock(), limit)
                    .map_err(|e| format!("cannot read the prompt from standard input: {e}"))?;
                (bytes, "the prompt on standard input".to_owned())
            }
        };
        let Some(bytes) = bytes else { return Err(too_long(n_ctx, limit).into()) };
        let text = String::from_utf8(bytes).map_err(|e| format!("{what} is not UTF-8 text: {e}"))?;
        Ok(drop_final_newline(text))
    }
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
    #[arg(short = 'r', long = "reverse-prompt", value_name = "TEXT", allow_hyphen_values = true)]
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
