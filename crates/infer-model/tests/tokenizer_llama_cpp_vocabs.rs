//! llama.cpp's own tokenizer test files (`models/ggml-vocab-<name>.gguf`
//! with `.inp` texts and `.out` ids, as its `test-tokenizer-0` reads them)
//! for the byte-level BPE families we support: every case exact, and every
//! encoding decoding back to its text.
//!
//! The files come with llama.cpp's source (`$INFER_LLAMA_CPP_MODELS`, else
//! the tree `bench/build-llama-cpp.sh` unpacks into the cache; about 21 MB,
//! so they are not copied into `testdata/`). Without them each vocabulary
//! is reported as ignored, with the reason.

use std::path::{Path, PathBuf};

use infer_model::gguf::GgufFile;
use infer_model::tokenizer::Tokenizer;

const VOCABS: [&str; 5] = ["gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "starcoder"];

/// llama.cpp's `models/` directory: `$INFER_LLAMA_CPP_MODELS`, else the
/// source tree that `bench/build-llama-cpp.sh` unpacks into the cache.
fn llama_cpp_models() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("INFER_LLAMA_CPP_MODELS") {
        return Some(p.into());
    }
    let root = infer_model::fetch::cache_dir().join("llama.cpp");
    let mut srcs: Vec<PathBuf> = std::fs::read_dir(&root)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("llama.cpp/models")))
        .filter(|p| p.is_dir())
        .collect();
    srcs.sort();
    srcs.pop()
}

/// Reads `<vocab>.inp` (texts separated by `\n__ggml_vocab_test__\n`) and
/// `<vocab>.out` (one line of ids per text).
fn vocab_cases(vocab: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(vocab.with_extension("gguf.inp")).expect("inp");
    let out = std::fs::read_to_string(vocab.with_extension("gguf.out")).expect("out");
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // A file that ends with the separator has no empty last case.
    if texts.last() == Some(&"") {
        texts.pop();
    }
    let ids: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|x| x.parse().expect("id")).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{}", vocab.display());
    texts.into_iter().map(str::to_owned).zip(ids).collect()
}

/// Every case of one vocabulary, encoded without BOS and without parsing
/// special tokens (as `test-tokenizer-0` does).
fn check(name: &str, path: &Path) -> Result<(), String> {
    let file = GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let t = Tokenizer::from_gguf(&file).map_err(|e| format!("{name}: {e}"))?;
    let cases = vocab_cases(path);
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = t.encode_with(text, false, false);
        if &got != want {
            failures.push(format!("{text:?}\n  want {want:?}\n   got {got:?}"));
        }
        if t.decode(&got) != *text {
            failures.push(format!("{text:?} decodes to {:?}", t.decode(&got)));
        }
    }
    println!("{name}: {} of {} cases exact", cases.len() - failures.len(), cases.len());
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("{name}:\n{}", failures.join("\n")))
    }
}

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let models = llama_cpp_models();
    let trials = VOCABS
        .iter()
        .map(|&name| {
            let path = models.as_ref().map(|m| m.join(format!("ggml-vocab-{name}.gguf")));
            libtest_mimic::Trial::ignorable_test(format!("llama_cpp_vocab_{name}"), move || match path {
                Some(p) if p.is_file() => {
                    check(name, &p).map(|()| libtest_mimic::Completion::Completed).map_err(Into::into)
                }
                Some(p) => Ok(libtest_mimic::Completion::ignored_with(format!("{} is absent", p.display()))),
                None => Ok(libtest_mimic::Completion::ignored_with(
                    "no llama.cpp source tree (bench/build-llama-cpp.sh unpacks one; or set INFER_LLAMA_CPP_MODELS)",
                )),
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
