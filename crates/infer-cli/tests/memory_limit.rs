//! The `infer` binary under a memory limit (`ulimit -v`): a model or file
//! that does not fit ends in one clear error line and exit code 1, never in
//! the allocator's abort. Also `--no-mmap`, which reads the model into
//! memory instead of mapping it.
//!
//! Unix only (the limit is set by `bash -c 'ulimit -v ...'`); the tests on
//! the default model fetch it when it is not cached.

#![cfg(unix)]

use std::process::{Command, Output, Stdio};

use infer_model::gguf::GgufWriter;

/// Runs `infer args` under a virtual-memory limit of `kib` KiB.
fn infer_limited(kib: u64, args: &[&str]) -> Output {
    let mut script = format!("ulimit -v {kib} && exec \"$0\"");
    for i in 1..=args.len() {
        script.push_str(&format!(" \"${{{i}}}\""));
    }
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_infer"))
        .args(args)
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .expect("run infer under bash")
}

fn default_model() -> String {
    infer_model::fetch::default_model_path().expect("default model").display().to_string()
}

/// A temporary directory, removed with its files when dropped.
fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("infer-cli-memlimit-").tempdir().expect("temporary directory")
}

/// Exit code 1 (not a signal: an abort is SIGABRT) and one error line
/// mentioning every fragment.
fn assert_clean_error(o: &Output, fragments: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "status {:?}, stderr: {err}", o.status);
    assert!(!err.contains("memory allocation of"), "the allocator aborted: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    for f in fragments {
        assert!(lines[0].contains(f), "{:?} lacks {f:?}", lines[0]);
    }
    eprintln!("{}", lines[0]);
}

#[test]
fn exact_precision_that_does_not_fit_is_a_clean_error() {
    // The exact mode dequantizes the 270M model to f32 (about 1.1 GB of
    // weights): under 700 MB the allocation fails and says how much it
    // needed.
    let model = default_model();
    let o =
        infer_limited(700_000, &["run", "--model", &model, "--precision", "exact", "-n", "2", "--threads", "2", "Hi"]);
    assert_clean_error(&o, &["out of memory", "bytes"]);
}

#[test]
fn a_quantized_model_or_kv_cache_that_does_not_fit_is_a_clean_error() {
    // The quantized 270M model under 450 MB aborted in the allocator: its
    // packed weights are now fallible allocations, and the error says what
    // did not fit and how much it needed.
    let model = default_model();
    let o = infer_limited(450_000, &["run", "--model", &model, "-n", "2", "--threads", "2", "--temp", "0", "Hi"]);
    assert_clean_error(&o, &["out of memory", "needs", "bytes"]);
    // Weights that fit and a KV cache that does not (32 768 positions of
    // f32 keys and values, 1.2 GB; the f16 default would take half).
    let o = infer_limited(
        1_100_000,
        &[
            "run",
            "--model",
            &model,
            "-c",
            "32768",
            "-ctk",
            "f32",
            "-ctv",
            "f32",
            "-n",
            "2",
            "--threads",
            "2",
            "--temp",
            "0",
            "Hi",
        ],
    );
    assert_clean_error(&o, &["out of memory: a KV cache layer", "bytes"]);
}

#[test]
fn the_quantized_model_under_a_sweep_of_limits_runs_or_fails_cleanly() {
    // Every limit from 280 to 480 MB in 20 MB steps, those between that
    // aborted in the allocator (the tokenizer's vocabulary-sized tables, the
    // spinner's thread), and one the run fits in. Where the limit falls
    // varies from run to run (address-space layout, threads), so each limit
    // is checked for an outcome, not for which one.
    let model = default_model();
    let mut limits: Vec<u64> = (280..=480).step_by(20).collect();
    limits.extend([290, 350, 410, 430, 700]);
    let mut bad = Vec::new();
    let mut outcomes = Vec::new();
    for mb in limits {
        let o = infer_limited(mb * 1000, &["run", "--model", &model, "-n", "2", "--threads", "2", "--temp", "0", "hi"]);
        let err = String::from_utf8_lossy(&o.stderr);
        let error_line = err.lines().find(|l| l.starts_with("error:"));
        let outcome =
            if o.status.success() { "ok".to_owned() } else { error_line.unwrap_or("(no error line)").to_owned() };
        let clean = o.status.success()
            || (o.status.code() == Some(1)
                && error_line.is_some()
                && !err.contains("memory allocation of")
                && !err.contains("panicked"));
        if !clean {
            bad.push(format!("{mb} MB: status {:?}, stderr: {err}", o.status));
        }
        outcomes.push(format!("{mb} MB: {outcome}"));
    }
    eprintln!("{}", outcomes.join("\n"));
    assert!(bad.is_empty(), "runs that did not end cleanly:\n{}", bad.join("\n"));
    assert!(outcomes.iter().any(|o| o.contains("out of memory")), "no limit was too small: {outcomes:?}");
}

#[test]
fn a_50m_element_metadata_array_fits_in_its_size() {
    // 50 M u8 elements: a 50 MB file. Held one enum per element it cost
    // 1.6 GB and aborted under this limit; now it is read into 50 MB and
    // `info` lists it.
    let tmp = tmpdir();
    let path = tmp.path().join("big-array.gguf");
    let mut w = GgufWriter::new();
    w.add_metadata("big.array", vec![1u8; 50_000_000]).unwrap();
    w.write_to_path(&path).unwrap();
    drop(w);
    let p = path.display().to_string();
    for extra in [&[][..], &["--no-mmap"][..]] {
        let mut args = vec!["info", "--model", &p];
        args.extend_from_slice(extra);
        let o = infer_limited(400_000, &args);
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{extra:?}: status {:?}, stderr: {err}", o.status);
        assert!(out.contains("1 metadata keys"), "{extra:?}: {out}");
    }
    // Measured: the array costs about its size over the same command on a
    // one-element array (mapped or read, the file's bytes plus the parsed
    // array), not 32 bytes per element. On the CPU backend: `auto` would
    // also load any Vulkan driver while it looks for a GPU (Mesa's lavapipe
    // adds about 60 MB at the peak of the large file's run, 16 MB at the
    // small one's), which is not the array's cost.
    #[cfg(target_os = "linux")]
    {
        let small = tmp.path().join("small-array.gguf");
        let mut w = GgufWriter::new();
        w.add_metadata("big.array", vec![1u8; 1]).unwrap();
        w.write_to_path(&small).unwrap();
        let file_bytes = std::fs::metadata(&path).unwrap().len();
        for extra in [&[][..], &["--no-mmap"][..]] {
            let rss = |p: &std::path::Path| {
                let mut args = vec!["info", "--backend", "cpu", "--model", p.to_str().unwrap()];
                args.extend_from_slice(extra);
                let (ok, out, rss) = peak_rss(&args);
                assert!(ok && out.contains("1 metadata keys"), "{extra:?}: {out}");
                rss
            };
            let (base, big) = (rss(&small), rss(&path));
            let extra_bytes = big.saturating_sub(base);
            eprintln!(
                "{extra:?}: peak RSS {:.1} MB for a {:.1} MB array file, {:.1} MB for a 1-element one: {:.2}x the file",
                big as f64 / 1e6,
                file_bytes as f64 / 1e6,
                base as f64 / 1e6,
                extra_bytes as f64 / file_bytes as f64
            );
            assert!(extra_bytes <= 2 * file_bytes, "{extra:?}: {extra_bytes} bytes more for a {file_bytes}-byte file");
        }
    }
    tmp.close().unwrap();
}

/// Runs `infer args` to the end; returns whether it succeeded, its stdout
/// and its peak resident set in bytes (`ru_maxrss` of this child alone).
#[cfg(target_os = "linux")]
// The child is reaped by `wait4` (which gives its resource usage), not by
// `Child::wait`.
#[allow(clippy::zombie_processes)]
fn peak_rss(args: &[&str]) -> (bool, String, u64) {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(args)
        .env("RAYON_NUM_THREADS", "2")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run infer");
    let mut out = String::new();
    child.stdout.take().expect("stdout").read_to_string(&mut out).expect("read stdout");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: `rusage` is plain data, for which all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for (and reaps) the child started above, with valid
    // pointers; `child` is not waited on again (dropping it does not wait).
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    // Linux gives ru_maxrss in KiB.
    (ok, out, ru.ru_maxrss as u64 * 1024)
}

#[test]
fn no_mmap_reads_the_model_into_memory() {
    let model = default_model();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--model", &model, "-n", "4", "--threads", "2", "--temp", "0"];
        args.extend_from_slice(extra);
        args.push("The capital of France is");
        let o = Command::new(env!("CARGO_BIN_EXE_infer")).args(&args).output().expect("run infer");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(run(&["--no-mmap"]), run(&[]), "the same text, mapped or read");
    // A file that is not a model fails the same way.
    let tmp = tmpdir();
    let bad = tmp.path().join("not-a-model.gguf");
    std::fs::write(&bad, b"GGUF\x03\0\0\0").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["info", "--no-mmap", "--model", &bad.display().to_string()])
        .output()
        .unwrap();
    assert_clean_error(&o, &["not-a-model.gguf", "truncated"]);
    tmp.close().unwrap();
}

/// `--no-mmap` reaches every command that loads a model (`run` and `chat`
/// opened the file mapped whatever the flag said): while `infer chat` waits
/// for its next turn the model file is not mapped, and truncating it then
/// does not end the process (a mapped file that shrinks ends it with
/// SIGBUS). Without the flag the file is mapped.
#[cfg(target_os = "linux")]
#[test]
fn no_mmap_holds_no_mapping_of_the_model_file() {
    use std::io::{BufRead, Write};
    let tmp = tmpdir();
    let model = tmp.path().join("tiny.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["synth", "--arch", "gemma3", "--size", "tiny", "-t", "2", "-o", model.to_str().unwrap()])
        .output()
        .expect("run infer synth");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let model = model.canonicalize().unwrap();
    for no_mmap in [false, true] {
        let mut args = vec!["chat", "--model", model.to_str().unwrap(), "--temp", "0", "-n", "4"];
        if no_mmap {
            args.push("--no-mmap");
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(&args)
            .env("RAYON_NUM_THREADS", "2")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run infer chat");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"hello\n").unwrap();
        // The first turn's statistics line: the model is loaded and the
        // process waits for the next line.
        let mut err_pipe = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut err = String::new();
        while !err.contains("[prefill ") {
            let mut line = String::new();
            if err_pipe.read_line(&mut line).expect("read stderr") == 0 {
                panic!("infer chat ended early: {err}");
            }
            err.push_str(&line);
        }
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).expect("maps");
        assert_eq!(maps.contains(model.to_str().unwrap()), !no_mmap, "--no-mmap {no_mmap}:\n{maps}");
        if no_mmap {
            std::fs::File::options().write(true).open(&model).unwrap().set_len(0).unwrap();
        }
        stdin.write_all(b"again\n/exit\n").unwrap();
        drop(stdin);
        std::io::Read::read_to_string(&mut err_pipe, &mut err).expect("read stderr");
        let o = child.wait_with_output().expect("wait");
        assert!(o.status.success(), "--no-mmap {no_mmap}: status {:?}, stderr: {err}", o.status);
        assert_eq!(err.matches("[prefill ").count(), 2, "{err}");
    }
}

/// A tiny synthetic llama model in `dir`, with `template` as its
/// `tokenizer.chat_template` when given.
fn tiny_model(dir: &std::path::Path, template: Option<&str>) -> String {
    let path = dir.join("tiny.gguf");
    if !path.exists() {
        let o = Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(["synth", "--arch", "llama", "--size", "tiny", "--seed", "3", "-t", "2", "-o"])
            .arg(&path)
            .output()
            .expect("run infer synth");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let Some(template) = template else { return path.display().to_string() };
    let model = infer_model::gguf::GgufFile::open(&path).expect("open");
    let mut w = GgufWriter::from_gguf(&model).expect("rewrite");
    w.set_metadata("tokenizer.chat_template", template).unwrap();
    let out =
        dir.join(format!("tiny-{:x}.gguf", template.len() * 31 + template.bytes().map(usize::from).sum::<usize>()));
    w.write_to_path(&out).expect("write");
    out.display().to_string()
}

/// Runs `infer args` under `kib` KiB with `input` on standard input (a
/// command's output: `bash -c` runs `input_cmd | infer ...`).
fn infer_limited_piped(kib: u64, input_cmd: &str, args: &[&str]) -> Output {
    let mut script = format!("{input_cmd} | (ulimit -v {kib} && exec \"$0\"");
    for i in 1..=args.len() {
        script.push_str(&format!(" \"${{{i}}}\""));
    }
    script.push(')');
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_infer"))
        .args(args)
        .env("RAYON_NUM_THREADS", "2")
        .stdin(Stdio::null())
        .output()
        .expect("run infer under bash")
}

/// Issue 31 item 2a: chat templates that grow a string (doubled 40 times,
/// or a message repeated ten million times in a loop) or a list (doubled
/// 40 times: minijinja 3.1.0 built the 34th in full, 2^33 slots) end in
/// the template's budget error under every limit of a sweep, quickly; they
/// ran 6-18 s, peaked at 2.6 GB and ended in SIGABRT under 1.5 GB.
#[test]
fn chat_templates_that_grow_strings_are_a_clean_error_under_memory_limits() {
    let tmp = tmpdir();
    let bombs = [
        "{% set ns = namespace(s=messages[0].content) %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "{% for i in range(1000) %}{{ messages[0].content * 10000000 }}{% endfor %}",
        "{% set ns = namespace(l=[messages[0].content]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
        "{{ '{:>99999999999}'.format('a') }}",
        "{% set s = 'x' * 1000000 %}{{ ''.join([s] * 100000) | length }}",
        "{{ ('\"' * 100000000) | escape }}",
    ];
    for bomb in bombs {
        let model = tiny_model(tmp.path(), Some(bomb));
        for kib in [600_000, 1_000_000, 1_500_000] {
            let t0 = std::time::Instant::now();
            let o = infer_limited(kib, &["run", "--model", &model, "--chat", "-n", "1", "-t", "2", "hello"]);
            assert_clean_error(&o, &["chat template", "did not finish", "MiB of data"]);
            assert!(t0.elapsed().as_secs() < 20, "{kib} KiB: {:?}", t0.elapsed());
        }
    }
}

/// Issue 31 item 2a, under every limit of a sweep: a value nested 200 000
/// levels deep is an error when printed or compared, and is freed without
/// a stack overflow when it is not (under a limit the render runs on the
/// main thread, where each of these overflowed the stack and ended in
/// SIGSEGV); a value that shares itself (`[d, d]` doubled 64 times) turned
/// into a string, and a list made per item by `batch`, stop within the
/// budget (they grew until the allocator aborted).
#[test]
fn chat_templates_that_nest_or_share_values_end_cleanly_under_memory_limits() {
    let tmp = tmpdir();
    let deep = "{% set ns = namespace(l=[]) %}{% for k in range(2) %}{% for i in range(100000) %}\
                {% set ns.l = [ns.l] %}{% endfor %}{% endfor %}";
    let sharing = "{% set ns = namespace(d=[1]) %}{% for i in range(64) %}{% set ns.d = [ns.d, ns.d] %}{% endfor %}";
    let nested: &[&str] = &["chat template", "nested more than 500 levels"];
    let budget: &[&str] = &["chat template", "did not finish", "MiB of data"];
    let cases: [(String, Option<&[&str]>); 7] = [
        (format!("{deep}{{{{ ns.l }}}}"), Some(nested)),
        (format!("{deep}{{{{ ns.l == [ns.l] }}}}"), Some(nested)),
        (format!("{deep}x"), None),
        ("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}".into(), Some(nested)),
        (format!("{sharing}{{{{ (ns.d ~ '') | length }}}}"), Some(budget)),
        (format!("{sharing}{{{{ ns.d | upper | length }}}}"), Some(budget)),
        ("{{ ([1] * 100000000) | batch(1) | length }}".into(), Some(budget)),
    ];
    for (template, error) in &cases {
        let model = tiny_model(tmp.path(), Some(template));
        for kib in [600_000, 1_000_000, 1_500_000] {
            let t0 = std::time::Instant::now();
            let o = infer_limited(kib, &["run", "--model", &model, "--chat", "-n", "1", "-t", "2", "hello"]);
            match error {
                Some(fragments) => assert_clean_error(&o, fragments),
                None => assert!(
                    o.status.success(),
                    "{kib} KiB, {template}: status {:?}, stderr: {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr)
                ),
            }
            assert!(t0.elapsed().as_secs() < 30, "{kib} KiB, {template}: {:?}", t0.elapsed());
        }
    }
}

/// Issue 31 item 2b: a prompt longer than the context is refused after
/// reading about as many bytes as the context holds tokens (64 per
/// position), from a file or standard input, instead of being read and
/// tokenized whole (`head -c 200000000 /dev/zero | infer run -` aborted
/// under 6 GB; 48 MB took 1.67 GB and 43 s).
#[test]
fn a_prompt_longer_than_the_context_is_refused_unread() {
    let tmp = tmpdir();
    let model = tiny_model(tmp.path(), None);
    // 200 MB of zeros on standard input, under 600 MB.
    let t0 = std::time::Instant::now();
    let o = infer_limited_piped(
        600_000,
        "head -c 200000000 /dev/zero",
        &["run", "--model", &model, "-c", "256", "-n", "4", "-"],
    );
    assert_clean_error(&o, &["the prompt is longer than the context (256 positions)", "20480 bytes"]);
    assert!(t0.elapsed().as_secs() < 20, "{:?}", t0.elapsed());
    // A 200 MB (sparse) file, with the default context of the model.
    let big = tmp.path().join("big.txt");
    std::fs::File::create(&big).unwrap().set_len(200_000_000).unwrap();
    let o = infer_limited(600_000, &["run", "--model", &model, "-n", "4", "-f", big.to_str().unwrap()]);
    assert_clean_error(&o, &["the prompt is longer than the context (", "positions)"]);
    // With --chat too (the template does not see it).
    let o = infer_limited(
        600_000,
        &["run", "--model", &model, "--chat", "-c", "64", "-n", "4", "-f", big.to_str().unwrap()],
    );
    assert_clean_error(&o, &["the prompt is longer than the context (64 positions)"]);
    // At the limit (64 bytes per position and 4096, final newline dropped)
    // a prompt is read and tokenized: here it is too many tokens.
    let at_limit = tmp.path().join("at-limit.txt");
    std::fs::write(&at_limit, format!("{}\n", "a b ".repeat((64 * 64 + 4096) / 4))).unwrap();
    let o =
        infer_limited(600_000, &["run", "--model", &model, "-c", "64", "-n", "4", "-f", at_limit.to_str().unwrap()]);
    assert_clean_error(&o, &["the prompt has", "a context of 64 positions"]);
    // A prompt that fits runs.
    let o = infer_limited(600_000, &["run", "--model", &model, "-c", "64", "-n", "2", "-t", "2", "hello there"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Issue 31 item 2b, the token bound: a prompt within the byte limit of a
/// long context (64 MiB for 2^20 positions) but of more tokens than the
/// context is refused after tokenizing about as much text as the context
/// holds, under every limit of a sweep. Tokenized whole first (about 22
/// bytes per byte of text, 1.4 GB here), it ended in SIGABRT under them.
#[test]
fn a_prompt_of_more_tokens_than_a_long_context_is_refused_under_memory_limits() {
    let tmp = tmpdir();
    let tiny = tiny_model(tmp.path(), None);
    let n_ctx: u32 = 1 << 20;
    let model = infer_model::gguf::GgufFile::open(&tiny).expect("open");
    let mut w = GgufWriter::from_gguf(&model).expect("rewrite");
    w.set_metadata("llama.context_length", n_ctx).unwrap();
    let long = tmp.path().join("long-context.gguf");
    w.write_to_path(&long).expect("write");
    // Just under the byte limit of the context (64 bytes per position).
    let text = tmp.path().join("words.txt");
    let words = "hello world, this is some text ";
    std::fs::write(&text, words.repeat(64 * n_ctx as usize / words.len())).unwrap();
    let (model, text) = (long.to_str().unwrap(), text.to_str().unwrap());
    for kib in [700_000, 1_000_000, 1_500_000] {
        let t0 = std::time::Instant::now();
        let o = infer_limited(kib, &["run", "--model", model, "-c", "0", "-n", "4", "-t", "2", "-f", text]);
        assert_clean_error(&o, &["the prompt has more than 1048575 tokens", "a context of 1048576 positions"]);
        assert!(t0.elapsed().as_secs() < 30, "{kib} KiB: {:?}", t0.elapsed());
    }
}
