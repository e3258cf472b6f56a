//! The tokenizers of GGUF models, built from the `tokenizer.ggml.*`
//! metadata and reproducing llama.cpp's token ids.
//!
//! [`Tokenizer::from_gguf`] dispatches on `tokenizer.ggml.model`:
//! - `"llama"`: SentencePiece BPE, merging by score, with byte fallback
//!   ([`sentencepiece`]; Gemma, Llama 2, Mistral);
//! - `"gpt2"`: byte-level BPE, merging by rank after a regular-expression
//!   pre-tokenizer named by `tokenizer.ggml.pre` ([`bpe`],
//!   [`pretokenize`]; SmolLM2, Llama 3, Qwen 2, DeepSeek).
//!
//! Both share the [`vocab`]: encoding first cuts special tokens out of the
//! text (control, user-defined and unknown tokens, longest first; control
//! and unknown ones only when special tokens are parsed, see
//! [`Tokenizer::encode_with`]), then encodes each remaining run of text
//! with the model. Decoding ([`decode`]) streams whole UTF-8 characters.
//!
//! The metadata read (all under `tokenizer.ggml.`): `model`, `tokens`,
//! `token_type` (optional; when present its length must equal the number of
//! tokens), `bos_token_id`, `eos_token_id`, `unknown_token_id`,
//! `padding_token_id`, `eot_token_id`, `add_bos_token`, `add_eos_token`;
//! for SentencePiece also `scores` and `add_space_prefix`, for byte-level
//! BPE `merges` and `pre`. Missing keys take llama.cpp's defaults for the
//! model (see [`SpmVocab`] and [`BpeVocab`]). (Gemma 3's files set
//! `add_space_prefix = false`, so `"Hello"` encodes as `Hello`, not
//! `▁Hello`; SmolLM2's set `add_bos_token = false`.)

pub mod bpe;
pub mod decode;
pub mod pretokenize;
pub mod sentencepiece;
pub mod vocab;

pub use bpe::BpeVocab;
pub use decode::Decoder;
pub use pretokenize::PreTokenizer;
pub use sentencepiece::SpmVocab;
pub use vocab::TokenType;

use std::ops::ControlFlow;

use crate::gguf::GgufFile;
use crate::{Error, Result};
use bpe::{BpeModel, BpeSession};
use sentencepiece::{SpmModel, SpmSession};
use vocab::{Fragment, Vocab};

/// Which algorithm a [`Tokenizer`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// SentencePiece BPE (`tokenizer.ggml.model = "llama"`).
    SentencePiece,
    /// Byte-level BPE (`tokenizer.ggml.model = "gpt2"`) with the given
    /// pre-tokenizer.
    ByteLevelBpe(PreTokenizer),
}

#[derive(Clone)]
enum Model {
    Spm(Box<SpmModel>),
    Bpe(Box<BpeModel>),
}

/// A tokenizer read from GGUF metadata: SentencePiece or byte-level BPE.
///
/// Built once per model; encoding and decoding take `&self`, so one
/// tokenizer can serve several threads.
#[derive(Clone)]
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    add_bos: bool,
    add_eos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind())
            .field("n_vocab", &self.n_vocab())
            .field("bos", &self.vocab.bos)
            .field("eos", &self.vocab.eos)
            .field("eog", &self.vocab.eog)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("add_space_prefix", &self.add_space_prefix())
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

const P: &str = "tokenizer.ggml.";

fn key(k: &str) -> String {
    format!("{P}{k}")
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
    ///
    /// # Errors
    /// [`Error::MissingKey`] when `tokenizer.ggml.model` or
    /// `tokenizer.ggml.tokens` is absent (and `merges` or `pre` for
    /// byte-level BPE); [`Error::KeyType`] for keys of the wrong type;
    /// [`Error::Tokenizer`] for a tokenizer model other than `"llama"` and
    /// `"gpt2"`, an unknown pre-tokenizer, and an inconsistent vocabulary
    /// (see [`Tokenizer::from_vocab`] and [`Tokenizer::from_bpe_vocab`]);
    /// out of memory ([`Error::Compute`]) when a table sized by the
    /// vocabulary or the merges does not fit.
    ///
    /// The token texts and merges are read in place from the file's
    /// metadata: the tokenizer's tables are the only copies made.
    ///
    /// What [`Tokenizer::warnings`] lists (a special-token id past the
    /// vocabulary) is printed on stderr, one `warning:` line each, as
    /// llama.cpp logs it when it loads a vocabulary.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        let t = Tokenizer::read_gguf(file)?;
        for w in t.warnings() {
            eprintln!("warning: {w}");
        }
        Ok(t)
    }

    fn read_gguf(file: &GgufFile) -> Result<Tokenizer> {
        let model = file.get_str(&key("model"))?;
        let tokens = match model {
            "llama" | "gpt2" => file.get_strings(&key("tokens"))?,
            other => {
                return Err(Error::Tokenizer(format!(
                "unsupported tokenizer model `{other}` (supported: `llama` = SentencePiece, `gpt2` = byte-level BPE)"
            )))
            }
        };
        let token_types = optional(file.get_i32_array(&key("token_type")))?;
        let id = |k: &str| optional(file.get_u32(&key(k)));
        let flag = |k: &str| optional(file.get_bool(&key(k)));
        if model == "llama" {
            let vocab = SpmVocab {
                tokens: Vec::new(),
                scores: optional(file.get_f32_array(&key("scores")))?,
                token_types,
                bos_id: id("bos_token_id")?,
                eos_id: id("eos_token_id")?,
                unk_id: id("unknown_token_id")?,
                pad_id: id("padding_token_id")?,
                eot_id: id("eot_token_id")?,
                add_bos: flag("add_bos_token")?,
                add_eos: flag("add_eos_token")?,
                add_space_prefix: flag("add_space_prefix")?,
            };
            let (vocab, model, add_bos, add_eos) = SpmModel::build_from(tokens, vocab)?;
            return Ok(Tokenizer { vocab, model: Model::Spm(Box::new(model)), add_bos, add_eos });
        }
        let merges = file.get_strings(&key("merges"))?;
        let pre = file.get_str(&key("pre"))?;
        let vocab = BpeVocab {
            tokens: Vec::new(),
            merges: Vec::new(),
            token_types,
            pre: String::new(),
            bos_id: id("bos_token_id")?,
            eos_id: id("eos_token_id")?,
            unk_id: id("unknown_token_id")?,
            pad_id: id("padding_token_id")?,
            eot_id: id("eot_token_id")?,
            add_bos: flag("add_bos_token")?,
            add_eos: flag("add_eos_token")?,
        };
        let (vocab, model, add_bos, add_eos) = BpeModel::build_from(tokens, merges, pre, vocab)?;
        Ok(Tokenizer { vocab, model: Model::Bpe(Box::new(model)), add_bos, add_eos })
    }

    /// Builds a SentencePiece tokenizer from an already-read vocabulary.
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
        let (vocab, model, add_bos, add_eos) = SpmModel::build(vocab)?;
        Ok(Tokenizer { vocab, model: Model::Spm(Box::new(model)), add_bos, add_eos })
    }

    /// Builds a byte-level BPE tokenizer from an already-read vocabulary
    /// and merges list.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] for an unknown pre-tokenizer name, an empty
    /// vocabulary or merges list, token types of the wrong length, two
    /// tokens with the same text, or a merge that is not two texts
    /// separated by a space.
    pub fn from_bpe_vocab(vocab: BpeVocab) -> Result<Tokenizer> {
        let (vocab, model, add_bos, add_eos) = BpeModel::build(vocab)?;
        Ok(Tokenizer { vocab, model: Model::Bpe(Box::new(model)), add_bos, add_eos })
    }

    /// What was wrong with the file's special-token ids, one line each: an
    /// id past the vocabulary, and which id was taken instead (empty for a
    /// sound file).
    pub fn warnings(&self) -> &[String] {
        &self.vocab.warnings
    }

    /// Which algorithm this tokenizer runs.
    pub fn kind(&self) -> TokenizerKind {
        match &self.model {
            Model::Spm(_) => TokenizerKind::SentencePiece,
            Model::Bpe(m) => TokenizerKind::ByteLevelBpe(m.pre),
        }
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    /// The beginning-of-sequence token.
    pub fn bos_id(&self) -> Option<u32> {
        self.vocab.bos
    }

    /// The end-of-sequence token.
    pub fn eos_id(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// The end-of-turn token (`<end_of_turn>` for Gemma, `<|im_end|>` for
    /// ChatML models).
    pub fn eot_id(&self) -> Option<u32> {
        self.vocab.eot
    }

    /// The unknown token.
    pub fn unk_id(&self) -> Option<u32> {
        self.vocab.unk
    }

    /// The padding token.
    pub fn pad_id(&self) -> Option<u32> {
        self.vocab.pad
    }

    /// Whether generation should stop at `id`: EOS, the end-of-turn token,
    /// or another token whose text marks the end of a turn or text
    /// (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`, `<|endoftext|>` ...,
    /// the list llama.cpp uses).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.is_eog(id)
    }

    /// Every end-of-generation token, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
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
    /// follows a special token (SentencePiece only; always false for
    /// byte-level BPE).
    pub fn add_space_prefix(&self) -> bool {
        match &self.model {
            Model::Spm(m) => m.add_space_prefix,
            Model::Bpe(_) => false,
        }
    }

    /// The id of the token whose vocabulary text is exactly `piece`, as
    /// stored: `▁` for spaces in SentencePiece (`token_id("▁world")`),
    /// byte-level characters in BPE (`token_id("Ġworld")`).
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.vocab.id(piece)
    }

    /// The vocabulary text of token `id`, as stored (`▁` or `Ġ` for
    /// spaces, `<0x0A>` for byte tokens).
    pub fn piece(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.n_vocab()).then(|| self.vocab.piece_at(id as usize))
    }

    /// The merge score of token `id` (SentencePiece; 0 for byte-level BPE,
    /// which merges by rank).
    pub fn score(&self, id: u32) -> Option<f32> {
        match &self.model {
            Model::Spm(m) => m.scores.get(id as usize).copied(),
            Model::Bpe(_) => ((id as usize) < self.n_vocab()).then_some(0.0),
        }
    }

    /// The type of token `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.vocab.token_type(id)
    }

    /// Whether `id` is a control or unknown token (`<bos>`,
    /// `<start_of_turn>`, `<|im_start|>`, `<unk>`): parsed from text only
    /// on request and left out by [`Tokenizer::decode_with`] when asked to.
    pub fn is_special(&self, id: u32) -> bool {
        self.vocab.token_type(id).is_some_and(|t| t.is_special())
    }

    /// The bytes token `id` contributes to decoded text: its text with `▁`
    /// turned into spaces (SentencePiece) or its byte-level characters
    /// turned back into bytes (BPE; possibly part of a UTF-8 character),
    /// the single byte of a byte token, the literal text of control,
    /// unknown and user-defined tokens, nothing for unused ones. `None` for
    /// ids outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.vocab.bytes(id)
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
    /// SentencePiece: a byte that has to fall back to a byte token the
    /// vocabulary lacks becomes the unknown token (or is dropped when there
    /// is none). Byte-level BPE: a byte whose character is not a token is
    /// left out (as llama.cpp does).
    pub fn encode_with(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_at_most(text, add_special, parse_special, usize::MAX).unwrap_or_default()
    }

    /// [`Tokenizer::encode_with`] for a text that must fit in `max` tokens
    /// (a context): `None` when it has more, found out without encoding all
    /// of it. The text is encoded in order, each word (byte-level BPE) or
    /// piece of a run of text (SentencePiece, cut before a space where the
    /// vocabulary allows it, see [`sentencepiece`]) in turn, and encoding
    /// stops at the first one past `max`; a text with more than `max`
    /// special tokens is refused before anything is merged. The tokens of a
    /// text that fits are exactly [`Tokenizer::encode_with`]'s.
    ///
    /// What is not bounded by `max`: finding the special tokens, which
    /// scans the whole text (linear time, and a list of the runs between
    /// them); and a SentencePiece run without spaces, or of a vocabulary
    /// whose tokens join text to a following space, which is merged whole.
    /// A caller bounds the text's length first ([`crate::prompt`]).
    pub fn encode_at_most(&self, text: &str, add_special: bool, parse_special: bool, max: usize) -> Option<Vec<u32>> {
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.extend(self.vocab.bos);
        }
        let frags = self.vocab.partition(text, parse_special);
        let specials = frags.iter().filter(|f| matches!(f, Fragment::Token(_))).count();
        if out.len().saturating_add(specials) > max {
            return None;
        }
        out.reserve(text.len().min(max.saturating_mul(8)) / 2 + 2);
        let flow = match &self.model {
            Model::Spm(m) => {
                let mut prev_special = true;
                let mut session = SpmSession::default();
                frags.into_iter().try_for_each(|frag| match frag {
                    Fragment::Text(s) => {
                        let prefix = m.add_space_prefix && prev_special;
                        prev_special = false;
                        session.encode(&self.vocab, m, s, prefix, max, &mut out)
                    }
                    Fragment::Token(id) => {
                        prev_special = true;
                        push_within(&mut out, id, max)
                    }
                })
            }
            Model::Bpe(m) => {
                let mut session = BpeSession::default();
                frags.into_iter().try_for_each(|frag| match frag {
                    Fragment::Text(s) => session.encode(&self.vocab, m, s, max, &mut out),
                    Fragment::Token(id) => push_within(&mut out, id, max),
                })
            }
        };
        if flow.is_break() {
            return None;
        }
        if add_special && self.add_eos {
            out.extend(self.vocab.eos);
        }
        (out.len() <= max).then_some(out)
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
        Decoder::new(self, skip_special)
    }
}

/// Pushes `id`, breaking when `out` then has more than `max` tokens.
fn push_within(out: &mut Vec<u32>, id: u32, max: usize) -> ControlFlow<()> {
    out.push(id);
    if out.len() > max {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    }
}
