//! Helpers shared by the tokenizer tests: the test data, the reference
//! cases of every model present, and the model files they belong to.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use infer_model::gguf::GgufFile;
use infer_model::tokenizer::Tokenizer;

/// `$INFER_TESTDATA`, else the workspace's `testdata/`.
pub fn testdata() -> PathBuf {
    match std::env::var_os("INFER_TESTDATA") {
        Some(p) => p.into(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata"),
    }
}

/// Every model directory of the test data that has a `tokenizer/` folder,
/// sorted by name.
pub fn model_dirs() -> Vec<PathBuf> {
    let root = testdata();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("tokenizer").is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// The GGUF file of the model whose test data is in `dir`, by the known
/// model name the directory carries (fetched and verified when absent, as
/// `infer run --model NAME` does). `Err` says why there is none.
pub fn model_file(dir: &Path) -> Result<PathBuf, String> {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    infer_model::fetch::ensure_model(name).map_err(|e| format!("test data `{name}`: {e}"))
}

/// The tokenizer of the model whose test data is in `dir`.
pub fn tokenizer_for(dir: &Path) -> Result<Tokenizer, String> {
    let path = model_file(dir)?;
    let file = GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Tokenizer::from_gguf(&file).map_err(|e| format!("{}: {e}", path.display()))
}

/// Files in `dir` named `<prefix>NN.json`, sorted.
pub fn numbered_json(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.strip_prefix(prefix)
                .and_then(|r| r.strip_suffix(".json"))
                .is_some_and(|num| !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    files.sort();
    files
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn ids_of(v: &serde_json::Value, path: &Path) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("{}: ids are not an array", path.display()))
        .iter()
        .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()).expect("token id"))
        .collect()
}

/// Checks one reference case: exact ids (BOS added when the model asks for
/// it, special tokens parsed), and the text back from the ids without BOS.
pub fn check_case(tok: &Tokenizer, path: &Path, text: &str, want: &[u32]) -> Result<(), String> {
    let got = tok.encode(text, true);
    if got != want {
        return Err(format!(
            "{}: {text:?}\n  want {want:?}\n   got {got:?}\n  want pieces {:?}\n   got pieces {:?}",
            path.display(),
            want.iter().map(|&i| tok.piece(i)).collect::<Vec<_>>(),
            got.iter().map(|&i| tok.piece(i)).collect::<Vec<_>>(),
        ));
    }
    let body = match (tok.add_bos(), tok.bos_id()) {
        (true, Some(bos)) => got.strip_prefix(&[bos][..]).unwrap_or(&got),
        _ => &got[..],
    };
    let back = tok.decode(body);
    if back != text {
        return Err(format!("{}: round trip {text:?} -> {back:?}", path.display()));
    }
    Ok(())
}

/// The reference cases of one model directory: `tokenizer/tokNN.json`
/// (`text`, `ids`) and the prompts of `logits*/pNN.json` (`prompt`,
/// `prompt_ids`), as (file, text, ids).
pub fn cases(dir: &Path) -> Vec<(PathBuf, String, Vec<u32>)> {
    let mut out = Vec::new();
    for path in numbered_json(&dir.join("tokenizer"), "tok") {
        let v = read_json(&path);
        let text = v["text"].as_str().unwrap_or_else(|| panic!("{}: no text", path.display())).to_owned();
        let ids = ids_of(&v["ids"], &path);
        out.push((path, text, ids));
    }
    let mut logit_dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_dir() && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("logits"))
                })
                .collect()
        })
        .unwrap_or_default();
    logit_dirs.sort();
    for d in logit_dirs {
        for path in numbered_json(&d, "p") {
            let v = read_json(&path);
            let text = v["prompt"].as_str().unwrap_or_else(|| panic!("{}: no prompt", path.display())).to_owned();
            let ids = ids_of(&v["prompt_ids"], &path);
            out.push((path, text, ids));
        }
    }
    out
}
