//! `Tokenizer::encode_at_most`: a text that must fit in a context is
//! tokenized only until it is known not to, with the tokens of
//! `Tokenizer::encode` when it fits (issue 31, item 2b: a prompt was
//! tokenized whole, at about 22 bytes of memory per byte of text, before
//! the context was checked).
//!
//! The memory is measured by this test binary's own allocator, which keeps
//! the peak of the bytes allocated: deterministic, unlike timings.

mod tokenizer_util;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use infer_model::chat::ChatTemplate;
use infer_model::gguf::{GgufFile, GgufWriter};
use infer_model::tokenizer::{BpeVocab, SpmVocab, Tokenizer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The system allocator, counting the bytes in use and their peak.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `System.alloc`, with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = IN_USE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `alloc` above with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The tests that measure memory run one at a time (the counters are
/// global).
static MEASURE: Mutex<()> = Mutex::new(());

/// What `f` returns, and the most bytes allocated while it ran beyond
/// those in use when it started.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = IN_USE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - base)
}

/// The SentencePiece tokenizer of the synthetic models (4096 tokens, `▁x`
/// pieces only: no token joins text to a following space).
fn generated_spm() -> Tokenizer {
    let mut w = GgufWriter::new();
    for (k, v) in infer_model::synth::generated_vocab(4096).expect("a generated vocabulary") {
        w.add_metadata(k, v).expect("vocabulary metadata");
    }
    let file = GgufFile::from_bytes(w.to_bytes().expect("in memory")).expect("a valid file");
    Tokenizer::from_gguf(&file).expect("the generated tokenizer")
}

/// A SentencePiece vocabulary with tokens that join text to the space
/// after it (`a▁`, `b▁c`): a run of text is then merged whole.
fn spm_with_trailing_spaces() -> Tokenizer {
    let pieces: &[(&str, f32)] = &[
        ("\u{2581}", -10.0),
        ("a", -1.0),
        ("b", -1.0),
        ("c", -1.0),
        ("a\u{2581}", -2.0),
        ("b\u{2581}c", -1.5),
        ("\u{2581}a", -3.0),
        ("ab", -2.5),
    ];
    let mut v = SpmVocab::default();
    let (mut tokens, mut scores, mut types) =
        (vec!["<unk>".to_string(), "<s>".into(), "</s>".into()], vec![0.0; 3], vec![2, 3, 3]);
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
    Tokenizer::from_vocab(v).expect("a vocabulary")
}

/// GPT-2's byte-to-character table, written out independently of the
/// library's.
fn byte_char(b: u8) -> char {
    let printable = |x: u8| matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return b as char;
    }
    char::from_u32(256 + (0..b).filter(|&x| !printable(x)).count() as u32).unwrap_or('?')
}

/// A byte-level BPE tokenizer: the 256 byte characters, a few merges, and
/// ChatML's control tokens.
fn tiny_bpe() -> Tokenizer {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    for t in ["ab", "bc", "abc", "aa", "\u{120}a", "<|im_start|>", "<|im_end|>", "<|endoftext|>"] {
        tokens.push(t.to_string());
    }
    let mut types = vec![1; tokens.len()];
    let n = types.len();
    types[n - 3..].fill(3);
    Tokenizer::from_bpe_vocab(BpeVocab {
        tokens,
        merges: ["b c", "a b", "a bc", "a a", "\u{120} a"].map(String::from).to_vec(),
        token_types: Some(types),
        pre: "gpt2".into(),
        ..Default::default()
    })
    .expect("a vocabulary")
}

/// Random text of `len` characters: letters, spaces and `▁` in runs,
/// newlines, other scripts, and now and then a special token's text.
fn random_text(rng: &mut ChaCha8Rng, len: usize) -> String {
    let mut s = String::new();
    while s.chars().count() < len {
        match rng.gen_range(0..20) {
            0..=9 => s.push(char::from(b'a' + rng.gen_range(0..4u8))),
            10..=13 => s.push_str(&" ".repeat(rng.gen_range(1..4))),
            14 => s.push('\u{2581}'),
            15 => s.push('\n'),
            16 => s.push(char::from_u32(rng.gen_range(0xA0..0x3000)).unwrap_or('é')),
            17 => s.push_str(["<s>", "</s>", "<|im_start|>", "<|im_end|>"][rng.gen_range(0..4)]),
            _ => s.push(char::from(rng.gen_range(b'!'..=b'~'))),
        }
    }
    s
}

/// `encode_at_most` agrees with `encode_with` at, below and above the
/// text's token count, with and without BOS and special tokens.
fn check_agrees(name: &str, t: &Tokenizer, text: &str) {
    for (add_special, parse_special) in [(true, true), (false, true), (true, false)] {
        let all = t.encode_with(text, add_special, parse_special);
        let n = all.len();
        let at = |max| t.encode_at_most(text, add_special, parse_special, max);
        assert_eq!(at(usize::MAX).as_ref(), Some(&all), "{name}: {text:?}");
        assert_eq!(at(n).as_ref(), Some(&all), "{name}: {text:?}");
        if n > 0 {
            assert_eq!(at(n - 1), None, "{name}: {n} tokens fit in {}: {text:?}", n - 1);
            assert_eq!(at(n / 2), None, "{name}: {text:?}");
        }
    }
}

#[test]
fn the_tokens_of_a_text_that_fits_are_those_of_encode() {
    let toks = [("generated spm", generated_spm()), ("spm a▁", spm_with_trailing_spaces()), ("bpe", tiny_bpe())];
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    for (name, t) in &toks {
        for len in [0, 1, 2, 5, 40, 300] {
            for _ in 0..50 {
                check_agrees(name, t, &random_text(&mut rng, len));
            }
        }
        // Past a piece of 4 KiB: runs of text are cut, in many places.
        for _ in 0..20 {
            let len = rng.gen_range(4000..20_000);
            check_agrees(name, t, &random_text(&mut rng, len));
        }
        check_agrees(name, t, &"ab ".repeat(5000));
        check_agrees(name, t, &format!("{}{}", "a".repeat(9000), " b".repeat(3000)));
    }
}

#[test]
fn a_text_past_the_limit_is_refused_in_memory_of_the_limit() {
    let _one = MEASURE.lock().unwrap_or_else(|e| e.into_inner());
    // 16 MB of words: tokenized whole, its tokens alone take tens of MB.
    let text = "hello world, this is some text ".repeat(16 << 20 >> 5);
    let chat = format!("<|im_start|>user\n{text}<|im_end|>\n");
    for (name, t) in [("generated spm", generated_spm()), ("bpe", tiny_bpe())] {
        let (whole, whole_peak) = peak_during(|| t.encode(&text, true).len());
        let (refused, peak) = peak_during(|| t.encode_at_most(&text, true, true, 4096));
        assert_eq!(refused, None, "{name}: {whole} tokens fit in 4096");
        eprintln!("{name}: {whole} tokens; whole: {} MB at peak; refused at 4096: {} KB", whole_peak >> 20, peak >> 10);
        assert!(whole_peak > 20 << 20, "{name}: {whole_peak}");
        assert!(peak < 1 << 20, "{name}: {peak} bytes to refuse it");
        let (refused, peak) = peak_during(|| ChatTemplate::encode_rendered_at_most(&t, &chat, 4096));
        assert_eq!(refused, None, "{name}");
        assert!(peak < 1 << 20, "{name}: {peak} bytes to refuse a render");
    }
    // More special tokens than the limit: refused before any merge.
    let t = generated_spm();
    let specials = "<s>".repeat(100_000);
    assert_eq!(t.encode_at_most(&specials, false, true, 99_999), None);
    assert_eq!(t.encode_at_most(&specials, false, true, 100_000).map(|v| v.len()), Some(100_000));
}

#[test]
fn the_models_tokenizers_agree_with_encode() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for dir in tokenizer_util::model_dirs() {
        let t = tokenizer_util::tokenizer_for(&dir).unwrap_or_else(|e| panic!("{e}"));
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for len in [3, 50, 500, 9000] {
            for _ in 0..10 {
                check_agrees(&name, &t, &random_text(&mut rng, len));
            }
        }
        let prose = "The quick brown fox jumps over the lazy dog. ".repeat(400);
        check_agrees(&name, &t, &prose);
        check_agrees(&name, &t, &format!("<start_of_turn>user\n{prose}<end_of_turn>\n"));
    }
}
