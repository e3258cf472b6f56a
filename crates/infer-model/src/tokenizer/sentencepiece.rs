//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`): merging by score,
//! with byte fallback, as llama.cpp's `llm_tokenizer_spm`.
//!
//! 1. Each text fragment (special tokens are already cut out) has its
//!    spaces replaced by `▁` (U+2581), a `▁` put in front when
//!    `add_space_prefix` is set and the fragment starts the text or follows
//!    a special token, and is split into characters.
//! 2. **Merging.** Adjacent symbols whose concatenation is a vocabulary
//!    entry are merged, highest score first (the leftmost pair among equal
//!    scores), until no pair can be merged. A priority queue of candidate
//!    pairs keeps this at O(n log n) in the fragment length.
//! 3. **Byte fallback.** A symbol that is not in the vocabulary (a
//!    character the vocabulary lacks) becomes one `<0xXX>` token per UTF-8
//!    byte.
//!
//! Decoding maps `▁` back to a space and byte tokens back to their byte.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::ops::ControlFlow;

use super::vocab::{SpecialIds, Texts, TokenType, Vocab};
use crate::{memory, Error, Result};

/// The vocabulary and settings of a SentencePiece tokenizer: the content of
/// the `tokenizer.ggml.*` metadata, already read.
///
/// `None` fields take llama.cpp's defaults for this tokenizer: BOS 1, EOS 2,
/// unknown 0, no padding, EOT looked up by text, add BOS, no EOS, add a
/// space prefix.
#[derive(Clone, Debug, Default)]
pub struct SpmVocab {
    /// Token texts, indexed by id (`▁` stands for a space).
    pub tokens: Vec<String>,
    /// Merge scores (higher merges first); all 0 when absent.
    pub scores: Option<Vec<f32>>,
    /// GGUF token types (see [`TokenType::from_gguf`]); all normal when
    /// absent.
    pub token_types: Option<Vec<i32>>,
    /// Beginning-of-sequence token.
    pub bos_id: Option<u32>,
    /// End-of-sequence token.
    pub eos_id: Option<u32>,
    /// Unknown token.
    pub unk_id: Option<u32>,
    /// Padding token.
    pub pad_id: Option<u32>,
    /// End-of-turn token; when absent it is looked up by text
    /// (`<end_of_turn>`, `<|eot_id|>`, `<|im_end|>` ...).
    pub eot_id: Option<u32>,
    /// Whether encoding with `add_special` puts BOS first.
    pub add_bos: Option<bool>,
    /// Whether encoding with `add_special` puts EOS last.
    pub add_eos: Option<bool>,
    /// Whether a space is put in front of text that starts the input or
    /// follows a special token.
    pub add_space_prefix: Option<bool>,
}

/// The merge data of a SentencePiece tokenizer.
#[derive(Clone)]
pub(crate) struct SpmModel {
    pub scores: Vec<f32>,
    /// The token for each byte value in byte fallback.
    byte_tokens: [Option<u32>; 256],
    pub add_space_prefix: bool,
    /// Whether no token's text (but a user-defined token's, which merging
    /// never makes) has a `▁` right after another character
    /// ([`crosses_a_space`]): then no merge joins the text before a space to
    /// the space, and a fragment can be encoded in pieces cut before its
    /// spaces, each as the whole would encode it.
    cut_at_spaces: bool,
}

/// Whether `piece` has a `▁` right after a character other than `▁`
/// (`a▁b`, `a▁`): a token that, merged, would join a space to the text
/// before it.
fn crosses_a_space(piece: &str) -> bool {
    let mut prev_other = false;
    for c in piece.chars() {
        if c == '\u{2581}' && prev_other {
            return true;
        }
        prev_other = c != '\u{2581}';
    }
    false
}

/// Parses `<0xXX>` (either case of hex digit).
fn parse_byte_token(s: &str) -> Option<u8> {
    let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl SpmModel {
    /// Builds the vocabulary and the model; returns them with `add_bos` and
    /// `add_eos`.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] for the errors of [`Vocab::new`], when `scores`
    /// has a length other than the number of tokens or holds a NaN, or when a byte
    /// token's text is not of the form `<0xXX>`; out of memory
    /// ([`Error::Compute`]) when a table does not fit.
    pub fn build(mut v: SpmVocab) -> Result<(Vocab, SpmModel, bool, bool)> {
        let tokens = std::mem::take(&mut v.tokens);
        SpmModel::build_from(&tokens, v)
    }

    /// [`SpmModel::build`] with the token texts given apart (a GGUF
    /// file's string array, read in place); `v.tokens` is not read.
    ///
    /// # Errors
    /// As [`SpmModel::build`].
    pub(crate) fn build_from(tokens: &dyn Texts, v: SpmVocab) -> Result<(Vocab, SpmModel, bool, bool)> {
        let n = tokens.count();
        if let Some(s) = &v.scores {
            if s.len() != n && n > 0 {
                return Err(Error::Tokenizer(format!("{} scores for {n} tokens", s.len())));
            }
            // A NaN compares false with every score: the merge order, and so
            // the tokenization, would be arbitrary.
            if let Some(i) = s.iter().position(|x| x.is_nan()) {
                return Err(Error::Tokenizer(format!("the merge score of token {i} is NaN")));
            }
        }
        let given = SpecialIds { bos: v.bos_id, eos: v.eos_id, unk: v.unk_id, pad: v.pad_id, eot: v.eot_id };
        let defaults = SpecialIds { bos: Some(1), eos: Some(2), unk: Some(0), pad: None, eot: None };
        let vocab =
            Vocab::new(tokens, v.token_types.as_deref(), given, defaults, |id, ty, piece, out| {
                match ty {
                    TokenType::Normal => {
                        // `▁` (3 bytes) becomes a space.
                        for (k, part) in piece.split('\u{2581}').enumerate() {
                            if k > 0 {
                                out.push(b' ');
                            }
                            out.extend_from_slice(part.as_bytes());
                        }
                    }
                    TokenType::Byte => out.push(parse_byte_token(piece).ok_or_else(|| {
                        Error::Tokenizer(format!("byte token {id} has text {piece:?}, expected <0xXX>"))
                    })?),
                    TokenType::Control | TokenType::Unknown | TokenType::UserDefined => {
                        out.extend_from_slice(piece.as_bytes())
                    }
                    TokenType::Unused | TokenType::Undefined => {}
                }
                Ok(())
            })?;
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            *slot = vocab.id(&format!("<0x{b:02X}>")).or_else(|| {
                // A vocabulary without byte tokens may still hold the byte
                // itself as a one-character token (ASCII only).
                let c = [b as u8];
                std::str::from_utf8(&c).ok().and_then(|s| vocab.id(s))
            });
        }
        let model = SpmModel {
            scores: match v.scores {
                Some(scores) => scores,
                None => memory::vec_filled(n, 0.0, || format!("the merge scores ({n} tokens)"))?,
            },
            byte_tokens,
            add_space_prefix: v.add_space_prefix.unwrap_or(true),
            // A user-defined token is cut out of the text before merging
            // (always, `Vocab::partition`): no merge makes one.
            cut_at_spaces: !(0..vocab.len()).any(|i| {
                vocab.token_type(i as u32) != Some(TokenType::UserDefined) && crosses_a_space(vocab.piece_at(i))
            }),
        };
        Ok((vocab, model, v.add_bos.unwrap_or(true), v.add_eos.unwrap_or(false)))
    }
}

/// Scratch space for encoding one fragment, reused across fragments.
#[derive(Default)]
pub(crate) struct SpmSession {
    escaped: String,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Candidate>,
}

/// A run of the escaped fragment, `[start, start + len)`, in a doubly
/// linked list of the fragment's current symbols. `len == 0` marks a
/// symbol merged into its left neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;

/// A pair of adjacent symbols whose concatenation is a token.
#[derive(Clone, Copy)]
struct Candidate {
    score: f32,
    left: u32,
    right: u32,
    /// Byte length of the concatenation when the pair was queued; a pair
    /// whose symbols have changed since no longer adds up to it.
    len: u32,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    /// Higher score first; among equal scores the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

/// The fewest bytes of a piece of a fragment encoded at once when the
/// fragment may be cut ([`SpmSession::encode`]).
const PIECE_BYTES: usize = 4096;

impl SpmSession {
    /// Appends the tokens of `text` (a fragment without special tokens) to
    /// `out`, with a `▁` in front when `space_prefix` is set, stopping (with
    /// `Break`) once `out` has more than `max` tokens.
    ///
    /// When the vocabulary allows it (`cut_at_spaces`), a long fragment is
    /// encoded in pieces of about [`PIECE_BYTES`] cut before a space (or
    /// `▁`) that follows another character: no token spans such a cut, so
    /// every merge of the whole fragment happens inside one piece and the
    /// pieces' tokens are the whole's. The pieces after the one that passes
    /// `max` are not encoded. Otherwise the fragment is encoded whole.
    pub fn encode(
        &mut self,
        vocab: &Vocab,
        m: &SpmModel,
        text: &str,
        space_prefix: bool,
        max: usize,
        out: &mut Vec<u32>,
    ) -> ControlFlow<()> {
        let mut rest = text;
        let mut prefix = space_prefix;
        while !rest.is_empty() {
            let cut = if m.cut_at_spaces { next_cut(rest, PIECE_BYTES) } else { rest.len() };
            self.encode_piece(vocab, m, &rest[..cut], prefix, out);
            if out.len() > max {
                return ControlFlow::Break(());
            }
            rest = &rest[cut..];
            prefix = false;
        }
        ControlFlow::Continue(())
    }

    /// Encodes `text` whole (see [`SpmSession::encode`]).
    fn encode_piece(&mut self, vocab: &Vocab, m: &SpmModel, text: &str, space_prefix: bool, out: &mut Vec<u32>) {
        self.escaped.clear();
        if space_prefix {
            self.escaped.push('\u{2581}');
        }
        for c in text.chars() {
            self.escaped.push(if c == ' ' { '\u{2581}' } else { c });
        }
        self.symbols.clear();
        self.queue.clear();
        let n_chars = self.escaped.chars().count();
        for (i, (start, c)) in self.escaped.char_indices().enumerate() {
            self.symbols.push(Symbol {
                start: start as u32,
                len: c.len_utf8() as u32,
                prev: if i == 0 { NONE } else { i as u32 - 1 },
                next: if i + 1 == n_chars { NONE } else { i as u32 + 1 },
            });
        }
        if self.symbols.is_empty() {
            return;
        }
        for i in 1..self.symbols.len() {
            self.try_pair(vocab, m, i as u32 - 1, i as u32);
        }
        while let Some(c) = self.queue.pop() {
            let (l, r) = (self.symbols[c.left as usize], self.symbols[c.right as usize]);
            if l.len == 0 || r.len == 0 || l.len + r.len != c.len {
                continue;
            }
            let left = &mut self.symbols[c.left as usize];
            left.len += r.len;
            left.next = r.next;
            self.symbols[c.right as usize].len = 0;
            if r.next != NONE {
                self.symbols[r.next as usize].prev = c.left;
            }
            let (prev, next) = (l.prev, r.next);
            if prev != NONE {
                self.try_pair(vocab, m, prev, c.left);
            }
            if next != NONE {
                self.try_pair(vocab, m, c.left, next);
            }
        }
        let mut i = 0u32;
        while i != NONE {
            let s = self.symbols[i as usize];
            let piece = &self.escaped[s.start as usize..(s.start + s.len) as usize];
            match vocab.id(piece) {
                Some(id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        out.extend(m.byte_tokens[b as usize].or(vocab.unk));
                    }
                }
            }
            i = s.next;
        }
    }

    fn try_pair(&mut self, vocab: &Vocab, m: &SpmModel, left: u32, right: u32) {
        let l = self.symbols[left as usize];
        let r = self.symbols[right as usize];
        let piece = &self.escaped[l.start as usize..(l.start + l.len + r.len) as usize];
        if let Some(id) = vocab.id(piece) {
            self.queue.push(Candidate { score: m.scores[id as usize], left, right, len: l.len + r.len });
        }
    }
}

/// Where the first piece of `text` ends: at the first space or `▁` that
/// follows another character at or past byte `at_least`, or at the end.
fn next_cut(text: &str, at_least: usize) -> usize {
    let is_space = |c: char| c == ' ' || c == '\u{2581}';
    let mut prev_other = false;
    for (i, c) in text.char_indices() {
        if i >= at_least && prev_other && is_space(c) {
            return i;
        }
        prev_other = !is_space(c);
    }
    text.len()
}
