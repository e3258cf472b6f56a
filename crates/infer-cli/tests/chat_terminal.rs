//! `infer chat` on a terminal, driven through a pseudo-terminal with the
//! real SmolLM2 135M Instruct (fetched and cached by name on first use): the
//! line editor's keys (arrows, history), multi-line input, commands handled
//! locally, Ctrl-C at the prompt and during a reply, Ctrl-D, SIGTERM.
#![cfg(unix)]

mod common;

use std::process::Command;
use std::time::Duration;

use rexpect::process::WaitStatus;
use rexpect::session::PtySession;

/// The escape sequences a terminal sends for these keys.
const LEFT: &str = "\x1b[D";
const UP: &str = "\x1b[A";

/// `infer chat` on a new pseudo-terminal, greedy, at most `n` tokens per
/// reply, waiting (30 s at most per step) until its first prompt.
fn chat_on_terminal(n: &str) -> PtySession {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infer"));
    cmd.args(["chat", "-m", "smollm2-135m", "--temp", "0", "-n", n, "-t", "2"]);
    session_on_terminal(cmd)
}

/// `cmd` (an `infer chat` of SmolLM2 135M Instruct, fetched here on first
/// use) on a new pseudo-terminal, once it shows its first prompt.
fn session_on_terminal(mut cmd: Command) -> PtySession {
    infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    if !cmd.get_envs().any(|(k, _)| k == "TERM") {
        cmd.env("TERM", "xterm");
    }
    cmd.env_remove("INFER_MODEL");
    let mut p = rexpect::session::spawn_command(cmd, Some(60_000)).expect("spawn infer chat on a pty");
    p.exp_string("/help lists the commands").expect("the session's hint");
    p.exp_string("> ").expect("the first prompt");
    p
}

/// Types `text` (sent at once, as a terminal sends a key's bytes).
fn keys(p: &mut PtySession, text: &str) {
    p.send(text).unwrap();
    p.flush().unwrap();
}

/// Waits for the stats line that ends a reply and returns its stop reason.
fn reply_stop(p: &mut PtySession) -> String {
    let (_, stop) = p.exp_regex(r"tokens/s; [a-z -]+\]").expect("a reply's stats line");
    p.exp_string("> ").expect("the prompt after the reply");
    stop
}

/// Saves the conversation through `/save` and returns its messages as
/// (role, content) pairs.
fn saved(p: &mut PtySession, dir: &std::path::Path) -> Vec<(String, String)> {
    let file = dir.join("conversation.json");
    p.send_line(&format!("/save {}", file.display())).unwrap();
    p.exp_string("saved to").expect("the /save confirmation");
    p.exp_string("> ").unwrap();
    let text = std::fs::read_to_string(&file).expect("the saved conversation");
    let list: Vec<serde_json::Value> = serde_json::from_str(&text).expect("a JSON array");
    list.iter().map(|m| (m["role"].as_str().unwrap().to_string(), m["content"].as_str().unwrap().to_string())).collect()
}

/// The contents of the user messages among `messages` (as [`saved`] gives them).
fn user_contents(messages: &[(String, String)]) -> Vec<&str> {
    messages.iter().filter(|(r, _)| r == "user").map(|(_, c)| c.as_str()).collect()
}

/// Ends the session with `/exit` and checks that it exits with code 0.
fn exit_cleanly(p: &mut PtySession) {
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
    assert_eq!(exit_code(p), 0);
}

/// The exit code of the session's process once it ends.
fn exit_code(p: &PtySession) -> i32 {
    match p.process().wait().expect("wait for infer chat") {
        WaitStatus::Exited(_, code) => code,
        other => panic!("infer chat ended with {other:?}"),
    }
}

#[test]
fn arrow_keys_edit_the_line_and_up_recalls_the_last_message() {
    let dir = common::tmpdir();
    let mut p = chat_on_terminal("24");
    // A typo mended with the left arrow: the model gets the mended line.
    keys(&mut p, "What is the capital of Frace?");
    keys(&mut p, &LEFT.repeat(3));
    keys(&mut p, "n\r");
    reply_stop(&mut p);
    // Up recalls it; Enter sends it again.
    keys(&mut p, UP);
    keys(&mut p, "\r");
    reply_stop(&mut p);
    let messages = saved(&mut p, dir.path());
    let user = user_contents(&messages);
    assert_eq!(user, ["What is the capital of France?", "What is the capital of France?"], "{messages:?}");
    exit_cleanly(&mut p);
}

#[test]
fn a_trailing_backslash_continues_the_message_and_commands_stay_local() {
    let dir = common::tmpdir();
    let mut p = chat_on_terminal("8");
    p.send_line("/help").unwrap();
    p.exp_string("/save FILE").expect("the command list");
    p.exp_string("> ").unwrap();
    p.send_line("/nonsense").unwrap();
    p.exp_string("unknown command /nonsense").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("Say hello\\").unwrap();
    p.exp_string("... ").expect("the continuation prompt");
    p.send_line("in French.").unwrap();
    reply_stop(&mut p);
    let messages = saved(&mut p, dir.path());
    // The commands were never sent; the two lines are one message.
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0], ("user".to_string(), "Say hello\nin French.".to_string()));
    // Ctrl-D ends the session with the line ended.
    p.send_control('d').unwrap();
    let rest = p.exp_eof().unwrap();
    assert!(rest.ends_with('\n'), "the output ends without a newline: {rest:?}");
    assert_eq!(exit_code(&p), 0);
}

/// `/save` over a file that is not a conversation asks first: no keeps
/// the file, yes replaces it.
#[test]
fn save_asks_before_replacing_another_file() {
    let dir = common::tmpdir();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "my notes\n").unwrap();
    let mut p = chat_on_terminal("4");
    for answer in ["n", "y"] {
        p.send_line(&format!("/save {}", notes.display())).unwrap();
        p.exp_string("exists and is not a conversation file; replace it? [y/N] ").expect("the question");
        p.send_line(answer).unwrap();
        p.exp_string(if answer == "n" { "was kept; nothing was saved" } else { "saved to" }).unwrap();
        p.exp_string("> ").unwrap();
        if answer == "n" {
            assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes\n");
        }
    }
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&notes).unwrap()).unwrap();
    assert_eq!(saved, serde_json::json!([]));
    exit_cleanly(&mut p);
}

/// With standard output redirected (`infer chat > FILE`, or `| tee`), the
/// line editor still edits on the terminal, as llama.cpp's console does:
/// the model gets the mended line, the prompts stay on the terminal and
/// the reply goes to the file.
#[test]
fn the_line_editor_works_with_standard_output_redirected() {
    let dir = common::tmpdir();
    let out = dir.path().join("out.txt");
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(r#"exec "$0" chat -m smollm2-135m --temp 0 -n 12 -t 2 > "$1""#);
    cmd.arg(env!("CARGO_BIN_EXE_infer")).arg(&out);
    // The hint and the first prompt show on the terminal, not in the file.
    let mut p = session_on_terminal(cmd);
    keys(&mut p, "What is the capital of Frace?");
    keys(&mut p, &LEFT.repeat(3));
    keys(&mut p, "n\r");
    reply_stop(&mut p);
    let messages = saved(&mut p, dir.path());
    assert_eq!(messages[0], ("user".to_string(), "What is the capital of France?".to_string()));
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
    assert_eq!(exit_code(&p), 0);
    let file = std::fs::read_to_string(&out).expect("the redirected output");
    assert!(!file.contains("> ") && !file.contains('\x1b') && !file.trim().is_empty(), "{file:?}");
    assert_eq!(file.trim(), messages[1].1.trim(), "the file holds the reply");
}

#[test]
fn ctrl_c_stops_a_reply_then_asks_before_leaving() {
    let mut p = chat_on_terminal("-1");
    p.send_line("Write a very long story about a dragon who learns to cook, with many chapters.").unwrap();
    // Some of the reply, then Ctrl-C: the reply stops, the session stays.
    p.exp_string("chapters.").expect("the line's echo");
    p.exp_regex(r"[A-Za-z]{3}").expect("the reply begins");
    std::thread::sleep(Duration::from_millis(300));
    p.send_control('c').unwrap();
    assert_eq!(reply_stop(&mut p), "tokens/s; interrupted]");
    // At the prompt the first Ctrl-C asks, the second leaves.
    p.send_control('c').unwrap();
    p.exp_string("Ctrl-C again").expect("the question");
    p.send_control('c').unwrap();
    p.exp_eof().unwrap();
    assert_eq!(exit_code(&p), 0);
}

#[test]
fn sigterm_at_the_prompt_ends_the_session_as_ctrl_d() {
    let mut p = chat_on_terminal("8");
    p.process_mut().signal(rexpect::process::Signal::SIGTERM).unwrap();
    let rest = p.exp_eof().expect("the session ends at SIGTERM");
    assert!(rest.ends_with('\n'), "the output ends without a newline: {rest:?}");
    assert_eq!(exit_code(&p), 0);
    // The terminal is given back in the mode it had, not the line editor's
    // raw mode (the master side reads the pair's settings).
    let tty = p.process().get_file_handle().unwrap();
    // SAFETY: tcgetattr fills a zeroed termios from an open descriptor.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::tcgetattr(std::os::fd::AsRawFd::as_raw_fd(&tty), &mut t) }, 0);
    assert_ne!(t.c_lflag & libc::ICANON, 0, "the terminal was left in raw mode");
}

#[test]
fn sigterm_during_a_reply_stops_it_and_ends_the_session() {
    let mut p = chat_on_terminal("-1");
    p.send_line("Write a very long story about a dragon who learns to cook, with many chapters.").unwrap();
    p.exp_string("chapters.").expect("the line's echo");
    p.exp_regex(r"[A-Za-z]{3}").expect("the reply begins");
    p.process_mut().signal(rexpect::process::Signal::SIGTERM).unwrap();
    p.exp_string("tokens/s; interrupted]").expect("the reply's stats line");
    let rest = p.exp_eof().expect("the session ends after the reply");
    assert!(!rest.contains("> "), "a prompt after SIGTERM: {rest:?}");
    assert_eq!(exit_code(&p), 0);
}

/// Ctrl-C on a line with text clears the line, as a shell does, and does
/// not ask to leave; a byte that is not UTF-8 refuses that line, and the
/// session goes on (as from a pipe).
#[test]
fn ctrl_c_clears_a_typed_line_and_a_non_utf8_line_is_refused() {
    let dir = common::tmpdir();
    let mut p = chat_on_terminal("4");
    keys(&mut p, "thrown away");
    p.send_control('c').unwrap();
    // The line is empty now (once the editor reads again): this Ctrl-C is
    // the first at an empty prompt.
    std::thread::sleep(Duration::from_millis(500));
    p.send_control('c').unwrap();
    p.exp_string("Ctrl-C again").expect("the question, the session still on");
    keys(&mut p, "Hello\r");
    reply_stop(&mut p);
    {
        use std::io::Write;
        let mut tty = p.process().get_file_handle().unwrap();
        tty.write_all(b"\xff\r").unwrap();
        tty.flush().unwrap();
    }
    p.exp_string("that line is not valid UTF-8; it was not sent").expect("the refusal");
    p.exp_string("> ").unwrap();
    let messages = saved(&mut p, dir.path());
    let user = user_contents(&messages);
    assert_eq!(user, ["Hello"], "{messages:?}");
    exit_cleanly(&mut p);
}

/// On a terminal the line editor cannot drive (TERM=dumb), an arrow key's
/// escape sequence is not sent to the model: the line is refused.
#[test]
fn escape_sequences_on_a_dumb_terminal_are_not_sent() {
    let dir = common::tmpdir();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infer"));
    cmd.args(["chat", "-m", "smollm2-135m", "--temp", "0", "-n", "4", "-t", "2"]).env("TERM", "dumb");
    let mut p = session_on_terminal(cmd);
    keys(&mut p, &format!("Hi{UP}\r"));
    p.exp_string("escape sequences").expect("the refusal");
    p.exp_string("> ").unwrap();
    let messages = saved(&mut p, dir.path());
    assert!(messages.is_empty(), "{messages:?}");
    exit_cleanly(&mut p);
}
