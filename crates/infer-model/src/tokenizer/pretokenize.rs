//! The pre-tokenizer of byte-level BPE: the regular expressions that cut a
//! text fragment into words before merging, chosen by
//! `tokenizer.ggml.pre`.
//!
//! The expressions are those of each model family's `tokenizer.json`, as
//! llama.cpp applies them (`llm_tokenizer_bpe` in `llama-vocab.cpp`): a list
//! of expressions applied in turn, each to every piece the previous one
//! left; the text between two matches is a piece of its own, so no byte is
//! lost. llama.cpp rewrites `(?i:'s|'t|...)` as `'[sS]|'[tT]|...`, which
//! means the same; `(?!\S)` needs look-ahead, hence `fancy-regex`.

use std::ops::ControlFlow;

use fancy_regex::Regex;

use crate::{Error, Result};

/// The pre-tokenizers understood, by family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PreTokenizer {
    /// GPT-2's split (`gpt-2`, `gpt2`, `phi-2`, `mpt`, `olmo`,
    /// `roberta-bpe`): contractions, letters, digits, other symbols, each
    /// with an optional leading space.
    Gpt2,
    /// Llama 3's split (`llama3`, `llama-bpe`, `llama-v3`, `falcon3`):
    /// digits in groups of up to three, newlines kept with the symbols they
    /// follow; whole words found in the vocabulary skip merging.
    Llama3,
    /// SmolLM's and StarCoder's split (`smollm`, `starcoder`, `refact`,
    /// `codeshell`): every digit on its own, then GPT-2's split.
    Smollm,
    /// Qwen 2's split (`qwen2`, `deepseek-r1-qwen`, `stablelm2`): Llama 3's
    /// with every digit on its own.
    Qwen2,
    /// DeepSeek LLM's split (`deepseek-llm`): newlines, Latin-like words,
    /// ASCII and CJK punctuation, trailing spaces, CJK runs, digits.
    DeepseekLlm,
}

/// The `tokenizer.ggml.pre` names understood, and what each maps to.
const NAMES: &[(&str, PreTokenizer)] = &[
    ("gpt-2", PreTokenizer::Gpt2),
    ("gpt2", PreTokenizer::Gpt2),
    ("phi-2", PreTokenizer::Gpt2),
    ("mpt", PreTokenizer::Gpt2),
    ("olmo", PreTokenizer::Gpt2),
    ("roberta-bpe", PreTokenizer::Gpt2),
    ("llama3", PreTokenizer::Llama3),
    ("llama-bpe", PreTokenizer::Llama3),
    ("llama-v3", PreTokenizer::Llama3),
    ("falcon3", PreTokenizer::Llama3),
    ("smollm", PreTokenizer::Smollm),
    ("starcoder", PreTokenizer::Smollm),
    ("refact", PreTokenizer::Smollm),
    ("codeshell", PreTokenizer::Smollm),
    ("qwen2", PreTokenizer::Qwen2),
    ("deepseek-r1-qwen", PreTokenizer::Qwen2),
    ("stablelm2", PreTokenizer::Qwen2),
    ("deepseek-llm", PreTokenizer::DeepseekLlm),
];

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK_LLM: &[&str] = &[
    r"[\r\n]",
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
    r"\s+$",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}+",
];

impl PreTokenizer {
    /// The pre-tokenizer that `tokenizer.ggml.pre` names.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] naming `name` and the supported names when it
    /// is not one of them.
    pub fn from_name(name: &str) -> Result<PreTokenizer> {
        NAMES.iter().find(|(n, _)| *n == name).map(|&(_, p)| p).ok_or_else(|| {
            let known: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
            Error::Tokenizer(format!(
                "unsupported pre-tokenizer `{name}` (tokenizer.ggml.pre); supported: {}",
                known.join(", ")
            ))
        })
    }

    /// The family's canonical name (`gpt2`, `llama3`, `smollm`, `qwen2`,
    /// `deepseek-llm`).
    pub fn name(self) -> &'static str {
        match self {
            PreTokenizer::Gpt2 => "gpt2",
            PreTokenizer::Llama3 => "llama3",
            PreTokenizer::Smollm => "smollm",
            PreTokenizer::Qwen2 => "qwen2",
            PreTokenizer::DeepseekLlm => "deepseek-llm",
        }
    }

    /// The expressions applied in turn.
    fn patterns(self) -> &'static [&'static str] {
        match self {
            PreTokenizer::Gpt2 => &[GPT2],
            PreTokenizer::Llama3 => &[LLAMA3],
            PreTokenizer::Smollm => &[r"\p{N}", GPT2],
            PreTokenizer::Qwen2 => &[QWEN2],
            PreTokenizer::DeepseekLlm => DEEPSEEK_LLM,
        }
    }

    /// Whether a word that is itself a token is taken whole, without
    /// merging (llama.cpp's `ignore_merges`, set for Llama 3 only).
    pub(crate) fn ignore_merges(self) -> bool {
        self == PreTokenizer::Llama3
    }

    /// Whether BOS is added when the file does not say (llama.cpp's
    /// default per family).
    pub(crate) fn default_add_bos(self) -> bool {
        matches!(self, PreTokenizer::Llama3 | PreTokenizer::DeepseekLlm)
    }
}

/// The compiled expressions of one [`PreTokenizer`].
#[derive(Clone, Debug)]
pub(crate) struct Splitter {
    regexes: Vec<Regex>,
}

impl Splitter {
    /// Compiles the expressions of `pre`.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if an expression does not compile (a bug).
    pub fn new(pre: PreTokenizer) -> Result<Splitter> {
        let regexes = pre
            .patterns()
            .iter()
            .map(|p| Regex::new(p).map_err(|e| Error::Tokenizer(format!("pre-tokenizer `{}`: {e}", pre.name()))))
            .collect::<Result<_>>()?;
        Ok(Splitter { regexes })
    }

    /// Calls `f` with each word of `text`, in order, until it breaks (then
    /// returns `Break`): each expression is applied to the pieces the
    /// previous one left, one piece at a time, so that the words come as
    /// they are found and none is kept. Their concatenation is `text`.
    ///
    /// Should an expression's matcher give up (fancy-regex limits how far
    /// it backtracks), the rest of that piece is kept as one word: the
    /// tokens then still spell the text, only split differently.
    pub fn each_word<'t>(&self, text: &'t str, f: &mut dyn FnMut(&'t str) -> ControlFlow<()>) -> ControlFlow<()> {
        self.split_at_level(0, text, f)
    }

    /// [`Splitter::each_word`] from expression `level` on.
    fn split_at_level<'t>(
        &self,
        level: usize,
        piece: &'t str,
        f: &mut dyn FnMut(&'t str) -> ControlFlow<()>,
    ) -> ControlFlow<()> {
        let Some(re) = self.regexes.get(level) else { return f(piece) };
        let mut pos = 0;
        for m in re.find_iter(piece) {
            let Ok(m) = m else { break };
            if m.start() > pos {
                self.split_at_level(level + 1, &piece[pos..m.start()], f)?;
            }
            if m.end() > m.start() {
                self.split_at_level(level + 1, m.as_str(), f)?;
            }
            pos = m.end();
        }
        if pos < piece.len() {
            self.split_at_level(level + 1, &piece[pos..], f)?;
        }
        ControlFlow::Continue(())
    }
}
