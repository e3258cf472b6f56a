//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`), the tokenizer of
//! GPT-2 and of most recent model families (Llama 3, Qwen 2, SmolLM,
//! DeepSeek), as llama.cpp's `llm_tokenizer_bpe`.
//!
//! 1. The pre-tokenizer ([`super::pretokenize`]) cuts each text fragment
//!    (special tokens are already cut out) into words.
//! 2. **Byte-level mapping.** Every byte of a word becomes one character of
//!    GPT-2's `bytes_to_unicode` table: printable Latin-1 bytes stand for
//!    themselves, the 68 others (controls, space, soft hyphen ...) for
//!    U+0100 onwards in byte order, so a space is `Ġ` and a newline `Ċ`.
//!    Vocabulary texts and merges are written in these characters.
//! 3. **Merging by rank.** Starting from one symbol per byte, the adjacent
//!    pair whose merge comes first in `tokenizer.ggml.merges` ("left right",
//!    rank = position in the list) is merged, the leftmost among equal
//!    ranks, until no adjacent pair has a merge. A priority queue keeps
//!    this at O(n log n) in the word length. With Llama 3's pre-tokenizer a
//!    word that is itself a token is taken whole (`ignore_merges`).
//!
//! Decoding maps each character of a normal token back to its byte.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::ops::ControlFlow;

use super::pretokenize::{PreTokenizer, Splitter};
use super::vocab::{SpecialIds, Texts, TokenType, Vocab};
use crate::{memory, Error, Result};

/// The vocabulary and settings of a byte-level BPE tokenizer: the content
/// of the `tokenizer.ggml.*` metadata, already read.
///
/// Special ids have no defaults (an absent one means no such token; EOT is
/// then looked up by text); `add_bos` defaults to llama.cpp's choice for
/// the pre-tokenizer's family (true for Llama 3 and DeepSeek LLM), `add_eos`
/// to false.
#[derive(Clone, Debug, Default)]
pub struct BpeVocab {
    /// Token texts in byte-level characters, indexed by id (`Ġ` stands for
    /// a space).
    pub tokens: Vec<String>,
    /// Merges, `"left right"`, in rank order (first merges first).
    pub merges: Vec<String>,
    /// GGUF token types (see [`TokenType::from_gguf`]); all normal when
    /// absent.
    pub token_types: Option<Vec<i32>>,
    /// The pre-tokenizer's `tokenizer.ggml.pre` name (see
    /// [`PreTokenizer::from_name`]).
    pub pre: String,
    /// Beginning-of-sequence token.
    pub bos_id: Option<u32>,
    /// End-of-sequence token.
    pub eos_id: Option<u32>,
    /// Unknown token.
    pub unk_id: Option<u32>,
    /// Padding token.
    pub pad_id: Option<u32>,
    /// End-of-turn token; when absent it is looked up by text.
    pub eot_id: Option<u32>,
    /// Whether encoding with `add_special` puts BOS first.
    pub add_bos: Option<bool>,
    /// Whether encoding with `add_special` puts EOS last.
    pub add_eos: Option<bool>,
}

/// GPT-2's `bytes_to_unicode`: the character that stands for each byte.
pub(crate) fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b as u8, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        // Every code is below 256 + 68, so always a valid character.
        *slot = char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
    }
    table
}

/// The inverse of [`byte_chars`]: the byte of a character, `None` for
/// characters outside the table.
fn char_byte(c: char) -> Option<u8> {
    let code = c as u32;
    match code {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(code as u8),
        0x100..=0x143 => {
            // The n-th non-printable byte, in byte order.
            let n = code - 0x100;
            (0u16..256)
                .filter(|&b| !matches!(b as u8, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF))
                .nth(n as usize)
                .map(|b| b as u8)
        }
        _ => None,
    }
}

/// The merge data of a byte-level BPE tokenizer.
#[derive(Clone)]
pub(crate) struct BpeModel {
    pub pre: PreTokenizer,
    splitter: Splitter,
    /// The character of each byte.
    byte_char: [char; 256],
    /// The token of each byte's character, when the vocabulary has it.
    byte_token: [Option<u32>; 256],
    /// `(left id << 32) | right id` to `(rank, merged id)`.
    merges: HashMap<u64, (u32, u32)>,
}

fn pair_key(left: u32, right: u32) -> u64 {
    ((left as u64) << 32) | right as u64
}

impl BpeModel {
    /// Builds the vocabulary and the model; returns them with `add_bos` and
    /// `add_eos`.
    ///
    /// A merge whose two sides or whose result are not tokens can never
    /// produce a token and is skipped, as is a repeated merge (the first
    /// rank counts).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] for an unknown pre-tokenizer, for the errors of
    /// [`Vocab::new`], when the merges list is empty, and for a merge that
    /// is not two texts separated by a space; out of memory
    /// ([`Error::Compute`]) when a table does not fit.
    pub fn build(mut v: BpeVocab) -> Result<(Vocab, BpeModel, bool, bool)> {
        let tokens = std::mem::take(&mut v.tokens);
        let merges = std::mem::take(&mut v.merges);
        let pre = std::mem::take(&mut v.pre);
        BpeModel::build_from(&tokens, &merges, &pre, v)
    }

    /// [`BpeModel::build`] with the token texts, merges and pre-tokenizer
    /// name given apart (a GGUF file's metadata, read in place);
    /// `v.tokens`, `v.merges` and `v.pre` are not read.
    ///
    /// # Errors
    /// As [`BpeModel::build`].
    pub(crate) fn build_from(
        tokens: &dyn Texts,
        merge_list: &dyn Texts,
        pre: &str,
        v: BpeVocab,
    ) -> Result<(Vocab, BpeModel, bool, bool)> {
        let pre = PreTokenizer::from_name(pre)?;
        let given = SpecialIds { bos: v.bos_id, eos: v.eos_id, unk: v.unk_id, pad: v.pad_id, eot: v.eot_id };
        let vocab = Vocab::new(tokens, v.token_types.as_deref(), given, SpecialIds::default(), |_, ty, piece, out| {
            match ty {
                TokenType::Normal | TokenType::Byte => {
                    for c in piece.chars() {
                        match char_byte(c) {
                            Some(b) => out.push(b),
                            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                }
                TokenType::Control | TokenType::Unknown | TokenType::UserDefined => {
                    out.extend_from_slice(piece.as_bytes())
                }
                TokenType::Unused | TokenType::Undefined => {}
            }
            Ok(())
        })?;
        let n_merges = merge_list.count();
        if n_merges == 0 {
            return Err(Error::Tokenizer("byte-level BPE without merges (tokenizer.ggml.merges)".into()));
        }
        let mut merges = HashMap::new();
        merges.try_reserve(n_merges).map_err(|_| {
            let bytes = n_merges as u64 * std::mem::size_of::<(u64, (u32, u32))>() as u64;
            memory::out_of_memory(format!("the merges table ({n_merges} merges)"), bytes)
        })?;
        // The two sides of a merge joined, reused across merges.
        let mut joined = String::new();
        for rank in 0..n_merges {
            let m = merge_list.text(rank);
            // The first space after the first character (a merge's left side
            // is never empty).
            let skip = m.chars().next().map_or(0, char::len_utf8);
            let split = m[skip..].find(' ').map(|p| p + skip);
            let Some(at) = split else {
                return Err(Error::Tokenizer(format!("merge {rank} {m:?} is not two texts separated by a space")));
            };
            let (left, right) = (&m[..at], &m[at + 1..]);
            joined.clear();
            joined.try_reserve(m.len()).map_err(|_| memory::out_of_memory(format!("merge {rank}"), m.len() as u64))?;
            joined.push_str(left);
            joined.push_str(right);
            let (Some(l), Some(r), Some(merged)) = (vocab.id(left), vocab.id(right), vocab.id(&joined)) else {
                continue;
            };
            merges.entry(pair_key(l, r)).or_insert((rank as u32, merged));
        }
        let byte_char = byte_chars();
        let mut byte_token = [None; 256];
        for (b, slot) in byte_token.iter_mut().enumerate() {
            *slot = vocab.id(byte_char[b].encode_utf8(&mut [0; 4]));
        }
        let model = BpeModel { pre, splitter: Splitter::new(pre)?, byte_char, byte_token, merges };
        let add_bos = v.add_bos.unwrap_or(pre.default_add_bos());
        Ok((vocab, model, add_bos, v.add_eos.unwrap_or(false)))
    }
}

/// Scratch space for encoding, reused across words and fragments.
#[derive(Default)]
pub(crate) struct BpeSession {
    mapped: String,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Candidate>,
}

/// One symbol of a word being merged, in a doubly linked list; `id ==
/// DEAD` marks a symbol merged into its left neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;
const DEAD: u32 = u32::MAX;

/// An adjacent pair with a merge, as it was when queued.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Candidate {
    rank: u32,
    left: u32,
    right: u32,
    left_id: u32,
    right_id: u32,
    merged: u32,
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    /// The max-heap pops the lowest rank first, the leftmost among equal
    /// ranks.
    fn cmp(&self, other: &Self) -> Ordering {
        other.rank.cmp(&self.rank).then_with(|| other.left.cmp(&self.left))
    }
}

impl BpeSession {
    /// Appends the tokens of `text` (a fragment without special tokens) to
    /// `out`, word by word, stopping (with `Break`) after the first word
    /// that takes `out` past `max` tokens: the rest of `text` is neither
    /// split nor merged.
    ///
    /// A byte whose character is not a token (SmolLM2's vocabulary lacks a
    /// few control and non-UTF-8 bytes) is left out, as llama.cpp and
    /// Hugging Face `tokenizers` do: the model has no way to see it.
    pub fn encode(
        &mut self,
        vocab: &Vocab,
        m: &BpeModel,
        text: &str,
        max: usize,
        out: &mut Vec<u32>,
    ) -> ControlFlow<()> {
        m.splitter.each_word(text, &mut |word| {
            self.encode_word(vocab, m, word, out);
            if out.len() > max {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
    }

    fn encode_word(&mut self, vocab: &Vocab, m: &BpeModel, word: &str, out: &mut Vec<u32>) {
        if m.pre.ignore_merges() {
            self.mapped.clear();
            self.mapped.extend(word.bytes().map(|b| m.byte_char[b as usize]));
            if let Some(id) = vocab.id(&self.mapped) {
                out.push(id);
                return;
            }
        }
        self.symbols.clear();
        self.queue.clear();
        for b in word.bytes() {
            match m.byte_token[b as usize] {
                Some(id) => {
                    let i = self.symbols.len() as u32;
                    self.symbols.push(Symbol { id, prev: i.wrapping_sub(1), next: i + 1 });
                }
                None => {
                    // A byte without a token ends the run of mergeable
                    // symbols and is left out.
                    self.merge_run(m, out);
                }
            }
        }
        self.merge_run(m, out);
    }

    /// Merges the symbols collected so far and appends their ids.
    fn merge_run(&mut self, m: &BpeModel, out: &mut Vec<u32>) {
        let n = self.symbols.len();
        if n == 0 {
            return;
        }
        self.symbols[0].prev = NONE;
        self.symbols[n - 1].next = NONE;
        for i in 1..n as u32 {
            self.try_pair(m, i - 1, i);
        }
        while let Some(c) = self.queue.pop() {
            let (l, r) = (self.symbols[c.left as usize], self.symbols[c.right as usize]);
            if l.id != c.left_id || r.id != c.right_id || l.next != c.right {
                continue;
            }
            self.symbols[c.left as usize].id = c.merged;
            self.symbols[c.left as usize].next = r.next;
            self.symbols[c.right as usize].id = DEAD;
            if r.next != NONE {
                self.symbols[r.next as usize].prev = c.left;
            }
            if l.prev != NONE {
                self.try_pair(m, l.prev, c.left);
            }
            if r.next != NONE {
                self.try_pair(m, c.left, r.next);
            }
        }
        let mut i = 0u32;
        while i != NONE {
            let s = self.symbols[i as usize];
            out.push(s.id);
            i = s.next;
        }
        self.symbols.clear();
        self.queue.clear();
    }

    fn try_pair(&mut self, m: &BpeModel, left: u32, right: u32) {
        let (left_id, right_id) = (self.symbols[left as usize].id, self.symbols[right as usize].id);
        if let Some(&(rank, merged)) = m.merges.get(&pair_key(left_id, right_id)) {
            self.queue.push(Candidate { rank, left, right, left_id, right_id, merged });
        }
    }
}
