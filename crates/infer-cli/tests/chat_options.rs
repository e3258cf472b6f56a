//! `infer chat` on tiny synthetic models (offline): the system message of a
//! loaded conversation kept when old turns are dropped, `/load`'s checks, a
//! turn refused by the template without ending the session, and llama-cli's
//! `--ignore-eos`, `--verbose-prompt` and `-v`.

mod common;

use std::path::Path;
use std::process::Command;

use common::{infer, output_with_stdin, stderr, stdout, synth_tiny, tmpdir};
use serde_json::{json, Value};

/// `infer chat` on `model`, greedy, one thread, with `args`.
fn chat_command(model: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infer"));
    cmd.args(["chat", "-m", model.to_str().unwrap(), "-t", "1", "--temp", "0"]).args(args);
    cmd
}

/// Runs `infer chat` on `model` greedily with `input` on stdin; returns
/// stderr (the run must succeed).
fn chat(model: &Path, args: &[&str], input: &str) -> String {
    let o = output_with_stdin(chat_command(model, args), input.as_bytes());
    assert!(o.status.success(), "{}", stderr(&o));
    stderr(&o)
}

/// (prefilled, reused) of each turn's stats line (`[prefill N (R reused) ...`).
fn prefills(err: &str) -> Vec<(usize, usize)> {
    err.lines()
        .filter_map(|l| l.strip_prefix("[prefill "))
        .map(|l| {
            let n = |s: &str| s.split_whitespace().next().unwrap().parse::<usize>().unwrap();
            (n(l), n(&l[l.find('(').unwrap() + 1..]))
        })
        .collect()
}

/// A conversation of three long turns, with the system message `system`
/// first when given.
fn long_conversation(system: Option<&str>) -> Value {
    let words = |tag: &str| format!("{tag} {}", (0..15).map(|i| format!("word{i}")).collect::<Vec<_>>().join(" "));
    let mut list: Vec<Value> = system.iter().map(|s| json!({"role": "system", "content": s})).collect();
    for t in 0..3 {
        list.push(json!({"role": "user", "content": words(&format!("U{t}"))}));
        list.push(json!({"role": "assistant", "content": words(&format!("A{t}"))}));
    }
    Value::Array(list)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// After `/load`, the conversation's own leading system message is what
/// dropping old turns keeps: the file's, without `-sys`; none, with `-sys`
/// and a file without one (the file's first user turn is not protected).
#[test]
fn a_loaded_system_message_survives_dropped_turns() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let (with, without, out) =
        (dir.path().join("with.json"), dir.path().join("without.json"), dir.path().join("o.json"));
    std::fs::write(&with, long_conversation(Some("SYSTEM keep me")).to_string()).unwrap();
    std::fs::write(&without, long_conversation(None).to_string()).unwrap();
    let input = |file: &Path| format!("/load {}\nnext question\n/save {}\n", file.display(), out.display());

    let err = chat(&m, &["-c", "256", "-n", "4"], &input(&with));
    assert!(err.contains("(context full: the 6 oldest messages were dropped)"), "{err}");
    let saved = read_json(&out);
    assert_eq!(saved[0], json!({"role": "system", "content": "SYSTEM keep me"}), "{saved}");
    assert_eq!(saved[1]["content"], "next question", "{saved}");
    assert_eq!(saved.as_array().unwrap().len(), 3, "{saved}");

    chat(&m, &["-c", "256", "-n", "4", "-sys", "SYS"], &input(&without));
    let saved = read_json(&out);
    assert_eq!(saved[0], json!({"role": "user", "content": "next question"}), "{saved}");
    assert_eq!(saved.as_array().unwrap().len(), 2, "{saved}");
}

/// `/load` refuses a conversation whose turns do not alternate; the session
/// goes on.
#[test]
fn load_refuses_turns_that_do_not_alternate() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let file = dir.path().join("c.json");
    let c = json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]);
    std::fs::write(&file, c.to_string()).unwrap();
    let err = chat(&m, &["-n", "2"], &format!("/load {}\nhi\n", file.display()));
    assert!(err.contains("message 2 is a user message where an assistant message is expected"), "{err}");
    assert_eq!(err.matches("[prefill ").count(), 1, "the next turn is answered: {err}");
}

/// A turn the template refuses (its `raise_exception`) is not sent and the
/// conversation is kept; the next turn is answered.
#[test]
fn a_turn_the_template_refuses_does_not_end_the_session() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let strict = dir.path().join("strict.gguf");
    let template =
        "{% for m in messages %}{% if 'boom' in m.content %}{{ raise_exception('no boom here') }}{% endif %}\
                    <|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n";
    let g = infer_model::gguf::GgufFile::open(&m).unwrap();
    let mut w = infer_model::gguf::GgufWriter::from_gguf(&g).unwrap();
    w.set_metadata("tokenizer.chat_template", template).unwrap();
    w.write_to_path(&strict).unwrap();
    let out = dir.path().join("o.json");
    let err = chat(&strict, &["-n", "2"], &format!("first\nboom\nsecond\n/save {}\n", out.display()));
    let line = err.lines().find(|l| l.contains("no boom here")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.starts_with("the chat template refused this turn") && line.ends_with("it was not sent"), "{err}");
    assert_eq!(err.matches("[prefill ").count(), 2, "{err}");
    let saved = read_json(&out);
    let users: Vec<&str> = saved
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["first", "second"], "{saved}");
}

/// llama-cli's `--ignore-eos`, `--verbose-prompt` and `-v` on `chat`.
#[test]
fn chat_takes_ignore_eos_verbose_prompt_and_verbose() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    // A model whose end-of-generation token is the one it answers first.
    let o =
        infer(&["run", "-m", m.to_str().unwrap(), "-t", "1", "--chat", "--temp", "0", "-n", "1", "--json", "-p", "hi"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let first: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let first = first["text"].as_str().unwrap().to_string();
    let g = infer_model::gguf::GgufFile::open(&m).unwrap();
    let tokenizer = infer_model::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    let id = (0..tokenizer.n_vocab() as u32)
        .find(|&id| tokenizer.token_bytes(id) == Some(first.as_bytes()))
        .unwrap_or_else(|| panic!("no token is {first:?}"));
    let ending = dir.path().join("ending.gguf");
    let mut w = infer_model::gguf::GgufWriter::from_gguf(&g).unwrap();
    w.set_metadata("tokenizer.ggml.eos_token_id", id).unwrap();
    w.write_to_path(&ending).unwrap();

    let err = chat(&ending, &["-n", "5"], "hi\n");
    assert!(err.contains("; end of turn]"), "{err}");
    let err = chat(&ending, &["-n", "5", "--ignore-eos"], "hi\n");
    assert!(err.contains("5 tokens at") && err.contains("; -n reached]"), "{err}");

    // --verbose-prompt: each turn's whole prompt and its tokens.
    let err = chat(&m, &["-n", "2", "--verbose-prompt"], "hello\nagain\n");
    let counts: Vec<usize> = err
        .lines()
        .filter_map(|l| l.strip_prefix("number of tokens in prompt = "))
        .map(|n| n.trim().parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 2, "{err}");
    assert!(counts[1] > counts[0], "{err}");
    assert!(err.contains("prompt: '<|im_start|>user\nhello<|im_end|>"), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains(" -> '")).count(), counts[0] + counts[1], "{err}");

    // -v: the settings once, at the start.
    let err = chat(&m, &["-n", "1", "-v", "-c", "64"], "hi\n");
    assert!(err.contains("context:  64 positions") && err.contains("sampler chain: "), "{err}");
    assert!(err.contains("predict:  1 token"), "{err}");
}

/// Input that is not text: a line with NUL bytes is refused and the
/// session goes on; an input without line ends (`/dev/zero`) ends the
/// session with one error line instead of being read for ever.
#[cfg(unix)]
#[test]
fn nul_bytes_are_refused_and_endless_lines_end_the_session() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let err = chat(&m, &["-n", "2"], "\0\0\0\0\nhello\n");
    assert!(err.contains("that line has a NUL byte: it is not text; it was not sent"), "{err}");
    assert_eq!(err.matches("[prefill ").count(), 1, "{err}");

    let zero = std::fs::File::open("/dev/zero").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["chat", "-m", m.to_str().unwrap(), "-t", "1", "-n", "2"])
        .stdin(zero)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A minute at most: before the fix it read /dev/zero for ever.
    let mut ended = None;
    for _ in 0..600 {
        ended = child.try_wait().unwrap();
        if ended.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    if ended.is_none() {
        let _ = child.kill();
        panic!("infer chat < /dev/zero did not end within a minute");
    }
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: reading the input: a line of more than 64 MiB without an end"), "{err}");
}

/// llama.cpp's `--no-display-prompt` is taken (the chat echoes no prompt,
/// so the output is the same); `/save ~/FILE` writes into $HOME; `/save`
/// over a file that is not a conversation keeps it when there is no
/// terminal to ask on.
#[test]
fn chat_takes_no_display_prompt_and_save_knows_home_and_other_files() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let plain = output_with_stdin(chat_command(&m, &["-n", "4"]), b"hello\n");
    let hidden = output_with_stdin(chat_command(&m, &["-n", "4", "--no-display-prompt"]), b"hello\n");
    assert!(plain.status.success() && hidden.status.success(), "{}", stderr(&hidden));
    assert_eq!(stdout(&plain), stdout(&hidden));
    assert!(stdout(&hidden).len() > "> > ".len(), "{}", stdout(&hidden));

    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "my notes\n").unwrap();
    let mut cmd = chat_command(&m, &["-n", "2"]);
    cmd.env("HOME", dir.path());
    let o = output_with_stdin(cmd, b"hello\n/save ~/c.json\n/save ~/notes.txt\n/save ~/c.json\n");
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let saved = read_json(&dir.path().join("c.json"));
    assert_eq!(saved[0], json!({"role": "user", "content": "hello"}), "{saved}");
    let line = format!("/save: {} exists and is not a conversation file; it was kept", notes.display());
    assert!(err.lines().any(|l| l.starts_with(&line)), "{err}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes\n");
    // A conversation file is replaced without asking.
    assert_eq!(err.matches("saved to ").count(), 2, "{err}");
}

/// A turn that does not fit drops the oldest turns and prefills the
/// conversation again, reusing from the cache what it still starts with:
/// the system prompt (as much as `/reset` keeps, or more).
#[test]
fn dropping_old_turns_reuses_the_system_prompt_in_the_cache() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let long = |tag: &str| format!("{tag} {}\n", (0..12).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" "));
    let input = format!("{}{}{}/reset\n{}", long("one"), long("two"), long("three"), long("one"));
    let err = chat(&m, &["-c", "128", "-n", "4", "--ignore-eos", "-sys", "SYSTEM be brief"], &input);
    let t = prefills(&err);
    assert_eq!(t.len(), 4, "{err}");
    let dropped = err.lines().position(|l| l.starts_with("(context full: the")).unwrap_or_else(|| panic!("{err}"));
    // The turn right after the drop.
    let after = err.lines().skip(dropped).filter(|l| l.starts_with("[prefill ")).count();
    let (_, reused) = t[t.len() - after];
    let (_, after_reset) = t[3];
    assert!(after_reset > 3, "/reset keeps the system prompt's tokens: {err}");
    assert!(
        reused >= after_reset,
        "after dropping turns {reused} tokens were reused, after /reset {after_reset}: {err}"
    );
}

/// `/save` refuses a symbolic link (the link and what it points to stay),
/// takes a name in quotes without them, and `/load` skips a UTF-8
/// byte-order mark.
#[cfg(unix)]
#[test]
fn save_refuses_links_and_strips_quotes_and_load_skips_a_bom() {
    let dir = tmpdir();
    let m = synth_tiny(dir.path(), "llama");
    let target = dir.path().join("target.json");
    std::fs::write(&target, "[]\n").unwrap();
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let bom = dir.path().join("bom.json");
    std::fs::write(
        &bom,
        "\u{feff}[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]",
    )
    .unwrap();
    let quoted = dir.path().join("quoted.json");
    let input = format!("/save {}\n/load {}\n/save \"{}\"\n", link.display(), bom.display(), quoted.display());
    let err = chat(&m, &["-n", "2"], &input);
    assert!(err.contains(&format!("/save: {} is a symbolic link", link.display())), "{err}");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "[]\n");
    assert!(err.contains("(conversation of 2 messages loaded from"), "{err}");
    assert_eq!(read_json(&quoted)[1], json!({"role": "assistant", "content": "yo"}), "{err}");
}
