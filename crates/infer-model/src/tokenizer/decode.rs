//! Streaming detokenization: tokens in, whole UTF-8 characters out.

use super::vocab::TokenType;
use super::Tokenizer;

/// Turns tokens into text incrementally, emitting whole characters only.
///
/// A character whose bytes are spread over several tokens (byte-fallback
/// tokens of SentencePiece, or byte-level BPE tokens that end inside a
/// character) is held back until its last byte arrives; a byte sequence
/// that can no longer become valid UTF-8 is emitted as U+FFFD. The
/// concatenation of everything [`Decoder::push`] and [`Decoder::finish`]
/// return equals [`Tokenizer::decode_with`] of the same ids.
#[derive(Clone, Debug)]
pub struct Decoder<'a> {
    tok: &'a Tokenizer,
    pending: Vec<u8>,
    skip_special: bool,
    /// Whether the previous token was a pre-tokenized one (or there was
    /// none): with `add_space_prefix` the encoder put a space before the
    /// text that follows, which decoding removes again.
    prev_special: bool,
}

impl<'a> Decoder<'a> {
    /// A decoder for `tok`, leaving out control and unknown tokens when
    /// `skip_special` is set.
    pub(crate) fn new(tok: &'a Tokenizer, skip_special: bool) -> Decoder<'a> {
        Decoder { tok, pending: Vec::new(), skip_special, prev_special: true }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    /// An id outside the vocabulary gives U+FFFD.
    pub fn push(&mut self, id: u32) -> String {
        let (Some(bytes), Some(ty)) = (self.tok.token_bytes(id), self.tok.token_type(id)) else {
            let mut s = self.flush_lossy();
            s.push(char::REPLACEMENT_CHARACTER);
            self.prev_special = false;
            return s;
        };
        if ty.is_pretokenized() {
            self.prev_special = true;
            if self.skip_special && ty.is_special() {
                return String::new();
            }
            self.pending.extend_from_slice(bytes);
        } else {
            let strip = self.tok.add_space_prefix() && self.prev_special && ty == TokenType::Normal;
            let bytes = if strip { bytes.strip_prefix(b" ").unwrap_or(bytes) } else { bytes };
            self.pending.extend_from_slice(bytes);
            self.prev_special = false;
        }
        self.take_complete()
    }

    /// Returns what is still held back (an unfinished character becomes
    /// U+FFFD) and resets the decoder.
    pub fn finish(&mut self) -> String {
        self.prev_special = true;
        self.flush_lossy()
    }

    /// Whether bytes of an unfinished character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn flush_lossy(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Moves every complete character (and every invalid byte sequence, as
    /// U+FFFD) out of `pending`, keeping an incomplete tail.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is valid UTF-8 by construction.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let total = self.pending.len();
        self.pending.drain(..total - keep);
        out
    }
}
