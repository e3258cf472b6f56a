//! Tokenizer tests: a tiny hand-made SentencePiece vocabulary for the
//! algorithm and the error paths, the default model (Gemma 3 270M), and
//! every model's reference cases in the test data against llama.cpp's token
//! ids.

mod tokenizer_util;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use infer_model::gguf::{GgufFile, GgufWriter};
use infer_model::tokenizer::{SpmVocab, TokenType, Tokenizer};
use infer_model::Error;
use tokenizer_util::{check_case, testdata};

// ---------------------------------------------------------------------------
// A tiny vocabulary.

const UNK: u32 = 0;
const BOS: u32 = 1;
const EOS: u32 = 2;
const START: u32 = 3;
const NEWLINE: u32 = 4;

/// Specials, a few scored pieces, then the 256 byte tokens.
fn tiny_vocab() -> SpmVocab {
    let specials: &[(&str, i32)] =
        &[("<unk>", 2), ("<s>", 3), ("</s>", 3), ("<start>", 3), ("\n", 4), ("<unused0>", 5)];
    let pieces: &[(&str, f32)] = &[
        ("\u{2581}", -10.0),
        ("a", -1.0),
        ("b", -1.0),
        ("c", -1.0),
        ("ab", -3.0),
        ("bc", -2.0),
        ("abc", -4.0),
        ("aa", -2.0),
        ("\u{2581}a", -5.0),
        ("é", -1.0),
    ];
    let mut v = SpmVocab::default();
    let (mut tokens, mut scores, mut types) = (Vec::new(), Vec::new(), Vec::new());
    for &(t, ty) in specials {
        tokens.push(t.to_string());
        scores.push(-1000.0);
        types.push(ty);
    }
    for &(t, s) in pieces {
        tokens.push(t.to_string());
        scores.push(s);
        types.push(1);
    }
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(6);
    }
    v.tokens = tokens;
    v.scores = Some(scores);
    v.token_types = Some(types);
    v
}

fn tiny(space_prefix: bool) -> Tokenizer {
    let mut v = tiny_vocab();
    v.add_space_prefix = Some(space_prefix);
    Tokenizer::from_vocab(v).expect("tiny vocabulary")
}

fn pieces(t: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&id| t.piece(id).unwrap().to_string()).collect()
}

#[test]
fn tiny_defaults() {
    let t = Tokenizer::from_vocab(tiny_vocab()).unwrap();
    assert_eq!(t.n_vocab(), 6 + 10 + 256);
    assert_eq!((t.unk_id(), t.bos_id(), t.eos_id()), (Some(UNK), Some(BOS), Some(EOS)));
    assert!(t.add_bos() && !t.add_eos() && t.add_space_prefix());
    assert!(t.is_eog(EOS) && !t.is_eog(BOS));
    assert_eq!(t.token_id("<start>"), Some(START));
    assert_eq!(t.token_id("\u{2581}a"), Some(14));
    assert_eq!(t.token_id("zz"), None);
    assert_eq!(t.token_type(NEWLINE), Some(TokenType::UserDefined));
    assert_eq!(t.token_type(9999), None);
    assert!(t.is_special(START) && t.is_special(UNK) && !t.is_special(NEWLINE));
}

#[test]
fn tiny_merges_by_score() {
    let t = tiny(false);
    // bc (-2) merges before ab (-3); then a+bc = abc.
    assert_eq!(pieces(&t, &t.encode("abc", false)), ["abc"]);
    // a b c b: bc first, then abc; "bcb" is not a token.
    assert_eq!(pieces(&t, &t.encode("abcb", false)), ["abc", "b"]);
    // Equal scores: the leftmost pair merges first.
    assert_eq!(pieces(&t, &t.encode("aaa", false)), ["aa", "a"]);
    assert_eq!(pieces(&t, &t.encode("aaaa", false)), ["aa", "aa"]);
    assert_eq!(t.encode("", false), Vec::<u32>::new());
    assert_eq!(t.encode("", true), vec![BOS]);
}

#[test]
fn tiny_space_prefix_and_specials() {
    let t = tiny(true);
    assert_eq!(pieces(&t, &t.encode("a", false)), ["\u{2581}a"]);
    assert_eq!(pieces(&t, &t.encode("a a", false)), ["\u{2581}a", "\u{2581}a"]);
    // A space is put in front of text that follows a special token.
    assert_eq!(t.encode("<start>a", true), vec![BOS, START, 14]);
    assert_eq!(t.decode_with(&t.encode("<start>a", true), true), "a");
    // User-defined tokens are cut out too (and a space follows them).
    assert_eq!(pieces(&t, &t.encode("a\na", false)), ["\u{2581}a", "\n", "\u{2581}a"]);
    // Without parsing specials, `<start>` is plain text (byte fallback).
    let plain = t.encode_with("<start>", false, false);
    assert!(!plain.contains(&START));
    assert_eq!(t.decode(&plain), "<start>");
    // User-defined tokens are matched even then.
    assert!(t.encode_with("a\n", false, false).contains(&NEWLINE));
    let t = tiny(false);
    assert_eq!(pieces(&t, &t.encode("a", false)), ["a"]);
    assert_eq!(t.encode("<start>a", false), vec![START, t.token_id("a").unwrap()]);
}

#[test]
fn tiny_round_trips() {
    for prefix in [false, true] {
        let t = tiny(prefix);
        for text in ["abc", "a b  c", " a", "a\n\nb ", "x€é<start>q", "<s>ab</s>", ""] {
            let ids = t.encode(text, false);
            assert_eq!(t.decode(&ids), text, "prefix {prefix}, {text:?} -> {ids:?}");
        }
    }
}

#[test]
fn tiny_byte_fallback_and_streaming() {
    let t = tiny(false);
    // '€' is not in the vocabulary: three byte tokens.
    let ids = t.encode("€", false);
    assert_eq!(pieces(&t, &ids), ["<0xE2>", "<0x82>", "<0xAC>"]);
    assert_eq!(t.token_bytes(ids[0]), Some(&[0xE2u8][..]));
    let mut d = t.decoder(false);
    assert_eq!(d.push(ids[0]), "");
    assert_eq!(d.push(ids[1]), "");
    assert!(d.has_pending());
    assert_eq!(d.push(ids[2]), "€");
    assert!(!d.has_pending());
    // An unfinished character interrupted by other text becomes U+FFFD.
    let a = t.token_id("a").unwrap();
    assert_eq!(d.push(ids[0]), "");
    assert_eq!(d.push(a), "\u{FFFD}a");
    assert_eq!(d.push(ids[0]), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    // Ids outside the vocabulary.
    assert_eq!(d.push(100_000), "\u{FFFD}");
    assert_eq!(t.decode(&[a, 100_000, a]), "a\u{FFFD}a");
    assert!(matches!(t.try_decode(&[a, 100_000]), Err(Error::Tokenizer(_))));
    assert_eq!(t.try_decode(&[a]).unwrap(), "a");
    // Unused tokens decode as nothing; specials can be skipped.
    let unused = t.token_id("<unused0>").unwrap();
    assert_eq!(t.decode(&[BOS, a, unused, EOS]), "<s>a</s>");
    assert_eq!(t.decode_with(&[BOS, a, unused, EOS], true), "a");
}

#[test]
fn tiny_byte_fallback_without_byte_tokens() {
    let mut v = tiny_vocab();
    let n = v.tokens.len() - 256;
    v.tokens.truncate(n);
    v.scores.as_mut().unwrap().truncate(n);
    v.token_types.as_mut().unwrap().truncate(n);
    let t = Tokenizer::from_vocab(v).unwrap();
    assert_eq!(t.encode_with("a€", false, true), vec![t.token_id("\u{2581}a").unwrap(), UNK, UNK, UNK]);
}

#[test]
fn tiny_rejects_bad_vocabularies() {
    let bad = |v: SpmVocab| match Tokenizer::from_vocab(v) {
        Err(Error::Tokenizer(m)) => m,
        other => panic!("expected a tokenizer error, got {other:?}"),
    };
    let mut v = tiny_vocab();
    v.scores.as_mut().unwrap().pop();
    assert!(bad(v).contains("scores"));
    let mut v = tiny_vocab();
    v.scores.as_mut().unwrap()[7] = f32::NAN;
    assert_eq!(bad(v), "the merge score of token 7 is NaN");
    let mut v = tiny_vocab();
    v.token_types.as_mut().unwrap().push(1);
    assert!(bad(v).contains("token types"));
    let mut v = tiny_vocab();
    v.tokens[8] = "a".into();
    assert!(bad(v).contains("same text"));
    let mut v = tiny_vocab();
    let last = v.tokens.len() - 1;
    v.tokens[last] = "<0xZZ>".into();
    assert!(bad(v).contains("byte token"));
    assert!(bad(SpmVocab::default()).contains("empty"));
    // Out-of-range special ids fall back to the defaults.
    let mut v = tiny_vocab();
    v.bos_id = Some(1_000_000);
    v.eos_id = Some(START);
    let t = Tokenizer::from_vocab(v).unwrap();
    assert_eq!((t.bos_id(), t.eos_id()), (Some(BOS), Some(START)));
}

fn gguf_with(entries: Vec<(&str, infer_model::gguf::Value)>) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in entries {
        w.add_metadata(k, v).unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

#[test]
fn from_gguf_metadata_and_errors() {
    let v = tiny_vocab();
    let base = || {
        vec![
            ("tokenizer.ggml.model", "llama".into()),
            ("tokenizer.ggml.tokens", v.tokens.clone().into()),
            ("tokenizer.ggml.scores", v.scores.clone().unwrap().into()),
            ("tokenizer.ggml.token_type", v.token_types.clone().unwrap().into()),
        ]
    };
    let mut e = base();
    e.push(("tokenizer.ggml.add_space_prefix", false.into()));
    e.push(("tokenizer.ggml.bos_token_id", START.into()));
    let t = Tokenizer::from_gguf(&gguf_with(e)).unwrap();
    assert!(!t.add_space_prefix());
    assert_eq!(t.bos_id(), Some(START));
    assert_eq!(pieces(&t, &t.encode("abcb", false)), ["abc", "b"]);

    let mut e = base();
    e[0].1 = "rwkv".into();
    match Tokenizer::from_gguf(&gguf_with(e)) {
        Err(Error::Tokenizer(m)) => assert!(m.contains("rwkv"), "{m}"),
        other => panic!("{other:?}"),
    }
    let mut e = base();
    e.remove(1);
    assert!(matches!(Tokenizer::from_gguf(&gguf_with(e)), Err(Error::MissingKey(_))));
    let mut e = base();
    e[2].1 = vec![1.0f32, 2.0].into();
    assert!(matches!(Tokenizer::from_gguf(&gguf_with(e)), Err(Error::Tokenizer(_))));
    let mut e = base();
    e[3].1 = "oops".into();
    assert!(matches!(Tokenizer::from_gguf(&gguf_with(e)), Err(Error::KeyType { .. })));
    // Scores and types are optional.
    let mut e = base();
    e.truncate(2);
    let t = Tokenizer::from_gguf(&gguf_with(e)).unwrap();
    assert_eq!(t.token_type(0), Some(TokenType::Normal));
}

// ---------------------------------------------------------------------------
// The default model.

/// The default model (`$INFER_MODEL`, else the cached download, fetched
/// when absent).
fn model_path() -> PathBuf {
    infer_model::fetch::default_model_path().unwrap_or_else(|e| panic!("default model: {e}"))
}

fn gemma() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = model_path();
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        let t0 = Instant::now();
        let tok = Tokenizer::from_gguf(&file).expect("Gemma 3 tokenizer");
        eprintln!("tokenizer loaded in {:?}", t0.elapsed());
        tok
    })
}

#[test]
fn gemma_metadata() {
    let t = gemma();
    assert_eq!(t.n_vocab(), 262_144);
    assert_eq!((t.bos_id(), t.eos_id(), t.unk_id(), t.pad_id()), (Some(2), Some(1), Some(3), Some(0)));
    assert_eq!(t.eot_id(), Some(106));
    assert!(t.is_eog(1) && t.is_eog(106) && !t.is_eog(2));
    assert!(t.add_bos() && !t.add_eos());
    assert!(!t.add_space_prefix(), "Gemma 3 sets tokenizer.ggml.add_space_prefix = false");
    assert_eq!(t.token_id("<start_of_turn>"), Some(105));
    assert_eq!(t.token_id("<0x0A>"), Some(248));
    assert_eq!(t.token_type(248), Some(TokenType::Byte));
    assert_eq!(t.token_bytes(248), Some(&b"\n"[..]));
    assert_eq!(t.token_bytes(1902), Some(&b" world"[..]));
}

/// Every reference case of every model in the test data (`tokNN.json` and
/// the prompts of `logits*/pNN.json`), exactly; each model's file is
/// fetched by its name when absent.
#[test]
fn golden_cases_every_model() {
    let dirs = tokenizer_util::model_dirs();
    assert!(dirs.iter().any(|d| d.ends_with("gemma3-270m")), "no gemma3-270m test data in {}", testdata().display());
    let mut failures = Vec::new();
    let (mut models, mut total) = (0, 0);
    for dir in &dirs {
        let tok = match tokenizer_util::tokenizer_for(dir) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        let cases = tokenizer_util::cases(dir);
        assert!(!cases.is_empty(), "no tokNN.json in {}/tokenizer", dir.display());
        let before = failures.len();
        for (path, text, ids) in &cases {
            if let Err(e) = check_case(&tok, path, text, ids) {
                failures.push(e);
            }
        }
        println!("{}: {} of {} cases exact", dir.display(), cases.len() - (failures.len() - before), cases.len());
        models += 1;
        total += cases.len();
    }
    println!("tokenizer cases: {} of {total} passed ({models} models)", total - failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn gemma_special_parsing_and_round_trips() {
    let t = gemma();
    let turn = "<start_of_turn>user\nHi<end_of_turn>";
    assert_eq!(t.encode(turn, false), vec![105, 2364, 107, 10979, 106]);
    let plain = t.encode_with(turn, false, false);
    assert!(!plain.contains(&105) && !plain.contains(&106));
    assert_eq!(t.decode(&plain), turn);
    assert_eq!(t.decode_with(&t.encode(turn, true), true), "user\nHi");
    for text in [
        "",
        " ",
        "   x   ",
        "\t\ttabs\n\n\n\nand newlines\r\n",
        "<b>bold</b> <table> <0x41> <bos>",
        "mixed 日本語 עברית العربية Ελληνικά 한국어 🦀🧑‍🚀",
        "\u{10FFFD}ꙮ\u{378}𓀀 rare",
        "a".repeat(3000).as_str(),
    ] {
        let ids = t.encode(text, false);
        assert_eq!(t.decode(&ids), text, "{ids:?}");
    }
}

#[test]
fn gemma_byte_fallback_streams_whole_chars() {
    let t = gemma();
    // U+10FFFD is not in the vocabulary: four byte tokens.
    let text = "x\u{10FFFD}y";
    let ids = t.encode(text, false);
    let types: Vec<_> = ids.iter().map(|&i| t.token_type(i).unwrap()).collect();
    assert_eq!(types.iter().filter(|&&ty| ty == TokenType::Byte).count(), 4, "{ids:?}");
    let mut d = t.decoder(false);
    let mut chunks = Vec::new();
    for &id in &ids {
        let s = d.push(id);
        assert!(!s.contains('\u{FFFD}'));
        chunks.push(s);
    }
    chunks.push(d.finish());
    assert_eq!(chunks.concat(), text);
    assert!(chunks.iter().any(|c| c == "\u{10FFFD}"), "{chunks:?}");
}

#[test]
fn gemma_encode_speed() {
    let t = gemma();
    let prompt = "The committee met on Tuesday to review the quarterly budget. After a long \
        discussion about rising costs, unexpected repairs to the old library roof and the new \
        software licences, the members agreed to postpone the purchase of new furniture until \
        spring. Several residents asked whether the summer reading programme would continue; \
        the chair promised an answer by the end of the month, once the grant application had \
        been reviewed by the regional office. Refreshments were served afterwards.";
    let n = t.encode(prompt, true).len();
    assert!((80..=200).contains(&n), "{n} tokens");
    let mut best = Duration::MAX;
    for _ in 0..20 {
        let t0 = Instant::now();
        std::hint::black_box(t.encode(std::hint::black_box(prompt), true));
        best = best.min(t0.elapsed());
    }
    println!("encoding {n} tokens: {best:?} (best of 20)");
    assert!(best < Duration::from_millis(10), "{best:?}");
}

#[test]
fn gemma_long_whitespace_runs() {
    let t = gemma();
    // Newline runs are user-defined tokens of up to 31 newlines, taken
    // longest first.
    assert_eq!(t.encode(&"\n".repeat(31), false), vec![137]);
    assert_eq!(t.encode(&"\n".repeat(33), false), vec![137, 108]);
    // Long runs of pre-tokenized whitespace stay linear in the text length.
    for text in ["\n".repeat(300_000), " ".repeat(300_000) + "x", "\t \n".repeat(100_000)] {
        let t0 = Instant::now();
        let ids = t.encode(&text, false);
        let took = t0.elapsed();
        assert_eq!(t.decode(&ids), text);
        println!("{} bytes of whitespace: {} tokens in {took:?}", text.len(), ids.len());
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
}

// ---------------------------------------------------------------------------
// End-of-generation tokens found by their text (llama.cpp's rules).

/// A SentencePiece vocabulary laid out like Gemma 3's: `<eos>` 1, `<bos>`
/// 2, `<end_of_turn>` a control token, `</s>` a user-defined token (text,
/// not EOS), the pieces of `</s>` as text, byte tokens; `extra` tokens
/// (text, type) at the end.
fn gemma_like(extra: &[(&str, i32)]) -> SpmVocab {
    let mut entries: Vec<(&str, i32)> =
        vec![("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<end_of_turn>", 3), ("</s>", 4)];
    entries.extend([("<", 1), ("/", 1), ("s", 1), (">", 1), ("</", 1), ("x", 1)]);
    entries.extend_from_slice(extra);
    let mut v = SpmVocab::default();
    for &(t, ty) in &entries {
        v.tokens.push(t.to_string());
        v.token_types.get_or_insert_with(Vec::new).push(ty);
        v.scores.get_or_insert_with(Vec::new).push(if ty == 1 { -1.0 } else { 0.0 });
    }
    for b in 0..=255u8 {
        v.tokens.push(format!("<0x{b:02X}>"));
        v.token_types.as_mut().unwrap().push(6);
        v.scores.as_mut().unwrap().push(0.0);
    }
    v.eos_id = Some(1);
    v.bos_id = Some(2);
    v.add_space_prefix = Some(false);
    v
}

/// Issue 31 item 5: llama.cpp turns every token whose text is `</s>` into
/// an end-of-generation control token (Gemma 3's `</s>` is text, not EOS):
/// generation stops there, and without special parsing the text `</s>` is
/// tokenized as text (it was one user-defined id here, three in llama.cpp).
#[test]
fn a_text_token_spelled_eos_ends_generation_as_in_llama_cpp() {
    let t = Tokenizer::from_vocab(gemma_like(&[])).unwrap();
    let s = t.token_id("</s>").unwrap();
    assert_eq!(t.token_type(s), Some(TokenType::Control));
    assert!(t.is_eog(s) && t.is_eog(1) && t.is_eog(3), "{:?}", t.eog_ids());
    assert_eq!(t.eot_id(), Some(3), "<end_of_turn> stays the end-of-turn token");
    // Parsed as special: one id; as text: its pieces, as llama.cpp does.
    assert_eq!(t.encode_with("x</s>x", false, true), [10, s, 10]);
    let plain = t.encode_with("x</s>x", false, false);
    assert!(!plain.contains(&s), "{:?}", pieces(&t, &plain));
    assert_eq!(pieces(&t, &plain), ["x", "</", "s", ">", "x"]);
    // A control token: left out of decoded text unless asked for.
    assert_eq!(t.decode_with(&[10, s, 10], true), "xx");
    assert_eq!(t.decode_with(&[10, s, 10], false), "x</s>x");
}

/// llama.cpp's exceptions: with `<|tool_response>` (Gemma 4) `</s>` is a
/// normal token and no end of generation; with `<|return|>` and `<|call|>`
/// (gpt-oss) `<|end|>` is a user-defined token and no end of generation.
#[test]
fn llama_cpp_exceptions_to_the_end_of_generation_texts() {
    let t = Tokenizer::from_vocab(gemma_like(&[("<|tool_response>", 3)])).unwrap();
    let (s, tool) = (t.token_id("</s>").unwrap(), t.token_id("<|tool_response>").unwrap());
    assert!(!t.is_eog(s) && t.is_eog(tool), "{:?}", t.eog_ids());
    assert_eq!(t.token_type(s), Some(TokenType::Normal));

    let t = Tokenizer::from_vocab(gemma_like(&[("<|end|>", 3), ("<|return|>", 3), ("<|call|>", 3)])).unwrap();
    let end = t.token_id("<|end|>").unwrap();
    assert!(!t.is_eog(end), "{:?}", t.eog_ids());
    assert_eq!(t.token_type(end), Some(TokenType::UserDefined));
    for text in ["<|return|>", "<|call|>", "</s>", "<end_of_turn>"] {
        assert!(t.is_eog(t.token_id(text).unwrap()), "{text}");
    }
    // `<|end|>` alone ends the generation.
    let t = Tokenizer::from_vocab(gemma_like(&[("<|end|>", 3)])).unwrap();
    assert!(t.is_eog(t.token_id("<|end|>").unwrap()));
}

/// Issue 31 item 6: a special-token id past the vocabulary is reported (as
/// llama.cpp's "bad special token" warning), once, with the id used
/// instead; a sound file has no warning.
#[test]
fn special_ids_past_the_vocabulary_are_warned_about() {
    let mut v = tiny_vocab();
    v.bos_id = Some(1_000_000);
    v.eot_id = Some(5000);
    let t = Tokenizer::from_vocab(v).unwrap();
    assert_eq!(t.bos_id(), Some(BOS));
    assert_eq!(
        t.warnings(),
        [
            "bad special token: tokenizer.ggml.bos_token_id = 1000000 is past the vocabulary of 272 tokens; using the \
             default id 1",
            "bad special token: tokenizer.ggml.eot_token_id = 5000 is past the vocabulary of 272 tokens; there is no \
             such token",
        ]
    );
    assert!(Tokenizer::from_vocab(tiny_vocab()).unwrap().warnings().is_empty());
}
