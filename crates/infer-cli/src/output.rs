//! Checked writes to standard output.
//!
//! `print!` panics when a write fails (`infer info > /dev/full`), and a
//! closed standard output (`infer run >&-`) is silently reopened on
//! `/dev/null` by Rust's runtime. Every subcommand writes through [`Out`]
//! instead: a failed write is an error naming standard output, which
//! `main` reports with a non-zero exit, and [`check_open`] turns a closed
//! standard output into an error before any work is done.

use std::io::{self, Write};

/// Standard output, locked, whose write errors say what failed.
pub struct Out {
    inner: io::StdoutLock<'static>,
}

impl Out {
    /// Locks standard output.
    pub fn new() -> Self {
        Out { inner: io::stdout().lock() }
    }
}

impl Default for Out {
    fn default() -> Self {
        Self::new()
    }
}

/// The error of a failed write to standard output, kind kept.
fn named(e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("cannot write to standard output: {e}"))
}

impl Write for Out {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf).map_err(named)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().map_err(named)
    }
}

/// An error when standard output was closed when the process started
/// (`infer run >&-`).
///
/// Rust's runtime reopens a closed descriptor 1 on `/dev/null` for reading
/// and writing; a shell's `> /dev/null` opens it for writing only. So
/// descriptor 1 open read-write on `/dev/null` means it was closed.
///
/// # Errors
/// `standard output is closed`.
#[cfg(unix)]
pub fn check_open() -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: fcntl(F_GETFL) only reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(1, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::other("standard output is closed"));
    }
    if flags & libc::O_ACCMODE != libc::O_RDWR {
        return Ok(());
    }
    let Ok(null) = std::fs::metadata("/dev/null") else { return Ok(()) };
    // SAFETY: `stat` is plain data; fstat fills it for an open descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable stat buffer.
    if unsafe { libc::fstat(1, &mut st) } != 0 {
        return Ok(());
    }
    if null.rdev() == st.st_rdev as u64 && null.ino() == st.st_ino as u64 {
        return Err(io::Error::other("standard output is closed; nothing could be printed"));
    }
    Ok(())
}

/// Standard output cannot be detected as closed here.
///
/// # Errors
/// Never.
#[cfg(not(unix))]
pub fn check_open() -> io::Result<()> {
    Ok(())
}
