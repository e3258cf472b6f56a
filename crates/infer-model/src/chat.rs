//! Chat templates: turning a conversation into the prompt text a model was
//! trained on.
//!
//! The template is the Jinja source in the GGUF key
//! `tokenizer.chat_template` (the `chat_template` of the model's Hugging
//! Face `tokenizer_config.json`), rendered with `minijinja` as Hugging Face
//! `transformers` renders it (`trim_blocks` and `lstrip_blocks` on, Python
//! string methods such as `.strip()` through `minijinja-contrib`'s
//! `pycompat`). The variables are `messages` (a list of `{role, content}`),
//! `add_generation_prompt`, `bos_token` and `eos_token`; the functions
//! `raise_exception(message)` and `strftime_now(format)` are provided, and
//! the filters `tojson` (as `transformers` defines it: Python's
//! `json.dumps`, nothing escaped for HTML, `ensure_ascii`, `indent`) and
//! `fromjson`. `{% generation %}…{% endgeneration %}` (the markers of
//! assistant text some templates carry, SmolLM3's among them) render their
//! content unchanged, as they do for inference in `transformers`.
//!
//! A render is bounded in time and in memory by one budget (minijinja's
//! fuel, [`RENDER_FUEL`]): each template instruction costs one unit, and each
//! byte of data the template creates (strings and lists from operators,
//! filters, functions and literals, and the output) costs 1/64 of one. A
//! render that runs [`RENDER_FUEL`] instructions or creates
//! [`RENDER_MEMORY`] bytes fails with [`Error::ChatTemplate`]; a value whose
//! size is known beforehand (`"x" * n`, `a ~ b`) is refused before it is
//! allocated, so that no single allocation passes the budget; `join` (ours,
//! around minijinja's) pays for its output as it grows, so that a lazy list
//! of many repeats (`[s] * n`) cannot get past it. The messages themselves
//! are not counted: their size is the caller's to bound. What minijinja
//! 3.1.0 does without charging it is mended by the workspace's patched copy
//! (`vendor/minijinja/PATCHED.md`: a list concatenation's size checked
//! before it is built, every walk over a value, printing, comparing or
//! serializing it, at most 500 levels deep and charged per item) and by
//! `chat_budget.rs` (upper bounds charged before some methods and
//! filters run). A render needs no thread of its own: it fits in a stack of
//! 1 MiB.
//!
//! A file without a template gets a default chosen by architecture
//! (the registry's [`crate::model::ChatFormat`], [`TemplateSource`]): Gemma's turn format for `gemma*` (the format of
//! Gemma's model card: `<start_of_turn>user\n…<end_of_turn>\n`, the
//! assistant's role called `model`, a system message put in front of the
//! first user turn), ChatML (`<|im_start|>role\n…<|im_end|>\n`) otherwise.

use std::collections::BTreeMap;

use std::borrow::Cow;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, ErrorKind, State};

use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Who speaks a [`Message`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    /// The role's name in templates: `"system"`, `"user"` or `"assistant"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    /// A message of `role` saying `content`.
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message { role, content: content.into() }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Message {
        Message::new(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Message {
        Message::new(Role::User, content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new(Role::Assistant, content)
    }
}

/// Where a [`ChatTemplate`]'s source came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateSource {
    /// The file's `tokenizer.chat_template`.
    Gguf,
    /// Given by the caller ([`ChatTemplate::new`]).
    Given,
    /// The default for Gemma architectures ([`GEMMA_TEMPLATE`]).
    DefaultGemma,
    /// The default for every other architecture ([`CHATML_TEMPLATE`]).
    DefaultChatMl,
}

impl std::fmt::Display for TemplateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TemplateSource::Gguf => "the model's tokenizer.chat_template",
            TemplateSource::Given => "a given template",
            TemplateSource::DefaultGemma => "the default Gemma turn template (the file has none)",
            TemplateSource::DefaultChatMl => "the default ChatML template (the file has none)",
        })
    }
}

/// The default template of Gemma architectures: BOS, then one
/// `<start_of_turn>{user|model}\n{content}<end_of_turn>\n` per turn with the
/// content trimmed, system messages joined to the next turn followed by a
/// blank line, and `<start_of_turn>model\n` as the generation prompt.
pub const GEMMA_TEMPLATE: &str = r#"{{- bos_token -}}
{%- set ns = namespace(prefix="") -%}
{%- for message in messages -%}
    {%- if message.role == "system" -%}
        {%- set ns.prefix = ns.prefix ~ message.content ~ "\n\n" -%}
    {%- else -%}
        {%- set role = "model" if message.role == "assistant" else message.role -%}
        {{- "<start_of_turn>" ~ role ~ "\n" ~ ns.prefix ~ message.content | trim ~ "<end_of_turn>\n" -}}
        {%- set ns.prefix = "" -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "<start_of_turn>model\n" -}}
{%- endif -%}"#;

/// The default template of other architectures, ChatML: one
/// `<|im_start|>{role}\n{content}<|im_end|>\n` per message and
/// `<|im_start|>assistant\n` as the generation prompt.
pub const CHATML_TEMPLATE: &str = r#"{%- for message in messages -%}
    {{- "<|im_start|>" ~ message.role ~ "\n" ~ message.content ~ "<|im_end|>\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "<|im_start|>assistant\n" -}}
{%- endif -%}"#;

/// The name the template is stored under in its environment.
const NAME: &str = "chat";

/// A parsed chat template with the model's BOS and EOS texts.
pub struct ChatTemplate {
    env: Environment<'static>,
    text: String,
    source: TemplateSource,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

/// The most bytes of data one render may create (see the module's
/// documentation): a template that doubles a string in a loop, or repeats a
/// message ten million times, fails after about this much, well before the
/// machine's memory.
pub const RENDER_MEMORY: u64 = 256 << 20;

/// Bytes of data per unit of minijinja's fuel (its documented rate).
pub(crate) const BYTES_PER_FUEL: u64 = 64;

/// The budget of one render (minijinja's fuel): [`RENDER_FUEL`] template
/// instructions, or [`RENDER_MEMORY`] bytes of data, or a mix. 4000
/// messages of about 110 bytes take 4.3% of it through the Gemma template
/// and 2.1% through ChatML (measured: 180 613 and 88 549 units), and a
/// runaway loop stops within a second.
pub const RENDER_FUEL: u64 = RENDER_MEMORY / BYTES_PER_FUEL;

/// The longest chat template accepted, in bytes (1 MiB; the templates of
/// published models are a few KiB).
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;

/// Runs `f`, turning a panic inside the template engine (a bug of
/// minijinja's, such as `loop.cycle()` dividing by zero before it was
/// patched) into an [`Error::ChatTemplate`] instead of the end of the
/// process. A render needs no stack of its own: minijinja's walks over a
/// value go at most 500 levels deep (`vendor/minijinja/PATCHED.md`), and its
/// macros and templates recurse at most 500 levels deep as well, which fits
/// in a thread of 1 MiB.
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Error::ChatTemplate(format!("the template engine failed while rendering: {what}")))
    })
}

fn template_error(what: &str, e: &minijinja::Error) -> Error {
    // Out of fuel, or a filter's error caused by it (`tojson`'s "cannot
    // serialize to JSON").
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut out_of_fuel = false;
    while let Some(c) = cause {
        out_of_fuel |= c.downcast_ref::<minijinja::Error>().is_some_and(|m| m.kind() == ErrorKind::OutOfFuel);
        cause = c.source();
    }
    if out_of_fuel {
        return Error::ChatTemplate(format!(
            "{what}: the template did not finish within its budget of {RENDER_FUEL} steps or {} MiB of data (a \
             loop that runs too long, or a string or list that grows too large?)",
            RENDER_MEMORY >> 20
        ));
    }
    let mut msg = format!("{what}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    Error::ChatTemplate(msg)
}

/// `strftime_now(format)`: the current UTC time, formatted with `%Y %m %d
/// %H %M %S %b %B %e %j %%` (the directives chat templates use, for
/// "Today Date: 26 Jul 2024" lines); other directives stay as written.
fn strftime_now(format: &str) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    strftime(secs, format)
}

/// Formats `secs` since the Unix epoch (UTC) with the directives of
/// the template function `strftime_now` (`%Y %m %d %H %M %S %b %B %e %j %%`; others stay as
/// written): `strftime(0, "%Y-%m-%dT%H:%M:%SZ")` is
/// `1970-01-01T00:00:00Z`.
pub fn strftime(secs: u64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cumulative[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('b') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson` as `transformers` defines it for chat templates: Python's
/// `json.dumps(value, ensure_ascii=False, indent=None)`. minijinja's own
/// filter escapes `<`, `>`, `&` and `'` for HTML, which `transformers` does
/// not (a `"<tool_call>"` stays as written); `ensure_ascii=true` escapes
/// every non-ASCII character as Python does. `sort_keys` is accepted: maps
/// are sorted by key here in any case (minijinja's maps are ordered by key;
/// Python keeps the insertion order of a dict made in the template).
/// `separators` other than Python's defaults are an error.
fn tojson(
    state: &State,
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    }
    .filter(|v| !v.is_none() && !v.is_undefined());
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let _sort_keys = kwargs.get::<Option<bool>>("sort_keys")?;
    let separators = kwargs.get::<Option<Value>>("separators")?.filter(|v| !v.is_none() && !v.is_undefined());
    kwargs.assert_all_used()?;
    if let Some(sep) = separators {
        let parts: Vec<String> = match sep.try_iter() {
            Ok(items) => items.map(|v| v.as_str().map(str::to_owned)).collect::<Option<Vec<_>>>().unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        let default: [&str; 2] = if indent.is_some() { [",", ": "] } else { [", ", ": "] };
        if parts != default {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: separators {sep} are not supported (only Python's default {default:?})"),
            ));
        }
    }
    // Indented, each item is on a line of its own, indented by its depth,
    // which minijinja does not charge: the value's size with its
    // indentation is checked, and paid for, before it is written out.
    // (minijinja charges the items it writes, and stops once the budget is
    // used up.)
    if let Some(indent) = &indent {
        let mut size = 0u64;
        measure(value, &mut size, 0, indent.as_usize().unwrap_or(usize::MAX) as u64)?;
        state.consume_fuel(size.saturating_mul(16).div_ceil(BYTES_PER_FUEL))?;
    }
    let json = minijinja::filters::tojson(value, indent, Kwargs::from_iter(std::iter::empty::<(&str, Value)>()))?;
    let json = json.as_str().unwrap_or_default();
    Ok(Value::from_safe_string(unescape_html_json(json, ensure_ascii)))
}

/// Levels of nesting [`measure`] visits.
const MEASURED_DEPTH: usize = 256;

/// Adds to `size` an estimate of the bytes `value` takes written out (its
/// strings' lengths, and 8 per item plus `indent` per level of its depth),
/// failing once that passes [`RENDER_MEMORY`]: a lazy sequence is visited
/// only that far.
pub(crate) fn measure(
    value: &Value,
    size: &mut u64,
    depth: usize,
    indent: u64,
) -> std::result::Result<(), minijinja::Error> {
    let too_large = || {
        minijinja::Error::new(
            ErrorKind::OutOfFuel,
            format!("the value would take more than the render's {} MiB", RENDER_MEMORY >> 20),
        )
    };
    *size = size
        .saturating_add(8 + value.as_str().map_or(0, |s| s.len() as u64))
        .saturating_add(indent.saturating_mul(depth as u64 + 1));
    if *size > RENDER_MEMORY {
        return Err(too_large());
    }
    if !matches!(value.kind(), ValueKind::Seq | ValueKind::Map | ValueKind::Iterable) {
        return Ok(());
    }
    if depth > MEASURED_DEPTH {
        // Deeper, an indented value's lines would not be counted, and the
        // measure's own recursion must stay shallow.
        if indent > 0 {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("the value is nested more than {MEASURED_DEPTH} levels deep to be written with indentation"),
            ));
        }
        return Ok(());
    }
    let is_map = value.kind() == ValueKind::Map;
    if let Some(pairs) = value.as_object().filter(|_| is_map).and_then(|o| o.try_iter_pairs()) {
        for (key, v) in pairs {
            measure(&key, size, depth + 1, indent)?;
            measure(&v, size, depth + 1, indent)?;
        }
        return Ok(());
    }
    for item in value.try_iter()? {
        if is_map {
            let v = value.get_item(&item)?;
            measure(&v, size, depth + 1, indent)?;
        }
        measure(&item, size, depth + 1, indent)?;
    }
    Ok(())
}

/// `join(d="", attribute=none)` as Jinja's, with the output paid for as it
/// grows: minijinja's own checks the output's size only with a joiner, so
/// that joining a lazy list of many repeats of a long string
/// (`[s] * n`, `l + l`) could grow without bound.
fn join(
    state: &State,
    value: &Value,
    joiner: Option<&str>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let attribute: Option<String> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    if value.is_undefined() || value.is_none() {
        return Ok(Value::from(""));
    }
    let joiner = joiner.unwrap_or("");
    if let Some(s) = value.as_str() {
        // Its characters joined: paid for before the result is built.
        let len = s.len() as u64 + (s.chars().count() as u64).saturating_mul(joiner.len() as u64);
        if len > RENDER_MEMORY {
            return Err(minijinja::Error::new(
                ErrorKind::OutOfFuel,
                format!("join: the result would take more than the render's {} MiB", RENDER_MEMORY >> 20),
            ));
        }
        state.consume_fuel(len.div_ceil(BYTES_PER_FUEL))?;
        let mut out = String::with_capacity(len as usize);
        for (i, c) in s.chars().enumerate() {
            if i > 0 {
                out.push_str(joiner);
            }
            out.push(c);
        }
        return Ok(Value::from(out));
    }
    let mut out = String::new();
    for (i, item) in value.try_iter()?.enumerate() {
        let item = match &attribute {
            Some(path) => path.split('.').try_fold(item, |v, part| match part.parse::<usize>() {
                Ok(idx) => v.get_item(&Value::from(idx)),
                Err(_) => v.get_attr(part),
            })?,
            None => item,
        };
        let before = out.len();
        if i > 0 {
            out.push_str(joiner);
        }
        use std::fmt::Write;
        let _ = write!(out, "{item}");
        // One unit per item, and one per 64 bytes of output.
        state.consume_fuel(1 + (out.len() - before) as u64 / BYTES_PER_FUEL)?;
        if out.len() as u64 > RENDER_MEMORY {
            return Err(minijinja::Error::new(
                ErrorKind::OutOfFuel,
                format!("join: the result would take more than the render's {} MiB", RENDER_MEMORY >> 20),
            ));
        }
    }
    Ok(Value::from(out))
}

/// Undoes minijinja's HTML escapes (`\u003c`, `\u003e`, `\u0026`, `\u0027`)
/// in JSON text, leaving every other escape as it is; with `ensure_ascii`,
/// escapes every non-ASCII character as `\uXXXX` (UTF-16, lower-case hex,
/// as Python's `json.dumps`). Outside string literals JSON has neither
/// backslashes nor non-ASCII characters, so the text can be scanned without
/// parsing it.
fn unescape_html_json(json: &str, ensure_ascii: bool) -> String {
    let mut out = String::with_capacity(json.len());
    let mut rest = json;
    while let Some(c) = rest.chars().next() {
        if c == '\\' {
            let html =
                ["\\u003c", "\\u003e", "\\u0026", "\\u0027"].iter().zip(['<', '>', '&', '\'']).find_map(|(esc, ch)| {
                    rest.get(..esc.len()).filter(|p| p.eq_ignore_ascii_case(esc)).map(|_| (esc.len(), ch))
                });
            match html {
                Some((len, ch)) => {
                    out.push(ch);
                    rest = &rest[len..];
                }
                None => {
                    // Another escape: the backslash and the character after it
                    // (an escaped backslash must not start a new escape).
                    let len = 1 + rest[1..].chars().next().map_or(0, char::len_utf8);
                    out.push_str(&rest[..len]);
                    rest = &rest[len..];
                }
            }
            continue;
        }
        if ensure_ascii && !c.is_ascii() {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// `fromjson`: the value of a JSON text (objects become maps, ordered by
/// key). The result is charged to the render's budget as 16 bytes per byte
/// of JSON, which covers its size (a value slot per two bytes at most, as
/// in `[0,0,…]`).
fn fromjson(state: &State, text: &str) -> std::result::Result<Value, minijinja::Error> {
    state.consume_fuel((text.len() as u64).saturating_mul(16).div_ceil(BYTES_PER_FUEL))?;
    let parsed: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, format!("fromjson: the text is not JSON: {e}"))
    })?;
    Ok(json_value(parsed))
}

fn json_value(v: serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s),
        serde_json::Value::Array(items) => Value::from(items.into_iter().map(json_value).collect::<Vec<_>>()),
        serde_json::Value::Object(map) => {
            Value::from(map.into_iter().map(|(k, v)| (k, json_value(v))).collect::<BTreeMap<String, Value>>())
        }
    }
}

/// The template with its `{% generation %}` and `{% endgeneration %}` block
/// tags made no-ops: each becomes `{% if true %}` or `{% endif %}` with the
/// same whitespace control (`-`, `+`), so that the text in between, the
/// trimming around the tags and an unbalanced pair behave as in
/// `transformers`. Only block tags are rewritten: the same words in text,
/// comments, `{{ }}` expressions, string literals or `{% raw %}` blocks stay.
fn rewrite_generation_tags(src: &str) -> Cow<'_, str> {
    if !src.contains("generation") {
        return Cow::Borrowed(src);
    }
    let mut out = String::with_capacity(src.len());
    let mut copied = 0; // src[..copied] is in `out`
    let mut i = 0;
    let b = src.as_bytes();
    while i + 1 < b.len() {
        if b[i] != b'{' || !matches!(b[i + 1], b'{' | b'%' | b'#') {
            i += 1;
            continue;
        }
        let open = b[i + 1];
        if open == b'#' {
            i = src[i + 2..].find("#}").map_or(b.len(), |k| i + 2 + k + 2);
            continue;
        }
        let close = if open == b'{' { "}}" } else { "%}" };
        let Some(end) = tag_end(src, i + 2, close) else { break };
        if open == b'%' {
            let inner = &src[i + 2..end];
            let lead = inner.strip_prefix(['-', '+']).map_or("", |_| &inner[..1]);
            let body = &inner[lead.len()..];
            let trail = body.strip_suffix(['-', '+']).map_or("", |_| &body[body.len() - 1..]);
            let word = body[..body.len() - trail.len()].trim();
            let replacement = match word {
                "generation" => Some("if true"),
                "endgeneration" => Some("endif"),
                "raw" => {
                    // Everything up to `{% endraw %}` is text.
                    let after = end + 2;
                    i = find_endraw(src, after).unwrap_or(b.len());
                    continue;
                }
                _ => None,
            };
            if let Some(r) = replacement {
                out.push_str(&src[copied..i]);
                out.push_str("{%");
                out.push_str(lead);
                out.push(' ');
                out.push_str(r);
                out.push(' ');
                out.push_str(trail);
                out.push_str("%}");
                copied = end + 2;
            }
        }
        i = end + 2;
    }
    if copied == 0 {
        return Cow::Borrowed(src);
    }
    out.push_str(&src[copied..]);
    Cow::Owned(out)
}

/// Where the tag whose contents start at `from` ends: the position of its
/// `close` delimiter outside string literals.
fn tag_end(src: &str, from: usize, close: &str) -> Option<usize> {
    let b = src.as_bytes();
    let mut i = from;
    let mut quote: Option<u8> = None;
    while i < b.len() {
        match quote {
            Some(q) => {
                if b[i] == b'\\' {
                    i += 1;
                } else if b[i] == q {
                    quote = None;
                }
            }
            None => {
                if b[i] == b'"' || b[i] == b'\'' {
                    quote = Some(b[i]);
                } else if b[i..].starts_with(close.as_bytes()) {
                    return Some(i);
                }
            }
        }
        i += 1;
    }
    None
}

/// The position of the `{%` of the first `{% endraw %}` tag at or after
/// `from`.
fn find_endraw(src: &str, from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(k) = src[at..].find("{%") {
        let start = at + k;
        let end = src[start + 2..].find("%}")? + start + 2;
        if src[start + 2..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace()) == "endraw" {
            return Some(start);
        }
        at = start + 2;
    }
    None
}

impl ChatTemplate {
    /// The template of `file`: its `tokenizer.chat_template`, or when it has
    /// none the default for its `general.architecture` (Gemma's turn format
    /// for `gemma*`, ChatML otherwise); [`ChatTemplate::source`] says which.
    /// `bos_token` and `eos_token` are the texts of the tokenizer's BOS and
    /// EOS tokens (empty when it has none).
    ///
    /// # Errors
    /// [`Error::KeyType`] when `tokenizer.chat_template` is not a string;
    /// [`Error::ChatTemplate`] when the template does not parse.
    pub fn from_gguf(file: &GgufFile, tokenizer: &Tokenizer) -> Result<ChatTemplate> {
        let bos = tokenizer.bos_id().and_then(|id| tokenizer.piece(id)).unwrap_or("");
        let eos = tokenizer.eos_id().and_then(|id| tokenizer.piece(id)).unwrap_or("");
        match file.get_str("tokenizer.chat_template") {
            Ok(text) => ChatTemplate::build(text.to_owned(), TemplateSource::Gguf, bos, eos),
            Err(Error::MissingKey(_)) => {
                let arch = file.get_str("general.architecture").unwrap_or("");
                // The registry's family; an architecture outside it by name.
                let gemma = match crate::model::Arch::from_gguf_name(arch) {
                    Some(a) => a.info().chat == crate::model::ChatFormat::Gemma,
                    None => arch.starts_with("gemma"),
                };
                let (text, source) = if gemma {
                    (GEMMA_TEMPLATE, TemplateSource::DefaultGemma)
                } else {
                    (CHATML_TEMPLATE, TemplateSource::DefaultChatMl)
                };
                ChatTemplate::build(text.to_owned(), source, bos, eos)
            }
            Err(e) => Err(e),
        }
    }

    /// A template from Jinja source `template`, with the given BOS and EOS
    /// texts.
    ///
    /// # Errors
    /// [`Error::ChatTemplate`] when the template does not parse.
    pub fn new(template: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        ChatTemplate::build(template.to_owned(), TemplateSource::Given, bos_token, eos_token)
    }

    fn build(text: String, source: TemplateSource, bos: &str, eos: &str) -> Result<ChatTemplate> {
        // Compiling takes about 20 times the source's size: a template of
        // tens of megabytes in a model file ran out of memory before any
        // budget applied. Real templates are a few KiB.
        if text.len() > MAX_TEMPLATE_BYTES {
            return Err(Error::ChatTemplate(format!(
                "the chat template is {} bytes, more than the {} KiB accepted",
                text.len(),
                MAX_TEMPLATE_BYTES >> 10
            )));
        }
        let mut env = Environment::new();
        // A template comes with the model file: one that loops for hours
        // must fail instead (`RENDER_FUEL`).
        env.set_fuel(Some(RENDER_FUEL));
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| template_error("syntax settings", &e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(crate::chat_budget::unknown_method);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |format: String| strftime_now(&format));
        env.add_filter("tojson", tojson);
        env.add_filter("fromjson", fromjson);
        env.add_filter("join", join);
        env.add_filter("split", crate::chat_budget::split_filter);
        env.add_filter("lines", crate::chat_budget::lines_filter);
        env.add_filter("escape", crate::chat_budget::escape_filter);
        env.add_filter("e", crate::chat_budget::escape_filter);
        env.add_filter("format", crate::chat_budget::format_filter);
        env.add_filter("pprint", crate::chat_budget::pprint_filter);
        env.add_filter("sort", crate::chat_budget::sort_filter);
        env.add_filter("unique", crate::chat_budget::unique_filter);
        env.add_filter("dictsort", crate::chat_budget::dictsort_filter);
        env.add_filter("groupby", crate::chat_budget::groupby_filter);
        env.add_filter("max", crate::chat_budget::max_filter);
        env.add_filter("min", crate::chat_budget::min_filter);
        env.add_template_owned(NAME, rewrite_generation_tags(&text).into_owned())
            .map_err(|e| template_error("the chat template does not parse", &e))?;
        Ok(ChatTemplate { env, text, source, bos_token: bos.to_owned(), eos_token: eos.to_owned() })
    }

    /// Where the template came from.
    pub fn source(&self) -> TemplateSource {
        self.source
    }

    /// The template's Jinja source.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Renders `messages`, followed by the opening of the assistant's turn
    /// when `add_generation_prompt` is set.
    ///
    /// # Errors
    /// [`Error::ChatTemplate`] when rendering fails, including a template's
    /// own `raise_exception` (for example Gemma's on roles that do not
    /// alternate), runs out of its budget of steps and memory
    /// ([`RENDER_FUEL`], [`RENDER_MEMORY`]), or turns messages into no text.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let n = messages.len();
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut map = BTreeMap::new();
                map.insert("role", Value::from(m.role.as_str()));
                map.insert("content", Value::from(m.content.as_str()));
                Value::from(map)
            })
            .collect();
        let mut ctx = BTreeMap::new();
        ctx.insert("messages", Value::from(messages));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        ctx.insert("bos_token", Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token", Value::from(self.eos_token.as_str()));
        let text = guarded(|| {
            let template = self.env.get_template(NAME).map_err(|e| template_error("the chat template", &e))?;
            template.render(Value::from(ctx)).map_err(|e| template_error("rendering the chat template", &e))
        })?;
        // Messages that render to nothing would become an empty prompt.
        if n > 0 && text.trim().is_empty() {
            return Err(Error::ChatTemplate(format!("the chat template renders {n} message(s) as no text")));
        }
        Ok(text)
    }

    /// Renders `messages` (see [`ChatTemplate::render`]) and encodes the
    /// text with special tokens parsed, adding BOS when the tokenizer asks
    /// for it unless the template already wrote one (as Gemma's and Llama
    /// 3's do), so the prompt never starts with two.
    ///
    /// # Errors
    /// Those of [`ChatTemplate::render`].
    pub fn encode(&self, tokenizer: &Tokenizer, messages: &[Message], add_generation_prompt: bool) -> Result<Vec<u32>> {
        let text = self.render(messages, add_generation_prompt)?;
        Ok(ChatTemplate::encode_rendered(tokenizer, &text))
    }

    /// The tokens of `text`, a render of this template, as
    /// [`ChatTemplate::encode`] makes them (special tokens parsed, one BOS),
    /// for a caller that checks the rendered text first (its length, before
    /// paying for tokenizing it).
    pub fn encode_rendered(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
        ChatTemplate::encode_rendered_at_most(tokenizer, text, usize::MAX).unwrap_or_default()
    }

    /// [`ChatTemplate::encode_rendered`] for a render that must fit in
    /// `max` tokens: `None` when it has more, found out without tokenizing
    /// all of it ([`Tokenizer::encode_at_most`]).
    pub fn encode_rendered_at_most(tokenizer: &Tokenizer, text: &str, max: usize) -> Option<Vec<u32>> {
        // One more, for the BOS that may be dropped.
        let mut ids = tokenizer.encode_at_most(text, true, true, max.saturating_add(1))?;
        if let (true, Some(bos)) = (tokenizer.add_bos(), tokenizer.bos_id()) {
            if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
                ids.remove(0);
            }
        }
        (ids.len() <= max).then_some(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::{strftime, ChatTemplate, Message, Role, CHATML_TEMPLATE, GEMMA_TEMPLATE};

    #[test]
    fn long_conversations_render_and_runaway_templates_stop() {
        let messages: Vec<Message> = (0..4000)
            .map(|i| Message {
                role: if i % 2 == 0 { Role::User } else { Role::Assistant },
                content: format!("message {i} {}", "x".repeat(100)),
            })
            .collect();
        for t in [GEMMA_TEMPLATE, CHATML_TEMPLATE] {
            let template = ChatTemplate::new(t, "<bos>", "<eos>").unwrap();
            let text = template.render(&messages, true).unwrap();
            assert!(text.contains("message 3999"));
            // The share of the budget they take (the constant's comment).
            let ctx: Vec<minijinja::Value> = messages
                .iter()
                .map(|m| minijinja::context! { role => m.role.as_str(), content => m.content.as_str() })
                .collect();
            let tmpl = template.env.get_template(super::NAME).unwrap();
            let captured = tmpl
                .render_captured(
                    minijinja::context! { messages => ctx, add_generation_prompt => true, bos_token => "<bos>" },
                )
                .unwrap();
            let (used, _) = captured.state().fuel_levels().unwrap();
            eprintln!("4000 messages: {used} of {} units", super::RENDER_FUEL);
            assert!(used * 100 < super::RENDER_FUEL * 10, "{used}");
        }
        let loops = "{% for i in range(10000) %}{% for j in range(10000) %}{% for k in range(10000) %}\
                     {% endfor %}{% endfor %}{% endfor %}x";
        let t0 = std::time::Instant::now();
        let e = ChatTemplate::new(loops, "", "").unwrap().render(&[], true).unwrap_err();
        assert!(e.to_string().contains("did not finish"), "{e}");
        assert!(t0.elapsed().as_secs() < 30, "stopped after {:?}", t0.elapsed());
    }

    /// A namespace that holds itself is freed with what it holds when the
    /// render ends (the cycle kept both for the life of the process).
    #[test]
    fn a_namespace_that_holds_itself_is_freed() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        #[derive(Debug)]
        struct Freed(Arc<AtomicBool>);
        impl minijinja::value::Object for Freed {}
        impl Drop for Freed {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let template =
            ChatTemplate::new("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{% set ns.t = t %}ok", "", "").unwrap();
        let freed = Arc::new(AtomicBool::new(false));
        let t = minijinja::Value::from_object(Freed(freed.clone()));
        let tmpl = template.env.get_template(super::NAME).unwrap();
        assert_eq!(tmpl.render(minijinja::context! { t => t }).unwrap(), "ok");
        assert!(freed.load(Ordering::Relaxed));
    }

    #[test]
    fn a_template_that_renders_messages_as_nothing_is_an_error() {
        let e = ChatTemplate::new("", "", "").unwrap().render(&[Message::user("hi")], true).unwrap_err();
        assert!(e.to_string().contains("renders 1 message(s) as no text"), "{e}");
        // No messages, no text: not an error.
        assert_eq!(ChatTemplate::new("", "", "").unwrap().render(&[], false).unwrap(), "");
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-07-26 13:05:09 UTC.
        let t = 1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(strftime(t, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(strftime(t, "%Y-%m-%d %H:%M:%S %B %j %% %q"), "2024-07-26 13:05:09 July 208 % %q");
        assert_eq!(strftime(0, "%e %b %Y"), " 1 Jan 1970");
        // 2000-02-29 (a leap day of a century leap year).
        assert_eq!(strftime(951_782_400, "%Y-%m-%d %j"), "2000-02-29 060");
    }
}
