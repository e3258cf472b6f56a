//! Locating the default model. Environment variables are process-global,
//! so every check that sets them lives in the one test of this binary.

use infer_model::fetch::{
    cache_dir, default_model_path, CACHE_DIR_ENV, DEFAULT_MODEL_FILE, MODEL_ENV,
};
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
    std::fs::File::create(&cached)
        .unwrap()
        .set_len(infer_model::fetch::DEFAULT_MODEL_SIZE)
        .unwrap();
    assert_eq!(default_model_path().unwrap(), cached);

    std::env::remove_var(CACHE_DIR_ENV);
    std::fs::remove_dir_all(&tmp).unwrap();
}
