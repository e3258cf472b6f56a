//! The commands of `infer chat`: input lines that begin with `/` are
//! handled by `infer` and never sent to the model (`//` sends a line that
//! begins with `/`), and the conversation files of `/save` and `/load`.
//!
//! A conversation file is a JSON array of messages in the OpenAI shape,
//! `[{"role": "system"|"user"|"assistant", "content": "..."}]`, the body's
//! `messages` of a `/v1/chat/completions` request.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use infer_model::chat::{Message, Role};
use serde::{Deserialize, Serialize};

use crate::common::CliResult;

/// What an input line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// Send this text to the model.
    Send(String),
    /// `/help` or `/?`: list the commands.
    Help,
    /// `/reset` or `/clear`: forget the conversation (the system prompt stays).
    Reset,
    /// `/exit`, `/quit` or `/bye`: leave.
    Exit,
    /// `/save FILE`: write the conversation as JSON.
    Save(PathBuf),
    /// `/load FILE`: replace the conversation by one saved with `/save`.
    Load(PathBuf),
    /// A command used wrongly or unknown: the message to show.
    Invalid(String),
}

/// The text of `/help`.
pub const HELP: &str = "\
commands:
  /help             this list
  /reset            forget the conversation (the system prompt stays)
  /save FILE        write the conversation to FILE as JSON (OpenAI's messages; ~/ is your home folder)
  /load FILE        continue a conversation written by /save
  /exit             leave (also /quit, /bye, Ctrl-D)
  //TEXT            send /TEXT to the model
keys: a line that ends in \\ continues on the next; up and down recall earlier messages; Ctrl-C stops a reply, and at \
an empty prompt asks to leave (Ctrl-C again leaves)";

/// Reads what an input line (already trimmed) asks for.
pub fn parse(line: &str) -> Command {
    if let Some(text) = line.strip_prefix("//") {
        return Command::Send(format!("/{text}"));
    }
    let Some(rest) = line.strip_prefix('/') else { return Command::Send(line.to_string()) };
    let (name, arg) = match rest.split_once(char::is_whitespace) {
        Some((n, a)) => (n, a.trim()),
        None => (rest, ""),
    };
    let no_arg = |c: Command| if arg.is_empty() { c } else { Command::Invalid(format!("/{name} takes no argument")) };
    let file = |c: fn(PathBuf) -> Command| {
        if arg.is_empty() {
            Command::Invalid(format!("/{name} needs a file name: /{name} FILE"))
        } else {
            c(expand_home(unquote(arg), std::env::var_os("HOME")))
        }
    };
    match name {
        "help" | "?" => no_arg(Command::Help),
        "reset" | "clear" => no_arg(Command::Reset),
        "exit" | "quit" | "bye" => no_arg(Command::Exit),
        "save" => file(Command::Save),
        "load" => file(Command::Load),
        _ => Command::Invalid(format!(
            "unknown command /{name} (/help lists the commands; start the line with // to send it as it is)"
        )),
    }
}

/// `arg` without one pair of matching quotes around it (`"a b.json"` or
/// `'a b.json'`), as a shell would take them.
fn unquote(arg: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = arg.strip_prefix(q).and_then(|a| a.strip_suffix(q)) {
            return inner;
        }
    }
    arg
}

/// `file` with a leading `~` (alone, or `~/...`) replaced by `home`, as a
/// shell does (`~user` and a `~` elsewhere are taken as written, and so is
/// everything without a home).
fn expand_home(file: &str, home: Option<std::ffi::OsString>) -> PathBuf {
    match (file.strip_prefix('~'), home.filter(|h| !h.is_empty())) {
        (Some(""), Some(home)) => PathBuf::from(home),
        (Some(rest), Some(home)) if rest.starts_with('/') => PathBuf::from(home).join(rest.trim_start_matches('/')),
        _ => PathBuf::from(file),
    }
}

/// Whether the file at `path` is a conversation file as [`save`] writes
/// them (a JSON array of `{"role", "content"}` objects): one that `/save`
/// may replace without asking. A file of more than 64 MiB is not read.
fn is_conversation_file(path: &Path) -> bool {
    let mut text = String::new();
    let read = std::fs::File::open(path).and_then(|f| f.take(64 << 20).read_to_string(&mut text));
    read.is_ok() && serde_json::from_str::<Vec<FileMessage>>(&text).is_ok()
}

/// One message of a conversation file.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileMessage {
    role: String,
    content: String,
}

/// Writes `messages` to `path` as a JSON array: into a new file beside
/// it, then renamed over it, so that a failed write loses nothing. An
/// existing file that is not a conversation file is replaced only when
/// `confirm` (given the question) says yes; `confirm` gives `None` where
/// there is no one to ask (no terminal), and the file is kept.
///
/// # Errors
/// The file cannot be written (named with the path); `path` exists and is
/// not a regular file (a device or a pipe would never end, or block), is
/// a GGUF model (a conversation must never replace a model, least of all
/// the one being run), or is another file that was not to be replaced.
pub fn save(path: &Path, messages: &[Message], confirm: &mut dyn FnMut(&str) -> Option<bool>) -> CliResult {
    let what = path.display();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_symlink() {
            return Err(format!("/save: {what} is a symbolic link; name the file itself").into());
        }
        if !meta.is_file() {
            return Err(format!("/save: {what} is not a regular file").into());
        }
        let mut magic = [0u8; 4];
        let is_gguf = std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF";
        if is_gguf {
            return Err(format!("/save: {what} is a GGUF model; name another file").into());
        }
        if !is_conversation_file(path) {
            match confirm(&format!("{what} exists and is not a conversation file; replace it? [y/N] ")) {
                Some(true) => {}
                Some(false) => return Err(format!("/save: {what} was kept; nothing was saved").into()),
                None => {
                    return Err(format!(
                        "/save: {what} exists and is not a conversation file; it was kept (name a new file, or \
                         remove it first)"
                    )
                    .into())
                }
            }
        }
    }
    let list: Vec<FileMessage> =
        messages.iter().map(|m| FileMessage { role: m.role.as_str().into(), content: m.content.clone() }).collect();
    let mut text = serde_json::to_string_pretty(&list)?;
    text.push('\n');
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.partial", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        std::fs::File::create_new(&tmp)?.write_all(text.as_bytes())?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("/save: cannot write {what}: {e}")
    })?;
    Ok(())
}

/// Reads a conversation written by [`save`] from `path`, of at most `limit`
/// bytes.
///
/// # Errors
/// A file that cannot be read, is longer than `limit`, is not such a JSON
/// array, has a role other than system, user and assistant (or a system
/// message after the first), or whose user and assistant messages do not
/// alternate from a user's to an assistant's (the next turn is the user's).
pub fn load(path: &Path, limit: usize) -> CliResult<Vec<Message>> {
    let what = path.display();
    // Before opening: a pipe would block the open, a device never end.
    let meta = std::fs::metadata(path).map_err(|e| format!("/load: cannot read {what}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("/load: {what} is not a regular file").into());
    }
    let len = meta.len();
    if len > limit as u64 {
        return Err(format!("/load: {what} has {len} bytes, more than the context can hold ({limit})").into());
    }
    // At most `limit` bytes even if the file grows meanwhile.
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limit as u64 + 1).read_to_string(&mut text))
        .map_err(|e| format!("/load: cannot read {what}: {e}"))?;
    if text.len() > limit {
        return Err(format!("/load: {what} has more than {limit} bytes, more than the context can hold").into());
    }
    // A byte-order mark (some editors write one) is no part of the JSON.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let list: Vec<FileMessage> = serde_json::from_str(text).map_err(|e| {
        format!("/load: {what} is not a conversation (a JSON array of {{\"role\", \"content\"}} objects): {e}")
    })?;
    let messages: Vec<Message> = list
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" if i == 0 => Role::System,
                "system" => {
                    return Err(format!("/load: {what}: message {} is a system message; only the first may be", i + 1))
                }
                "user" => Role::User,
                "assistant" => Role::Assistant,
                r => {
                    return Err(format!("/load: {what}: message {} has role '{r}' (system, user or assistant)", i + 1))
                }
            };
            Ok(Message::new(role, m.content))
        })
        .collect::<Result<_, String>>()?;
    let n_system = messages.iter().take_while(|m| m.role == Role::System).count();
    let a_role = |r: Role| format!("{} {}", if r == Role::Assistant { "an" } else { "a" }, r.as_str());
    for (i, m) in messages.iter().enumerate().skip(n_system) {
        let want = if (i - n_system) % 2 == 0 { Role::User } else { Role::Assistant };
        if m.role != want {
            return Err(format!(
                "/load: {what}: message {} is {} message where {} message is expected (user and assistant messages \
                 alternate, the user's first)",
                i + 1,
                a_role(m.role),
                a_role(want)
            )
            .into());
        }
    }
    if (messages.len() - n_system) % 2 == 1 {
        return Err(format!(
            "/load: {what}: the last message is the user's, without a reply (a conversation ends with an assistant \
             message)"
        )
        .into());
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_and_load_refuse_what_is_not_a_conversation_file() {
        let dir = tempfile::tempdir().unwrap();
        let msgs = [
            Message { role: Role::User, content: "hi".into() },
            Message { role: Role::Assistant, content: "hello".into() },
        ];
        // A device never ends and a directory is no file.
        assert!(load(Path::new("/dev/zero"), 1 << 20).unwrap_err().to_string().contains("not a regular file"));
        assert!(load(dir.path(), 1 << 20).unwrap_err().to_string().contains("not a regular file"));
        let mut no_one = |_: &str| None;
        assert!(save(dir.path(), &msgs, &mut no_one).unwrap_err().to_string().contains("not a regular file"));
        // A model is never replaced by a conversation, and stays as it was.
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"GGUF\x03\0\0\0rest").unwrap();
        let mut yes = |_: &str| Some(true);
        assert!(save(&model, &msgs, &mut yes).unwrap_err().to_string().contains("is a GGUF model"));
        assert_eq!(std::fs::read(&model).unwrap(), b"GGUF\x03\0\0\0rest");
        // Another file is replaced only when the answer is yes; with no one
        // to ask, or a no, it stays.
        let conv = dir.path().join("c.json");
        std::fs::write(&conv, "old").unwrap();
        let e = save(&conv, &msgs, &mut no_one).unwrap_err().to_string();
        assert!(e.contains("exists and is not a conversation file; it was kept"), "{e}");
        let e = save(&conv, &msgs, &mut |_: &str| Some(false)).unwrap_err().to_string();
        assert!(e.contains("was kept"), "{e}");
        assert_eq!(std::fs::read(&conv).unwrap(), b"old");
        save(&conv, &msgs, &mut yes).unwrap();
        assert_eq!(load(&conv, 1 << 20).unwrap().len(), 2);
        // A conversation file is replaced whole without asking, and nothing else is left.
        let mut never = |q: &str| panic!("asked {q}");
        save(&conv, &msgs[..1], &mut never).unwrap();
        assert_eq!(std::fs::read_to_string(&conv).unwrap().matches("role").count(), 1);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "a partial file was left");
    }

    #[test]
    fn commands_are_read_and_the_rest_is_sent() {
        assert_eq!(parse("/help"), Command::Help);
        assert_eq!(parse("/exit"), Command::Exit);
        assert_eq!(parse("/bye"), Command::Exit);
        assert_eq!(parse("/reset"), Command::Reset);
        assert_eq!(parse("/save  chat.json"), Command::Save("chat.json".into()));
        assert_eq!(parse("/load a b.json"), Command::Load("a b.json".into()));
        assert_eq!(parse("hello /help"), Command::Send("hello /help".into()));
        assert_eq!(parse("//help"), Command::Send("/help".into()));
        assert!(matches!(parse("/save"), Command::Invalid(m) if m.contains("needs a file name")));
        assert!(matches!(parse("/exit now"), Command::Invalid(m) if m.contains("takes no argument")));
        assert!(matches!(parse("/frobnicate"), Command::Invalid(m) if m.starts_with("unknown command /frobnicate")));
    }

    #[test]
    fn a_leading_tilde_is_the_home_folder() {
        let home = || Some(std::ffi::OsString::from("/home/ada"));
        assert_eq!(expand_home("~/chats/a.json", home()), Path::new("/home/ada/chats/a.json"));
        assert_eq!(expand_home("~", home()), Path::new("/home/ada"));
        assert_eq!(expand_home("~bob/a.json", home()), Path::new("~bob/a.json"));
        assert_eq!(expand_home("a~/b", home()), Path::new("a~/b"));
        assert_eq!(expand_home("~/a.json", None), Path::new("~/a.json"));
    }

    #[test]
    fn a_saved_conversation_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        let messages = vec![Message::system("be brief"), Message::user("hi \"there\"\n"), Message::assistant("Hello.")];
        save(&path, &messages, &mut |_: &str| None).unwrap();
        assert_eq!(load(&path, 1 << 20).unwrap(), messages);
        let e = load(&path, 10).unwrap_err().to_string();
        assert!(e.contains("more than the context can hold"), "{e}");
        std::fs::write(&path, r#"[{"role": "tool", "content": "x"}]"#).unwrap();
        assert!(load(&path, 1 << 20).unwrap_err().to_string().contains("role 'tool'"));
        // User and assistant messages alternate, the user's first and the assistant's last.
        let write = |roles: &[&str]| {
            let list: Vec<String> = roles.iter().map(|r| format!(r#"{{"role": "{r}", "content": "x"}}"#)).collect();
            std::fs::write(&path, format!("[{}]", list.join(","))).unwrap();
            load(&path, 1 << 20).map_err(|e| e.to_string())
        };
        assert_eq!(write(&["system", "user", "assistant"]).unwrap().len(), 3);
        assert_eq!(write(&["user", "assistant", "user", "assistant"]).unwrap().len(), 4);
        assert!(write(&["system"]).is_ok() && write(&[]).is_ok());
        let e = write(&["system", "user", "user", "assistant"]).unwrap_err();
        assert!(e.contains("message 3 is a user message where an assistant message is expected"), "{e}");
        let e = write(&["assistant", "user"]).unwrap_err();
        assert!(e.contains("message 1 is an assistant message where a user message is expected"), "{e}");
        assert!(write(&["user", "assistant", "user"]).unwrap_err().contains("without a reply"));
        assert!(write(&["user", "system"]).unwrap_err().contains("message 2 is a system message"));
        std::fs::write(&path, r#"{"messages": []}"#).unwrap();
        assert!(load(&path, 1 << 20).unwrap_err().to_string().contains("is not a conversation"));
        assert!(load(&dir.path().join("none.json"), 1 << 20)
            .unwrap_err()
            .to_string()
            .starts_with("/load: cannot read"));
    }
}
