//! The tokenizer of GGUF models whose `tokenizer.ggml.model` is `"llama"`:
//! SentencePiece BPE, merging by score, with byte fallback.
//!
//! It reproduces llama.cpp's SPM tokenizer token for token:
//!
//! 1. **Special tokens first.** Control, user-defined and unknown tokens
//!    (`<start_of_turn>`, `"\n"`, runs of spaces, `<b>` ...) are cut out of
//!    the text before anything else, longest token first; each cut leaves
//!    its token as a fragment of its own. User-defined tokens are always cut;
//!    control and unknown tokens only when special tokens are parsed
//!    ([`Tokenizer::encode`] parses them, [`Tokenizer::encode_with`] lets
//!    the caller choose).
//! 2. **Each text fragment** has its spaces replaced by `▁` (U+2581), a `▁`
//!    put in front when `add_space_prefix` is set and the fragment starts the
//!    text or follows a special token, and is split into characters.
//! 3. **Merging.** Adjacent symbols whose concatenation is a vocabulary entry
//!    are merged, highest score first (the leftmost pair among equal
//!    scores), until no pair can be merged. A priority queue of candidate
//!    pairs keeps this at O(n log n) in the fragment length.
//! 4. **Byte fallback.** A symbol that is not in the vocabulary (a character
//!    the vocabulary lacks) becomes one `<0xXX>` token per UTF-8 byte.
//!
//! Decoding maps `▁` back to a space and byte tokens back to their byte;
//! [`Decoder`] streams text token by token and holds back the bytes of a
//! character that byte tokens have not completed yet.
//!
//! The metadata read (all under `tokenizer.ggml.`): `model`, `tokens`,
//! `scores` and `token_type` (optional; when present their lengths must
//! equal the number of tokens), `bos_token_id`, `eos_token_id`,
//! `unknown_token_id`, `padding_token_id`, `eot_token_id`, `add_bos_token`,
//! `add_eos_token`, `add_space_prefix`. Missing keys take llama.cpp's
//! defaults for this tokenizer: BOS 1, EOS 2, unknown 0, add BOS, no EOS,
//! add a space prefix. (Gemma 3's files set `add_space_prefix = false`, so
//! `"Hello"` encodes as `Hello`, not `▁Hello`.)

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// What kind of vocabulary entry a token is (GGUF's
/// `tokenizer.ggml.token_type` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0, or any value outside 0..=6. Never produced by merging on its own
    /// and decoded as nothing.
    Undefined,
    /// 1: ordinary text.
    Normal,
    /// 2: the unknown token (`<unk>`).
    Unknown,
    /// 3: a control token (`<bos>`, `<start_of_turn>`).
    Control,
    /// 4: a token matched verbatim before merging (`"\n"`, `"  "`, `<b>`).
    UserDefined,
    /// 5: an unused slot; decoded as nothing.
    Unused,
    /// 6: a byte-fallback token `<0xXX>`.
    Byte,
}

impl TokenType {
    /// The type for a GGUF `token_type` value; unknown values map to
    /// [`TokenType::Undefined`].
    pub fn from_gguf(value: i32) -> TokenType {
        match value {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// Whether tokens of this type are cut out of the text before merging.
    fn is_pretokenized(self) -> bool {
        matches!(self, TokenType::Control | TokenType::UserDefined | TokenType::Unknown)
    }

    /// Whether tokens of this type are "special": only cut out of the text
    /// when special tokens are parsed, and left out of decoded text on
    /// request.
    fn is_special(self) -> bool {
        matches!(self, TokenType::Control | TokenType::Unknown)
    }
}

/// The vocabulary and settings a [`Tokenizer`] is built from: the content
/// of the `tokenizer.ggml.*` metadata, already read.
///
/// `None` fields take the defaults described in the [module
/// documentation](self).
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

/// Texts of tokens that end a turn or the generation in some model
/// families; the tokens found among them join EOS in [`Tokenizer::is_eog`].
const EOG_TEXTS: &[&str] = &[
    "<end_of_turn>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<EOT>",
    "<end_of_utterance>",
];

/// A SentencePiece (BPE-by-score) tokenizer read from GGUF metadata.
///
/// Built once per model; encoding and decoding take `&self`, so one
/// tokenizer can serve several threads.
#[derive(Clone)]
pub struct Tokenizer {
    /// Every token's text, concatenated; token `i` is
    /// `text[offsets[i]..offsets[i + 1]]`.
    text: String,
    offsets: Vec<u32>,
    scores: Vec<f32>,
    types: Vec<TokenType>,
    /// Every token's decoded bytes, concatenated, indexed by
    /// `rendered_offsets` like `text`.
    rendered: Vec<u8>,
    rendered_offsets: Vec<u32>,
    lookup: PieceTable,
    /// The token for each byte value in byte fallback.
    byte_tokens: [Option<u32>; 256],
    specials: SpecialTrie,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    eot: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.n_vocab())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("add_space_prefix", &self.add_space_prefix)
            .finish()
    }
}

/// Reads an optional key: `Ok(None)` when it is absent, an error when it has
/// the wrong type.
fn optional<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(Error::MissingKey(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
    ///
    /// # Errors
    /// [`Error::MissingKey`] when `tokenizer.ggml.model` or
    /// `tokenizer.ggml.tokens` is absent; [`Error::KeyType`] for keys of the
    /// wrong type; [`Error::Tokenizer`] for a tokenizer model other than
    /// `"llama"` and for an inconsistent vocabulary (see
    /// [`Tokenizer::from_vocab`]).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        const P: &str = "tokenizer.ggml.";
        let key = |k: &str| format!("{P}{k}");
        let model = file.get_str(&key("model"))?;
        if model != "llama" {
            return Err(Error::Tokenizer(format!(
                "unsupported tokenizer model `{model}` (only SentencePiece, `llama`, is implemented)"
            )));
        }
        let tokens = file.get_str_array(&key("tokens"))?.into_iter().map(str::to_owned).collect();
        let vocab = SpmVocab {
            tokens,
            scores: optional(file.get_f32_array(&key("scores")))?,
            token_types: optional(file.get_i32_array(&key("token_type")))?,
            bos_id: optional(file.get_u32(&key("bos_token_id")))?,
            eos_id: optional(file.get_u32(&key("eos_token_id")))?,
            unk_id: optional(file.get_u32(&key("unknown_token_id")))?,
            pad_id: optional(file.get_u32(&key("padding_token_id")))?,
            eot_id: optional(file.get_u32(&key("eot_token_id")))?,
            add_bos: optional(file.get_bool(&key("add_bos_token")))?,
            add_eos: optional(file.get_bool(&key("add_eos_token")))?,
            add_space_prefix: optional(file.get_bool(&key("add_space_prefix")))?,
        };
        Tokenizer::from_vocab(vocab)
    }

    /// Builds the tokenizer from an already-read vocabulary.
    ///
    /// An empty token text is replaced by `[EMPTY_<id>]` (as llama.cpp
    /// does), so that it can never match. A special-token id outside the
    /// vocabulary is ignored in favour of the default; a default outside the
    /// vocabulary means "no such token".
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the vocabulary is empty or has more than
    /// `u32::MAX` entries, when `scores` or `token_types` has a length other
    /// than the number of tokens, when two tokens have the same text, or
    /// when a byte token's text is not of the form `<0xXX>`.
    pub fn from_vocab(vocab: SpmVocab) -> Result<Tokenizer> {
        let err = |m: String| Error::Tokenizer(m);
        let n = vocab.tokens.len();
        if n == 0 {
            return Err(err("the vocabulary is empty".into()));
        }
        if u32::try_from(n).is_err() || n == u32::MAX as usize {
            return Err(err(format!("vocabulary of {n} tokens is too large")));
        }
        if let Some(s) = &vocab.scores {
            if s.len() != n {
                return Err(err(format!("{} scores for {n} tokens", s.len())));
            }
        }
        if let Some(t) = &vocab.token_types {
            if t.len() != n {
                return Err(err(format!("{} token types for {n} tokens", t.len())));
            }
        }

        let mut text = String::new();
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0u32);
        for (i, t) in vocab.tokens.iter().enumerate() {
            if t.is_empty() {
                text.push_str(&format!("[EMPTY_{i}]"));
            } else {
                text.push_str(t);
            }
            let end = u32::try_from(text.len()).map_err(|_| err("the vocabulary's texts exceed 4 GiB".into()))?;
            offsets.push(end);
        }
        let scores = vocab.scores.unwrap_or_else(|| vec![0.0; n]);
        let mut types: Vec<TokenType> = match &vocab.token_types {
            Some(t) => t.iter().map(|&v| TokenType::from_gguf(v)).collect(),
            None => vec![TokenType::Normal; n],
        };

        let piece = |i: usize| &text[offsets[i] as usize..offsets[i + 1] as usize];
        let lookup = PieceTable::build(n, piece)
            .map_err(|(a, b)| err(format!("tokens {a} and {b} have the same text {:?}", piece(b as usize))))?;
        let find = |s: &str| lookup.get(s, piece);

        // Special token ids: a value from the file when it is in range,
        // else the default when that is.
        let pick = |given: Option<u32>, default: Option<u32>| {
            given.filter(|&id| (id as usize) < n).or(default.filter(|&id| (id as usize) < n))
        };
        let bos = pick(vocab.bos_id, Some(1));
        let eos = pick(vocab.eos_id, Some(2));
        let unk = pick(vocab.unk_id, Some(0));
        let pad = pick(vocab.pad_id, None);
        let mut eot = pick(vocab.eot_id, None);
        if eot.is_none() {
            eot = EOG_TEXTS.iter().find_map(|t| find(t));
        }
        // End-of-generation tokens. A token recognised by its text is
        // treated as a control token whatever its type says (as llama.cpp
        // does), so that it is parsed and decoded like one.
        let by_text: Vec<u32> = EOG_TEXTS.iter().filter_map(|t| find(t)).collect();
        for &id in &by_text {
            types[id as usize] = TokenType::Control;
        }
        let mut eog = by_text;
        eog.extend(eos);
        eog.extend(eot);
        eog.sort_unstable();
        eog.dedup();

        // Byte values of byte tokens, and the token for each byte value.
        let mut byte_of = vec![0u8; n];
        for i in 0..n {
            if types[i] == TokenType::Byte {
                byte_of[i] = parse_byte_token(piece(i))
                    .ok_or_else(|| err(format!("byte token {i} has text {:?}, expected <0xXX>", piece(i))))?;
            }
        }
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = find(&hex).or_else(|| {
                // A vocabulary without byte tokens may still hold the byte
                // itself as a one-character token (ASCII only).
                let c = [b as u8];
                std::str::from_utf8(&c).ok().and_then(find)
            });
        }

        // What each token decodes to.
        let mut rendered = Vec::with_capacity(text.len());
        let mut rendered_offsets = Vec::with_capacity(n + 1);
        rendered_offsets.push(0u32);
        for i in 0..n {
            match types[i] {
                TokenType::Normal => rendered.extend_from_slice(piece(i).replace('\u{2581}', " ").as_bytes()),
                TokenType::Byte => rendered.push(byte_of[i]),
                TokenType::Control | TokenType::Unknown | TokenType::UserDefined => {
                    rendered.extend_from_slice(piece(i).as_bytes())
                }
                TokenType::Unused | TokenType::Undefined => {}
            }
            let end = u32::try_from(rendered.len()).map_err(|_| err("the vocabulary's texts exceed 4 GiB".into()))?;
            rendered_offsets.push(end);
        }

        let mut specials = SpecialTrie::default();
        for (i, ty) in types.iter().enumerate() {
            if ty.is_pretokenized() {
                specials.insert(piece(i).as_bytes(), i as u32);
            }
        }

        Ok(Tokenizer {
            text,
            offsets,
            scores,
            types,
            rendered,
            rendered_offsets,
            lookup,
            byte_tokens,
            specials,
            bos,
            eos,
            unk,
            pad,
            eot,
            eog,
            add_bos: vocab.add_bos.unwrap_or(true),
            add_eos: vocab.add_eos.unwrap_or(false),
            add_space_prefix: vocab.add_space_prefix.unwrap_or(true),
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.types.len()
    }

    /// The beginning-of-sequence token.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The end-of-turn token (`<end_of_turn>` for Gemma).
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    /// The unknown token.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    /// The padding token.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Whether generation should stop at `id`: EOS, the end-of-turn token,
    /// or another token whose text marks the end of a turn.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Every end-of-generation token, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `encode(_, true)` puts BOS first.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(_, true)` puts EOS last.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether a space is put in front of text that starts the input or
    /// follows a special token.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// The id of the token whose vocabulary text is exactly `piece` (with
    /// `▁` for spaces, as stored: `token_id("▁world")`).
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.lookup.get(piece, |i| self.piece_at(i))
    }

    /// The vocabulary text of token `id`, as stored (`▁` for spaces,
    /// `<0x0A>` for byte tokens).
    pub fn piece(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.n_vocab()).then(|| self.piece_at(id as usize))
    }

    fn piece_at(&self, i: usize) -> &str {
        &self.text[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// The merge score of token `id`.
    pub fn score(&self, id: u32) -> Option<f32> {
        self.scores.get(id as usize).copied()
    }

    /// The type of token `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Whether `id` is a control or unknown token (`<bos>`,
    /// `<start_of_turn>`, `<unk>`): parsed from text only on request and
    /// left out by [`Tokenizer::decode_with`] when asked to.
    pub fn is_special(&self, id: u32) -> bool {
        self.types.get(id as usize).is_some_and(|t| t.is_special())
    }

    /// The bytes token `id` contributes to decoded text: its text with `▁`
    /// turned into spaces, the single byte of a byte token (possibly part of
    /// a UTF-8 character), the literal text of control, unknown and
    /// user-defined tokens, nothing for unused ones. `None` for ids outside
    /// the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if i >= self.n_vocab() {
            return None;
        }
        Some(&self.rendered[self.rendered_offsets[i] as usize..self.rendered_offsets[i + 1] as usize])
    }

    /// Encodes `text`, parsing special tokens written in it
    /// (`<start_of_turn>` becomes its token). With `add_special`, BOS is put
    /// first when the model asks for it (and EOS last when it asks for
    /// that).
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.encode_with(text, add_special, true)
    }

    /// [`Tokenizer::encode`] choosing whether control tokens written in the
    /// text are parsed (`parse_special`) or encoded as plain text.
    /// User-defined tokens (newlines, runs of spaces for Gemma) are matched
    /// either way.
    ///
    /// A byte that has to fall back to a byte token the vocabulary lacks
    /// becomes the unknown token (or is dropped when there is none).
    pub fn encode_with(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 2 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let mut prev_special = true;
        let mut session = Session::default();
        for frag in self.partition(text, parse_special) {
            match frag {
                Fragment::Text(s) => {
                    session.encode(self, s, self.add_space_prefix && prev_special, &mut out);
                    prev_special = false;
                }
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Splits `text` into runs of plain text and pre-tokenized tokens.
    ///
    /// Tokens are taken longest first (lowest id among equal lengths); each
    /// splits every remaining run of text at its non-overlapping
    /// occurrences, leftmost first. Only the tokens that occur in `text` at
    /// all (found in one pass over a trie) are searched for, so the cost is
    /// the text length times the number of distinct tokens present.
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        if text.is_empty() {
            return Vec::new();
        }
        let bytes = text.as_bytes();
        let mut present: Vec<u32> = Vec::new();
        for start in 0..bytes.len() {
            self.specials.matches(&bytes[start..], |_, id| {
                if parse_special || !self.types[id as usize].is_special() {
                    present.push(id);
                }
            });
            // Keep the list short when the same tokens occur many times.
            if present.len() > 4096 {
                present.sort_unstable();
                present.dedup();
            }
        }
        let mut frags = vec![Fragment::Text(text)];
        if present.is_empty() {
            return frags;
        }
        present.sort_unstable();
        present.dedup();
        present.sort_by(|&a, &b| {
            let len = |id: u32| self.offsets[id as usize + 1] - self.offsets[id as usize];
            len(b).cmp(&len(a)).then(a.cmp(&b))
        });
        let mut next = Vec::new();
        for id in present {
            let needle = self.piece_at(id as usize);
            next.clear();
            for frag in frags.drain(..) {
                let Fragment::Text(run) = frag else {
                    next.push(frag);
                    continue;
                };
                // Matches of a whole UTF-8 string start and end on character
                // boundaries, so every slice below is valid.
                let mut pos = 0;
                for (at, m) in run.match_indices(needle) {
                    if at > pos {
                        next.push(Fragment::Text(&run[pos..at]));
                    }
                    next.push(Fragment::Token(id));
                    pos = at + m.len();
                }
                if pos < run.len() {
                    next.push(Fragment::Text(&run[pos..]));
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }

    /// Decodes `ids` to text, control tokens included (as their text, e.g.
    /// `<start_of_turn>`; BOS too, so strip it first if unwanted). Bytes
    /// that do not form valid UTF-8 become U+FFFD, as do ids outside the
    /// vocabulary.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, false)
    }

    /// [`Tokenizer::decode`], leaving out control and unknown tokens when
    /// `skip_special` is set.
    pub fn decode_with(&self, ids: &[u32], skip_special: bool) -> String {
        let mut d = self.decoder(skip_special);
        let mut s = String::new();
        for &id in ids {
            s.push_str(&d.push(id));
        }
        s.push_str(&d.finish());
        s
    }

    /// [`Tokenizer::decode`], but failing on ids outside the vocabulary.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] naming the first id that is not a token.
    pub fn try_decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.n_vocab()) {
            return Err(Error::Tokenizer(format!("token id {bad} is outside the vocabulary of {}", self.n_vocab())));
        }
        Ok(self.decode(ids))
    }

    /// A streaming decoder (see [`Decoder`]).
    pub fn decoder(&self, skip_special: bool) -> Decoder<'_> {
        Decoder { tok: self, pending: Vec::new(), skip_special, prev_special: true }
    }
}

/// Parses `<0xXX>` (either case of hex digit).
fn parse_byte_token(s: &str) -> Option<u8> {
    let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// A piece of the input after special tokens have been cut out.
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// Turns tokens into text incrementally, emitting whole characters only.
///
/// A character that byte-fallback tokens spell one byte at a time is held
/// back until its last byte arrives; a byte sequence that can no longer
/// become valid UTF-8 is emitted as U+FFFD. The concatenation of everything
/// [`Decoder::push`] and [`Decoder::finish`] return equals
/// [`Tokenizer::decode_with`] of the same ids.
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

impl Decoder<'_> {
    /// Adds one token and returns the text it completes (possibly empty).
    /// An id outside the vocabulary gives U+FFFD.
    pub fn push(&mut self, id: u32) -> String {
        let Some(bytes) = self.tok.token_bytes(id) else {
            let mut s = self.flush_lossy();
            s.push(char::REPLACEMENT_CHARACTER);
            self.prev_special = false;
            return s;
        };
        let ty = self.tok.types[id as usize];
        if ty.is_pretokenized() {
            self.prev_special = true;
            if self.skip_special && ty.is_special() {
                return String::new();
            }
            self.pending.extend_from_slice(bytes);
        } else {
            let strip = self.tok.add_space_prefix && self.prev_special && ty == TokenType::Normal;
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

/// Open-addressing hash table from token text to id, storing only ids (the
/// texts live in the tokenizer's `text`).
#[derive(Clone)]
struct PieceTable {
    slots: Vec<u32>,
    mask: usize,
}

const EMPTY_SLOT: u32 = u32::MAX;

fn hash_bytes(b: &[u8]) -> u64 {
    // FNV-1a, then a final mix so that the low bits used for the slot
    // index depend on every byte.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

impl PieceTable {
    /// Builds the table for `n` texts; a duplicate text gives the ids of
    /// the two tokens sharing it.
    fn build<'a>(n: usize, piece: impl Fn(usize) -> &'a str) -> std::result::Result<Self, (u32, u32)> {
        let cap = (2 * n).next_power_of_two().max(16);
        let mut t = PieceTable { slots: vec![EMPTY_SLOT; cap], mask: cap - 1 };
        for i in 0..n {
            let key = piece(i);
            let mut s = hash_bytes(key.as_bytes()) as usize & t.mask;
            loop {
                let cur = t.slots[s];
                if cur == EMPTY_SLOT {
                    t.slots[s] = i as u32;
                    break;
                }
                if piece(cur as usize) == key {
                    return Err((cur, i as u32));
                }
                s = (s + 1) & t.mask;
            }
        }
        Ok(t)
    }

    fn get<'a>(&self, key: &str, piece: impl Fn(usize) -> &'a str) -> Option<u32> {
        let mut s = hash_bytes(key.as_bytes()) as usize & self.mask;
        loop {
            let cur = self.slots[s];
            if cur == EMPTY_SLOT {
                return None;
            }
            if piece(cur as usize) == key {
                return Some(cur);
            }
            s = (s + 1) & self.mask;
        }
    }
}

/// A byte trie over the texts of pre-tokenized tokens.
#[derive(Clone, Debug)]
struct SpecialTrie {
    nodes: Vec<TrieNode>,
}

#[derive(Clone, Debug, Default)]
struct TrieNode {
    /// (byte, child node index), sorted by byte.
    children: Vec<(u8, u32)>,
    token: Option<u32>,
}

impl Default for SpecialTrie {
    fn default() -> Self {
        SpecialTrie { nodes: vec![TrieNode::default()] }
    }
}

impl SpecialTrie {
    fn insert(&mut self, key: &[u8], id: u32) {
        let mut node = 0usize;
        for &b in key {
            node = match self.nodes[node].children.binary_search_by_key(&b, |c| c.0) {
                Ok(k) => self.nodes[node].children[k].1 as usize,
                Err(k) => {
                    let child = self.nodes.len();
                    self.nodes.push(TrieNode::default());
                    self.nodes[node].children.insert(k, (b, child as u32));
                    child
                }
            };
        }
        self.nodes[node].token = Some(id);
    }

    /// Calls `f(length, id)` for every token that is a prefix of `s`.
    fn matches(&self, s: &[u8], mut f: impl FnMut(usize, u32)) {
        let mut node = 0usize;
        for (i, &b) in s.iter().enumerate() {
            match self.nodes[node].children.binary_search_by_key(&b, |c| c.0) {
                Ok(k) => node = self.nodes[node].children[k].1 as usize,
                Err(_) => return,
            }
            if let Some(id) = self.nodes[node].token {
                f(i + 1, id);
            }
        }
    }
}

/// Scratch space for encoding one fragment, reused across fragments.
#[derive(Default)]
struct Session {
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

impl Session {
    fn encode(&mut self, tok: &Tokenizer, text: &str, space_prefix: bool, out: &mut Vec<u32>) {
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
            self.try_pair(tok, i as u32 - 1, i as u32);
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
                self.try_pair(tok, prev, c.left);
            }
            if next != NONE {
                self.try_pair(tok, c.left, next);
            }
        }
        let mut i = 0u32;
        while i != NONE {
            let s = self.symbols[i as usize];
            let piece = &self.escaped[s.start as usize..(s.start + s.len) as usize];
            match tok.token_id(piece) {
                Some(id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        out.extend(tok.byte_tokens[b as usize].or(tok.unk));
                    }
                }
            }
            i = s.next;
        }
    }

    fn try_pair(&mut self, tok: &Tokenizer, left: u32, right: u32) {
        let l = self.symbols[left as usize];
        let r = self.symbols[right as usize];
        let piece = &self.escaped[l.start as usize..(l.start + l.len + r.len) as usize];
        if let Some(id) = tok.token_id(piece) {
            self.queue.push(Candidate { score: tok.scores[id as usize], left, right, len: l.len + r.len });
        }
    }
}
