//! Ctrl-C and termination signals (SIGINT, SIGTERM, SIGHUP).
//!
//! One handler for the whole process, run on a thread of its own, outside
//! signal context (on Unix the signal handler only writes the signal's
//! number into a pipe that the thread reads; elsewhere the `ctrlc` crate
//! does the same). It first removes the files registered with
//! [`remove_on_signal`] (the partial output of `infer synth`). A model
//! fetch in progress is stopped, its processes and work files with it,
//! before the process exits (`infer_model::fetch::abort_active_fetch`).
//! Then, while a command has asked for [`graceful`] stops (`infer run`: the
//! prefill and the generation loop poll [`requested`] between steps), the
//! first signal only sets the flag; otherwise, and at a second signal, the
//! process exits with status 130 (128 + SIGINT, as shells report it).
//!
//! In a chat session ([`session`]) SIGTERM and SIGHUP end the session as
//! the end of the input does, exit status 0: during a reply the reply
//! stops and the session ends after it ([`ending`]); at the prompt, where
//! the main thread waits for a line, this thread ends the line, gives the
//! terminal its settings back and exits.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;

/// Exit status after a signal.
pub const EXIT_INTERRUPTED: u8 = 130;

static REQUESTED: AtomicBool = AtomicBool::new(false);
static GRACEFUL: AtomicBool = AtomicBool::new(false);
static CLEANUP: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Where a chat session is, for SIGTERM: one of the constants below.
static SESSION: AtomicU8 = AtomicU8::new(NO_SESSION);
const NO_SESSION: u8 = 0;
/// Replying or running a command.
const BUSY: u8 = 1;
/// Waiting for a line.
const AT_PROMPT: u8 = 2;
/// A termination signal came: the session ends.
const ENDING: u8 = 3;

/// The terminal's settings before the line editor took it (restored when a
/// signal ends the session at the prompt).
#[cfg(unix)]
static TERMINAL: Mutex<Option<libc::termios>> = Mutex::new(None);

/// What a signal asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM, SIGHUP.
    Terminate,
}

/// Installs the handler. Failing to install it only loses the clean stop,
/// so it is reported as a warning.
pub fn install() {
    if let Err(e) = platform::install() {
        eprintln!("warning: cannot handle Ctrl-C: {e}");
    }
}

fn on_signal(kind: Kind) {
    let paths = std::mem::take(&mut *CLEANUP.lock().unwrap_or_else(|p| p.into_inner()));
    for p in paths {
        // Best effort: the file may not have been created yet.
        let _ = std::fs::remove_file(p);
    }
    if kind == Kind::Terminate && end_session() {
        return;
    }
    let again = REQUESTED.swap(true, Ordering::SeqCst);
    if again || !GRACEFUL.load(Ordering::SeqCst) {
        infer_model::fetch::abort_active_fetch();
        eprintln!("\ninterrupted");
        std::process::exit(EXIT_INTERRUPTED.into());
    }
}

/// A termination signal in a chat session: ends it (at the prompt, the
/// process); `false` outside a session or when it is already ending (a
/// second signal exits as any other).
fn end_session() -> bool {
    let mut state = SESSION.load(Ordering::SeqCst);
    loop {
        if state == NO_SESSION || state == ENDING {
            return false;
        }
        match SESSION.compare_exchange(state, ENDING, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => break,
            Err(now) => state = now,
        }
    }
    if state == AT_PROMPT {
        leave_prompt();
    }
    // A reply in progress stops at its next step.
    REQUESTED.store(true, Ordering::SeqCst);
    true
}

/// Ends the session from this thread while the main thread waits for a
/// line: the terminal's settings back, the prompt's line ended (as the end
/// of the input leaves it), exit status 0.
fn leave_prompt() -> ! {
    #[cfg(unix)]
    // SAFETY: tcsetattr and write get a valid termios and buffer; the main
    // thread only waits for input (it parks if it gets a line now).
    unsafe {
        if let Some(t) = *TERMINAL.lock().unwrap_or_else(|p| p.into_inner()) {
            libc::tcsetattr(0, libc::TCSANOW, &t);
        }
        // Not through `std::io::stdout`, whose lock the main thread holds.
        libc::write(1, b"\n".as_ptr().cast(), 1);
    }
    std::process::exit(0);
}

/// A chat session begins: from now on SIGTERM and SIGHUP end it (exit
/// status 0) instead of the process.
pub fn session() {
    let _ = SESSION.compare_exchange(NO_SESSION, BUSY, Ordering::SeqCst, Ordering::SeqCst);
}

/// The session waits for a line from now on; `false` when a termination
/// signal already ended it (then no line is read).
pub fn at_prompt() -> bool {
    #[cfg(unix)]
    {
        // SAFETY: isatty and tcgetattr only read the descriptor's state
        // into a zeroed termios.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        let saved = unsafe { libc::isatty(0) == 1 && libc::tcgetattr(0, &mut t) == 0 };
        *TERMINAL.lock().unwrap_or_else(|p| p.into_inner()) = saved.then_some(t);
    }
    SESSION.compare_exchange(BUSY, AT_PROMPT, Ordering::SeqCst, Ordering::SeqCst).is_ok()
}

/// The line came. When a termination signal came first, the signal's
/// thread is ending the process: this thread waits for it.
pub fn left_prompt() {
    if SESSION.compare_exchange(AT_PROMPT, BUSY, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        loop {
            std::thread::park();
        }
    }
}

/// Whether a termination signal ended the session (it leaves after the
/// reply that the signal stopped).
pub fn ending() -> bool {
    SESSION.load(Ordering::SeqCst) == ENDING
}

#[cfg(unix)]
mod platform {
    //! The signals through a pipe: the handler writes the signal's number,
    //! a thread reads it and runs [`super::on_signal`].

    use std::sync::atomic::{AtomicI32, Ordering};

    use super::Kind;

    static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);

    extern "C" fn handler(sig: libc::c_int) {
        let byte = sig as u8;
        // SAFETY: write(2) is async-signal-safe; a full pipe loses only a
        // repeated signal.
        unsafe {
            libc::write(PIPE_WRITE.load(Ordering::Relaxed), (&byte as *const u8).cast(), 1);
        }
    }

    pub fn install() -> std::io::Result<()> {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into `fds`; fcntl sets flags
        // on them.
        unsafe {
            if libc::pipe(fds.as_mut_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for fd in fds {
                // Not inherited by the processes a fetch runs.
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
        let read = fds[0];
        PIPE_WRITE.store(fds[1], Ordering::Relaxed);
        std::thread::Builder::new().name("signals".into()).spawn(move || loop {
            let mut byte = 0u8;
            // SAFETY: reads one byte into `byte`.
            let n = unsafe { libc::read(read, (&mut byte as *mut u8).cast(), 1) };
            match n {
                1 => super::on_signal(if i32::from(byte) == libc::SIGINT { Kind::Interrupt } else { Kind::Terminate }),
                _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
                _ => return,
            }
        })?;
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: a zeroed sigaction with a handler that only writes to
            // the pipe; SA_RESTART keeps reads of the input going.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

#[cfg(not(unix))]
mod platform {
    //! The `ctrlc` crate, which does not tell the signals apart: each is
    //! taken as Ctrl-C.

    pub fn install() -> Result<(), ctrlc::Error> {
        ctrlc::set_handler(|| super::on_signal(super::Kind::Interrupt))
    }
}

/// From now on the first signal only sets [`requested`].
pub fn graceful() {
    GRACEFUL.store(true, Ordering::SeqCst);
}

/// Forgets a stop request, so that the next signal is again a first one
/// (`infer chat`: Ctrl-C stops one reply, the session goes on); not the
/// one of a signal that ends the session.
pub fn clear() {
    if !ending() {
        REQUESTED.store(false, Ordering::SeqCst);
    }
}

/// Whether a signal asked to stop.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst) || ending()
}

/// Removes `path` when a signal arrives (until [`keep`]).
pub fn remove_on_signal(path: &Path) {
    CLEANUP.lock().unwrap_or_else(|p| p.into_inner()).push(path.to_path_buf());
}

/// No longer removes `path` on a signal.
pub fn keep(path: &Path) {
    CLEANUP.lock().unwrap_or_else(|p| p.into_inner()).retain(|p| p != path);
}
