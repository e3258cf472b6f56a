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
//! `raise_exception(message)` and `strftime_now(format)` are provided.
//!
//! A file without a template gets a default chosen by architecture
//! (the registry's [`crate::model::ChatFormat`], [`TemplateSource`]): Gemma's turn format for `gemma*` (the format of
//! Gemma's model card: `<start_of_turn>user\n…<end_of_turn>\n`, the
//! assistant's role called `model`, a system message put in front of the
//! first user turn), ChatML (`<|im_start|>role\n…<|im_end|>\n`) otherwise.

use std::collections::BTreeMap;

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};

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

/// The most template instructions one render may run (minijinja's fuel):
/// 4000 messages through the Gemma or ChatML template fit in 1% of it
/// (measured), a runaway loop stops within a few seconds.
const RENDER_FUEL: u64 = 50_000_000;

fn template_error(what: &str, e: &minijinja::Error) -> Error {
    if e.kind() == ErrorKind::OutOfFuel {
        return Error::ChatTemplate(format!(
            "{what}: the template did not finish within {RENDER_FUEL} steps (a loop that runs too long?)"
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

/// Formats `secs` since the Unix epoch (UTC) as [`strftime_now`] does.
fn strftime(secs: u64, format: &str) -> String {
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
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |format: String| strftime_now(&format));
        env.add_template_owned(NAME, text.clone())
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
    /// alternate), runs out of its step budget, or turns messages into no
    /// text.
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
        let template = self.env.get_template(NAME).map_err(|e| template_error("the chat template", &e))?;
        let text = template.render(Value::from(ctx)).map_err(|e| template_error("rendering the chat template", &e))?;
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
        let mut ids = tokenizer.encode(&text, true);
        if let (true, Some(bos)) = (tokenizer.add_bos(), tokenizer.bos_id()) {
            if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
                ids.remove(0);
            }
        }
        Ok(ids)
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
            let text = ChatTemplate::new(t, "<bos>", "<eos>").unwrap().render(&messages, true).unwrap();
            assert!(text.contains("message 3999"));
        }
        let loops = "{% for i in range(10000) %}{% for j in range(10000) %}{% for k in range(10000) %}\
                     {% endfor %}{% endfor %}{% endfor %}x";
        let t0 = std::time::Instant::now();
        let e = ChatTemplate::new(loops, "", "").unwrap().render(&[], true).unwrap_err();
        assert!(e.to_string().contains("did not finish"), "{e}");
        assert!(t0.elapsed().as_secs() < 30, "stopped after {:?}", t0.elapsed());
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
