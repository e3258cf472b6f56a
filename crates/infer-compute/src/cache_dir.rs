//! The one cache directory of this project on disk: fetched models (by
//! `infer-model`) and compiled GPU kernels (by the CUDA backend) live under
//! it.

use std::path::PathBuf;

/// The environment variable naming the cache directory.
pub const CACHE_DIR_ENV: &str = "INFER_CACHE_DIR";

/// `$INFER_CACHE_DIR` when set and non-empty, else
/// `$HOME/.cache/infer-compute`, else `infer-compute` in the system's
/// temporary directory. Not created here.
pub fn cache_dir() -> PathBuf {
    let env_path = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = env_path(CACHE_DIR_ENV) {
        return dir;
    }
    match env_path("HOME") {
        Some(home) => home.join(".cache").join("infer-compute"),
        None => std::env::temp_dir().join("infer-compute"),
    }
}
