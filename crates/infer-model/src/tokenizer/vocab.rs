//! The vocabulary shared by every tokenizer model: token texts and types, the
//! text-to-id table, the special ids (BOS, EOS, end of turn ...) and the
//! end-of-generation set, what each token decodes to, and the first step of
//! every encoding: cutting special and user-defined tokens out of the text
//! (`Vocab::partition`, llama.cpp's `tokenizer_st_partition`).

use crate::gguf::StringArray;
use crate::memory;
use crate::{Error, Result};

/// Texts indexed from 0 (token texts, merges): a slice of strings, or a
/// GGUF string array read in place.
pub(crate) trait Texts {
    /// Number of texts.
    fn count(&self) -> usize;
    /// Text `i` (`i < count()`).
    fn text(&self, i: usize) -> &str;
}

impl Texts for Vec<String> {
    fn count(&self) -> usize {
        self.len()
    }
    fn text(&self, i: usize) -> &str {
        &self[i]
    }
}

impl Texts for StringArray {
    fn count(&self) -> usize {
        self.len()
    }
    fn text(&self, i: usize) -> &str {
        self.get(i).unwrap_or_default()
    }
}

/// Decimal digits of `i`.
fn digits(i: usize) -> usize {
    i.checked_ilog10().map_or(1, |d| d as usize + 1)
}

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
    /// 3: a control token (`<bos>`, `<start_of_turn>`, `<|im_start|>`).
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
    pub(crate) fn is_pretokenized(self) -> bool {
        matches!(self, TokenType::Control | TokenType::UserDefined | TokenType::Unknown)
    }

    /// Whether tokens of this type are "special": only cut out of the text
    /// when special tokens are parsed, and left out of decoded text on
    /// request.
    pub(crate) fn is_special(self) -> bool {
        matches!(self, TokenType::Control | TokenType::Unknown)
    }
}

/// Texts of tokens that end a turn or the generation (the list of
/// llama.cpp's `llama_vocab::impl::load` that fills `special_eog_ids`, and
/// DeepSeek's end of sentence, which llama.cpp finds as an end-of-turn
/// token): the tokens found among them join EOS and EOT in
/// [`Vocab::is_eog`] and become control tokens. `</s>` is among them (for
/// PaddleOCR in llama.cpp): in a vocabulary where it is text, such as Gemma
/// 3's, it ends the generation too, as in llama.cpp.
pub(crate) const EOG_TEXTS: &[&str] = &[
    "<end_of_turn>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "</s>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
];

/// Texts of end-of-turn tokens, for a file without
/// `tokenizer.ggml.eot_token_id`: the first one present is the EOT token
/// (llama.cpp's list of the same search, which takes whichever it meets
/// first, and DeepSeek's end of sentence).
const EOT_TEXTS: &[&str] = &[
    "<end_of_turn>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<end_of_utterance>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
];

/// Special token ids as read from the file (`None`: absent) and the
/// tokenizer model's defaults for absent ones.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub eot: Option<u32>,
}

/// Token texts, types and special ids, with the lookups every tokenizer
/// model needs.
#[derive(Clone)]
pub(crate) struct Vocab {
    /// Every token's text, concatenated; token `i` is
    /// `text[offsets[i]..offsets[i + 1]]`.
    text: String,
    offsets: Vec<u32>,
    types: Vec<TokenType>,
    /// Every token's decoded bytes, concatenated, indexed by
    /// `rendered_offsets` like `text`.
    rendered: Vec<u8>,
    rendered_offsets: Vec<u32>,
    lookup: PieceTable,
    specials: SpecialTrie,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub eot: Option<u32>,
    /// End-of-generation tokens, ascending.
    pub eog: Vec<u32>,
    /// What was wrong with the file's special ids (one line each), for the
    /// caller to report.
    pub warnings: Vec<String>,
}

fn tok_err(m: String) -> Error {
    Error::Tokenizer(m)
}

impl Vocab {
    /// Builds the vocabulary.
    ///
    /// An empty token text is replaced by `[EMPTY_<id>]` (as llama.cpp
    /// does), so that it can never match. A special id from the file outside
    /// the vocabulary is ignored in favour of the default; a default outside
    /// the vocabulary means "no such token". Without an EOT id the first
    /// token of [`EOG_TEXTS`] present is taken. Tokens recognised by their
    /// text as ends of generation become control tokens whatever their type
    /// says (as llama.cpp does), so that they are parsed and decoded like
    /// one.
    ///
    /// `render(id, type, text, out)` appends what token `id` decodes to.
    ///
    /// `render` appends at most as many bytes as the token's text has; every
    /// table is allocated fallibly, with its size computed up front where it
    /// is known.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the vocabulary is empty or has `u32::MAX`
    /// entries or more, when `token_types` has a length other than the
    /// number of tokens, when two tokens have the same text, when the texts
    /// exceed 4 GiB, and any error of `render`; out of memory
    /// ([`Error::Compute`]) when a table does not fit.
    pub fn new(
        tokens: &dyn Texts,
        token_types: Option<&[i32]>,
        given: SpecialIds,
        defaults: SpecialIds,
        mut render: impl FnMut(u32, TokenType, &str, &mut Vec<u8>) -> Result<()>,
    ) -> Result<Vocab> {
        let n = tokens.count();
        if n == 0 {
            return Err(tok_err("the vocabulary is empty".into()));
        }
        if u32::try_from(n).is_err() || n == u32::MAX as usize {
            return Err(tok_err(format!("vocabulary of {n} tokens is too large")));
        }
        if let Some(t) = token_types {
            if t.len() != n {
                return Err(tok_err(format!("{} token types for {n} tokens", t.len())));
            }
        }
        let too_long = || tok_err("the vocabulary's texts exceed 4 GiB".into());
        let what = |table: &'static str| move || format!("the vocabulary's {table} ({n} tokens)");
        let (text, offsets) = pack_texts(tokens)?;
        let mut types: Vec<TokenType> = memory::vec_with_capacity(n, what("token types"))?;
        match token_types {
            Some(t) => types.extend(t.iter().map(|&v| TokenType::from_gguf(v))),
            None => types.resize(n, TokenType::Normal),
        }

        let piece = |i: usize| &text[offsets[i] as usize..offsets[i + 1] as usize];
        let lookup = PieceTable::build(n, piece, what("lookup table"))?;
        let find = |s: &str| lookup.get(s, piece);

        let mut warnings = Vec::new();
        let mut pick = |key: &str, given: Option<u32>, default: Option<u32>| {
            let default = default.filter(|&id| (id as usize) < n);
            match given {
                Some(id) if (id as usize) < n => Some(id),
                Some(id) => {
                    let instead =
                        default.map_or("there is no such token".to_owned(), |d| format!("using the default id {d}"));
                    warnings.push(format!(
                        "bad special token: tokenizer.ggml.{key} = {id} is past the vocabulary of {n} tokens; {instead}"
                    ));
                    default
                }
                None => default,
            }
        };
        let bos = pick("bos_token_id", given.bos, defaults.bos);
        let eos = pick("eos_token_id", given.eos, defaults.eos);
        let unk = pick("unknown_token_id", given.unk, defaults.unk);
        let pad = pick("padding_token_id", given.pad, defaults.pad);
        let eot = pick("eot_token_id", given.eot, defaults.eot).or_else(|| EOT_TEXTS.iter().find_map(|t| find(t)));
        let eog = end_of_generation(&find, eos, eot, &mut types);

        // Every token renders to at most its text's bytes, so `text.len()`
        // bytes hold them all; the reservation per token is then free.
        let mut rendered = memory::vec_with_capacity(text.len(), what("decoded texts"))?;
        let mut rendered_offsets = memory::vec_with_capacity(n + 1, what("decoded text offsets"))?;
        rendered_offsets.push(0u32);
        for (i, &ty) in types.iter().enumerate() {
            memory::reserve(&mut rendered, piece(i).len(), what("decoded texts"))?;
            render(i as u32, ty, piece(i), &mut rendered)?;
            rendered_offsets.push(u32::try_from(rendered.len()).map_err(|_| too_long())?);
        }

        let mut specials = SpecialTrie::default();
        for (i, ty) in types.iter().enumerate() {
            if ty.is_pretokenized() {
                specials.insert(piece(i).as_bytes(), i as u32, what("special-token trie"))?;
            }
        }
        Ok(Vocab {
            text,
            offsets,
            types,
            rendered,
            rendered_offsets,
            lookup,
            specials,
            bos,
            eos,
            unk,
            pad,
            eot,
            eog,
            warnings,
        })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// The id of the token whose text is exactly `piece`.
    pub fn id(&self, piece: &str) -> Option<u32> {
        self.lookup.get(piece, |i| self.piece_at(i))
    }

    /// The text of token `i` (`i < len()`).
    pub fn piece_at(&self, i: usize) -> &str {
        &self.text[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// The type of token `id`, `None` outside the vocabulary.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// What token `id` decodes to; `None` outside the vocabulary.
    pub fn bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if i >= self.len() {
            return None;
        }
        Some(&self.rendered[self.rendered_offsets[i] as usize..self.rendered_offsets[i + 1] as usize])
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Splits `text` into runs of plain text and pre-tokenized tokens
    /// (control, user-defined and unknown tokens; control and unknown ones
    /// only when `parse_special` is set).
    ///
    /// Tokens are taken longest first (lowest id among equal lengths); each
    /// splits every remaining run of text at its non-overlapping
    /// occurrences, leftmost first. Only the tokens that occur in `text` at
    /// all (found in one pass over a trie) are searched for, so the cost is
    /// the text length times the number of distinct tokens present.
    pub fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
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
}

/// A piece of the input after special tokens have been cut out.
pub(crate) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}
/// The token texts end to end, and the offset of each (`n + 1` offsets,
/// the last the total length); an empty text becomes `[EMPTY_<id>]`.
///
/// # Errors
/// [`Error::Tokenizer`] when the texts exceed 4 GiB; out of memory.
fn pack_texts(tokens: &dyn Texts) -> Result<(String, Vec<u32>)> {
    let n = tokens.count();
    let too_long = || tok_err("the vocabulary's texts exceed 4 GiB".into());
    // An empty text becomes `[EMPTY_<id>]`: 8 bytes and the digits.
    let text_len = |i: usize| match tokens.text(i).len() {
        0 => 8 + digits(i),
        len => len,
    };
    let mut total = 0usize;
    for i in 0..n {
        total = total.checked_add(text_len(i)).filter(|&t| u32::try_from(t).is_ok()).ok_or_else(too_long)?;
    }
    let what = |table: &'static str| move || format!("the vocabulary's {table} ({n} tokens)");
    let mut text = memory::string_with_capacity(total, what("texts"))?;
    let mut offsets = memory::vec_with_capacity(n + 1, what("text offsets"))?;
    offsets.push(0u32);
    for i in 0..n {
        match tokens.text(i) {
            "" => {
                use std::fmt::Write;
                // Within the capacity reserved: writing cannot fail.
                let _ = write!(text, "[EMPTY_{i}]");
            }
            t => text.push_str(t),
        }
        // At most `total`, which fits in u32.
        offsets.push(text.len() as u32);
    }
    Ok((text, offsets))
}

/// The end-of-generation ids, sorted, as llama.cpp's vocabulary loader
/// makes them: the tokens of [`EOG_TEXTS`] present (made control tokens
/// in `types`), EOS and EOT, less its exceptions: `<|end|>` where the
/// vocabulary also ends at `<|return|>` and `<|call|>` (gpt-oss's harmony
/// format) or `<|calls|>` and `<|flush|>`, and `</s>` where it has
/// `<|tool_response>` (their types changed as llama.cpp does).
fn end_of_generation(
    find: &dyn Fn(&str) -> Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    types: &mut [TokenType],
) -> Vec<u32> {
    let mut eog: Vec<u32> = EOG_TEXTS.iter().filter_map(|t| find(t)).collect();
    for &id in &eog {
        types[id as usize] = TokenType::Control;
    }
    // The exceptions apply after EOS and EOT joined the list (so that they
    // take those out too).
    eog.extend(eos);
    eog.extend(eot);
    let has = |eog: &[u32], t: &str| find(t).filter(|id| eog.contains(id));
    if let Some(end) = has(&eog, "<|end|>") {
        let harmony = has(&eog, "<|return|>").is_some() && has(&eog, "<|call|>").is_some();
        let solar = has(&eog, "<|calls|>").is_some() && has(&eog, "<|flush|>").is_some();
        if harmony || solar {
            eog.retain(|&id| id != end);
            types[end as usize] = TokenType::UserDefined;
        }
    }
    if let (Some(s), Some(_)) = (has(&eog, "</s>"), has(&eog, "<|tool_response>")) {
        eog.retain(|&id| id != s);
        types[s as usize] = TokenType::Normal;
    }
    eog.sort_unstable();
    eog.dedup();
    eog
}

/// Open-addressing hash table from token text to id, storing only ids (the
/// texts live in the vocabulary's `text`).
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
    /// Builds the table for `n` texts (`n < u32::MAX`).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] naming the two tokens of a duplicate text; out
    /// of memory naming `what` when the table does not fit.
    fn build<'a>(n: usize, piece: impl Fn(usize) -> &'a str, what: impl FnOnce() -> String) -> Result<Self> {
        let cap = (2 * n).next_power_of_two().max(16);
        let mut t = PieceTable { slots: memory::vec_filled(cap, EMPTY_SLOT, what)?, mask: cap - 1 };
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
                    return Err(tok_err(format!("tokens {cur} and {i} have the same text {key:?}")));
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
    /// Adds `key` for token `id`.
    ///
    /// # Errors
    /// Out of memory naming `what` when a node does not fit.
    fn insert(&mut self, key: &[u8], id: u32, what: impl Fn() -> String) -> Result<()> {
        let mut node = 0usize;
        for &b in key {
            node = match self.nodes[node].children.binary_search_by_key(&b, |c| c.0) {
                Ok(k) => self.nodes[node].children[k].1 as usize,
                Err(k) => {
                    let child = self.nodes.len();
                    memory::reserve(&mut self.nodes, 1, &what)?;
                    memory::reserve(&mut self.nodes[node].children, 1, &what)?;
                    self.nodes.push(TrieNode::default());
                    self.nodes[node].children.insert(k, (b, child as u32));
                    child
                }
            };
        }
        self.nodes[node].token = Some(id);
        Ok(())
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
