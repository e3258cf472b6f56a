//! `infer chat` over stdin on the real SmolLM2 135M Instruct (fetched and
//! cached by name on first use): replies stop at `<|im_end|>`, and a second
//! turn prefills only its new tokens.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

/// `infer chat` on SmolLM2 135M Instruct (fetched on first use), greedy,
/// at most `n` tokens per reply, its standard streams piped.
fn spawn_chat(n: &str) -> std::process::Child {
    infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["chat", "--model", "smollm2-135m", "--temp", "0", "-n", n])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run infer chat")
}

/// Runs `infer chat` greedily with `input` on stdin; returns (stdout, stderr).
fn chat(input: &str) -> (String, String) {
    let mut child = spawn_chat("64");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    println!("stdout:\n{out}\nstderr:\n{err}");
    assert!(o.status.success(), "{err}");
    (out, err)
}

/// (prefilled, reused, stop) of each turn's stats line.
fn turns(err: &str) -> Vec<(usize, usize, String)> {
    err.lines()
        .filter_map(|l| l.strip_prefix("[prefill "))
        .map(|l| {
            let n = |s: &str| s.split_whitespace().next().unwrap().parse::<usize>().unwrap();
            let prefilled = n(l);
            let reused = n(&l[l.find('(').unwrap() + 1..]);
            let stop = l.rsplit("; ").next().unwrap().trim_end_matches(']').to_string();
            (prefilled, reused, stop)
        })
        .collect()
}

#[test]
fn two_turns_stop_at_im_end_and_reuse_the_cache() {
    let q = "What is the capital of France? Answer in one word.";
    let (out, err) = chat(&format!("{q}\nAnd of Germany?\n/reset\n{q}\n/exit\n"));
    let t = turns(&err);
    assert_eq!(t.len(), 3, "{err}");
    for (_, _, stop) in &t {
        assert_eq!(stop, "end of turn", "{err}");
    }
    assert!(out.contains("Paris") && out.contains("Berlin"), "{out}");
    assert!(!out.contains("<|im_end|>") && !out.contains("<|im_start|>"), "{out}");
    // Turn 1 prefills everything; turn 2 reuses at least turn 1's prompt and
    // prefills only the new turn (far fewer tokens); after /reset only the
    // template's default system prompt is reused.
    let (p1, r1, _) = t[0];
    let (p2, r2, _) = t[1];
    assert_eq!(r1, 0);
    assert!(r2 > p1, "turn 2 reused {r2} tokens, turn 1 had {p1}");
    assert!(p2 < 25 && p2 < r2, "turn 2 prefilled {p2} tokens");
    let (p3, r3, _) = t[2].clone();
    assert!(r3 > 0 && r3 < p1 && p3 + r3 == p1, "after /reset: {:?}", t[2]);
    assert_eq!(out.matches("Paris").count(), 2, "{out}");
    assert!(err.contains("tokens/s"), "{err}");
}

/// Ctrl-C (SIGINT) stops the reply being written; the session goes on.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_reply_not_the_session() {
    use std::io::Read;
    let mut child = spawn_chat("2000");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Write a very long story about a dragon.\n").unwrap();
    let mut stdout = child.stdout.take().unwrap();
    // Wait until the reply is streaming, then interrupt it.
    let mut seen = Vec::new();
    let mut buf = [0u8; 64];
    while seen.len() < 40 {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "infer chat ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    // SAFETY: sends a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    stdin.write_all(b"What is the capital of France? Answer in one word.\n/exit\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    println!("stdout:\n{}{rest}\nstderr:\n{err}", String::from_utf8_lossy(&seen));
    assert!(o.status.success(), "{err}");
    let t = turns(&err);
    assert_eq!(t.len(), 2, "{err}");
    assert_eq!(t[0].2, "interrupted");
    assert_eq!(t[1].2, "end of turn");
    assert!(rest.contains("Paris"), "{rest}");
}

/// `chat` follows `run`'s rules: a random seed printed at the start, `-c 0`
/// meaning the training context, and a reply cut by a full context says so.
#[test]
fn chat_shares_runs_sampling_and_context_rules() {
    infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    let run = |args: &[&str], input: &str| {
        let all: Vec<&str> = ["chat", "--model", "smollm2-135m", "-t", "1"].iter().chain(args).copied().collect();
        let o = common::infer_stdin(&all, input.as_bytes());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let seed = |err: &str| err.split("seed ").nth(1).and_then(|s| s.split(',').next()).map(str::to_string);
    let (a, b) = (run(&["-n", "1"], "hi\n"), run(&["-n", "1"], "hi\n"));
    assert!(seed(&a).is_some() && seed(&a) != seed(&b), "two sessions should draw different seeds:\n{a}\n{b}");
    assert!(run(&["-n", "1", "-c", "0"], "hi\n").contains("context 8192 tokens"));
    // A reply that fills the context shifts it and goes on; without
    // context shift it ends there.
    let story = "Tell me a long story about a dragon\n";
    let shifted = run(&["-n", "100", "-c", "50", "--temp", "0"], story);
    assert!(shifted.contains("; context shifted"), "{shifted}");
    let full = run(&["-n", "100", "-c", "50", "--temp", "0", "--no-context-shift"], story);
    assert!(full.contains("; context full]"), "{full}");
}

/// Commands on piped input: `/load` continues a saved conversation (the next
/// reply sees it), `/save` writes it back, `/help` and unknown commands are
/// answered on stderr and never sent; a line ending in `\` continues.
#[test]
fn load_and_save_a_conversation_and_commands_stay_local() {
    let dir = common::tmpdir();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let earlier =
        r#"[{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello, Ada!"}]"#;
    std::fs::write(&a, earlier).unwrap();
    let input = format!("/help\n/frob\n/load {}\nWhat is\\\nmy name?\n/save {}\n", a.display(), b.display());
    let (_, err) = chat(&input);
    assert!(err.contains("/save FILE") && err.contains("unknown command /frob"), "{err}");
    assert!(err.contains("conversation of 2 messages loaded"), "{err}");
    let t = turns(&err);
    assert_eq!(t.len(), 1, "only the question is sent: {err}");
    // The loaded messages are in the prompt: it is longer than the question's alone.
    let (_, alone) = chat("What is\\\nmy name?\n");
    let t_alone = turns(&alone);
    assert!(
        t[0].0 > t_alone[0].0 + 8,
        "prefilled {} tokens with the loaded conversation, {} without",
        t[0].0,
        t_alone[0].0
    );
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&b).unwrap()).unwrap();
    assert_eq!(saved[0]["content"], "My name is Ada.");
    assert_eq!(saved[2]["content"], "What is\nmy name?");
    assert_eq!(saved[3]["role"], "assistant");
    // A file that is not a conversation is refused; the session goes on.
    std::fs::write(&a, "{}").unwrap();
    let (_, err) = chat(&format!("/load {}\n", a.display()));
    assert!(err.contains("is not a conversation"), "{err}");
}

/// `/reset` keeps the system prompt's part of the cache: the first turn
/// after it reuses those tokens instead of prefilling them again.
#[test]
fn reset_keeps_the_system_prompt_in_the_cache() {
    infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    let q = "What is the capital of France? Answer in one word.";
    let o = common::infer_stdin(
        &["chat", "--model", "smollm2-135m", "--temp", "0", "-n", "16", "-sys", "You are a geography teacher."],
        format!("{q}\n/reset\n{q}\n").as_bytes(),
    );
    let err = common::stderr(&o);
    assert!(o.status.success(), "{err}");
    let t = turns(&err);
    assert_eq!(t.len(), 2, "{err}");
    let ((p1, r1, _), (p2, r2, _)) = (t[0].clone(), t[1].clone());
    assert_eq!(r1, 0, "{err}");
    // The same conversation again: what is reused is not prefilled.
    assert!(r2 > 5, "after /reset the system prompt's tokens were prefilled again: {err}");
    assert_eq!(p2 + r2, p1, "{err}");
}

/// Waits at most a minute for `child` to end by itself (the test fails
/// instead of hanging when it does not).
#[cfg(unix)]
fn ends_within_a_minute(child: &mut std::process::Child) -> std::process::ExitStatus {
    for _ in 0..600 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("infer chat did not end within a minute");
}

/// SIGTERM ends a session read from a pipe cleanly (exit status 0, the
/// line ended): at the prompt, and during a reply, which stops first.
#[cfg(unix)]
#[test]
fn sigterm_ends_the_session_at_the_prompt_and_during_a_reply() {
    use std::io::Read;
    for during_reply in [false, true] {
        let mut child = spawn_chat("2000");
        // Kept open: the session waits for a line, not for the end of input.
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        if during_reply {
            stdin.write_all(b"Write a very long story about a dragon.\n").unwrap();
        }
        // The first prompt, then (during a reply) some of the reply.
        let mut prompted = false;
        while !prompted || (during_reply && seen.len() < 40) {
            assert_eq!(stdout.read(&mut byte).unwrap(), 1, "ended early: {}", String::from_utf8_lossy(&seen));
            seen.push(byte[0]);
            prompted |= seen.ends_with(b"> ");
        }
        // SAFETY: sends a signal to the child this test started.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) }, 0);
        let status = ends_within_a_minute(&mut child);
        stdout.read_to_end(&mut seen).unwrap();
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let out = String::from_utf8_lossy(&seen);
        assert!(status.success(), "{status}: {err}");
        assert!(out.ends_with('\n'), "the output ends without a newline: {out:?}");
        let stops: Vec<String> = turns(&err).into_iter().map(|t| t.2).collect();
        assert_eq!(stops, if during_reply { vec!["interrupted".to_string()] } else { vec![] }, "{err}");
        drop(stdin);
    }
}

/// Without -sys, `/reset` keeps the template's own default system prompt
/// in the cache (SmolLM2's template writes one), as with -sys; `-sys ''`
/// is no system prompt (the same as none); a context too small for the
/// template's default system prompt is refused at start-up, naming it.
#[test]
fn reset_keeps_the_default_system_prompt_and_an_empty_sys_is_none() {
    infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    let q = "What is the capital of France? Answer in one word.";
    let run = |extra: &[&str]| {
        let args = [&["chat", "--model", "smollm2-135m", "--temp", "0", "-n", "8"], extra].concat();
        let o = common::infer_stdin(&args, format!("{q}\n/reset\n{q}\n").as_bytes());
        assert!(o.status.success(), "{}", common::stderr(&o));
        common::stderr(&o)
    };
    let err = run(&[]);
    let t = turns(&err);
    assert_eq!(t.len(), 2, "{err}");
    assert!(t[1].1 > 5, "after /reset the default system prompt was prefilled again: {err}");
    assert_eq!(t[1].0 + t[1].1, t[0].0, "{err}");
    let empty = run(&["-sys", ""]);
    assert_eq!(turns(&empty)[0].0, t[0].0, "-sys '' is not the same as no system prompt: {empty}");
    let o = common::infer_stdin(&["chat", "--model", "smollm2-135m", "-c", "16"], b"Hi\n");
    common::assert_one_line_error(
        &o,
        "the chat template alone (with its own default system prompt, if it has one) takes all of the 16",
    );
}
