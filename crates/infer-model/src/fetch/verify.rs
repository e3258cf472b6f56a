//! Content verification of cached model files.
//!
//! A cached file is trusted only through a sidecar `FILE.sha256` written
//! after its full SHA-256 matched the registry: the sidecar records the
//! hash with the file's size, modification time (ns) and inode, so a file
//! that was replaced, rewritten or truncated since no longer matches its
//! sidecar and is hashed again. A file without a valid sidecar is hashed
//! once (about 1 s per 250 MB) and, when it verifies, gets one.

use std::fs::File;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::registry::KnownModel;
use crate::error::{Error, Result};

/// What the cache holds for a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheState {
    /// No file.
    Missing,
    /// The file is there and its content verified (now or per its sidecar).
    Verified,
    /// The file is there but its content is not the model's: the reason.
    Corrupt(String),
}

/// Path of the sidecar of `path`: the same name with `.sha256` appended.
pub fn sidecar_path(path: &Path) -> PathBuf {
    super::with_suffix(path, ".sha256")
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

/// The identity of a file's current content as far as metadata tells:
/// `size mtime_ns inode`.
fn fingerprint(meta: &std::fs::Metadata) -> String {
    let mtime_ns =
        meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
    #[cfg(unix)]
    let inode = {
        use std::os::unix::fs::MetadataExt;
        format!("{}:{}", meta.dev(), meta.ino())
    };
    #[cfg(not(unix))]
    let inode = String::from("-");
    format!("{} {mtime_ns} {inode}", meta.len())
}

/// Whether the sidecar of `path` vouches for its current content as the
/// model's, without hashing.
pub fn is_vouched(path: &Path, model: &KnownModel) -> bool {
    let Ok(meta) = std::fs::metadata(path) else { return false };
    meta.is_file() && meta.len() == model.size && vouched_sha256(path).is_some_and(|h| h == model.sha256)
}

/// The SHA-256 that the sidecar of `path` vouches for, when it still
/// matches the file's size, modification time and inode (no hashing).
pub fn vouched_sha256(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
    let sidecar = std::fs::read_to_string(sidecar_path(path)).ok()?;
    let (hash, print) = sidecar.trim_end().split_once(' ')?;
    (print == fingerprint(&meta)).then(|| hash.to_string())
}

/// Writes the sidecar of `path`, a file whose SHA-256 `sha256` was just
/// checked (best effort, as in [`check_cached`]).
pub fn vouch(path: &Path, sha256: &str) {
    if let Ok(meta) = std::fs::metadata(path) {
        write_sidecar(&sidecar_path(path), &format!("{sha256} {}", fingerprint(&meta)));
    }
}

/// Checks the cached copy of `model` at `path`, hashing it when its sidecar
/// does not vouch for it, and writes the sidecar when the hash matches.
///
/// # Errors
/// [`Error::Io`] when the file exists but cannot be read. A sidecar that
/// cannot be written is not an error (the file is hashed again next time).
pub fn check_cached(path: &Path, model: &KnownModel) -> Result<CacheState> {
    check_cached_as(path, model.size, model.sha256)
}

/// [`check_cached`] for a file of `size` bytes and SHA-256 `sha256` (a
/// model from the hub).
///
/// # Errors
/// As [`check_cached`].
pub fn check_cached_as(path: &Path, size: u64, sha256: &str) -> Result<CacheState> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(CacheState::Missing),
        Err(source) => return Err(Error::Io { path: path.to_path_buf(), source }),
    };
    if !meta.is_file() {
        return Ok(CacheState::Corrupt("not a regular file".into()));
    }
    if meta.len() != size {
        return Ok(CacheState::Corrupt(format!("{} bytes, expected {}", meta.len(), size)));
    }
    let expected = format!("{} {}", sha256, fingerprint(&meta));
    let sidecar = sidecar_path(path);
    if std::fs::read_to_string(&sidecar).is_ok_and(|s| s.trim_end() == expected) {
        return Ok(CacheState::Verified);
    }
    let digest = sha256_file(path)?;
    if digest != sha256 {
        return Ok(CacheState::Corrupt(format!("sha256 {digest}, expected {}", sha256)));
    }
    write_sidecar(&sidecar, &expected);
    Ok(CacheState::Verified)
}

/// Writes the sidecar through a temporary file and a rename, so that a
/// reader never sees half of one. Failures are ignored (best effort).
fn write_sidecar(sidecar: &Path, content: &str) {
    let tmp = sidecar.with_extension(format!("sha256.tmp{}", std::process::id()));
    if std::fs::write(&tmp, format!("{content}\n")).is_ok() && std::fs::rename(&tmp, sidecar).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Removes a cached file and its sidecar (missing ones are fine).
///
/// # Errors
/// [`Error::Io`] when an existing file cannot be removed.
pub fn remove_cached(path: &Path) -> Result<()> {
    for p in [path.to_path_buf(), sidecar_path(path)] {
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Io { path: p, source }),
        }
    }
    Ok(())
}
