//! A resumable download of one hub file, checked against its SHA-256.
//!
//! The bytes go to `FILE.partial` beside the destination. A partial file
//! left by an earlier, interrupted download is continued with a
//! `Range: bytes=N-` request (a server that answers 200 instead of 206
//! sends the whole file, which starts over); a connection that drops is
//! resumed the same way, up to [`ATTEMPTS`] times in one call. The
//! complete file must have the listed size and SHA-256; then it is renamed
//! into place with a sidecar that vouches for it ([`super::verify`]). A
//! file whose hash is wrong is removed, since resuming cannot mend it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::hub::{agent, get, status_error};
use super::verify;
use crate::error::{Error, Result};

/// Tries of one download: the first and the resumptions after a dropped
/// connection.
pub const ATTEMPTS: usize = 4;

/// How far a download is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Bytes in the partial file.
    pub done: u64,
    /// The file's size.
    pub total: u64,
}

/// `dest` with `.partial` appended: where its bytes are written.
pub fn partial_path(dest: &Path) -> PathBuf {
    super::with_suffix(dest, ".partial")
}

/// Why one attempt ended without the whole file.
enum Stopped {
    /// The connection dropped or timed out after `done` bytes: resumable.
    Dropped(String),
    /// An error that another attempt would meet again.
    Fatal(Error),
}

/// Downloads `url` into `dest`: `size` bytes whose SHA-256 is `sha256`,
/// resuming a partial file and dropped connections; `on_progress` is
/// called as bytes arrive.
///
/// # Errors
/// [`Error::Download`]: an error status, a server that keeps dropping the
/// connection (the partial file is kept for the next run), more bytes than
/// listed, or a wrong SHA-256 (the file is removed); [`Error::Io`] for the
/// cache's files.
pub fn download(url: &str, dest: &Path, size: u64, sha256: &str, on_progress: &mut dyn FnMut(Progress)) -> Result<()> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path: path.clone(), source }
    };
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let partial = partial_path(dest);
    refuse_odd_partial(&partial)?;
    let agent = agent();
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        match attempt(&agent, url, &partial, size, on_progress) {
            Ok(()) => return finish(&partial, dest, size, sha256, url),
            Err(Stopped::Fatal(e)) => return Err(e),
            Err(Stopped::Dropped(why)) => last = why,
        }
    }
    let done = std::fs::symlink_metadata(&partial).map_or(0, |m| m.len());
    Err(Error::Download(format!(
        "downloading {url}: {last}; stopped at {done} of {size} bytes after {ATTEMPTS} tries (run the command again \
         to resume)"
    )))
}

/// A `.partial` file that is not a regular file is never written through:
/// a symbolic link is removed (the download starts afresh), anything else
/// (a folder, a device, a pipe) is refused.
///
/// # Errors
/// [`Error::Download`] for a partial path that is neither missing, a
/// regular file nor a link; [`Error::Io`] when the link cannot be removed.
fn refuse_odd_partial(partial: &Path) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(partial) else { return Ok(()) };
    if meta.file_type().is_symlink() {
        return std::fs::remove_file(partial).map_err(|source| Error::Io { path: partial.to_path_buf(), source });
    }
    if !meta.is_file() {
        return Err(Error::Download(format!(
            "{} is not a regular file (an incomplete download should be one); remove it and try again",
            partial.display()
        )));
    }
    Ok(())
}

/// Opens the partial file to append to it, or (`append` false) creates or
/// empties it; never through a symbolic link (`O_NOFOLLOW`), nor a file
/// that is not a regular one.
fn open_partial(partial: &Path, append: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    if append {
        o.append(true);
    } else {
        o.write(true).create(true).truncate(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let f = o.open(partial)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(f)
}

/// One request: from the end of the partial file to the end of the file.
fn attempt(
    agent: &ureq::Agent,
    url: &str,
    partial: &Path,
    size: u64,
    on_progress: &mut dyn FnMut(Progress),
) -> std::result::Result<(), Stopped> {
    let fatal_io = |source| Stopped::Fatal(Error::Io { path: partial.to_path_buf(), source });
    let mut have = std::fs::symlink_metadata(partial).map_or(0, |m| m.len());
    if have > size {
        // Not a prefix of this file.
        open_partial(partial, false).map_err(fatal_io)?;
        have = 0;
    }
    if have == size {
        if size == 0 {
            // An empty file: nothing to ask the server for.
            open_partial(partial, false).map_err(fatal_io)?;
        }
        return Ok(());
    }
    let mut req = get(agent, url);
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
    }
    let mut resp = req.call().map_err(|e| Stopped::Dropped(e.to_string()))?;
    let status = resp.status().as_u16();
    let mut file = match status {
        206 if content_range_start(&resp) == Some(have) => open_partial(partial, true).map_err(fatal_io)?,
        // The whole file (a server without ranges, or a first request).
        200 => {
            have = 0;
            open_partial(partial, false).map_err(fatal_io)?
        }
        206 => {
            return Err(Stopped::Fatal(Error::Download(format!(
                "downloading {url}: the server sent another range than bytes={have}-"
            ))))
        }
        s if (500..600).contains(&s) => return Err(Stopped::Dropped(format!("HTTP status {s}"))),
        s => return Err(Stopped::Fatal(status_error(s, "downloading the model", url))),
    };
    on_progress(Progress { done: have, total: size });
    let mut body = resp.body_mut().with_config().limit(size - have).reader();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                file.flush().map_err(fatal_io)?;
                return Err(Stopped::Dropped(e.to_string()));
            }
        };
        file.write_all(&buf[..n]).map_err(fatal_io)?;
        have += n as u64;
        on_progress(Progress { done: have, total: size });
    }
    file.flush().map_err(fatal_io)?;
    if have < size {
        return Err(Stopped::Dropped(format!("the connection closed after {have} of {size} bytes")));
    }
    Ok(())
}

/// The first byte of a 206's `Content-Range: bytes FIRST-LAST/SIZE`.
fn content_range_start(resp: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    let v = resp.headers().get("content-range")?.to_str().ok()?;
    v.trim().strip_prefix("bytes ")?.split('-').next()?.trim().parse().ok()
}

/// Checks the complete partial file and moves it to `dest` with a sidecar.
fn finish(partial: &Path, dest: &Path, size: u64, sha256: &str, url: &str) -> Result<()> {
    let len = std::fs::metadata(partial).map_err(|source| Error::Io { path: partial.to_path_buf(), source })?.len();
    let digest = if len == size { Some(verify::sha256_file(partial)?) } else { None };
    if digest.as_deref() != Some(sha256) {
        let _ = std::fs::remove_file(partial);
        let got = digest.map_or(format!("{len} bytes"), |d| format!("sha256 {d}"));
        return Err(Error::Download(format!(
            "downloading {url}: the file is not the one the hub lists ({got}, expected {size} bytes of sha256 \
             {sha256}); it was removed"
        )));
    }
    std::fs::rename(partial, dest).map_err(|source| Error::Io { path: dest.to_path_buf(), source })?;
    // Hashed just now: the sidecar vouches for it from here on.
    verify::vouch(dest, sha256);
    Ok(())
}
