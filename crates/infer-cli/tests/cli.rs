//! The `infer` binary as a user runs it: generation on the default model,
//! `info`, and one clear error line with a non-zero exit for bad input.

mod common;

use std::process::Command;

use common::{assert_one_line_error, default_model, infer, stderr, tmpdir};

#[test]
fn run_generates_greedy_text_and_reports_speeds() {
    let model = default_model();
    let o = infer(&["run", "--model", &model, "-n", "8", "--temp", "0", "The capital of France is"]);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = stderr(&o);
    assert!(o.status.success(), "stderr: {err}");
    // llama.cpp's greedy continuation of this prompt on this model starts
    // with " the capital of" (testdata/gemma3-270m/logits/p00.json).
    assert!(out.starts_with("The capital of France is the capital of"), "stdout: {out}");
    for key in ["load:", "prefill:", "decode:", "tokens/s", "sampling: seed ", "greedy"] {
        assert!(err.contains(key), "stderr lacks {key}: {err}");
    }
}

/// A run that succeeds prints no error line, also without
/// `XDG_RUNTIME_DIR` (where Mesa's Vulkan device-select layer, which
/// `--backend auto` wakes while it looks for a GPU, prints two).
#[test]
fn a_successful_run_prints_no_error_line() {
    let dir = tmpdir();
    let m = common::synth_tiny(dir.path(), "llama");
    let o = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["run", "--model", m.to_str().expect("path"), "-n", "2", "hi"])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .output()
        .expect("run infer");
    let err = stderr(&o);
    assert!(o.status.success(), "stderr: {err}");
    assert!(!err.lines().any(|l| l.contains("error")), "stderr: {err}");
}

#[test]
fn info_describes_the_default_model() {
    let model = default_model();
    let o = infer(&["info", "--model", &model]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    for key in [
        "GGUF v3",
        "33 metadata keys",
        "236 tensors",
        "gemma3",
        "Q4_K",
        "Q6_K",
        "Q5_0",
        "Q8_0",
        "F32",
        "n_embd 640",
        "kernels:",
        // 18 layers, 5 local per global, as runs.
        "attention:    5 × local(512, rope 10000), global(rope 1000000), 5 × local",
    ] {
        assert!(out.contains(key), "info lacks {key}: {out}");
    }
    // The file it loaded, and ggml's type names as the README prints them.
    assert!(out.starts_with(&format!("path:         {model}\n")), "{out}");
    assert!(!out.contains("q4_K"), "{out}");
}

#[test]
fn missing_model_file_is_one_clear_error() {
    let o = infer(&["run", "--model", "/nonexistent/model.gguf", "hi"]);
    assert_one_line_error(&o, "does not exist");
}

#[test]
fn a_file_that_is_not_gguf_is_one_clear_error() {
    let dir = tmpdir();
    let p = dir.path().join("not-a-model.gguf");
    std::fs::write(&p, b"this is plainly not a GGUF file, just some text").unwrap();
    let o = infer(&["info", "--model", p.to_str().unwrap()]);
    assert_one_line_error(&o, "magic");
}

#[test]
fn unsupported_architecture_is_one_clear_error() {
    let mut w = infer_model::gguf::GgufWriter::new();
    w.add_metadata("general.architecture", "mamba").unwrap();
    let dir = tmpdir();
    let p = dir.path().join("mamba.gguf");
    w.write_to_path(&p).unwrap();
    let o = infer(&["run", "--model", p.to_str().unwrap(), "hi"]);
    assert_one_line_error(&o, "mamba");
}

#[test]
fn prompt_longer_than_the_context_is_one_clear_error() {
    let model = default_model();
    let o = infer(&["run", "--model", &model, "-c", "4", "one two three four five six seven eight"]);
    assert_one_line_error(&o, "context");
}

#[test]
fn bad_sampling_settings_are_one_clear_error() {
    let model = default_model();
    // (--top-p 0 is taken as llama.cpp takes it: the most likely token.)
    let o = infer(&["run", "--model", &model, "--temp", "0.7", "--top-p", "nan", "hi"]);
    assert_one_line_error(&o, "top_p");
}

#[test]
fn a_closed_pipe_ends_output_without_a_panic() {
    // `infer info | head -0`: the reader is gone before the first write.
    use std::process::Stdio;
    let model = default_model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["info", "--model", &model])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run infer");
    drop(child.stdout.take());
    let o = child.wait_with_output().expect("wait");
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "stderr: {err}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        // Either it finished writing before the pipe closed, or SIGPIPE
        // ended it: never a panic's exit code 101.
        assert!(
            o.status.success() || o.status.signal() == Some(libc_sigpipe()),
            "status {:?}, stderr: {err}",
            o.status
        );
    }
}

/// SIGPIPE's number on Linux and the BSDs.
#[cfg(unix)]
fn libc_sigpipe() -> i32 {
    13
}

/// clap's usage errors keep their content (the argument, what is wrong, the
/// values it takes, a tip) on one line, exit status 2.
#[test]
fn usage_errors_are_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["run", "--nonsense"], "unexpected argument '--nonsense' found; tip: to pass '--nonsense' as a value"),
        (
            &["bench", "-o", "xml"],
            "invalid value 'xml' for '--output <FORMAT>' [possible values: md, json, jsonl, csv]",
        ),
        (&["run", "-n", "abc"], "invalid value 'abc' for '--n-predict <N>'"),
        (&["run", "-m"], "a value is required for '--model"),
        (&["frobnicate"], "unrecognized subcommand 'frobnicate'"),
        (&["bench", "--json", "-o", "csv"], "the argument '--json' cannot be used with '--output <FORMAT>'"),
    ];
    for (args, needle) in cases {
        let o = infer(args);
        assert_one_line_error(&o, needle);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
    }
}

/// llama.cpp's flags that a command of `infer` does not take get one line
/// saying what to do instead (clap's own would suggest `-- -b`, or read
/// `-ngl99` as `-n gl99`), exit status 2.
#[test]
fn llama_cpp_flags_a_command_lacks_say_what_to_do_instead() {
    let cases: &[(&[&str], &str)] = &[
        (&["run", "-b", "512", "hi"], "-b (llama.cpp's --batch-size) is not an option of `infer run`"),
        (&["chat", "--batch-size", "512"], "leave -b out (`infer serve` and `infer perplexity` take -b)"),
        (&["run", "-i", "hi"], "-i is not an option of `infer run`: for a conversation, use `infer chat`"),
        (&["run", "--interactive-first"], "for a conversation, use `infer chat`"),
        (&["run", "-cnv", "hi"], "-cnv is not an option of `infer run`: for a conversation, use `infer chat`"),
        (&["chat", "-cnv"], "-cnv: `infer chat` is always an interactive conversation; leave -cnv out"),
        (&["chat", "-i"], "leave -i out"),
        (&["run", "-no-cnv", "hi"], "`infer run` is never a conversation"),
        (
            &["run", "-np", "2", "hi"],
            "-np/--parallel is an option of `infer serve` only: `infer run` runs one sequence",
        ),
        (&["bench", "-np", "2"], "`infer bench -npl B,...` runs B sequences at once"),
        (&["chat", "-p", "hi"], "`infer chat` takes no -p: type the message at its `> ` prompt or pipe it in"),
        (&["chat", "--file", "x.txt"], "`infer run --chat -p TEXT`"),
        (&["run", "-ngl99", "hi"], "-ngl99: give the value apart from the flag, `-ngl 99` or `-ngl=99`"),
        (&["serve", "-np4"], "`-np 4` or `-np=4`"),
    ];
    for (args, needle) in cases {
        let o = infer(args);
        assert_one_line_error(&o, needle);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
    }
}

/// Negative values are numbers, as llama.cpp reads them: `-t -1` (and 0)
/// means all cores; where llama.cpp gives a negative value no meaning, the
/// error names the range.
#[test]
fn negative_numbers_have_llama_cpp_meanings_or_a_range_error() {
    let dir = tmpdir();
    let m = common::synth_tiny(dir.path(), "llama");
    let m = m.to_str().unwrap();
    for t in ["-1", "0"] {
        let o = infer(&["run", "-m", m, "-t", t, "-n", "1", "hi"]);
        assert!(o.status.success(), "-t {t}: {}", stderr(&o));
    }
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "-m", m, "-r", "-1"], "invalid value '-1' for '--repetitions <N>': must be at least 1"),
        (
            &["bench", "-m", m, "--bandwidth", "-5"],
            "invalid value '-5' for '--bandwidth <GBPS>': must be a number above 0",
        ),
        (&["bench", "-m", m, "-p", "-8"], "-p -8: -8 is negative; the values are 0 or more"),
        (&["bench", "-m", m, "-t", "-1"], "-t -1: -1 is negative; the values are 1 or more"),
        (&["serve", "-m", m, "-np", "-2"], "invalid value '-2' for '--parallel <N>': must be at least 1, or -1"),
        (
            &["perplexity", "-m", m, "-f", m, "-c", "-3"],
            "invalid value '-3' for '--ctx-size <N>': must be 0 (the model's training context) or at least 2",
        ),
        // llama.cpp documents -1 ("all") and no other negative --keep.
        (&["run", "-m", m, "--keep", "-5", "hi"], "invalid value '-5' for '--keep <N>': must be at least 0, or -1"),
        (&["chat", "-m", m, "--keep", "-2"], "invalid value '-2' for '--keep <N>': must be at least 0, or -1"),
        (
            &["synth", "--arch", "llama", "--size", "tiny", "--seed", "-1", "-o", "x.gguf"],
            "'--seed <N>': must be at least 0",
        ),
    ];
    for (args, needle) in cases {
        assert_one_line_error(&infer(args), needle);
    }
}

#[test]
fn a_bad_magic_is_escaped_once() {
    let dir = tmpdir();
    let p = dir.path().join("elf.gguf");
    std::fs::write(&p, b"\x7fELF\x02\x01\x01\x00 and more bytes").unwrap();
    let o = infer(&["info", "--model", p.to_str().unwrap()]);
    assert_one_line_error(&o, r#"bad magic "\x7fELF" (expected "GGUF")"#);
}

/// llama-bench's `ngl` column with an `-ngl` list; `--profile` with
/// nothing to profile (`-n 0`) is an error, not a decode run.
#[test]
fn bench_shows_ngl_and_refuses_a_profile_without_decode() {
    let dir = tmpdir();
    let m = common::synth_tiny(dir.path(), "llama");
    let m = m.to_str().unwrap();
    let o = infer(&["bench", "-m", m, "-p", "4", "-n", "0", "-r", "1", "-t", "1", "-ngl", "0,0"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    let header = out.lines().next().unwrap_or_default();
    let cells: Vec<&str> = header.split('|').map(str::trim).collect();
    assert_eq!(cells[4..6], ["backend", "ngl"], "{out}");
    let rows: Vec<&str> = out.lines().filter(|l| l.contains("pp4")).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(rows.iter().all(|r| r.split('|').map(str::trim).nth(5) == Some("0")), "{out}");
    // Without -ngl (on the CPU) there is no such column, as llama-bench.
    let o = infer(&["bench", "-m", m, "-p", "4", "-n", "0", "-r", "1", "-t", "1"]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("ngl"), "{}", String::from_utf8_lossy(&o.stdout));

    let o = infer(&["bench", "-m", m, "-p", "4", "-n", "0", "-r", "1", "--profile"]);
    assert_one_line_error(&o, "--profile times the steps of the decode test, and -n 0 has none");
    // Batched mode has its own sizes and llama-batched-bench's formats:
    // what it would ignore is an error.
    let o = infer(&["bench", "-m", m, "--npl", "1,2", "--npp", "4", "--ntg", "2", "-o", "csv"]);
    assert_one_line_error(&o, "batched mode (--npl) writes md, json or jsonl");
    let o = infer(&["bench", "-m", m, "--npl", "1,2", "--npp", "4", "--ntg", "2", "-p", "32"]);
    assert_one_line_error(&o, "cannot be used with");
}
