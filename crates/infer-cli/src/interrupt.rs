//! Ctrl-C and termination signals (SIGINT, SIGTERM, SIGHUP).
//!
//! One handler for the whole process (the `ctrlc` crate runs it on its own
//! thread, outside signal context). It first removes the files registered
//! with [`remove_on_signal`] (the partial output of `infer synth`). A model
//! fetch in progress is stopped, its processes and work files with it,
//! before the process exits (`infer_model::fetch::abort_active_fetch`). Then,
//! while a command has asked for [`graceful`] stops (`infer run`: the
//! prefill and the generation loop poll [`requested`] between steps), the
//! first signal only sets the flag; otherwise, and at a second signal, the
//! process exits with status 130 (128 + SIGINT, as shells report it).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Exit status after a signal.
pub const EXIT_INTERRUPTED: u8 = 130;

static REQUESTED: AtomicBool = AtomicBool::new(false);
static GRACEFUL: AtomicBool = AtomicBool::new(false);
static CLEANUP: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Installs the handler. Failing to install it (another handler exists)
/// only loses the clean stop, so it is reported as a warning.
pub fn install() {
    if let Err(e) = ctrlc::set_handler(on_signal) {
        eprintln!("warning: cannot handle Ctrl-C: {e}");
    }
}

fn on_signal() {
    let paths = std::mem::take(&mut *CLEANUP.lock().unwrap_or_else(|p| p.into_inner()));
    for p in paths {
        // Best effort: the file may not have been created yet.
        let _ = std::fs::remove_file(p);
    }
    let again = REQUESTED.swap(true, Ordering::SeqCst);
    if again || !GRACEFUL.load(Ordering::SeqCst) {
        infer_model::fetch::abort_active_fetch();
        eprintln!("\ninterrupted");
        std::process::exit(EXIT_INTERRUPTED.into());
    }
}

/// From now on the first signal only sets [`requested`].
pub fn graceful() {
    GRACEFUL.store(true, Ordering::SeqCst);
}

/// Forgets a stop request, so that the next signal is again a first one
/// (`infer chat`: Ctrl-C stops one reply, the session goes on).
pub fn clear() {
    REQUESTED.store(false, Ordering::SeqCst);
}

/// Whether a signal asked to stop.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Removes `path` when a signal arrives (until [`keep`]).
pub fn remove_on_signal(path: &Path) {
    CLEANUP.lock().unwrap_or_else(|p| p.into_inner()).push(path.to_path_buf());
}

/// No longer removes `path` on a signal.
pub fn keep(path: &Path) {
    CLEANUP.lock().unwrap_or_else(|p| p.into_inner()).retain(|p| p != path);
}
