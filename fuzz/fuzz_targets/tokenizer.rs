//! The tokenizer on arbitrary bytes: encoding any text (with and without
//! special-token parsing) and decoding any id sequence (ids past the
//! vocabulary included) never panics or hangs.
//!
//! The vocabularies are those of the cached models (Gemma 3's
//! SentencePiece, SmolLM2's byte-level BPE; `$INFER_FUZZ_MODELS` lists
//! other files, separated by `:`), or a generated one when none is found.
//! The first input byte picks the vocabulary.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use infer_model::gguf::{GgufFile, GgufWriter};
use infer_model::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

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
        if toks.is_empty() {
            eprintln!("no model found: a generated vocabulary");
            let mut w = GgufWriter::new();
            for (k, v) in infer_model::synth::generated_vocab(4096).expect("a generated vocabulary") {
                w.add_metadata(k, v).expect("vocabulary metadata");
            }
            let file = GgufFile::from_bytes(w.to_bytes().expect("in memory")).expect("a valid file");
            toks.push(Tokenizer::from_gguf(&file).expect("the generated tokenizer"));
        }
        toks
    })
}

fuzz_target!(|data: &[u8]| {
    let toks = tokenizers();
    let Some((&pick, data)) = data.split_first() else {
        return;
    };
    let tok = &toks[pick as usize % toks.len()];
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
