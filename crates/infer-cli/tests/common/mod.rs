//! Helpers shared by the CLI tests: running the binary, temporary
//! directories that delete themselves, one-line error checks.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Runs `infer` with `args` (standard input empty).
pub fn infer<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_infer")).args(args).stdin(Stdio::null()).output().expect("run infer")
}

/// Runs `infer` with `args` and `input` on standard input.
pub fn infer_stdin<S: AsRef<std::ffi::OsStr>>(args: &[S], input: &[u8]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infer"));
    cmd.args(args);
    output_with_stdin(cmd, input)
}

/// Runs `cmd` (an `infer` command, its environment set) with `input` on
/// standard input.
pub fn output_with_stdin(mut cmd: Command, input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run infer");
    child.stdin.take().expect("stdin").write_all(input).expect("write stdin");
    child.wait_with_output().expect("wait")
}

/// The default model (fetched once into the cache).
pub fn default_model() -> String {
    infer_model::fetch::default_model_path().expect("default model").display().to_string()
}

/// A temporary directory, removed when dropped.
pub fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("infer-cli-test-").tempdir().expect("temporary directory")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A failed run whose stderr is one line starting with `error:` that
/// contains `needle`.
#[track_caller]
pub fn assert_one_line_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success; stderr: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got: {err}");
    assert!(lines[0].starts_with("error:"), "{err}");
    assert!(lines[0].contains(needle), "error line {:?} does not mention {needle:?}", lines[0]);
}

/// Writes a tiny synthetic model of `arch` into `dir`.
pub fn synth_tiny(dir: &Path, arch: &str) -> PathBuf {
    let path = dir.join(format!("{arch}-tiny.gguf"));
    let o = infer(&["synth", "--arch", arch, "--size", "tiny", "--seed", "3", "-t", "2", "-o", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("random weights"), "{}", stdout(&o));
    path
}
