//! The CLI against hostile conditions: absurd thread counts, a full or
//! closed standard output, `synth -o` pointed at what it must not replace,
//! Ctrl-C / SIGTERM in the middle of work, and model files whose metadata
//! is zero, absurd or inconsistent with their tensors.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{assert_one_line_error, default_model, infer, stderr, stdout, synth_tiny, tmpdir};
use infer_model::gguf::{GgufFile, GgufWriter, Value};

#[test]
fn threads_are_capped_with_a_warning() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let t0 = Instant::now();
    let o = infer(&["run", "--model", m.to_str().unwrap(), "-t", "100000", "-n", "4", "--temp", "0", "hi"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("warning: --threads 100000 is capped at "), "{}", stderr(&o));
    let o = infer(&["bench", "-m", m.to_str().unwrap(), "-t", "100000", "-p", "0", "-n", "2", "-r", "1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as u64;
    assert_eq!(v[0]["n_threads"].as_u64(), Some(4 * cores));
    assert_eq!(stderr(&o).matches("capped").count(), 1, "one warning: {}", stderr(&o));
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
}

/// Runs `infer args` with standard output on `/dev/full`.
fn to_dev_full(args: &[&str]) -> Option<Output> {
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").ok()?;
    Some(
        Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(full)
            .stderr(Stdio::piped())
            .output()
            .expect("run infer"),
    )
}

#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let ms = m.to_str().unwrap();
    let out = dir.path().join("x.gguf");
    let cases: [&[&str]; 7] = [
        &["info", "-m", ms],
        &["models"],
        &["chat", "-m", ms, "-n", "2"],
        &["run", "-m", ms, "-n", "2", "hi"],
        &["bench", "-m", ms, "-p", "4", "-n", "2", "-r", "1"],
        &["bench", "-m", ms, "-p", "4", "-n", "0", "-r", "1", "--json"],
        &["synth", "--arch", "llama", "--size", "tiny", "-o", out.to_str().unwrap()],
    ];
    for args in cases {
        let Some(o) = to_dev_full(args) else {
            eprintln!("skipped: no /dev/full on this system");
            return;
        };
        assert!(!stderr(&o).contains("panicked"), "{args:?}: {}", stderr(&o));
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("error: cannot write to standard output"), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn a_closed_stdout_is_an_error() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    for cmd in ["run -n 2 hi", "info"] {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("exec \"$0\" {cmd} -m \"$1\" >&-"))
            .arg(env!("CARGO_BIN_EXE_infer"))
            .arg(&m)
            .output()
            .expect("sh");
        assert_one_line_error(&o, "standard output is closed");
        // `> /dev/null` is a choice, not an error.
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("exec \"$0\" {cmd} -m \"$1\" >/dev/null"))
            .arg(env!("CARGO_BIN_EXE_infer"))
            .arg(&m)
            .output()
            .expect("sh");
        assert!(o.status.success(), "{}", stderr(&o));
    }
}

fn synth_to(out: &Path) -> Output {
    infer(&["synth", "--arch", "llama", "--size", "tiny", "-t", "1", "-o", out.to_str().unwrap()])
}

#[test]
fn synth_refuses_what_it_must_not_replace() {
    let dir = tmpdir();
    // A FIFO (mkfifo(1) is POSIX).
    let fifo = dir.path().join("fifo.gguf");
    if Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
        assert_one_line_error(&synth_to(&fifo), "not a regular file");
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    } else {
        eprintln!("skipped the FIFO case: mkfifo failed");
    }
    // A device node: a copy of /dev/null's (character device 1, 3) in the
    // temporary directory; mknod needs privileges, so this is skipped
    // without them.
    let node = dir.path().join("null-device.gguf");
    let made = Command::new("mknod").arg(&node).args(["c", "1", "3"]).stderr(Stdio::null()).status();
    if made.is_ok_and(|s| s.success()) {
        assert_one_line_error(&synth_to(&node), "not a regular file");
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&node).unwrap().file_type().is_char_device());
    } else {
        eprintln!("skipped the device-node case: mknod is not permitted here");
    }
    // A symbolic link (here to a device: the rename would replace the link).
    let link = dir.path().join("null.gguf");
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    assert_one_line_error(&synth_to(&link), "symbolic link");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    // A file of the model cache.
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let cached = cache.join("model.gguf");
    std::fs::write(&cached, b"a cached model").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["synth", "--arch", "llama", "--size", "tiny", "-o", cached.to_str().unwrap()])
        .env("INFER_CACHE_DIR", &cache)
        .output()
        .expect("run infer");
    assert_one_line_error(&o, "model cache");
    assert_eq!(std::fs::read(&cached).unwrap(), b"a cached model");
    // The file it reads its tokenizer from, named through another path.
    let src = dir.path().join("src.gguf");
    std::fs::write(&src, b"the user's model").unwrap();
    let via = dir.path().join("cache").join("..").join("src.gguf");
    let o = infer(&["synth", "--size", "270m", "--tokenizer-from", src.to_str().unwrap(), "-o", via.to_str().unwrap()]);
    assert_one_line_error(&o, "is the --tokenizer-from input");
    assert_eq!(std::fs::read(&src).unwrap(), b"the user's model");
    // A regular file elsewhere is replaced.
    let plain = dir.path().join("plain.gguf");
    std::fs::write(&plain, b"old").unwrap();
    let o = synth_to(&plain);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::metadata(&plain).unwrap().len() > 1000);
}

#[test]
fn synth_removes_stale_partial_files() {
    let dir = tmpdir();
    let out = dir.path().join("m.gguf");
    // A process id above any pid_max: its process is gone.
    let stale = dir.path().join(".m.gguf.partial-2147483000");
    std::fs::write(&stale, b"left by a killed run").unwrap();
    let other = dir.path().join(".other.gguf.partial-2147483000");
    std::fs::write(&other, b"another file's").unwrap();
    let o = synth_to(&out);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stale.exists(), "stale partial file kept");
    assert!(stderr(&o).contains("interrupted run"), "{}", stderr(&o));
    assert!(other.exists(), "a partial file of another output was removed");
}

/// Sends `signal` (a name for kill(1)) to `pid`.
fn kill(signal: &str, pid: u32) {
    let ok = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().is_ok_and(|s| s.success());
    assert!(ok, "kill -{signal} {pid}");
}

#[test]
fn signals_during_synth_remove_the_partial_file() {
    // A 270M-shaped model takes seconds to write: time to interrupt it.
    let model = default_model();
    for signal in ["INT", "TERM"] {
        let dir = tmpdir();
        let out = dir.path().join("big.gguf");
        let child = Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(["synth", "--size", "270m", "-t", "1", "--tokenizer-from", &model, "-o", out.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run infer");
        let partial = dir.path().join(format!(".big.gguf.partial-{}", child.id()));
        let t0 = Instant::now();
        while !partial.exists() && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(partial.exists(), "no partial file appeared");
        kill(signal, child.id());
        let o = child.wait_with_output().expect("wait");
        assert_eq!(o.status.code(), Some(130), "SIG{signal}: {}", stderr(&o));
        assert!(!partial.exists(), "SIG{signal} left {}", partial.display());
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "SIG{signal} left files");
    }
}

#[test]
fn ctrl_c_stops_a_long_prefill_cleanly() {
    // About 6000 prompt tokens: seconds of prefill in passes of 512.
    let model = default_model();
    let dir = tmpdir();
    let prompt = dir.path().join("long.txt");
    std::fs::write(&prompt, "The quick brown fox jumps over the lazy dog. ".repeat(600)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["run", "--model", &model, "-c", "8192", "-n", "-1", "-v", "-f", prompt.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run infer");
    // Wait until the model is loaded (--verbose prints the settings then).
    let mut err_pipe = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut err = String::new();
    while !err.contains("sampler params") {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut err_pipe, &mut line).expect("read stderr") == 0 {
            panic!("infer ended early: {err}");
        }
        err.push_str(&line);
    }
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    kill("INT", child.id());
    std::io::Read::read_to_string(&mut err_pipe, &mut err).expect("read stderr");
    let o = child.wait_with_output().expect("wait");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(130), "{err}");
    // Stopped at the end of the running pass, with the statistics printed.
    assert!(t0.elapsed() < Duration::from_secs(20), "took {:?} to stop", t0.elapsed());
    assert!(err.contains("prefill:") && err.contains("stop: interrupted"), "{err}");
    assert!(err.trim_end().ends_with("interrupted"), "{err}");
}

#[test]
fn long_prompts_show_prefill_progress_on_a_terminal() {
    // script(1) gives the command a terminal; the progress is drawn on it.
    if !Command::new("script").arg("--version").output().is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: script(1) is not installed, so no terminal can be given to infer");
        return;
    }
    let model = default_model();
    let dir = tmpdir();
    let prompt = dir.path().join("long.txt");
    std::fs::write(&prompt, "The quick brown fox jumps over the lazy dog. ".repeat(150)).unwrap();
    let cmd = format!(
        "'{}' run --model '{model}' -n 1 --temp 0 -c 4096 -f '{}'",
        env!("CARGO_BIN_EXE_infer"),
        prompt.display()
    );
    let o = Command::new("script").args(["-qec", &cmd, "/dev/null"]).stdin(Stdio::null()).output().expect("script");
    let all = stdout(&o);
    assert!(o.status.success(), "{all}");
    assert!(all.contains("prefill 512/") && all.contains("prefill 1024/"), "no progress: {all}");
    // Short prompts draw none.
    let cmd = format!("'{}' run --model '{model}' -n 1 --temp 0 -p hello", env!("CARGO_BIN_EXE_infer"));
    let o = Command::new("script").args(["-qec", &cmd, "/dev/null"]).stdin(Stdio::null()).output().expect("script");
    assert!(o.status.success() && !stdout(&o).contains("prefill 0/"), "{}", stdout(&o));
    assert!(!stdout(&o).contains("\rprefill "), "{}", stdout(&o));
}

/// `model` rewritten with `edit` applied to its metadata, as `dir/name`.
fn edited(dir: &Path, model: &GgufFile, name: &str, edit: impl FnOnce(&mut GgufWriter)) -> PathBuf {
    let mut w = GgufWriter::from_gguf(model).expect("rewrite");
    edit(&mut w);
    let path = dir.join(name);
    w.write_to_path(&path).expect("write");
    path
}

/// Exit code 1 (not a panic's 101, not a signal from an allocation abort)
/// and one `error:` line on stderr that contains every fragment.
#[track_caller]
fn assert_clean_failure(o: &Output, what: &str, fragments: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{what}: status {:?}, stderr: {err}", o.status);
    assert!(!err.contains("panicked") && !err.contains("memory allocation of"), "{what}: {err}");
    for f in fragments {
        assert_one_line_error(o, f);
    }
    eprintln!("{what}: {}", err.trim_end());
}

/// Issue 14 items 1, 2 and 7 end to end: a tiny Gemma 3 model with a zero
/// head count, an absurd layer count, or counts that disagree with its
/// tensors is one clear error naming the key in `info`, `run` and `bench`
/// (it was a division by zero, or an allocation abort before any tensor
/// was looked up).
#[test]
fn malformed_hyper_parameters_and_counts_are_one_clear_error_in_every_command() {
    let dir = tmpdir();
    let model = GgufFile::open(synth_tiny(dir.path(), "gemma3")).expect("open");
    let n_layer = model.get_u32("gemma3.block_count").expect("block_count");
    let mut tokens: Vec<String> =
        model.get_str_array("tokenizer.ggml.tokens").expect("tokens").into_iter().map(str::to_string).collect();
    let n_vocab = tokens.len();
    tokens.push("<extra>".into());
    let set = |key: &'static str, v: u32| {
        move |w: &mut GgufWriter| {
            w.set_metadata(key, v).unwrap();
        }
    };
    let cases: Vec<(&str, PathBuf, Vec<String>)> = vec![
        (
            "head_count 0",
            edited(dir.path(), &model, "heads0.gguf", |w| {
                w.set_metadata("gemma3.block_count", 62u32).unwrap();
                w.set_metadata("gemma3.attention.head_count", 0u32).unwrap();
            }),
            vec!["metadata `gemma3.attention.head_count` = 0".into()],
        ),
        (
            "block_count 2^32-1",
            edited(dir.path(), &model, "blocks-max.gguf", set("gemma3.block_count", u32::MAX)),
            vec!["metadata `gemma3.block_count` = 4294967295".into()],
        ),
        (
            "block_count 2^26",
            edited(dir.path(), &model, "blocks-2-26.gguf", set("gemma3.block_count", 1 << 26)),
            vec!["metadata `gemma3.block_count` = 67108864".into()],
        ),
        (
            "block_count below the blk.N tensors",
            edited(dir.path(), &model, "blocks-less.gguf", set("gemma3.block_count", n_layer - 1)),
            vec![
                format!("metadata `gemma3.block_count` = {} disagrees with the tensors", n_layer - 1),
                format!("{n_layer} layers"),
            ],
        ),
        (
            "block_count above the blk.N tensors",
            edited(dir.path(), &model, "blocks-more.gguf", set("gemma3.block_count", n_layer + 1)),
            vec![format!("metadata `gemma3.block_count` = {} disagrees with the tensors", n_layer + 1)],
        ),
        (
            "vocabulary larger than token_embd",
            edited(dir.path(), &model, "vocab.gguf", |w| {
                w.set_metadata("tokenizer.ggml.tokens", Value::from(tokens)).unwrap();
            }),
            vec![
                format!("metadata `tokenizer.ggml.tokens` = {} disagrees with the tensors", n_vocab + 1),
                "token_embd.weight".into(),
            ],
        ),
    ];
    for (what, path, fragments) in &cases {
        let m = path.to_str().unwrap();
        let fragments: Vec<&str> = fragments.iter().map(String::as_str).collect();
        // `info` still describes the file on stdout, then fails.
        let o = infer(&["info", "--model", m]);
        assert_clean_failure(&o, &format!("info, {what}"), &fragments);
        assert!(stdout(&o).contains("architecture: gemma3"), "info, {what}: {}", stdout(&o));
        assert!(!stdout(&o).contains("shapes:"), "info, {what}: {}", stdout(&o));
        let o = infer(&["run", "--model", m, "-n", "1", "hi"]);
        assert_clean_failure(&o, &format!("run, {what}"), &fragments);
        let o = infer(&["bench", "--model", m, "-p", "4", "-n", "1", "-r", "1"]);
        assert_clean_failure(&o, &format!("bench, {what}"), &fragments);
    }
    // The unedited file is described and runs.
    let m = dir.path().join("gemma3-tiny.gguf");
    let o = infer(&["info", "--model", m.to_str().unwrap()]);
    assert!(o.status.success() && stdout(&o).contains("shapes:"), "{}", stderr(&o));
    // A GGUF file that is no model this build runs is described, not an error.
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "mamba").unwrap();
    let mamba = dir.path().join("mamba.gguf");
    w.write_to_path(&mamba).unwrap();
    let o = infer(&["info", "--model", mamba.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("not runnable here: unsupported architecture `mamba`"), "{}", stdout(&o));
}

/// Help and usage text carry no colour codes when not on a terminal; the
/// help into a closed stdout is an error; a full stderr does not panic.
#[test]
fn help_and_diagnostics_survive_pipes_and_full_or_closed_streams() {
    let o = infer(&["--help"]);
    assert!(o.status.success());
    assert!(!String::from_utf8_lossy(&o.stdout).contains('\x1b'), "colour codes in piped help");
    let o = infer(&["run", "--bogus"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&o.stderr).contains('\x1b'), "colour codes in a piped usage error");

    let bin = env!("CARGO_BIN_EXE_infer");
    let closed = std::process::Command::new("sh").args(["-c", &format!("'{bin}' --help >&-")]).output().unwrap();
    assert_eq!(closed.status.code(), Some(1), "help into a closed stdout");
    assert!(String::from_utf8_lossy(&closed.stderr).contains("standard output is closed"));

    if std::path::Path::new("/dev/full").exists() {
        let m = default_model();
        let full = std::process::Command::new("sh")
            .args(["-c", &format!("'{bin}' run -m '{m}' -n 2 -t 1 --temp 0 hi 2>/dev/full")])
            .output()
            .unwrap();
        assert_eq!(full.status.code(), Some(0), "a full stderr: {}", String::from_utf8_lossy(&full.stdout));
        let bad = std::process::Command::new("sh")
            .args(["-c", &format!("'{bin}' run -m /nonexistent/model.gguf hi 2>/dev/full")])
            .output()
            .unwrap();
        assert_eq!(bad.status.code(), Some(1), "an error with a full stderr is still exit 1, not a panic (101)");
    }
}

/// `--tokenizer-from` is refused for a size that generates its own
/// vocabulary instead of being ignored.
#[test]
fn synth_refuses_a_tokenizer_source_it_would_not_use() {
    let dir = tmpdir();
    let out = dir.path().join("t.gguf");
    let o = infer(&[
        "synth",
        "--arch",
        "llama",
        "--size",
        "tiny",
        "--tokenizer-from",
        "README.md",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_one_line_error(&o, "--tokenizer-from");
    assert!(!out.exists());
}

/// A chat line that is not UTF-8 is refused with a message; the
/// conversation goes on with the next line.
#[test]
fn chat_skips_a_line_that_is_not_utf8() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let o = common::infer_stdin(
        &["chat", "--model", m.to_str().unwrap(), "-t", "1", "-n", "2", "--temp", "0"],
        b"hi \xff there\nhello\n/exit\n",
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("that line is not valid UTF-8; it was not sent"), "{err}");
    assert_eq!(err.matches("[prefill ").count(), 1, "one turn after the bad line: {err}");
}

/// Issue 31 item 6: a system prompt that leaves no room in the context is
/// one error, before any turn (every turn failed with `/reset` advice that
/// could not help); a message too long on its own is refused without that
/// advice, and a line longer than the context can hold is refused unread
/// past the limit; the session goes on after both.
#[test]
fn chat_refuses_a_system_prompt_or_a_message_longer_than_the_context() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let m = m.to_str().unwrap();
    let long = "a b c d ".repeat(40);
    let args = ["chat", "--model", m, "-t", "1", "-n", "2", "--temp", "0", "-c", "64", "--system", &long];
    let o = common::infer_stdin(&args, b"hi\nhello\n/exit\n");
    assert_clean_failure(&o, "system prompt", &["the system prompt takes", "of the 64 context positions"]);
    assert!(!stderr(&o).contains("[prefill"), "{}", stderr(&o));

    let huge = format!("{}\n", "x ".repeat(200_000));
    let input = format!("{long}\n{huge}hi\n/exit\n");
    let args = ["chat", "--model", m, "-t", "1", "-n", "2", "--temp", "0", "-c", "64"];
    let o = common::infer_stdin(&args, input.as_bytes());
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("of the 64 context positions on its own; it was not sent"), "{err}");
    assert!(!err.contains("/reset to start over"), "{err}");
    assert!(err.contains("that line has more than 8192 bytes"), "{err}");
    assert_eq!(err.matches("[prefill ").count(), 1, "one turn after the refused lines: {err}");
}

/// Issue 31 item 6: a special-token id past the vocabulary is warned about
/// once on stderr, as llama.cpp does, and the default id is used.
#[test]
fn special_token_ids_past_the_vocabulary_are_warned_about_once() {
    let dir = tmpdir();
    let model = GgufFile::open(synth_tiny(dir.path(), "llama")).expect("open");
    let bad = edited(dir.path(), &model, "bad-eos.gguf", |w| {
        w.set_metadata("tokenizer.ggml.eos_token_id", 999_999u32).unwrap();
    });
    let o = common::infer(&["run", "--model", bad.to_str().unwrap(), "-t", "1", "-n", "2", "--temp", "0", "hi"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: bad special token")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains("tokenizer.ggml.eos_token_id = 999999 is past the vocabulary"), "{err}");
    let o = common::infer(&[
        "run",
        "--model",
        &dir.path().join("llama-tiny.gguf").display().to_string(),
        "-t",
        "1",
        "-n",
        "1",
        "hi",
    ]);
    assert!(!stderr(&o).contains("warning: bad special token"), "{}", stderr(&o));
}
