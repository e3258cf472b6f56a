//! llama.cpp's flags with llama.cpp's meanings, on tiny synthetic models
//! (and the real SmolLM2 135M Instruct where a model must end its turn):
//! `-s`, `-ngl`, `-dev`, `-sys`, `-r`, `-e`, `--no-display-prompt`,
//! `--ignore-eos`, `--verbose-prompt`, negative values, `run --json`,
//! `info` (file type, tokenizer, chat template, `--json`), `infer models`,
//! `bench` lists and `-o`.

mod common;

use std::path::Path;

use common::{assert_one_line_error, infer, infer_stdin, stderr, stdout, synth_tiny, tmpdir};

fn run_tiny(model: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["run", "--model", model.to_str().unwrap(), "-t", "1"];
    all.extend_from_slice(args);
    infer(&all)
}

/// `run --json` of `args` on `model`, parsed.
fn run_json(model: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.push("--json");
    let o = run_tiny(model, &all);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(&o)))
}

#[test]
fn short_seed_and_negative_values_as_llama_cpp() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let a = run_tiny(&m, &["-n", "12", "-s", "42", "hello"]);
    let b = run_tiny(&m, &["-n", "12", "--seed", "42", "hello"]);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(stdout(&a), stdout(&b));
    assert!(stderr(&a).contains("sampling: seed 42,"), "{}", stderr(&a));
    // --top-k -5 is off (llama.cpp: <= 0), --repeat-last-n -1 the context,
    // a negative temperature greedy, a negative min-p off.
    let o = run_tiny(&m, &["-n", "4", "-v", "--top-k", "-5", "--repeat-last-n", "-1", "-c", "48", "hi"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("top_k = 0") && stderr(&o).contains("repeat_last_n = 48"), "{}", stderr(&o));
    let greedy = run_tiny(&m, &["-n", "8", "--temp", "0", "hi"]);
    let negative = run_tiny(&m, &["-n", "8", "--temp", "-1", "--min-p", "-0.5", "-v", "hi"]);
    assert!(negative.status.success(), "{}", stderr(&negative));
    assert_eq!(stdout(&negative), stdout(&greedy));
    assert!(stderr(&negative).contains("min_p = 0.000"), "{}", stderr(&negative));
    // -c -1 means nothing in llama.cpp either: one precise line.
    assert_one_line_error(&run_tiny(&m, &["-c", "-1", "hi"]), "-c -1: give a number of positions, or 0");
    // llama.cpp's -n -2 (until the context is filled).
    let o = run_tiny(&m, &["-n", "-2", "-c", "20", "--temp", "0", "hi"]);
    assert!(o.status.success() && stderr(&o).contains("stop: "), "{}", stderr(&o));
}

#[test]
fn gpu_layers_and_device_choose_the_backend_all_or_nothing() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    // -ngl is not `-n gl`: 3 tokens are generated with -ngl 0 and -n 3.
    let o = run_tiny(&m, &["-ngl", "0", "-n", "3", "--temp", "0", "hi"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("decode:   3 tokens") && stderr(&o).contains("backend:  CPU"), "{}", stderr(&o));
    let o = run_tiny(&m, &["-ngl=0", "-dev", "none", "--backend", "cpu", "-n", "1", "hi"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Conflicts name both sides.
    assert_one_line_error(
        &run_tiny(&m, &["-ngl", "99", "--backend", "cpu", "hi"]),
        "--backend cpu and -ngl 99 disagree",
    );
    assert_one_line_error(&run_tiny(&m, &["-ngl", "0", "-dev", "CUDA0", "hi"]), "-ngl 0 and -dev CUDA0 disagree");
    assert_one_line_error(&run_tiny(&m, &["-ngl", "lots", "hi"]), "-ngl lots: give a number of layers");
    assert_one_line_error(&run_tiny(&m, &["-dev", "CUDA1", "hi"]), "only the first NVIDIA GPU (CUDA0)");
    assert_one_line_error(&run_tiny(&m, &["-dev", "metal", "hi"]), "-dev metal: unknown device");
    let has_gpu = std::path::Path::new("/proc/driver/nvidia").exists();
    if !has_gpu {
        // Asked for by name, the GPU is required; -ngl 99 alone falls back
        // to the CPU with a warning, as llama.cpp.
        assert_one_line_error(&run_tiny(&m, &["-dev", "cuda", "hi"]), "-dev cuda: no NVIDIA driver");
        let o = run_tiny(&m, &["-ngl", "99", "-n", "2", "hi"]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("warning: -ngl 99: no usable GPU"), "{}", stderr(&o));
        assert!(stderr(&o).contains("backend:  CPU"), "{}", stderr(&o));
    }
    // llama.cpp's multi-letter flags that infer lacks are refused by name,
    // not taken apart (`-fa` as `-f a`, `-hf` as help).
    assert_one_line_error(&run_tiny(&m, &["-fa", "on", "hi"]), "-fa (llama.cpp's --flash-attn) is not an option");
    let o = infer(&["run", "-hft", "token", "hi"]);
    assert_one_line_error(&o, "-hft (llama.cpp's --hf-token)");
    assert_eq!(o.status.code(), Some(2));
    // -hff is infer's too (tests/hub.rs), and names a file of a repository.
    assert_one_line_error(&run_tiny(&m, &["-hff", "x.gguf", "hi"]), "--hf-file x.gguf names a file of a Hugging Face");
    // -hf is infer's too (tests/hub.rs): read as --hf-repo, not as -h -f.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["run", "-hf", "user/repo", "hi"])
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env("INFER_CACHE_DIR", dir.path())
        .output()
        .unwrap();
    assert_one_line_error(&o, "listing the files of user/repo");
    // -dev takes llama.cpp's comma list, of one backend's devices.
    let o = run_tiny(&m, &["-dev", "cpu,CPU", "-n", "1", "hi"]);
    assert!(o.status.success() && stderr(&o).contains("backend:  CPU"), "{}", stderr(&o));
    assert_one_line_error(
        &run_tiny(&m, &["-dev", "cpu,CUDA0", "hi"]),
        "-dev cpu,CUDA0: these devices are of different",
    );
    assert_one_line_error(&run_tiny(&m, &["-dev", "cpu,", "hi"]), "-dev cpu,: an empty device name");
    assert_one_line_error(&run_tiny(&m, &["-dev", "cpu,metal", "hi"]), "-dev metal: unknown device");
    // A -ngl list is bench's.
    assert_one_line_error(&run_tiny(&m, &["-ngl", "0,99", "hi"]), "(a list is for `infer bench`)");
    // --list-devices: the devices one a line, named as -dev takes them, and
    // nothing else runs (perplexity's -f is not needed).
    for cmd in [&["run", "--list-devices"][..], &["perplexity", "--list-devices"], &["bench", "--list-devices"]] {
        let o = infer(cmd);
        assert!(o.status.success(), "{cmd:?}: {}", stderr(&o));
        let out = stdout(&o);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "Available devices:", "{out}");
        assert!(lines.iter().any(|l| l.starts_with("  CPU: ")), "{out}");
        assert_eq!(lines.iter().any(|l| l.starts_with("  CUDA0: ")), has_gpu && cfg!(feature = "cuda"), "{out}");
    }
    // -ngl everywhere a model runs.
    let o = infer(&["info", "-m", m.to_str().unwrap(), "-ngl", "0"]);
    assert!(o.status.success() && stdout(&o).contains("backend:      CPU"), "{}", stderr(&o));
}

#[test]
fn escapes_display_prompt_and_verbose_prompt() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    // -e is on by default: "\n" in -p is a newline, as llama.cpp.
    let o = run_tiny(&m, &["-n", "1", "--temp", "0", "-p", r"one\ntwo\x21"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("one\ntwo!"), "{:?}", stdout(&o));
    let o = run_tiny(&m, &["-n", "1", "--temp", "0", "--no-escape", "-p", r"one\ntwo"]);
    assert!(stdout(&o).starts_with(r"one\ntwo"), "{:?}", stdout(&o));
    // The last of -e and --no-escape wins.
    let o = run_tiny(&m, &["-n", "1", "--temp", "0", "--no-escape", "-e", "-p", r"a\tb"]);
    assert!(stdout(&o).starts_with("a\tb"), "{:?}", stdout(&o));
    // Words on the command line are not llama.cpp's -p: taken as written.
    let o = run_tiny(&m, &["-n", "1", "--temp", "0", r"a\nb"]);
    assert!(stdout(&o).starts_with(r"a\nb"), "{:?}", stdout(&o));
    assert_one_line_error(&run_tiny(&m, &["-p", r"\xff"]), "-p: its \\x escapes do not form UTF-8");

    // --no-display-prompt prints only the generation.
    let shown = run_tiny(&m, &["-n", "6", "--temp", "0", "-p", "hello"]);
    let hidden = run_tiny(&m, &["-n", "6", "--temp", "0", "-p", "hello", "--no-display-prompt"]);
    assert_eq!(stdout(&shown), format!("hello{}", stdout(&hidden)));

    // --verbose-prompt: the prompt, its token count, `id -> 'piece'` lines
    // that add up to the prompt.
    let o = run_tiny(&m, &["-n", "1", "--verbose-prompt", "-p", "hello world"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("prompt: 'hello world'"), "{err}");
    let n: usize = err
        .split("number of tokens in prompt = ")
        .nth(1)
        .and_then(|s| s.lines().next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no token count in {err}"));
    let pieces: Vec<&str> = err.lines().filter(|l| l.contains(" -> '")).collect();
    assert_eq!(pieces.len(), n, "{err}");
    assert!(n >= 2, "{err}");
    let joined: String = pieces
        .iter()
        .map(|l| {
            let (id, piece) = l.split_once(" -> ").unwrap();
            assert!(id.trim().parse::<u32>().is_ok(), "{l}");
            piece.trim_start_matches('\'').trim_end_matches('\'').to_string()
        })
        .collect();
    assert!(joined.ends_with("hello world"), "{joined:?}");

    // With --chat: the prompt the model is given, rendered by the chat
    // template, and its tokens, as llama.cpp shows them.
    let o = run_tiny(&m, &["-n", "1", "--chat", "--verbose-prompt", "--json", "-p", "hello world"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("prompt: '<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n'"), "{err}");
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let n = j["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(err.contains(&format!("number of tokens in prompt = {n}\n")), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains(" -> '")).count(), n, "{err}");
}

/// `-r` ends the generation at the stop string: the text output shows it,
/// as llama.cpp's does; `--json`'s `text` ends before it (and
/// `stop_string` names it), as llama-server's `content`.
#[test]
fn reverse_prompts_stop_at_the_stop_string() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let greedy = ["-n", "40", "--temp", "0", "-p", "hello"];
    let full = run_json(&m, &greedy);
    let text = full["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 12, "too little text to cut: {text:?}");
    // A stop string of three characters from the middle: it spans tokens
    // or not, either way the text ends before it.
    let stop: String = chars[6..9].iter().collect();
    let at = text.find(&stop).unwrap();
    let mut args = greedy.to_vec();
    args.extend(["-r", &stop]);
    let cut = run_json(&m, &args);
    assert_eq!(cut["text"].as_str().unwrap(), &text[..at], "stop string {stop:?} in {text:?}");
    assert_eq!(cut["stop"], "stop string");
    assert_eq!(cut["stop_string"], stop.as_str());
    // Repeated -r: the earliest in the text wins.
    let early: String = chars[2..4].iter().collect();
    let early_at = text.find(&early).unwrap();
    args.extend(["-r", &early]);
    let cut = run_json(&m, &args);
    assert_eq!(cut["text"].as_str().unwrap(), &text[..early_at.min(at)]);
    // The text output: the prompt, the text up to the stop string and
    // the stop string (llama.cpp prints it), a newline; the statistics
    // say why it stopped.
    let o = run_tiny(&m, &[&greedy[..], &["-r", &stop]].concat());
    assert_eq!(stdout(&o), format!("hello{}{stop}\n", &text[..at]));
    assert!(stderr(&o).contains("stop: stop string"), "{}", stderr(&o));
    // A stop string that never comes changes nothing.
    let o = run_json(&m, &[&greedy[..], &["-r", "\u{1F600}never"]].concat());
    assert_eq!(o["text"].as_str().unwrap(), text);
    assert_one_line_error(&run_tiny(&m, &["-r", "", "hi"]), "-r: a stop string cannot be empty");
    // -r takes escapes as -p does: the stop string's first character as
    // \xHH stops at the same place; with --no-escape it is taken as written.
    let first = stop.chars().next().unwrap();
    let bytes: String = first.to_string().bytes().map(|b| format!("\\x{b:02x}")).collect();
    let escaped = format!("{bytes}{}", &stop[first.len_utf8()..]);
    assert!(!stop.contains('\\'), "{stop:?}");
    let cut = run_json(&m, &[&greedy[..], &["-r", &escaped]].concat());
    assert_eq!(cut["text"].as_str().unwrap(), &text[..at], "-r {escaped}");
    assert_eq!(cut["stop_string"], stop.as_str());
    let raw = run_json(&m, &[&greedy[..], &["-r", &escaped, "--no-escape"]].concat());
    assert_eq!(raw["text"].as_str().unwrap(), text, "-r {escaped} --no-escape");
    assert_one_line_error(&run_tiny(&m, &["-r", r"\xff", "hi"]), "-r: its \\x escapes do not form UTF-8");
}

/// llama.cpp's -sys turns the conversation mode on: `run -sys X` is `run
/// --chat -sys X` (the prompt in the chat template, not echoed).
#[test]
fn a_system_prompt_turns_chat_on_in_run() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let args = ["-n", "3", "--temp", "0", "-p", "hello"];
    let sys = run_json(&m, &[&args[..], &["-sys", "be brief"]].concat());
    let chat = run_json(&m, &[&args[..], &["--chat", "-sys", "be brief"]].concat());
    let plain = run_json(&m, &args);
    assert_eq!(sys["prompt_tokens"], chat["prompt_tokens"]);
    assert_eq!(sys["text"], chat["text"]);
    assert!(sys["prompt_tokens"].as_u64() > plain["prompt_tokens"].as_u64(), "{sys}\n{plain}");
    let o = run_tiny(&m, &[&args[..], &["--system-prompt", "be brief"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).starts_with("hello"), "the chat prompt is not echoed: {}", stdout(&o));
}

#[test]
fn run_json_has_text_counts_and_timings() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let v = run_json(&m, &["-n", "5", "--temp", "0", "-s", "7", "-p", "hello"]);
    assert_eq!(v["prompt"], "hello");
    assert_eq!(v["generated_tokens"], 5);
    assert!(v["prompt_tokens"].as_u64().unwrap() >= 1);
    assert_eq!(v["stop"], "max tokens");
    assert_eq!(v["seed"], 7);
    assert!(v["stop_string"].is_null());
    let t = &v["timings"];
    assert_eq!(t["predicted_n"], 5);
    assert_eq!(t["prompt_n"], v["prompt_tokens"]);
    for k in ["load_ms", "prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_second"] {
        assert!(t[k].as_f64().is_some_and(|x| x >= 0.0), "{k}: {t}");
    }
    // The text is the one `run` prints.
    let o = run_tiny(&m, &["-n", "5", "--temp", "0", "-p", "hello"]);
    assert_eq!(stdout(&o), format!("hello{}\n", v["text"].as_str().unwrap()));
    // Nothing but the JSON on stdout.
    let o = run_tiny(&m, &["-n", "2", "--json", "hello"]);
    assert!(stdout(&o).trim_start().starts_with('{') && stdout(&o).trim_end().ends_with('}'));
}

#[test]
fn info_shows_file_type_tokenizer_and_chat_template_also_as_json() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let o = infer(&["info", "-m", m.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("file type:    Q4_K_M (Q4_K - Medium; general.file_type 15)"), "{out}");
    assert!(out.contains("tokenizer:    SentencePiece (tokenizer.ggml.model llama), 1024 tokens"), "{out}");
    assert!(out.contains("chat template: the default ChatML template (the file has none)"), "{out}");
    assert!(out.contains("  | "), "{out}");
    let o = infer(&["info", "-m", m.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(v["file_type"]["name"], "Q4_K_M");
    assert_eq!(v["file_type"]["id"], 15);
    assert_eq!(v["architecture"], "llama");
    assert_eq!(v["tokenizer"]["type"], "SentencePiece");
    assert_eq!(v["tokenizer"]["n_vocab"], 1024);
    assert!(v["chat_template"]["text"].as_str().unwrap().contains("<|im_start|>"));
    assert!(v["shapes"]["n_layer"].as_u64().unwrap() > 0);
    assert!(v["tensor_types"].as_array().unwrap().iter().any(|t| t["type"] == "Q4_K"));
    assert!(v["backend"].as_str().unwrap().starts_with("CPU"));
    // Every text line's facts are in the JSON: the same parameter count.
    let params = v["parameters"].as_u64().unwrap() as f64 / 1e6;
    assert!(out.contains(&format!("parameters:   {params:.1} M")), "{out}");

    // Gemma's default template; a byte-level BPE tokenizer with its
    // pre-tokenizer (SmolLM2) and a template from the file.
    let g = synth_tiny(dir.path(), "gemma3");
    let out = stdout(&infer(&["info", "-m", g.to_str().unwrap()]));
    assert!(out.contains("chat template: the default Gemma turn template"), "{out}");
    let path = infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    let out = stdout(&infer(&["info", "-m", path.to_str().unwrap()]));
    assert!(out.contains("file type:    Q4_1 (Q4_1; general.file_type 3)"), "{out}");
    assert!(out.contains("tokenizer:    byte-level BPE (tokenizer.ggml.model gpt2), pre-tokenizer "), "{out}");
    assert!(out.contains("chat template: the model's tokenizer.chat_template ("), "{out}");
}

#[test]
fn bench_takes_lists_and_llama_bench_output_formats() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let ms = m.to_str().unwrap();
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "-m", ms, "-r", "1"];
        args.extend_from_slice(extra);
        let o = infer(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    // Each thread count is a row of every test: prefill tests, then decode.
    let v: serde_json::Value =
        serde_json::from_str(&bench(&["-p", "4,8", "-n", "2", "-t", "1,2", "-o", "json"])).unwrap();
    let rows = v.as_array().unwrap();
    let got: Vec<(String, u64)> =
        rows.iter().map(|r| (r["test"].as_str().unwrap().to_string(), r["n_threads"].as_u64().unwrap())).collect();
    let want: Vec<(String, u64)> = [("pp4", 1), ("pp8", 1), ("tg2", 1), ("pp4", 2), ("pp8", 2), ("tg2", 2)]
        .iter()
        .map(|&(t, n)| (t.to_string(), n))
        .collect();
    assert_eq!(got, want);
    // llama-bench's fields.
    for key in [
        "cpu_info",
        "gpu_info",
        "backends",
        "model_filename",
        "model_type",
        "model_size",
        "model_n_params",
        "n_threads",
        "n_gpu_layers",
        "use_mmap",
        "n_prompt",
        "n_gen",
        "n_depth",
        "test_time",
        "avg_ns",
        "stddev_ns",
        "avg_ts",
        "stddev_ts",
        "samples_ns",
        "samples_ts",
    ] {
        assert!(rows[0].get(key).is_some(), "{key} missing: {}", rows[0]);
    }
    assert_eq!(rows[0]["n_gpu_layers"], 0);
    assert!(rows[0]["avg_ns"].is_u64());
    let time = rows[0]["test_time"].as_str().unwrap();
    assert!(time.len() == 20 && time.ends_with('Z') && &time[10..11] == "T", "{time}");

    // Ranges as llama-bench: 4-16*2 is 4, 8, 16; --json is -o json.
    let v: serde_json::Value = serde_json::from_str(&bench(&["-p", "4-16*2", "-n", "0", "-t", "1", "--json"])).unwrap();
    let tests: Vec<&str> = v.as_array().unwrap().iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["pp4", "pp8", "pp16"]);

    // jsonl: one object a line.
    let out = bench(&["-p", "4", "-n", "2", "-t", "1", "-o", "jsonl"]);
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["test"], "tg2");

    // csv: a header, then quoted values, no sample arrays.
    let out = bench(&["-p", "4", "-n", "2", "-t", "1", "-o", "csv"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    let header: Vec<&str> = lines[0].split(',').collect();
    assert!(header.starts_with(&["cpu_info", "gpu_info", "backends", "model_filename", "model_type"]), "{out}");
    assert!(!header.contains(&"samples_ns"));
    let at = |row: &str, field: &str| {
        let i = header.iter().position(|h| *h == field).unwrap();
        row.split("\",\"").nth(i).unwrap().trim_matches('"').to_string()
    };
    assert_eq!(at(lines[1], "n_prompt"), "4");
    assert_eq!(at(lines[2], "n_gen"), "2");
    assert_eq!(at(lines[1], "use_mmap"), "1");
    assert!(lines[1].starts_with('"') && lines[1].ends_with('"'));

    // md: the tables.
    let out = bench(&["-p", "4", "-n", "2", "-t", "1", "-o", "md"]);
    assert!(out.starts_with("| model") && out.contains("pp4") && out.contains("tg2"), "{out}");

    assert_one_line_error(&infer(&["bench", "-m", ms, "-p", "4,x"]), "-p 4,x: 'x' is not a number");
    assert_one_line_error(&infer(&["bench", "-m", ms, "-p", "4-8*1"]), "a range must grow");
    assert_one_line_error(&infer(&["bench", "-m", ms, "-t", "1,0"]), "--threads must be at least 1");

    // -ngl takes llama-bench's list: every test for each value in turn
    // (-ngl 99 without a GPU runs on the CPU, with a warning).
    let o = infer(&["bench", "-m", ms, "-r", "1", "-p", "4", "-n", "2", "-t", "1", "-ngl", "0,99", "-o", "jsonl"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let tests: Vec<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["pp4", "tg2", "pp4", "tg2"]);
    assert_eq!(rows[0]["n_gpu_layers"], 0);
    let gpu = rows[2]["backends"] != "CPU";
    assert_eq!(rows[2]["n_gpu_layers"].as_u64() > Some(0), gpu, "{}", rows[2]);
    assert!(gpu || stderr(&o).contains("warning: -ngl 99: no usable GPU"), "{}", stderr(&o));
    // Each value is checked before anything runs.
    assert_one_line_error(&infer(&["bench", "-m", ms, "-ngl", "0,lots"]), "-ngl lots: give a number of layers");
    // --synth makes its own model: -m, -hf and -hff are refused with it.
    for other in [&["-m", ms][..], &["-hf", "owner/repo"], &["-hff", "x.gguf"]] {
        let mut args = vec!["bench", "--synth", "tiny"];
        args.extend_from_slice(other);
        let o = infer(&args);
        assert_eq!(o.status.code(), Some(2), "{other:?}: {}", stderr(&o));
        assert!(stderr(&o).starts_with("error: the argument '--synth <SIZE>' cannot be used with"), "{}", stderr(&o));
    }
    let o = infer(&["bench", "-m", ms, "-o", "sql"]);
    assert!(!o.status.success() && stderr(&o).contains("sql"), "{}", stderr(&o));
}

#[test]
fn models_say_base_or_instruct_and_names_ignore_case() {
    let cache = tmpdir();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
        .arg("models")
        .env("INFER_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    let out = stdout(&o);
    let row = |name: &str| out.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}: {out}"));
    assert!(row("gemma3-270m").contains(" base "), "{out}");
    assert!(row("smollm2-135m").contains(" instruct "), "{out}");
    assert!(out.contains("SmolLM2 135M Instruct: a small chat model"), "{out}");
    assert!(out.contains("Gemma 3 270M pre-trained (base)"), "{out}");
    assert!(out.contains("** default of chat"), "{out}");
    assert!(infer_model::fetch::find_model("SmolLM2-135M").is_some());
}

#[test]
fn chat_defaults_to_the_instruct_model_and_takes_llama_cpp_flags() {
    infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    // No -m and no $INFER_MODEL: SmolLM2 135M Instruct, which answers.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["chat", "--temp", "0", "-n", "64", "-t", "2"])
        .env_remove("INFER_MODEL")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b"What is the capital of France? Answer in one word.\n")?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("SmolLM2-135M-Instruct"), "{}", stderr(&o));
    assert!(stdout(&o).contains("Paris"), "{}", stdout(&o));
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));

    // -sys (and --system), -r, case-insensitive names.
    let chat = |args: &[&str], input: &str| {
        let mut all = vec!["chat", "-m", "SmolLM2-135M", "--temp", "0", "-t", "2"];
        all.extend_from_slice(args);
        let o = infer_stdin(&all, input.as_bytes());
        assert!(o.status.success(), "{}", stderr(&o));
        (stdout(&o), stderr(&o))
    };
    let (full, _) = chat(&["-n", "40"], "Count from 1 to 10, separated by commas.\n");
    assert!(full.contains('5'), "{full}");
    let (cut, err) = chat(&["-n", "40", "-r", "5"], "Count from 1 to 10, separated by commas.\n");
    let reply = cut.trim_start_matches("> ");
    assert!(!reply.contains('5') && full.contains(reply.trim_end_matches(['\n', '>', ' '])), "{cut} vs {full}");
    assert!(err.contains("; stop string]"), "{err}");
    let (a, _) = chat(&["-n", "12", "-sys", "Always answer in French."], "Hello\n");
    let (b, _) = chat(&["-n", "12", "--system", "Always answer in French."], "Hello\n");
    let (c, _) = chat(&["-n", "12"], "Hello\n");
    assert_eq!(a, b);
    assert_ne!(a, c, "the system prompt changed nothing");
}

#[test]
fn chat_warns_on_a_model_without_a_template_and_on_a_base_model() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let o = infer_stdin(&["chat", "-m", m.to_str().unwrap(), "-n", "2", "-t", "1"], b"hi\n");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("has no chat template; using the default ChatML template"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("the file has none"), "said twice: {}", stderr(&o));
    let base = common::default_model();
    let o = infer_stdin(&["chat", "-m", &base, "-n", "1", "-t", "2"], b"/exit\n");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("is a pre-trained (base) model"), "{}", stderr(&o));
    assert!(stderr(&o).contains("smollm2-135m"), "{}", stderr(&o));
    // The instruction-tuned chat model, however it is reached (a relative
    // path, a link, another name), is never called a base model.
    let smol = infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    let link = dir.path().join("renamed.gguf");
    std::os::unix::fs::symlink(&smol, &link).unwrap();
    let rel = std::path::PathBuf::from(".").join(smol.file_name().unwrap());
    for (m, cwd) in [(link.clone(), dir.path()), (rel, smol.parent().unwrap())] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_infer"));
        cmd.args(["chat", "-m", m.to_str().unwrap(), "-n", "1", "-t", "2"]).current_dir(cwd);
        let o = common::output_with_stdin(cmd, b"/exit\n");
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(!stderr(&o).contains("(base)"), "{}: {}", m.display(), stderr(&o));
    }
}

#[test]
fn ignore_eos_generates_past_the_end_of_the_turn() {
    infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-m", "smollm2-135m", "--chat", "--temp", "0", "-t", "2", "--json", "-p", "Say hi."];
        args.extend_from_slice(extra);
        let o = infer(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap()
    };
    let ends = run(&["-n", "200"]);
    assert_eq!(ends["stop"], "end of generation", "{ends}");
    let n = ends["generated_tokens"].as_u64().unwrap();
    let more = (n + 6).to_string();
    let on = run(&["-n", &more, "--ignore-eos"]);
    assert_eq!(on["stop"], "max tokens", "{on}");
    assert_eq!(on["generated_tokens"].as_u64(), Some(n + 6));
    assert!(on["text"].as_str().unwrap().starts_with(ends["text"].as_str().unwrap()), "{on}\n{ends}");
}
