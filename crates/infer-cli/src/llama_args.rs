//! llama.cpp's spellings on the command line: its multi-letter short flags
//! (`-ngl 99`, `-sys TEXT`, `-dev CUDA0`), which clap cannot declare, and
//! its escape processing of prompt text (`-e`, on by default).
//!
//! Clap reads `-ngl` as `-n gl` (a short flag with its value attached), so
//! argv is rewritten before parsing: each multi-letter flag that `infer`
//! has becomes its long form, and each one of llama.cpp's that `infer`
//! lacks is an error naming it, instead of being taken apart into short
//! flags (`-fa` as `-f a`, `-hf` as `-h -f`).

use std::ffi::OsString;

/// llama.cpp's multi-letter short flags that `infer` has, and the long
/// flag each one stands for.
pub const SHORT_ALIASES: &[(&str, &str)] = &[
    ("-ngl", "--n-gpu-layers"),
    ("-sys", "--system-prompt"),
    ("-dev", "--device"),
    ("-hf", "--hf-repo"),
    ("-hfr", "--hf-repo"),
    ("-hff", "--hf-file"),
    // llama-batched-bench's, for `bench`.
    ("-npp", "--npp"),
    ("-ntg", "--ntg"),
    ("-npl", "--npl"),
    // llama-server's, for `serve`.
    ("-np", "--parallel"),
    // The KV cache's element types.
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
];

/// The flags whose value is text, which may start with `-`.
const TEXT_FLAGS: &[&str] = &["-p", "--prompt", "-r", "--reverse-prompt", "-sys", "--system-prompt", "--system"];

/// llama.cpp's flags that `infer` lacks, given by their long name (as clap
/// reports an unknown one): said so, instead of clap's guess at a similar
/// option of infer's.
pub fn unsupported_long(cmd: Option<&str>, arg: &str) -> Option<String> {
    let flag = arg.split_once('=').map_or(arg, |(f, _)| f);
    let (short, long) = UNSUPPORTED.iter().find(|(_, long)| *long == flag)?;
    Some(hint(cmd, short).unwrap_or_else(|| {
        format!("{long} (llama.cpp's, also {short}) is not an option of infer; `infer help` lists the options")
    }))
}

/// llama.cpp's multi-letter short flags that `infer` does not have, with
/// their long names: refused by name rather than taken apart by clap.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("-hft", "--hf-token"),
    ("-hfd", "--hf-repo-draft"),
    ("-hfv", "--hf-repo-v"),
    ("-fa", "--flash-attn"),
    ("-cnv", "--conversation"),
    ("-no-cnv", "--no-conversation"),
    ("-st", "--single-turn"),
    ("-mli", "--multiline-input"),
    ("-if", "--interactive-first"),
    ("-ub", "--ubatch-size"),
    ("-tb", "--threads-batch"),
    ("-cb", "--cont-batching"),
    ("-nocb", "--no-cont-batching"),
    ("-sm", "--split-mode"),
    ("-ts", "--tensor-split"),
    ("-mg", "--main-gpu"),
    ("-ot", "--override-tensor"),
    ("-nkvo", "--no-kv-offload"),
    ("-md", "--model-draft"),
    ("-mu", "--model-url"),
    ("-lv", "--verbosity"),
    ("-co", "--color"),
    ("-sp", "--special"),
    ("-cmoe", "--cpu-moe"),
    ("-ncmoe", "--n-cpu-moe"),
    ("-kvu", "--kv-unified"),
    ("-fit", "--fit"),
    ("-rea", "--reasoning"),
    ("-ins", "--instruct"),
    ("-mm", "--mmproj"),
    ("-ps", "--p-split"),
    ("-nr", "--no-repack"),
    ("-dt", "--defrag-thold"),
    ("-gan", "--grp-attn-n"),
    ("-gaw", "--grp-attn-w"),
    ("-dkvc", "--dump-kv-cache"),
    ("-lcs", "--lookup-cache-static"),
    ("-lcd", "--lookup-cache-dynamic"),
    ("-jf", "--json-schema-file"),
    ("-bs", "--samplers"),
];

/// The subcommand of `args` (the program name first): the first argument
/// that is not a flag.
pub fn subcommand(args: &[OsString]) -> Option<&str> {
    args.iter().skip(1).filter_map(|a| a.to_str()).find(|a| !a.starts_with('-'))
}

/// What to do instead of a flag of llama.cpp's that `infer`'s command
/// `cmd` does not take, for `arg` as clap reports it unknown (an alias
/// already rewritten to its long form: `-np` as `--parallel`), or as it was
/// typed for the multi-letter flags `infer` lacks. `None` when there is
/// nothing more precise to say than clap's error.
pub fn hint(cmd: Option<&str>, arg: &str) -> Option<String> {
    let cmd = cmd.unwrap_or("run");
    let flag = arg.split_once('=').map_or(arg, |(f, _)| f);
    let not_here = |what: &str| format!("{what} is not an option of `infer {cmd}`");
    Some(match flag {
        "-b" | "--batch-size" => format!(
            "{}: it prefills the prompt in steps of its own size; leave -b out (`infer serve` and `infer perplexity` \
             take -b)",
            not_here("-b (llama.cpp's --batch-size)")
        ),
        "-i" | "--interactive" | "-if" | "--interactive-first" | "-cnv" | "--conversation" | "-ins" | "--instruct"
            if cmd == "chat" =>
        {
            format!("{flag}: `infer chat` is always an interactive conversation; leave {flag} out")
        }
        "-i" | "--interactive" | "-if" | "--interactive-first" | "-cnv" | "--conversation" | "-ins" | "--instruct" => {
            format!("{}: for a conversation, use `infer chat` (with the same model options)", not_here(flag))
        }
        "-no-cnv" | "--no-conversation" | "-st" | "--single-turn" if cmd == "run" => {
            format!("{flag}: `infer run` is never a conversation (one prompt, one continuation); leave {flag} out")
        }
        "-no-cnv" | "--no-conversation" | "-st" | "--single-turn" => format!(
            "{}: for one reply to one prompt, use `infer run --chat -p TEXT` (its output is not a conversation)",
            not_here(flag)
        ),
        "--parallel" if cmd != "serve" => format!(
            "-np/--parallel is an option of `infer serve` only: `infer {cmd}` runs one sequence{}",
            if cmd == "bench" { " (`infer bench -npl B,...` runs B sequences at once)" } else { "" }
        ),
        "-p" | "--prompt" | "-f" | "--file" if cmd == "chat" => format!(
            "`infer chat` takes no {flag}: type the message at its `> ` prompt or pipe it in (`echo 'Hi' | infer \
             chat`); for one reply to a prompt, use `infer run --chat -p TEXT`"
        ),
        _ => return None,
    })
}

/// The error for `short` (llama.cpp's `long`), a flag of [`UNSUPPORTED`],
/// on the command `cmd`: what to do instead where [`hint`] knows, else that
/// infer lacks it.
fn unsupported(cmd: Option<&str>, short: &str, long: &str) -> String {
    hint(cmd, short).unwrap_or_else(|| {
        format!("{short} (llama.cpp's {long}) is not an option of infer; `infer help` lists the options")
    })
}

/// A multi-letter flag of llama.cpp's with its value written against it
/// (`-ngl99`): `Some((flag, value))` when `arg` is one of the flags of
/// [`SHORT_ALIASES`] or [`UNSUPPORTED`] followed by a number.
fn glued_value(arg: &str) -> Option<(&'static str, &str)> {
    let flag = SHORT_ALIASES
        .iter()
        .map(|(short, _)| *short)
        .chain(UNSUPPORTED.iter().map(|(short, _)| *short))
        .filter(|short| arg.starts_with(short) && arg.len() > short.len())
        .max_by_key(|short| short.len())?;
    let value = &arg[flag.len()..];
    let number = value.strip_prefix('-').unwrap_or(value);
    number.starts_with(|c: char| c.is_ascii_digit()).then_some((flag, value))
}

/// Rewrites llama.cpp's multi-letter short flags in `args` (the program
/// name first) into the long flags clap knows: `-ngl 99` and `-ngl=99`
/// become `--n-gpu-layers 99` and `--n-gpu-layers=99`. Arguments after
/// `--` are left alone.
///
/// # Errors
/// One of llama.cpp's multi-letter flags that `infer` lacks, by name (with
/// what to do instead where there is something: `-cnv`, use `infer chat`);
/// one with its value written against it (`-ngl99`, which clap would read
/// as `-n gl99`, and llama.cpp refuses as an unknown argument).
pub fn rewrite_args(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let cmd = subcommand(&args).map(str::to_string);
    let mut out = Vec::with_capacity(args.len());
    let mut rest = false;
    // The argument after a flag that takes text is its value, whatever it
    // starts with (`-p -1`, `-sys '-be terse'`), as llama.cpp reads it.
    let mut is_value = false;
    for arg in args {
        if std::mem::take(&mut is_value) {
            out.push(arg);
            continue;
        }
        is_value = arg.to_str().is_some_and(|s| !rest && TEXT_FLAGS.contains(&s));
        let Some(s) = arg.to_str().filter(|s| !rest && s.starts_with('-') && !s.starts_with("--")) else {
            rest |= arg == "--";
            out.push(arg);
            continue;
        };
        let (flag, value) = match s.split_once('=') {
            Some((f, v)) => (f, Some(v)),
            None => (s, None),
        };
        if let Some((_, long)) = SHORT_ALIASES.iter().find(|(short, _)| *short == flag) {
            out.push(match value {
                Some(v) => format!("{long}={v}").into(),
                None => long.into(),
            });
            continue;
        }
        if let Some((short, long)) = UNSUPPORTED.iter().find(|(short, _)| *short == flag) {
            return Err(unsupported(cmd.as_deref(), short, long));
        }
        if let Some((flag, value)) = glued_value(s) {
            // A flag infer lacks, whatever its value: said so.
            if let Some((short, long)) = UNSUPPORTED.iter().find(|(short, _)| *short == flag) {
                return Err(unsupported(cmd.as_deref(), short, long));
            }
            return Err(format!(
                "{s}: give the value apart from the flag, `{flag} {value}` or `{flag}={value}` (llama.cpp does not \
                 read {s} either)"
            ));
        }
        out.push(arg);
    }
    Ok(out)
}

/// llama.cpp's `string_process_escapes`: `\n`, `\r`, `\t`, `\'`, `\"`,
/// `\\` and `\xHH` (two hex digits, one byte) are replaced; any other
/// backslash, and a backslash at the end, stays as it is. `what` names the
/// text in the error.
///
/// # Errors
/// `\xHH` bytes that do not form UTF-8.
pub fn process_escapes(text: &str, what: &str) -> Result<String, String> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'\'' | b'"' | b'\\' => out.push(c),
            b'x' if i + 1 < b.len() && b[i].is_ascii_hexdigit() && b[i + 1].is_ascii_hexdigit() => {
                let hex = |d: u8| (d as char).to_digit(16).unwrap_or(0) as u8;
                out.push(hex(b[i]) << 4 | hex(b[i + 1]));
                i += 2;
            }
            _ => out.extend_from_slice(&[b'\\', c]),
        }
    }
    String::from_utf8(out)
        .map_err(|_| format!("{what}: its \\x escapes do not form UTF-8 text (give whole characters, or --no-escape)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(args: &[&str]) -> Result<Vec<String>, String> {
        let out = rewrite_args(args.iter().map(OsString::from).collect())?;
        Ok(out.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    #[test]
    fn multi_letter_flags_become_long_flags() {
        assert_eq!(
            rw(&["infer", "run", "-ngl", "99", "-sys", "be brief", "-dev", "CUDA0", "-n", "5"]).unwrap(),
            ["infer", "run", "--n-gpu-layers", "99", "--system-prompt", "be brief", "--device", "CUDA0", "-n", "5"]
        );
        assert_eq!(rw(&["infer", "-ngl=0"]).unwrap(), ["infer", "--n-gpu-layers=0"]);
        assert_eq!(
            rw(&["infer", "-ctk", "q8_0", "-ctv=q4_0"]).unwrap(),
            ["infer", "--cache-type-k", "q8_0", "--cache-type-v=q4_0"]
        );
        // Values, long flags, single letters and words are left alone.
        assert_eq!(
            rw(&["infer", "run", "-n", "-1", "--top-k", "-5", "-ngl"]).unwrap(),
            ["infer", "run", "-n", "-1", "--top-k", "-5", "--n-gpu-layers"]
        );
        // Not after `--`.
        assert_eq!(rw(&["infer", "run", "--", "-ngl"]).unwrap(), ["infer", "run", "--", "-ngl"]);
    }

    #[test]
    fn llama_cpp_flags_infer_lacks_are_refused_by_name() {
        let e = rw(&["infer", "run", "-fa", "on"]).unwrap_err();
        assert!(e.starts_with("-fa (llama.cpp's --flash-attn) is not an option of infer"), "{e}");
        assert!(rw(&["infer", "run", "-hft", "x"]).unwrap_err().contains("--hf-token"));
        assert_eq!(
            rw(&["infer", "run", "-hf", "user/repo:Q8_0", "-hff", "x.gguf"]).unwrap(),
            ["infer", "run", "--hf-repo", "user/repo:Q8_0", "--hf-file", "x.gguf"]
        );
        assert!(rw(&["infer", "run", "-kvu"]).unwrap_err().contains("--kv-unified"));
    }

    #[test]
    fn glued_values_and_flags_of_other_commands_get_a_precise_line() {
        let e = rw(&["infer", "run", "-ngl99", "hi"]).unwrap_err();
        assert!(e.starts_with("-ngl99: give the value apart from the flag, `-ngl 99` or `-ngl=99`"), "{e}");
        assert!(rw(&["infer", "bench", "-npl4"]).unwrap_err().contains("`-npl 4`"));
        assert!(rw(&["infer", "run", "-ngl-1"]).unwrap_err().contains("`-ngl -1`"));
        assert!(rw(&["infer", "run", "-ub512"]).unwrap_err().starts_with("-ub (llama.cpp's --ubatch-size) is not an"));
        // Not a number after it: left to clap.
        assert_eq!(rw(&["infer", "run", "-sysx"]).unwrap(), ["infer", "run", "-sysx"]);
        assert!(rw(&["infer", "run", "-cnv"]).unwrap_err().contains("use `infer chat`"));
        assert!(rw(&["infer", "chat", "-cnv"]).unwrap_err().contains("leave -cnv out"));
        assert!(rw(&["infer", "-t", "2", "chat", "-no-cnv"]).unwrap_err().contains("infer run --chat"));
        assert_eq!(subcommand(&["infer".into(), "-v".into(), "chat".into()]), Some("chat"));
        assert!(hint(Some("run"), "-i").unwrap().contains("use `infer chat`"));
        assert!(hint(Some("serve"), "--parallel").is_none());
        assert!(hint(Some("perplexity"), "--nonsense").is_none());
    }

    #[test]
    fn escapes_as_llama_cpp() {
        let p = |s: &str| process_escapes(s, "-p").unwrap();
        assert_eq!(p(r"a\nb\tc\rd"), "a\nb\tc\rd");
        assert_eq!(p(r#"\'\"\\"#), "'\"\\");
        assert_eq!(p(r"\x41\x7a!"), "Az!");
        assert_eq!(p(r"\xC3\xA9"), "é");
        // Unknown escapes, a short \x and a final backslash stay.
        assert_eq!(p(r"\q \x4 \xZZ end\"), r"\q \x4 \xZZ end\");
        assert_eq!(p(r"\\n"), r"\n");
        assert_eq!(p("ünï\\ncode"), "ünï\ncode");
        assert!(process_escapes(r"\xff", "-p").unwrap_err().starts_with("-p: its \\x escapes"));
    }
}
