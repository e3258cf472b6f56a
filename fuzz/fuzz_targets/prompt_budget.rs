//! Prompts under a token budget: `Tokenizer::encode_at_most` on arbitrary
//! text and limits gives `encode`'s tokens when they fit and `None` when
//! they do not, never a panic; and a prompt read through
//! `infer_model::prompt::read_at_most` is never read past its limit.
//!
//! Input: byte 0 picks the vocabulary (those of the cached models, as the
//! `tokenizer` target finds them, a generated SentencePiece one, and one
//! whose tokens join text to a following space), byte 1 how many times the
//! text is repeated (1 to 16, so that runs pass the tokenizer's 4 KiB
//! pieces), bytes 2..4 the token limit (little-endian), the rest the text.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use infer_model::gguf::{GgufFile, GgufWriter};
use infer_model::tokenizer::{SpmVocab, Tokenizer};
use libfuzzer_sys::fuzz_target;

fn generated() -> Tokenizer {
    let mut w = GgufWriter::new();
    for (k, v) in infer_model::synth::generated_vocab(4096).expect("a generated vocabulary") {
        w.add_metadata(k, v).expect("vocabulary metadata");
    }
    let file = GgufFile::from_bytes(w.to_bytes().expect("in memory")).expect("a valid file");
    Tokenizer::from_gguf(&file).expect("the generated tokenizer")
}

/// Tokens that join text to the space after it (`a▁`, `b▁c`).
fn trailing_spaces() -> Tokenizer {
    let pieces: &[(&str, f32)] =
        &[("\u{2581}", -10.0), ("a", -1.0), ("b", -1.0), ("c", -1.0), ("a\u{2581}", -2.0), ("b\u{2581}c", -1.5)];
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let (mut scores, mut types) = (vec![0.0; 3], vec![2, 3, 3]);
    for &(t, s) in pieces {
        tokens.push(t.into());
        scores.push(s);
        types.push(1);
    }
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(6);
    }
    let v = SpmVocab { tokens, scores: Some(scores), token_types: Some(types), ..Default::default() };
    Tokenizer::from_vocab(v).expect("a vocabulary")
}

fn tokenizers() -> &'static [Tokenizer] {
    static TOKS: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    TOKS.get_or_init(|| {
        let cache = infer_model::fetch::cache_dir();
        let mut paths: Vec<PathBuf> =
            vec![cache.join(infer_model::fetch::DEFAULT_MODEL_FILE), cache.join("SmolLM2-135M-Instruct.Q4_1.gguf")];
        if let Some(more) = std::env::var_os("INFER_FUZZ_MODELS") {
            paths.extend(std::env::split_paths(&more));
        }
        let mut toks: Vec<Tokenizer> = paths
            .iter()
            .filter_map(|p| GgufFile::open(p).ok().map(|f| (p, f)))
            .map(|(p, f)| {
                eprintln!("tokenizer of {}", p.display());
                Tokenizer::from_gguf(&f).expect("the model's tokenizer")
            })
            .collect();
        toks.push(generated());
        toks.push(trailing_spaces());
        toks
    })
}

fuzz_target!(|data: &[u8]| {
    let [pick, repeat, lo, hi, text @ ..] = data else { return };
    let toks = tokenizers();
    let tok = &toks[*pick as usize % toks.len()];
    let text = String::from_utf8_lossy(text).repeat(*repeat as usize % 16 + 1);
    let max = u16::from_le_bytes([*lo, *hi]) as usize;
    for (add_special, parse_special) in [(true, true), (false, false)] {
        let all = tok.encode_with(&text, add_special, parse_special);
        let within = tok.encode_at_most(&text, add_special, parse_special, max);
        if all.len() <= max {
            assert_eq!(within.as_ref(), Some(&all), "{} tokens within {max}", all.len());
        } else {
            assert_eq!(within, None, "{} tokens within {max}", all.len());
        }
    }
    // Read through the prompt limit: at most `max + 3` bytes taken.
    let mut reader = std::io::Cursor::new(text.as_bytes());
    let read = infer_model::prompt::read_at_most(&mut reader, max).expect("reading memory");
    assert!(reader.position() as usize <= max + 3);
    // Refused exactly when the text without one final newline passes `max`.
    let body = text.strip_suffix("\r\n").or_else(|| text.strip_suffix('\n')).unwrap_or(&text);
    match read {
        Some(bytes) => {
            assert_eq!(bytes, text.as_bytes());
            assert!(body.len() <= max, "{} bytes read at {max}", body.len());
        }
        None => assert!(body.len() > max, "{} bytes refused at {max}", body.len()),
    }
});
