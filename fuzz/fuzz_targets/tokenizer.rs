//! The tokenizer on arbitrary bytes: encoding any text (with and without
//! special-token parsing) and decoding any id sequence (ids past the
//! vocabulary included) never panics or hangs.
//!
//! The vocabulary is the default model's (Gemma 3, 262 144 tokens) when
//! `$INFER_FUZZ_MODEL` or the model cache holds it, a generated one
//! otherwise.

#![no_main]

use std::sync::OnceLock;

use infer_model::gguf::{GgufFile, GgufWriter};
use infer_model::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = std::env::var_os("INFER_FUZZ_MODEL").map(std::path::PathBuf::from).unwrap_or_else(|| {
            infer_model::fetch::cache_dir().join(infer_model::fetch::DEFAULT_MODEL_FILE)
        });
        if let Ok(file) = GgufFile::open(&path) {
            eprintln!("tokenizer of {}", path.display());
            return Tokenizer::from_gguf(&file).expect("the model's tokenizer");
        }
        eprintln!("{} not found: a generated vocabulary", path.display());
        let mut w = GgufWriter::new();
        for (k, v) in infer_model::synth::generated_vocab(4096).expect("a generated vocabulary") {
            w.add_metadata(k, v).expect("vocabulary metadata");
        }
        let file = GgufFile::from_bytes(w.to_bytes().expect("in memory")).expect("a valid file");
        Tokenizer::from_gguf(&file).expect("the generated tokenizer")
    })
}

fuzz_target!(|data: &[u8]| {
    let tok = tokenizer();
    let text = String::from_utf8_lossy(data);
    let ids = tok.encode(&text, true);
    assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()), "an id past the vocabulary");
    let _ = tok.decode(&ids);
    let special = tok.encode_with(&text, false, true);
    let _ = tok.decode_with(&special, true);
    // Arbitrary ids, most of them past the vocabulary.
    let raw: Vec<u32> = data.chunks(4).map(|c| c.iter().fold(0u32, |a, &b| a << 8 | b as u32)).collect();
    let _ = tok.decode(&raw);
    let mut d = tok.decoder(false);
    for &id in &raw {
        let _ = d.push(id);
    }
    let _ = d.finish();
});
