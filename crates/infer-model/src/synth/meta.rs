//! Metadata of a synthetic file: `general.*`, the hyper-parameter keys and
//! the tokenizer (copied from a real file or generated).

use super::{SynthArch, SynthQuant, SynthShape};
use crate::gguf::{GgufFile, Value};
use crate::{Error, Result};

/// Where the tokenizer metadata of a synthetic file comes from.
#[derive(Clone, Copy)]
pub enum SynthVocab<'a> {
    /// Every `tokenizer.*` key of a real model file, copied as is; its
    /// vocabulary must have exactly the shape's `n_vocab` tokens.
    CopyFrom(&'a GgufFile),
    /// A small SentencePiece vocabulary (see [`generated_vocab`]).
    Generated,
}

impl std::fmt::Debug for SynthVocab<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SynthVocab::CopyFrom(_) => f.write_str("CopyFrom(..)"),
            SynthVocab::Generated => f.write_str("Generated"),
        }
    }
}

/// GGUF token types (`tokenizer.ggml.token_type`).
const TT_NORMAL: i32 = 1;
const TT_UNKNOWN: i32 = 2;
const TT_CONTROL: i32 = 3;
const TT_UNUSED: i32 = 5;
const TT_BYTE: i32 = 6;

/// A generated SentencePiece (`tokenizer.ggml.model = "llama"`) vocabulary
/// of exactly `n_vocab` tokens, as `tokenizer.ggml.*` metadata entries:
/// `<unk>` (0), `<s>` (1, BOS), `</s>` (2, EOS), the 256 byte tokens
/// `<0x00>`..`<0xFF>` (so that any text encodes by byte fallback, and
/// llama.cpp finds its newline token), printable ASCII characters with and
/// without the `▁` space marker, lower-case letter pairs with and without
/// it, then `<unused_N>` slots up to `n_vocab`. Scores favour longer pieces.
///
/// # Errors
/// [`Error::Tokenizer`] when `n_vocab` is smaller than the 259 tokens that
/// must be there.
pub fn generated_vocab(n_vocab: usize) -> Result<Vec<(String, Value)>> {
    const FIXED: usize = 3 + 256;
    if n_vocab < FIXED {
        return Err(Error::Tokenizer(format!(
            "a generated vocabulary needs at least {FIXED} tokens, asked for {n_vocab}"
        )));
    }
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut scores = vec![0f32; 3];
    let mut types = vec![TT_UNKNOWN, TT_CONTROL, TT_CONTROL];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(TT_BYTE);
    }
    let mut pieces: Vec<String> = vec!["\u{2581}".into()];
    for c in (0x21u8..=0x7e).map(char::from) {
        pieces.push(c.to_string());
        pieces.push(format!("\u{2581}{c}"));
    }
    for a in 'a'..='z' {
        for b in 'a'..='z' {
            pieces.push(format!("{a}{b}"));
            pieces.push(format!("\u{2581}{a}{b}"));
        }
    }
    for p in pieces.into_iter().take(n_vocab - FIXED) {
        // Longer pieces merge first; ties keep their order.
        scores.push(-1000.0 + p.chars().count() as f32 * 100.0 - tokens.len() as f32 * 1e-3);
        tokens.push(p);
        types.push(TT_NORMAL);
    }
    let mut unused = 0usize;
    while tokens.len() < n_vocab {
        tokens.push(format!("<unused_{unused}>"));
        scores.push(-1e9);
        types.push(TT_UNUSED);
        unused += 1;
    }
    let p = |k: &str| format!("tokenizer.ggml.{k}");
    Ok(vec![
        (p("model"), Value::from("llama")),
        (p("pre"), Value::from("default")),
        (p("tokens"), Value::from(tokens)),
        (p("scores"), Value::from(scores)),
        (p("token_type"), Value::from(types)),
        (p("bos_token_id"), Value::U32(1)),
        (p("eos_token_id"), Value::U32(2)),
        (p("unknown_token_id"), Value::U32(0)),
        (p("add_bos_token"), Value::Bool(true)),
        (p("add_eos_token"), Value::Bool(false)),
    ])
}

/// Every `tokenizer.*` entry of `file`, checked to hold `n_vocab` tokens.
fn copied_vocab(file: &GgufFile, n_vocab: usize) -> Result<Vec<(String, Value)>> {
    let n = file.get_array("tokenizer.ggml.tokens")?.len();
    if n != n_vocab {
        return Err(Error::Tokenizer(format!(
            "the tokenizer to copy has {n} tokens, the synthetic model needs {n_vocab}"
        )));
    }
    Ok(file.metadata().iter().filter(|(k, _)| k.starts_with("tokenizer.")).cloned().collect())
}

/// The metadata of a synthetic file, in file order: `general.*`, the
/// architecture's hyper-parameter keys (named as llama.cpp's converter
/// writes them for the real model), then the tokenizer. `general.name`
/// and `general.description` say that the weights are random;
/// `infer.synth.seed` records the seed.
///
/// # Errors
/// An invalid shape; a tokenizer to copy whose size differs from `n_vocab`;
/// a vocabulary too small to generate.
pub fn metadata(
    shape: &SynthShape,
    quant: SynthQuant,
    seed: u64,
    vocab: SynthVocab<'_>,
) -> Result<Vec<(String, Value)>> {
    shape.validate()?;
    let s = shape;
    let a = s.arch.name();
    let u = |v: usize| Value::U32(v as u32);
    let mut m: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::from(a)),
        ("general.type".into(), Value::from("model")),
        ("general.name".into(), Value::from(format!("{} (synthetic, random weights)", s.model_name))),
        (
            "general.description".into(),
            Value::from(format!(
                "Random weights with the shapes and {} tensor types of {}, written by `infer synth` with seed {seed}. \
                 Not a trained model: for speed measurements only.",
                quant.name().to_uppercase(),
                s.model_name
            )),
        ),
        ("general.size_label".into(), Value::from(s.size_label.as_str())),
        ("general.file_type".into(), Value::U32(quant.file_type())),
        ("general.quantization_version".into(), Value::U32(2)),
        ("infer.synth.seed".into(), Value::U64(seed)),
    ];
    let k = |key: &str| format!("{a}.{key}");
    m.push((k("context_length"), u(s.n_ctx_train)));
    m.push((k("embedding_length"), u(s.n_embd)));
    m.push((k("block_count"), u(s.n_layer)));
    m.push((k("feed_forward_length"), u(s.n_ff)));
    m.push((k("attention.head_count"), u(s.n_head)));
    m.push((k("attention.head_count_kv"), u(s.n_head_kv)));
    m.push((k("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps)));
    m.push((k("attention.key_length"), u(s.head_dim)));
    m.push((k("attention.value_length"), u(s.head_dim)));
    m.push((k("rope.freq_base"), Value::F32(s.rope_base)));
    if let Some(w) = s.sliding_window {
        m.push((k("attention.sliding_window"), u(w)));
    }
    if let Some(f) = s.rope_scaling {
        m.push((k("rope.scaling.type"), Value::from("linear")));
        m.push((k("rope.scaling.factor"), Value::F32(f)));
    }
    if matches!(s.arch, SynthArch::Llama | SynthArch::Phi3) || s.n_rot != s.head_dim {
        m.push((k("rope.dimension_count"), u(s.n_rot)));
    }
    if s.arch == SynthArch::Llama {
        m.push((k("vocab_size"), u(s.n_vocab)));
    }
    if let Some(c) = s.attn_softcap {
        m.push((k("attn_logit_softcapping"), Value::F32(c)));
    }
    if let Some(c) = s.final_softcap {
        m.push((k("final_logit_softcapping"), Value::F32(c)));
    }
    m.extend(match vocab {
        SynthVocab::CopyFrom(file) => copied_vocab(file, s.n_vocab)?,
        SynthVocab::Generated => generated_vocab(s.n_vocab)?,
    });
    Ok(m)
}
