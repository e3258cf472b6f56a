//! Byte-level BPE tests: a tiny hand-made vocabulary for the algorithm and
//! the error paths, SmolLM2's tokenizer, llama.cpp's own vocabulary test
//! files where a llama.cpp source tree is present, and round-trip property
//! tests of both tokenizers on random Unicode text.

mod tokenizer_util;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use infer_model::gguf::{GgufFile, GgufWriter};
use infer_model::tokenizer::{BpeVocab, PreTokenizer, TokenType, Tokenizer, TokenizerKind};
use infer_model::Error;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokenizer_util::{testdata, tokenizer_for};

// ---------------------------------------------------------------------------
// A tiny vocabulary: the 256 byte characters (ids 0..=255), a few merged
// tokens, then three control tokens.

/// GPT-2's byte-to-character table, written out independently of the
/// library's.
fn byte_char(b: u8) -> char {
    let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable {
        return b as char;
    }
    let n = (0..b).filter(|&x| !matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

fn tiny_vocab(pre: &str) -> BpeVocab {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    for t in ["ab", "bc", "abc", "aa", "\u{120}a", "<|im_start|>", "<|im_end|>", "<|endoftext|>"] {
        tokens.push(t.to_string());
    }
    let mut types = vec![1; tokens.len()];
    let n = types.len();
    for t in &mut types[n - 3..] {
        *t = 3;
    }
    BpeVocab {
        tokens,
        merges: ["b c", "a b", "a bc", "a a", "\u{120} a"].map(String::from).to_vec(),
        token_types: Some(types),
        pre: pre.into(),
        eos_id: Some(258 + 5),
        ..Default::default()
    }
}

fn tiny() -> Tokenizer {
    Tokenizer::from_bpe_vocab(tiny_vocab("gpt2")).expect("tiny vocabulary")
}

fn pieces(t: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&id| t.piece(id).unwrap().to_string()).collect()
}

#[test]
fn tiny_merges_by_rank() {
    let t = tiny();
    assert_eq!(t.kind(), TokenizerKind::ByteLevelBpe(PreTokenizer::Gpt2));
    // b+c (rank 0) before a+b (rank 1), then a+bc (rank 2).
    assert_eq!(pieces(&t, &t.encode("abc", false)), ["abc"]);
    // Equal ranks: the leftmost pair first.
    assert_eq!(pieces(&t, &t.encode("aaa", false)), ["aa", "a"]);
    assert_eq!(pieces(&t, &t.encode("abab", false)), ["ab", "ab"]);
    // The pre-tokenizer keeps the space with the word that follows.
    assert_eq!(pieces(&t, &t.encode("a a", false)), ["a", "\u{120}a"]);
    assert_eq!(pieces(&t, &t.encode("a\n", false)), ["a", "\u{10a}"]);
    // No BOS by default for GPT-2's family, and no BOS token anyway.
    assert!(!t.add_bos() && !t.add_space_prefix());
    assert_eq!(t.encode("", true), Vec::<u32>::new());
    // Bytes of characters outside the vocabulary's merges stay bytes.
    let euro = t.encode("€", false);
    assert_eq!(euro, vec![0xE2, 0x82, 0xAC]);
    assert_eq!(t.decode(&euro), "€");
}

#[test]
fn tiny_special_tokens_and_eog() {
    let t = tiny();
    let (start, end, eot) = (261, 262, 263);
    assert_eq!(t.encode("<|im_start|>abc<|im_end|>", false), vec![start, 258, end]);
    // Not parsed: plain bytes that decode to the same text.
    let plain = t.encode_with("<|im_start|>", false, false);
    assert!(!plain.contains(&start));
    assert_eq!(t.decode(&plain), "<|im_start|>");
    assert_eq!(t.decode_with(&[start, 258, end], true), "abc");
    // EOS, and tokens recognised by their text.
    assert_eq!(t.eos_id(), Some(263));
    assert_eq!(t.eot_id(), Some(end));
    assert_eq!(t.eog_ids(), &[end, eot]);
    assert!(t.is_eog(end) && t.is_eog(eot) && !t.is_eog(start));
    assert_eq!(t.token_type(start), Some(TokenType::Control));
}

#[test]
fn tiny_streaming_decoder_holds_split_characters() {
    let t = tiny();
    // '€' is three byte tokens: nothing comes out until the last.
    let mut d = t.decoder(false);
    assert_eq!(d.push(0xE2), "");
    assert_eq!(d.push(0x82), "");
    assert!(d.has_pending());
    assert_eq!(d.push(0xAC), "€");
    // An interrupted character becomes U+FFFD.
    assert_eq!(d.push(0xE2), "");
    assert_eq!(d.push(b'a' as u32), "\u{FFFD}a");
    assert_eq!(d.push(0xE2), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    assert_eq!(t.decode(&[b'a' as u32, 100_000]), "a\u{FFFD}");
    assert!(matches!(t.try_decode(&[100_000]), Err(Error::Tokenizer(_))));
}

#[test]
fn tiny_rejects_bad_vocabularies() {
    let bad = |v: BpeVocab| match Tokenizer::from_bpe_vocab(v) {
        Err(Error::Tokenizer(m)) => m,
        other => panic!("expected a tokenizer error, got {other:?}"),
    };
    let m = bad(tiny_vocab("gpt-4-turbo"));
    assert!(m.contains("gpt-4-turbo") && m.contains("smollm") && m.contains("qwen2"), "{m}");
    let mut v = tiny_vocab("gpt2");
    v.merges.clear();
    assert!(bad(v).contains("merges"));
    let mut v = tiny_vocab("gpt2");
    v.merges.push("abc".into());
    assert!(bad(v).contains("merge"));
    let mut v = tiny_vocab("gpt2");
    v.tokens[300 - 40] = "a".into();
    assert!(bad(v).contains("same text"));
    let mut v = tiny_vocab("gpt2");
    v.token_types.as_mut().unwrap().pop();
    assert!(bad(v).contains("token types"));
    // Merges naming texts that are not tokens are skipped.
    let mut v = tiny_vocab("gpt2");
    v.merges.insert(0, "x yz".into());
    let t = Tokenizer::from_bpe_vocab(v).unwrap();
    assert_eq!(pieces(&t, &t.encode("abc", false)), ["abc"]);
    // Every supported name builds.
    for pre in ["gpt2", "gpt-2", "llama3", "llama-bpe", "smollm", "qwen2", "deepseek-llm"] {
        let t = Tokenizer::from_bpe_vocab(tiny_vocab(pre)).unwrap_or_else(|e| panic!("{pre}: {e}"));
        assert_eq!(t.decode(&t.encode("ab c 12 d", false)), "ab c 12 d", "{pre}");
    }
}

fn gguf_with(entries: Vec<(&str, infer_model::gguf::Value)>) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in entries {
        w.add_metadata(k, v).unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

#[test]
fn from_gguf_dispatch_and_errors() {
    let v = tiny_vocab("smollm");
    let base = |model: &str| {
        vec![
            ("tokenizer.ggml.model", model.into()),
            ("tokenizer.ggml.tokens", v.tokens.clone().into()),
            ("tokenizer.ggml.merges", v.merges.clone().into()),
            ("tokenizer.ggml.token_type", v.token_types.clone().unwrap().into()),
            ("tokenizer.ggml.pre", "smollm".into()),
        ]
    };
    let t = Tokenizer::from_gguf(&gguf_with(base("gpt2"))).unwrap();
    assert_eq!(t.kind(), TokenizerKind::ByteLevelBpe(PreTokenizer::Smollm));
    // SmolLM's split puts every digit on its own.
    assert_eq!(t.encode("12", false), vec![b'1' as u32, b'2' as u32]);
    let mut e = base("gpt2");
    e.push(("tokenizer.ggml.add_bos_token", true.into()));
    e.push(("tokenizer.ggml.bos_token_id", 261u32.into()));
    let t = Tokenizer::from_gguf(&gguf_with(e)).unwrap();
    assert_eq!(t.encode("a", true), vec![261, b'a' as u32]);
    // A missing merges list or pre-tokenizer name is a missing key.
    let mut e = base("gpt2");
    e.remove(2);
    assert!(matches!(Tokenizer::from_gguf(&gguf_with(e)), Err(Error::MissingKey(_))));
    let mut e = base("gpt2");
    e.remove(4);
    assert!(matches!(Tokenizer::from_gguf(&gguf_with(e)), Err(Error::MissingKey(_))));
    let mut e = base("gpt2");
    e[4].1 = "mystery".into();
    match Tokenizer::from_gguf(&gguf_with(e)) {
        Err(Error::Tokenizer(m)) => assert!(m.contains("mystery") && m.contains("llama3"), "{m}"),
        other => panic!("{other:?}"),
    }
    match Tokenizer::from_gguf(&gguf_with(base("rwkv"))) {
        Err(Error::Tokenizer(m)) => assert!(m.contains("rwkv") && m.contains("gpt2"), "{m}"),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------
// SmolLM2.

fn smollm_dir() -> PathBuf {
    testdata().join("smollm2-135m")
}

/// SmolLM2's tokenizer (its file fetched and verified when absent).
fn smollm() -> Option<&'static Tokenizer> {
    static TOK: OnceLock<Option<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| match (Instant::now(), tokenizer_for(&smollm_dir())) {
        (t0, Ok(t)) => {
            println!("SmolLM2 tokenizer loaded in {:?}", t0.elapsed());
            Some(t)
        }
        (_, Err(e)) => panic!("{e}"),
    })
    .as_ref()
}

#[test]
fn smollm_metadata() {
    let Some(t) = smollm() else { return };
    assert_eq!(t.kind(), TokenizerKind::ByteLevelBpe(PreTokenizer::Smollm));
    assert_eq!(t.n_vocab(), 49_152);
    assert!(!t.add_bos(), "SmolLM2 sets add_bos_token = false");
    assert_eq!(t.token_id("<|im_start|>"), Some(1));
    assert_eq!(t.token_id("<|im_end|>"), Some(2));
    assert_eq!(t.eos_id(), Some(2));
    assert_eq!(t.eot_id(), Some(2));
    assert!(t.is_eog(2) && t.is_eog(0) && !t.is_eog(1), "{:?}", t.eog_ids());
    assert_eq!(t.token_bytes(t.token_id("\u{120}world").unwrap()), Some(&b" world"[..]));
}

#[test]
fn smollm_special_parsing_and_streaming() {
    let Some(t) = smollm() else { return };
    let turn = "<|im_start|>user\nHi<|im_end|>\n";
    let ids = t.encode(turn, false);
    assert_eq!(ids[0], 1);
    assert_eq!(t.decode(&ids), turn);
    assert_eq!(t.decode_with(&ids, true), "user\nHi\n");
    let plain = t.encode_with(turn, false, false);
    assert!(!plain.contains(&1) && !plain.contains(&2));
    assert_eq!(t.decode(&plain), turn);
    // 🤖 is spread over tokens that each end inside the character.
    let text = "a 🤖 b";
    let ids = t.encode(text, false);
    let mut d = t.decoder(false);
    let mut chunks: Vec<String> = ids.iter().map(|&id| d.push(id)).collect();
    chunks.push(d.finish());
    assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')), "{chunks:?}");
    assert!(chunks.iter().any(|c| c.contains('🤖')), "{chunks:?}");
    assert_eq!(chunks.concat(), text);
}

#[test]
fn smollm_encode_speed() {
    let Some(t) = smollm() else { return };
    let prompt = "The committee met on Tuesday to review the quarterly budget. After a long \
        discussion about rising costs, unexpected repairs to the old library roof and the new \
        software licences, the members agreed to postpone the purchase of new furniture until \
        spring. Several residents asked whether the summer reading programme would continue; \
        the chair promised an answer by the end of the month, once the grant application had \
        been reviewed by the regional office. Refreshments were served afterwards.";
    let n = t.encode(prompt, true).len();
    let mut best = Duration::MAX;
    for _ in 0..20 {
        let t0 = Instant::now();
        std::hint::black_box(t.encode(std::hint::black_box(prompt), true));
        best = best.min(t0.elapsed());
    }
    println!("encoding {n} tokens: {best:?} (best of 20)");
    assert!(best < Duration::from_millis(10), "{best:?}");
    // Long runs of whitespace and of one letter stay fast.
    for text in [" ".repeat(200_000) + "x", "a".repeat(200_000), "\n \t".repeat(50_000)] {
        let t0 = Instant::now();
        let ids = t.encode(&text, false);
        let took = t0.elapsed();
        assert_eq!(t.decode(&ids), text);
        println!("{} bytes: {} tokens in {took:?}", text.len(), ids.len());
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
}

// ---------------------------------------------------------------------------
// Properties of both tokenizers on random text.

/// A random string of `len` characters drawn from ASCII, whitespace runs,
/// Latin-1, CJK, emoji and the whole code space.
fn random_text(rng: &mut ChaCha8Rng, len: usize) -> String {
    let mut s = String::new();
    for _ in 0..len {
        let c = match rng.gen_range(0..10) {
            0..=3 => rng.gen_range(0x20u32..0x7F),
            4 => [' ', '\n', '\t', '\r', ' '][rng.gen_range(0..5)] as u32,
            5 => rng.gen_range(0xA0u32..0x250),
            6 => rng.gen_range(0x4E00u32..0x9FA5),
            7 => rng.gen_range(0x1F300u32..0x1FAFF),
            8 => rng.gen_range(0u32..0x20),
            _ => rng.gen_range(0u32..0x110000),
        };
        s.push(char::from_u32(c).unwrap_or('\u{FFFD}'));
    }
    s
}

/// decode(encode(s)) == s, and the streaming decoder fed token by token
/// gives the same text.
///
/// Byte-level BPE leaves out bytes whose character the vocabulary lacks,
/// so for it characters with such bytes are left out of the text.
fn check_round_trips(name: &str, t: &Tokenizer, seed: u64, n: usize) {
    let representable = |c: char| match t.kind() {
        TokenizerKind::SentencePiece => true,
        TokenizerKind::ByteLevelBpe(_) => {
            c.encode_utf8(&mut [0; 4]).bytes().all(|b| t.token_id(&byte_char(b).to_string()).is_some())
        }
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for i in 0..n {
        let len = rng.gen_range(0..40);
        let mut text: String = random_text(&mut rng, len).chars().filter(|&c| representable(c)).collect();
        // Now and then a control token of the model's chat format, parsed
        // as its token and decoded back to its text.
        if rng.gen_range(0..4) == 0 {
            let specials: Vec<&str> = ["<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "<bos>"]
                .into_iter()
                .filter(|s| t.token_id(s).is_some())
                .collect();
            if !specials.is_empty() {
                let mut at = rng.gen_range(0..=text.chars().count());
                at = text.char_indices().nth(at).map_or(text.len(), |(i, _)| i);
                text.insert_str(at, specials[rng.gen_range(0..specials.len())]);
            }
        }
        let ids = t.encode(&text, false);
        let back = t.decode(&ids);
        assert_eq!(back, text, "{name} case {i}: {ids:?}");
        let mut d = t.decoder(false);
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&d.push(id));
        }
        streamed.push_str(&d.finish());
        assert_eq!(streamed, back, "{name} case {i} streamed");
    }
}

#[test]
fn property_round_trips_tiny_bpe() {
    check_round_trips("tiny BPE", &tiny(), 1, 3000);
}

#[test]
fn property_round_trips_every_model() {
    let mut ran = 0;
    for dir in tokenizer_util::model_dirs() {
        let t = match tokenizer_for(&dir) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        let t0 = Instant::now();
        check_round_trips(&dir.display().to_string(), &t, 2, 3000);
        println!("{}: 3000 random round trips in {:?}", dir.display(), t0.elapsed());
        ran += 1;
    }
    assert!(ran > 0, "no model's tokenizer could be loaded");
}
