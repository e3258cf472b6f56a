//! `infer run` as llama.cpp's and Ollama's users call it: prompts from
//! words, `-p`, `-f` and standard input; llama.cpp's sampling flags and
//! defaults with a random, printed seed; `-n -1`; the context rule; the
//! same `--backend cuda` error in every build.

mod common;

use std::path::Path;

use common::{assert_one_line_error, infer, infer_stdin, stderr, stdout, synth_tiny, tmpdir};

/// The value after `key` on the stats lines (`sampling: seed 123, ...`).
fn stat_after<'a>(err: &'a str, key: &str) -> &'a str {
    let rest = err.split(key).nth(1).unwrap_or_else(|| panic!("no {key:?} in {err}"));
    rest.split([',', ' ', '\n']).next().unwrap_or("")
}

fn run_tiny(model: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["run", "--model", model.to_str().unwrap(), "-t", "1"];
    all.extend_from_slice(args);
    infer(&all)
}

#[test]
fn seed_is_random_by_default_printed_and_reproducible() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let a = run_tiny(&m, &["-n", "24", "hello"]);
    let b = run_tiny(&m, &["-n", "24", "hello"]);
    assert!(a.status.success() && b.status.success(), "{}", stderr(&a));
    let (ea, eb) = (stderr(&a), stderr(&b));
    let (sa, sb) = (stat_after(&ea, "sampling: seed "), stat_after(&eb, "sampling: seed "));
    assert!(sa.parse::<u64>().is_ok() && sb.parse::<u64>().is_ok(), "{sa} {sb}");
    assert_ne!(sa, sb, "two runs without --seed drew the same seed");
    // The printed seed reproduces the run; --seed N is reproducible.
    let again = run_tiny(&m, &["-n", "24", "--seed", sa, "hello"]);
    assert_eq!(stdout(&again), stdout(&a));
    let c = run_tiny(&m, &["-n", "24", "--seed", "42", "hello"]);
    let d = run_tiny(&m, &["-n", "24", "--seed", "42", "hello"]);
    assert_eq!(stdout(&c), stdout(&d));
    assert_eq!(stat_after(&stderr(&c), "sampling: seed "), "42");
    // -1 is llama.cpp's "random".
    let e = run_tiny(&m, &["-n", "2", "--seed", "-1", "hello"]);
    assert!(e.status.success(), "{}", stderr(&e));
    assert_one_line_error(&run_tiny(&m, &["--seed", "-5", "hello"]), "--seed");
}

#[test]
fn sampling_flags_have_llama_cpp_defaults_and_verbose_shows_them() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let o = run_tiny(&m, &["-n", "2", "--verbose", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for key in [
        "sampler chain: top-k -> top-p -> min-p -> temperature -> dist",
        "repeat_last_n = 64",
        "repeat_penalty = 1.000",
        "frequency_penalty = 0.000",
        "presence_penalty = 0.000",
        "top_k = 40",
        "top_p = 0.950",
        "min_p = 0.050",
        "temp = 0.800",
        "context:",
        "model:",
    ] {
        assert!(err.contains(key), "--verbose lacks {key}: {err}");
    }
    let o = run_tiny(
        &m,
        &[
            "-n",
            "2",
            "-v",
            "--temp",
            "1.5",
            "--top-k",
            "7",
            "--top-p",
            "0.5",
            "--min-p",
            "0.1",
            "--repeat-penalty",
            "1.1",
            "--repeat-last-n",
            "-1",
            "--presence-penalty",
            "0.25",
            "--frequency-penalty",
            "0.5",
            "-c",
            "100",
            "hello",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for key in [
        "sampler chain: penalties -> top-k -> top-p -> min-p -> temperature -> dist",
        "repeat_last_n = 100",
        "repeat_penalty = 1.100",
        "frequency_penalty = 0.500",
        "presence_penalty = 0.250",
        "top_k = 7",
        "top_p = 0.500",
        "min_p = 0.100",
        "temp = 1.500",
    ] {
        assert!(err.contains(key), "--verbose lacks {key}: {err}");
    }
    // (--top-p 0 and --min-p 2 are taken, as llama.cpp: see below.)
    assert_one_line_error(&run_tiny(&m, &["--min-p", "nan", "hi"]), "min_p");
    assert_one_line_error(&run_tiny(&m, &["--top-p", "nan", "--temp", "0", "hi"]), "top_p");
    assert_one_line_error(&run_tiny(&m, &["--repeat-penalty", "0", "hi"]), "repetition_penalty");
    assert_one_line_error(&run_tiny(&m, &["--presence-penalty", "inf", "hi"]), "presence_penalty");
    assert_one_line_error(&run_tiny(&m, &["--repeat-last-n", "-2", "hi"]), "--repeat-last-n");
    // A window beyond the context is the context (it reserved memory for
    // the whole window and failed).
    let o = run_tiny(&m, &["-n", "2", "-c", "64", "--repeat-last-n", "99999999999", "-v", "hi"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("repeat_last_n = 64"), "{}", stderr(&o));
}

#[test]
fn prompts_from_words_flag_file_and_stdin_agree() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let ms = m.to_str().unwrap();
    let greedy = ["run", "--model", ms, "-t", "1", "-n", "6", "--temp", "0"];
    let with = |extra: &[&str]| -> Vec<String> { greedy.iter().chain(extra).map(|s| s.to_string()).collect() };
    let words = infer(&with(&["Once", "upon", "a", "time"]));
    assert!(words.status.success(), "{}", stderr(&words));
    assert!(stdout(&words).starts_with("Once upon a time"), "{}", stdout(&words));
    let quoted = infer(&with(&["Once upon a time"]));
    let flag = infer(&with(&["-p", "Once upon a time"]));
    let long_flag = infer(&with(&["--prompt", "Once upon a time"]));
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, "Once upon a time\n").unwrap();
    let from_file = infer(&with(&["-f", file.to_str().unwrap()]));
    let dash = infer_stdin(&with(&["-"]), b"Once upon a time\n");
    let file_dash = infer_stdin(&with(&["-f", "-"]), b"Once upon a time");
    let piped = infer_stdin(&with(&[]), b"Once upon a time\n");
    for (name, o) in [
        ("quoted", &quoted),
        ("-p", &flag),
        ("--prompt", &long_flag),
        ("-f", &from_file),
        ("-", &dash),
        ("-f -", &file_dash),
        ("stdin", &piped),
    ] {
        assert!(o.status.success(), "{name}: {}", stderr(o));
        assert_eq!(stdout(o), stdout(&words), "{name}");
    }
    // Flags after the words are still flags.
    let after = infer(&["run", "--model", ms, "Once", "upon", "-n", "6", "a", "time", "--temp", "0", "-t", "1"]);
    assert_eq!(stdout(&after), stdout(&words), "{}", stderr(&after));
    assert_one_line_error(&infer(&with(&["-f", "/nonexistent/prompt.txt"])), "prompt file");
    let o = infer(&with(&["-p", "a", "b"]));
    assert!(!o.status.success() && stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
}

#[test]
fn n_minus_one_runs_to_the_end_and_one_token_is_singular() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let o = run_tiny(&m, &["-n", "-1", "-c", "24", "--no-context-shift", "--temp", "0", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("stop: context full") || err.contains("stop: end of generation"), "{err}");
    // llama.cpp's -2 ("until the context is filled") is accepted; below it
    // is an error.
    assert_one_line_error(&run_tiny(&m, &["-n", "-3", "hello"]), "-n -3");
    // "1 token", never "1 tokens".
    let o = run_tiny(&m, &["-n", "1", "-p", "", "--temp", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("prefill:  1 token in"), "{err}");
    assert!(err.contains("decode:   1 token (0 after the first)"), "{err}");
    // (A space before: a rate such as "3930.1 tokens/s" is not a count.)
    assert!(!err.contains(" 1 tokens"), "{err}");
}

#[test]
fn context_beyond_training_is_clamped_with_a_warning() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let o = run_tiny(&m, &["-n", "2", "-c", "100000000", "-v", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("warning: --ctx-size 100000000 is more than the model's training context of "), "{err}");
    let n_ctx_train = stat_after(&err, "training context of ");
    assert!(err.contains(&format!("context:  {n_ctx_train} positions")), "{err}");
}

#[test]
fn the_default_context_meets_a_shorter_training_context_silently() {
    // The tiny model with a training context of 2048, below the default 4096.
    let dir = tmpdir();
    let model = infer_model::gguf::GgufFile::open(synth_tiny(dir.path(), "llama")).expect("open");
    let mut w = infer_model::gguf::GgufWriter::from_gguf(&model).expect("rewrite");
    w.set_metadata("llama.context_length", 2048u32).unwrap();
    let m = dir.path().join("ctx2048.gguf");
    w.write_to_path(&m).expect("write");
    let o = run_tiny(&m, &["-n", "2", "-v", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(!err.contains("warning"), "{err}");
    assert!(err.contains("context:  2048 positions"), "{err}");
    // Asked for, the same length is clamped with the warning.
    let o = run_tiny(&m, &["-n", "2", "-c", "4096", "hello"]);
    assert!(stderr(&o).contains("warning: --ctx-size 4096 is more than the model's training context of 2048"));
}

#[test]
fn backend_cuda_without_a_gpu_is_the_same_error_in_every_build() {
    // The message of the plain build and of `--features cuda` on a machine
    // without the NVIDIA driver.
    let driver = ["/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1", "/usr/lib/libcuda.so.1"]
        .iter()
        .any(|p| Path::new(p).exists())
        || Path::new("/dev/nvidiactl").exists();
    if driver {
        eprintln!("skipped: this machine has an NVIDIA driver; the no-GPU error cannot be checked here");
        return;
    }
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let want =
        "--backend cuda: no NVIDIA driver on this machine (libcuda.so could not be loaded); use --backend cpu or auto";
    for cmd in ["run", "info"] {
        let o = infer(
            &[cmd, "--model", m.to_str().unwrap(), "--backend", "cuda", "hello"][..if cmd == "run" { 6 } else { 5 }],
        );
        assert_one_line_error(&o, want);
    }
    let o = infer(&["bench", "--model", m.to_str().unwrap(), "--backend", "cuda", "-p", "0", "-n", "1", "-r", "1"]);
    assert_one_line_error(&o, want);
    // auto falls back to the CPU in both builds.
    let o = infer(&["info", "--model", m.to_str().unwrap(), "--backend", "auto"]);
    assert!(o.status.success() && stdout(&o).contains("backend:      CPU"), "{}", stderr(&o));
}

#[test]
fn greedy_still_applies_the_penalties() {
    // llama.cpp's penalties come before the greedy choice: a strong
    // repetition penalty changes a greedy continuation.
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let plain = run_tiny(&m, &["-n", "16", "--temp", "0", "hello"]);
    let penalized =
        run_tiny(&m, &["-n", "16", "--temp", "0", "--repeat-penalty", "50", "--frequency-penalty", "5", "-v", "hello"]);
    assert!(plain.status.success() && penalized.status.success(), "{}", stderr(&penalized));
    assert!(stderr(&penalized).contains("sampler chain: penalties -> greedy"), "{}", stderr(&penalized));
    assert_ne!(stdout(&plain), stdout(&penalized));
}

/// A generation longer than the context shifts it (llama.cpp's context
/// shift: --keep tokens stay, the oldest half of the rest goes) and reaches
/// -n; `--no-context-shift` and llama.cpp's `-n -2` end at the full context.
#[test]
fn a_full_context_shifts_unless_told_not_to() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let o = run_tiny(&m, &["-n", "40", "-c", "16", "--keep", "2", "--ignore-eos", "--temp", "0", "--json", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("run --json");
    assert_eq!(j["generated_tokens"], 40, "{j}");
    assert_eq!(j["stop"], "max tokens", "{j}");
    assert!(j["context_shifts"].as_u64().unwrap() >= 2, "{j}");
    let o = run_tiny(&m, &["-n", "40", "-c", "16", "--ignore-eos", "--temp", "0", "hello"]);
    assert!(stderr(&o).contains("context:  shifted"), "{}", stderr(&o));
    for off in [&["--no-context-shift", "-n", "40"][..], &["-n", "-2"][..]] {
        let mut args = vec!["-c", "16", "--ignore-eos", "--temp", "0", "hello"];
        args.extend_from_slice(off);
        let o = run_tiny(&m, &args);
        assert!(stderr(&o).contains("stop: context full"), "{off:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("shifted"), "{off:?}: {}", stderr(&o));
    }
    assert_one_line_error(&run_tiny(&m, &["--keep", "-2", "hello"]), "invalid value '-2' for '--keep <N>'");
    // -1 keeps the whole prompt, as a --keep longer than the prompt does.
    let keep = |n: &str| {
        let o =
            run_tiny(&m, &["-n", "40", "-c", "16", "--keep", n, "--ignore-eos", "--temp", "0", "--json", "a b c d"]);
        assert!(o.status.success(), "--keep {n}: {}", stderr(&o));
        let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("run --json");
        assert!(j["context_shifts"].as_u64().unwrap() >= 2, "{j}");
        (j["text"].clone(), j["context_shifts"].clone())
    };
    assert_eq!(keep("-1"), keep("1000"));
}

/// A context shift feeds the kept tokens again, so it works on every KV
/// cache type: quantized keys, and TurboQuant keys with quantized values.
#[test]
fn a_full_context_shifts_on_quantized_cache_types() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    for types in [&["-ctk", "q8_0"][..], &["-ctk", "tq3", "-ctv", "q4_0"]] {
        let mut args = vec!["-n", "40", "-c", "16", "--keep", "2", "--ignore-eos", "--temp", "0", "--json", "hello"];
        args.extend_from_slice(types);
        let o = run_tiny(&m, &args);
        assert!(o.status.success(), "{types:?}: {}", stderr(&o));
        let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("run --json");
        assert_eq!(j["generated_tokens"], 40, "{types:?}: {j}");
        assert_eq!(j["stop"], "max tokens", "{types:?}: {j}");
        assert!(j["context_shifts"].as_u64().unwrap() >= 2, "{types:?}: {j}");
    }
}

/// `path` with `general.sampling.*` keys added (`(key suffix, value)`),
/// written to `out`.
fn with_sampling_keys(path: &Path, out: &Path, keys: &[(&str, infer_model::gguf::Value)]) {
    let g = infer_model::gguf::GgufFile::open(path).unwrap();
    let mut w = infer_model::gguf::GgufWriter::from_gguf(&g).unwrap();
    for (k, v) in keys {
        w.set_metadata(format!("general.sampling.{k}"), v.clone()).unwrap();
    }
    w.write_to_path(out).unwrap();
}

#[test]
fn the_files_sampling_keys_are_defaults_under_the_flags() {
    use infer_model::gguf::Value;
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let keyed = dir.path().join("keyed.gguf");
    with_sampling_keys(
        &m,
        &keyed,
        &[
            ("temp", Value::F32(0.0)),
            ("top_k", Value::I32(7)),
            ("min_p", Value::String("0.1".into())),
            ("penalty_repeat", Value::F32(1.1)),
            ("penalty_last_n", Value::I32(-1)),
            // No such stage here: ignored, as a mirostat key would be.
            ("xtc_probability", Value::F32(0.5)),
        ],
    );
    let o = run_tiny(&keyed, &["-n", "2", "-v", "-c", "100", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for key in [
        "sampler chain: penalties -> greedy",
        "repeat_last_n = 100",
        "repeat_penalty = 1.100",
        "top_k = 7",
        "top_p = 0.950",
        "min_p = 0.100",
        "temp = 0.000",
        "sampler params from the model (not given here): temp = 0, top_k = 7, min_p = 0.1, repeat_penalty = 1.1, \
         repeat_last_n = -1",
        "sampling: seed ",
        "; the model's temp = 0, top_k = 7",
    ] {
        assert!(err.contains(key), "stderr lacks {key}: {err}");
    }
    // The flags win; only the settings not given come from the file.
    let o = run_tiny(&keyed, &["-n", "2", "-v", "--temp", "0.7", "--top-k", "3", "--repeat-penalty", "1", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for key in [
        "sampler chain: top-k -> top-p -> min-p -> temperature -> dist",
        "temp = 0.700",
        "top_k = 3",
        "min_p = 0.100",
        "sampler params from the model (not given here): min_p = 0.1, repeat_last_n = -1",
    ] {
        assert!(err.contains(key), "stderr lacks {key}: {err}");
    }
    // A file without the keys: llama.cpp's defaults, nothing said.
    let o = run_tiny(&m, &["-n", "2", "hello"]);
    assert!(o.status.success() && !stderr(&o).contains("the model's"), "{}", stderr(&o));
    // A bad value from the file is an error that names it.
    let bad = dir.path().join("bad.gguf");
    with_sampling_keys(&m, &bad, &[("top_p", Value::F32(0.0))]);
    assert_one_line_error(&run_tiny(&bad, &["hi"]), "the model sets top_p = 0");
}

/// `run --json`'s rates mean what llama-server's do: the first predicted
/// token comes from the prompt's logits, so `predicted_ms` and the rates
/// are over the `predicted_n - 1` decode steps after it (llama-server's
/// `n_gen_steps`), which `predicted_per_token_ms` makes explicit.
#[test]
fn run_json_rates_count_the_decode_steps_as_llama_server() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let o = run_tiny(&m, &["-n", "8", "--temp", "0", "--ignore-eos", "--json", "-p", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let t = &v["timings"];
    let f = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("no {k}: {t}"));
    assert_eq!(t["predicted_n"], 8, "{t}");
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0);
    assert!(close(f("predicted_per_second"), 7.0 * 1e3 / f("predicted_ms")), "{t}");
    assert!(close(f("predicted_per_token_ms"), f("predicted_ms") / 7.0), "{t}");
    assert!(close(f("prompt_per_token_ms"), f("prompt_ms") / f("prompt_n")), "{t}");
}

/// `-c 1` cannot hold a prompt and a generated token: said without
/// "more than 0 tokens".
#[test]
fn a_context_of_one_position_is_a_clear_error() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let o = run_tiny(&m, &["-c", "1", "hello"]);
    assert_one_line_error(&o, "a context of 1 position leaves no room to generate after the prompt");
    assert!(!stderr(&o).contains("more than 0"), "{}", stderr(&o));
    let o = run_tiny(&m, &["-c", "2", "hello world again"]);
    assert_one_line_error(&o, "the prompt has more than 1 token; a context of 2 positions leaves no room");
}

/// Without a GPU, `-dev cuda` advises `-dev cpu` (the flag the user wrote),
/// `--backend cuda` advises `--backend cpu`.
#[test]
fn a_missing_gpu_is_named_in_the_flag_that_asked_for_it() {
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipped: this machine has an NVIDIA GPU");
        return;
    }
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let o = run_tiny(&m, &["-dev", "cuda", "hello"]);
    assert_one_line_error(&o, "-dev cuda: ");
    assert!(stderr(&o).contains("use -dev cpu") && !stderr(&o).contains("--backend"), "{}", stderr(&o));
    let o = run_tiny(&m, &["--backend", "cuda", "hello"]);
    assert_one_line_error(&o, "--backend cuda: ");
    assert!(stderr(&o).contains("use --backend cpu"), "{}", stderr(&o));
}

/// llama.cpp's ways with flags: the text options take a value that starts
/// with `-`; a flag given twice takes the last value; `--predict` is `-n`;
/// `--top-p` 0 or below keeps the most likely token (greedy), 1 or more is
/// off; `--min-p` above 1 keeps the most likely token; `-sys ''` is no
/// system prompt.
#[test]
fn flags_take_dash_values_the_last_repeat_and_llama_cpp_ranges() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let json = |args: &[&str]| -> serde_json::Value {
        let o = run_tiny(&m, &[&["--json", "--ignore-eos"], args].concat());
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    assert_eq!(json(&["-n", "2", "-p", "-1"])["prompt"], "-1");
    assert_eq!(json(&["-n", "2", "-p", "-hello"])["prompt"], "-hello");
    json(&["-n", "2", "-r", "-x", "-p", "hi"]);
    json(&["-n", "2", "-sys", "-be terse", "-p", "hi"]);
    json(&["-n", "2", "--system-prompt", "--be terse", "-p", "hi"]);
    // Twice: the last one counts.
    assert_eq!(json(&["-n", "5", "-n", "2", "-p", "hi"])["generated_tokens"], 2);
    assert_eq!(json(&["--predict", "3", "-p", "hi"])["generated_tokens"], 3);
    let greedy = json(&["-n", "8", "--temp", "0", "-p", "hi"]);
    for filter in [["--top-p", "0"], ["--top-p", "-1"], ["--min-p", "2"]] {
        let got = json(&[&["-n", "8", "--temp", "1", "--seed", "5", "-p", "hi"], &filter[..]].concat());
        assert_eq!(got["text"], greedy["text"], "{filter:?} does not keep the most likely token alone");
    }
    json(&["-n", "2", "--top-p", "1.5", "-p", "hi"]);
    // An empty system prompt is none: the same prompt as without it.
    let none = json(&["-n", "1", "--chat", "-p", "hi"]);
    let empty = json(&["-n", "1", "--chat", "-sys", "", "-p", "hi"]);
    assert_eq!(empty["prompt_tokens"], none["prompt_tokens"]);
}

/// An empty prompt, as llama.cpp: generated from BOS when the model adds
/// one (Gemma 3), else refused (SmolLM2) with one line and nothing on
/// standard output.
#[test]
fn an_empty_prompt_starts_from_bos_or_is_refused_before_any_output() {
    infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    let o = infer(&["run", "-m", "smollm2-135m", "-n", "2", "-p", ""]);
    assert_one_line_error(&o, "the prompt is empty and the model adds no BOS token");
    assert_eq!(stdout(&o), "");
    let gemma = common::default_model();
    let o = infer(&["run", "-m", &gemma, "-n", "2", "--ignore-eos", "-p", ""]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("the prompt is empty: generating from the BOS token alone"), "{}", stderr(&o));
}

/// Messages: `--keep` too large says so; llama.cpp's `--samplers` is named
/// as one infer lacks (no guess at a similar option); a one-token reply
/// has no decode rate; a full context that `--keep` keeps from shifting
/// says why it stopped.
#[test]
fn keep_samplers_and_decode_rate_messages() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let o = run_tiny(&m, &["--keep", "99999999999999999999", "-p", "x"]);
    assert_one_line_error(&o, "too large");
    let o = run_tiny(&m, &["--samplers", "x", "-p", "x"]);
    assert_one_line_error(&o, "--samplers (llama.cpp's, also -bs) is not an option of infer");
    assert!(!stderr(&o).contains("gpu-layers"), "{}", stderr(&o));
    let o = run_tiny(&m, &["-n", "1", "-p", "hi"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("(n/a tokens/s)"), "{}", stderr(&o));
    // A prompt of 14 tokens in a context of 16, all kept: one token left
    // to drop, none dropped (llama.cpp drops half of what is past --keep).
    let long = (1..60)
        .map(|k| "a b ".repeat(k))
        .find(|p| {
            let o = run_tiny(&m, &["-n", "1", "--json", "-p", p]);
            serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap()["prompt_tokens"] == 14
        })
        .expect("a prompt of 14 tokens");
    let o = run_tiny(&m, &["-c", "16", "--keep", "100", "-n", "40", "--ignore-eos", "-p", &long]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("stop: context full"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("full and not shifted: --keep 100 keeps 14 tokens of the 16 positions"),
        "{}",
        stderr(&o)
    );
}

/// `perplexity -c 0` is the training context (as llama-perplexity);
/// `--chunks 0` measures nothing and is an error.
#[test]
fn perplexity_takes_c_0_and_refuses_zero_chunks() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "the quick brown fox ".repeat(50)).unwrap();
    let ppl = |args: &[&str]| {
        let mut all = vec!["perplexity", "-m", m.to_str().unwrap(), "-t", "1", "-f", text.to_str().unwrap()];
        all.extend_from_slice(args);
        infer(&all)
    };
    // The training context of the tiny model is 4096 tokens.
    let o = ppl(&["-c", "0"]);
    assert!(!o.status.success() && stderr(&o).contains("with a context of 4096;"), "{}", stderr(&o));
    assert_one_line_error(&ppl(&["-c", "16", "--chunks", "0"]), "--chunks 0: nothing to measure");
    assert_one_line_error(&ppl(&["-c", "1"]), "must be 0 (the model's training context) or at least 2");
}
