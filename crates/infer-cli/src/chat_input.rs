//! The input of `infer chat`: a line editor on a terminal, plain line reads
//! otherwise.
//!
//! On a terminal (standard input and output both) lines are read with
//! rustyline: arrow keys move in the line, up and down walk the history of
//! this session, and Ctrl-C and Ctrl-D arrive as keys (the terminal is in
//! raw mode while a line is edited, so Ctrl-C is no signal there): Ctrl-C
//! on a line with text clears it, on an empty one it interrupts. A line
//! that is not UTF-8, or (on a terminal the editor cannot drive, such as
//! TERM=dumb) holds escape sequences, is refused and the session goes on.
//! From a
//! pipe or a file, lines are read as they are, at most [`ChatInput`]'s
//! byte limit each (a longer one is skipped unread to its end, as long as
//! it has an end within [`SKIP_LIMIT`]); a line with a NUL byte is not
//! text and is refused.
//!
//! Either way, a line that ends in a backslash continues on the next one
//! (llama.cpp's multi-line input): the backslash is dropped and the lines
//! are joined with a newline.

use std::io::{BufRead, IsTerminal, Write};

use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::{Behavior, Config, Editor};

use crate::output::Out;

/// The most bytes skipped to reach the end of a refused line: an input
/// without line ends (`infer chat < /dev/zero`, a binary file) is an error
/// then, instead of being read for ever.
pub const SKIP_LIMIT: u64 = 64 << 20;

/// The prompt of a new message.
pub const PROMPT: &str = "> ";
/// The prompt of a continuation line (after a line that ends in `\`).
pub const CONTINUATION: &str = "... ";

/// What one read gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// A message or a command: its lines, joined with newlines, without the
    /// continuation backslashes and the final newline.
    Text(String),
    /// Ctrl-C at an empty prompt (a terminal only; on a line with text it
    /// clears the line, and the line is read again).
    Interrupted,
    /// Ctrl-D on an empty line, or the end of the input.
    End,
    /// A message that cannot be sent, and why (longer than the limit, not
    /// UTF-8); the session goes on.
    Refused(String),
}

/// Where the lines come from.
enum Source {
    /// A terminal: rustyline, with this session's history.
    Editor(Box<Editor<LineWatch, DefaultHistory>>),
    /// A pipe or a file.
    Plain(std::io::StdinLock<'static>),
}

/// The input of a chat session ([`ChatInput::read`] gives one message at a
/// time).
pub struct ChatInput {
    source: Source,
    /// The most bytes of one message.
    limit: usize,
}

impl ChatInput {
    /// The line editor when standard input is a terminal (plain reads
    /// when it cannot be set up, with a warning), else plain reads of
    /// standard input; messages of more than `limit` bytes are refused.
    /// With standard output redirected (`infer chat | tee log`) the editor
    /// reads and writes the terminal itself (`/dev/tty`), as llama.cpp's
    /// console does, and the replies go to standard output.
    pub fn new(limit: usize) -> ChatInput {
        let plain = || Source::Plain(std::io::stdin().lock());
        let source = if std::io::stdin().is_terminal() {
            let behavior = if std::io::stdout().is_terminal() { Behavior::Stdio } else { Behavior::PreferTerm };
            match Editor::with_config(Config::builder().behavior(behavior).build()) {
                Ok(mut editor) => {
                    editor.set_helper(Some(LineWatch::default()));
                    Source::Editor(Box::new(editor))
                }
                Err(e) => {
                    eprintln!("warning: no line editor ({e}); reading plain lines");
                    plain()
                }
            }
        } else {
            plain()
        };
        ChatInput { source, limit }
    }

    /// Whether lines come from the line editor (a terminal).
    pub fn is_terminal(&self) -> bool {
        matches!(self.source, Source::Editor(_))
    }

    /// Reads one message, with its continuation lines. Plain reads write
    /// the prompts to `out`; the editor writes its own.
    ///
    /// # Errors
    /// A failed read of standard input (`reading the input: ...`) or write
    /// of the prompt (naming standard output).
    pub fn read(&mut self, out: &mut Out) -> std::io::Result<Input> {
        let mut text = String::new();
        let mut prompt = PROMPT;
        loop {
            out.flush()?;
            let line = match self.read_line(prompt, out)? {
                Line::Text(line) => line,
                Line::Interrupted => return Ok(Input::Interrupted),
                // The end of the input in the middle of a message sends
                // what there is.
                Line::End if !text.is_empty() => return Ok(self.finish(text)),
                Line::End => return Ok(Input::End),
                Line::Refused(why) => return Ok(Input::Refused(why)),
            };
            if text.len() + line.len() > self.limit {
                if let Source::Plain(input) = &mut self.source {
                    // The rest of the message is not read.
                    skip_continuations(input, &line).map_err(reading)?;
                }
                return Ok(Input::Refused(self.too_long()));
            }
            match line.strip_suffix('\\') {
                Some(head) => {
                    text.push_str(head);
                    text.push('\n');
                    prompt = CONTINUATION;
                }
                None => {
                    text.push_str(&line);
                    return Ok(self.finish(text));
                }
            }
        }
    }

    /// Asks `question` on the terminal: `Some(true)` for an answer of `y`
    /// or `yes` (any case), `Some(false)` for anything else (Ctrl-C and
    /// Ctrl-D included); `None` without a terminal to ask on (the input is
    /// a pipe or a file, whose next line is a message, not an answer).
    pub fn confirm(&mut self, question: &str) -> Option<bool> {
        let Source::Editor(editor) = &mut self.source else { return None };
        let answer = editor.readline(question).unwrap_or_default();
        Some(matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
    }

    /// A whole message: kept in the editor's history.
    fn finish(&mut self, text: String) -> Input {
        if let Source::Editor(editor) = &mut self.source {
            if !text.trim().is_empty() {
                // A history entry that cannot be added only loses recall.
                let _ = editor.add_history_entry(text.as_str());
            }
        }
        Input::Text(text)
    }

    fn too_long(&self) -> String {
        format!("that message has more than {} bytes, more than the context can hold", self.limit)
    }

    /// One line, without its newline.
    fn read_line(&mut self, prompt: &str, out: &mut Out) -> std::io::Result<Line> {
        let limit = self.limit;
        match &mut self.source {
            Source::Editor(editor) => match read_edited(editor, prompt) {
                // A terminal the editor cannot drive (TERM=dumb) hands the
                // keys' escape sequences over as text: not sent to the model.
                Ok(line) if line.contains('\x1b') => Ok(Line::Refused(
                    "that line has terminal escape sequences (arrow keys do not edit lines on this terminal, TERM \
                     is dumb or unsupported)"
                        .into(),
                )),
                Ok(line) => Ok(Line::Text(line)),
                Err(ReadlineError::Interrupted) => Ok(Line::Interrupted),
                Err(ReadlineError::Eof) => Ok(Line::End),
                // Bytes that are not UTF-8: that line is refused, as from a pipe.
                Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                    Ok(Line::Refused("that line is not valid UTF-8".into()))
                }
                Err(ReadlineError::Io(e)) => Err(reading(e)),
                Err(e) => Err(reading(std::io::Error::other(e))),
            },
            Source::Plain(input) => {
                write!(out, "{prompt}")?;
                out.flush()?;
                match read_line_at_most(input, limit).map_err(reading)? {
                    PlainLine::End => Ok(Line::End),
                    PlainLine::TooLong => Ok(Line::Refused(format!(
                        "that line has more than {limit} bytes, more than the context can hold"
                    ))),
                    PlainLine::Binary => Ok(Line::Refused("that line has a NUL byte: it is not text".into())),
                    PlainLine::Text(bytes) => match String::from_utf8(bytes) {
                        Ok(s) => Ok(Line::Text(s)),
                        Err(_) => Ok(Line::Refused("that line is not valid UTF-8".into())),
                    },
                }
            }
        }
    }
}

/// Whether the line being edited has text (rustyline tells its helper's
/// hinter of each edit): Ctrl-C on such a line clears it, as a shell does.
#[derive(Default)]
struct LineWatch {
    typed: std::cell::Cell<bool>,
}

impl rustyline::hint::Hinter for LineWatch {
    type Hint = String;
    fn hint(&self, line: &str, _: usize, _: &rustyline::Context<'_>) -> Option<String> {
        self.typed.set(!line.is_empty());
        None
    }
}
impl rustyline::completion::Completer for LineWatch {
    type Candidate = String;
}
impl rustyline::highlight::Highlighter for LineWatch {}
impl rustyline::validate::Validator for LineWatch {}
impl rustyline::Helper for LineWatch {}

/// One line from the editor; Ctrl-C on a line with text throws the text
/// away and reads the line again (only Ctrl-C on an empty line is
/// [`ReadlineError::Interrupted`]).
fn read_edited(editor: &mut Editor<LineWatch, DefaultHistory>, prompt: &str) -> rustyline::Result<String> {
    loop {
        if let Some(h) = editor.helper() {
            h.typed.set(false);
        }
        match editor.readline(prompt) {
            Err(ReadlineError::Interrupted) if editor.helper().is_some_and(|h| h.typed.get()) => continue,
            other => return other,
        }
    }
}

/// A failed read of the input, kind kept, saying so (a failed write of the
/// prompt already names standard output).
fn reading(e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("reading the input: {e}"))
}

/// One line as [`ChatInput::read_line`] gives it.
enum Line {
    Text(String),
    Interrupted,
    End,
    Refused(String),
}

/// Skips the continuation lines of a refused message whose last line read
/// was `line`: up to a line that does not end in a backslash.
fn skip_continuations(input: &mut impl BufRead, line: &str) -> std::io::Result<()> {
    let mut continued = line.ends_with('\\');
    while continued {
        let mut bytes = Vec::new();
        let n = std::io::Read::take(&mut *input, SKIP_LIMIT).read_until(b'\n', &mut bytes)?;
        if n == 0 {
            break;
        }
        if n as u64 == SKIP_LIMIT && !bytes.ends_with(b"\n") {
            return Err(no_end());
        }
        let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        continued = body.strip_suffix(b"\r").unwrap_or(body).ends_with(b"\\");
    }
    Ok(())
}

/// A line of input, as [`read_line_at_most`] reads it.
enum PlainLine {
    /// The line's bytes, without its newline (`\n` or `\r\n`).
    Text(Vec<u8>),
    /// A line of more than the limit, skipped up to its newline.
    TooLong,
    /// A line with a NUL byte (binary data), skipped up to its newline.
    Binary,
    /// The end of the input.
    End,
}

/// Reads one line of at most `limit` bytes (without its newline); a longer
/// one, or one with a NUL byte, is read no further than that and skipped
/// to its end, in chunks.
///
/// # Errors
/// A failed read; a line still without an end after [`SKIP_LIMIT`] bytes.
fn read_line_at_most(input: &mut impl BufRead, limit: usize) -> std::io::Result<PlainLine> {
    let mut bytes = Vec::new();
    let n = std::io::Read::take(&mut *input, limit.saturating_add(2) as u64).read_until(b'\n', &mut bytes)?;
    if n == 0 {
        return Ok(PlainLine::End);
    }
    let ended = bytes.ends_with(b"\n");
    let body = bytes.strip_suffix(b"\n").map_or(bytes.len(), |b| b.strip_suffix(b"\r").unwrap_or(b).len());
    let refused = if bytes.contains(&0) {
        PlainLine::Binary
    } else if body > limit {
        PlainLine::TooLong
    } else {
        bytes.truncate(body);
        return Ok(PlainLine::Text(bytes));
    };
    if !ended {
        skip_line(input)?;
    }
    Ok(refused)
}

/// Skips the rest of a line, up to and with its newline (or the end of the
/// input), at most [`SKIP_LIMIT`] bytes.
///
/// # Errors
/// A failed read; no newline within [`SKIP_LIMIT`] bytes.
fn skip_line(input: &mut impl BufRead) -> std::io::Result<()> {
    let mut skipped = 0u64;
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            input.consume(pos + 1);
            return Ok(());
        }
        let len = buf.len();
        input.consume(len);
        skipped += len as u64;
        if skipped > SKIP_LIMIT {
            return Err(no_end());
        }
    }
}

/// The error of a line still without an end after [`SKIP_LIMIT`] bytes.
fn no_end() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("a line of more than {} MiB without an end (not text?)", SKIP_LIMIT >> 20),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &str, limit: usize) -> Vec<String> {
        let mut r = std::io::Cursor::new(input.as_bytes().to_vec());
        let mut got = Vec::new();
        loop {
            match read_line_at_most(&mut r, limit).unwrap() {
                PlainLine::End => return got,
                PlainLine::TooLong => got.push("<too long>".into()),
                PlainLine::Binary => got.push("<binary>".into()),
                PlainLine::Text(b) => got.push(String::from_utf8(b).unwrap()),
            }
        }
    }

    #[test]
    fn plain_lines_lose_their_newline_and_long_ones_are_skipped() {
        assert_eq!(lines("ab\r\ncd\n\nlast", 4), ["ab", "cd", "", "last"]);
        assert_eq!(lines("abcdefgh\nok\n", 4), ["<too long>", "ok"]);
        assert_eq!(lines("abcd\n", 4), ["abcd"]);
        assert_eq!(lines("a\0b\nok\n\0\0\0\0\0\0\0\0\nend", 4), ["<binary>", "ok", "<binary>", "end"]);
    }

    #[test]
    fn a_line_without_an_end_is_an_error_not_an_endless_read() {
        let mut zeros = std::io::BufReader::new(std::io::Read::take(std::io::repeat(0), SKIP_LIMIT * 2));
        let e = read_line_at_most(&mut zeros, 16).err().expect("an error");
        assert!(e.to_string().contains("without an end"), "{e}");
        let mut r = std::io::Cursor::new(b"xxxxxxxx no end".to_vec());
        assert!(matches!(read_line_at_most(&mut r, 4).unwrap(), PlainLine::TooLong));
    }

    #[test]
    fn a_refused_message_skips_its_continuation_lines() {
        let mut r = std::io::Cursor::new(b"two\\\nthree\nnext\n".to_vec());
        skip_continuations(&mut r, "one\\").unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut r, &mut rest).unwrap();
        assert_eq!(rest, "next\n");
    }
}
