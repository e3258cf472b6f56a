//! Chat templates: the real templates of SmolLM2 (ChatML) and Gemma 3
//! render the expected prompts, the defaults of files without a template,
//! the prompt ids, and broken templates as errors.

use std::path::PathBuf;

use infer_model::chat::{ChatTemplate, Message, Role, TemplateSource, CHATML_TEMPLATE, GEMMA_TEMPLATE};
use infer_model::gguf::{GgufFile, GgufWriter, Value};
use infer_model::tokenizer::Tokenizer;
use infer_model::Error;

/// SmolLM2-135M-Instruct's `tokenizer.chat_template`, as in its GGUF file.
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Gemma 3's chat template (the `chat_template` of google/gemma-3-*-it's
/// `tokenizer_config.json`; the 270M GGUF of the default model carries
/// none).
const GEMMA3_TEMPLATE: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"#;

fn one_turn() -> Vec<Message> {
    vec![Message::system("You are a terse assistant."), Message::user("What is 2+2?")]
}

fn three_turns() -> Vec<Message> {
    vec![
        Message::system("You are a terse assistant."),
        Message::user("What is 2+2?"),
        Message::assistant("4"),
        Message::user("And 3+3?"),
    ]
}

#[test]
fn roles_and_messages() {
    assert_eq!([Role::System, Role::User, Role::Assistant].map(Role::as_str), ["system", "user", "assistant"]);
    assert_eq!(Message::user("x"), Message { role: Role::User, content: "x".into() });
}

#[test]
fn smollm2_template_renders_chatml() {
    let t = ChatTemplate::new(SMOLLM2_TEMPLATE, "<|im_start|>", "<|im_end|>").unwrap();
    assert_eq!(t.source(), TemplateSource::Given);
    assert_eq!(
        t.render(&one_turn(), true).unwrap(),
        "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&three_turns(), true).unwrap(),
        "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    );
    // Without a system message the template supplies its own.
    assert_eq!(
        t.render(&[Message::user("Hi")], false).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n"
    );
    // The default ChatML template agrees whenever a system message is given.
    let d = ChatTemplate::new(CHATML_TEMPLATE, "", "").unwrap();
    for (m, gen) in [(one_turn(), true), (three_turns(), true), (three_turns(), false)] {
        assert_eq!(d.render(&m, gen).unwrap(), t.render(&m, gen).unwrap());
    }
}

#[test]
fn gemma3_template_renders_turns() {
    let t = ChatTemplate::new(GEMMA3_TEMPLATE, "<bos>", "<eos>").unwrap();
    let one =
        "<bos><start_of_turn>user\nYou are a terse assistant.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n";
    let three = "<bos><start_of_turn>user\nYou are a terse assistant.\n\nWhat is 2+2?<end_of_turn>\n\
                 <start_of_turn>model\n4<end_of_turn>\n<start_of_turn>user\nAnd 3+3?<end_of_turn>\n\
                 <start_of_turn>model\n";
    assert_eq!(t.render(&one_turn(), true).unwrap(), one);
    assert_eq!(t.render(&three_turns(), true).unwrap(), three);
    assert_eq!(t.render(&[Message::user("  Hi \n")], false).unwrap(), "<bos><start_of_turn>user\nHi<end_of_turn>\n");
    // The default Gemma template gives the same prompts.
    let d = ChatTemplate::new(GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
    assert_eq!(d.render(&one_turn(), true).unwrap(), one);
    assert_eq!(d.render(&three_turns(), true).unwrap(), three);
    assert_eq!(d.render(&[Message::user("  Hi \n")], false).unwrap(), "<bos><start_of_turn>user\nHi<end_of_turn>\n");
    // The real template refuses roles that do not alternate.
    let bad = [Message::user("a"), Message::user("b")];
    match t.render(&bad, true) {
        Err(Error::ChatTemplate(m)) => assert!(m.contains("alternate"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn broken_templates_are_errors() {
    // Syntax errors are found when the template is built.
    for src in ["{% for m in messages %}{{ m.content }}", "{{ 'unclosed }}", "{% if %}{% endif %}", "{{ a b }}"] {
        match ChatTemplate::new(src, "", "") {
            Err(Error::ChatTemplate(m)) => assert!(m.contains("parse"), "{src}: {m}"),
            other => panic!("{src}: {other:?}"),
        }
    }
    // Others when it is rendered.
    for src in [
        "{{ raise_exception('no system prompt allowed') }}",
        "{{ messages[0].content.nosuchmethod() }}",
        "{{ nosuchfunction() }}",
        "{{ 'x' | nosuchfilter }}",
        "{{ 1 / 0 }}",
        "{% for m in messages %}{{ m.content + 1 }}{% endfor %}",
    ] {
        match ChatTemplate::new(src, "", "").and_then(|t| t.render(&one_turn(), true)) {
            Err(Error::ChatTemplate(m)) => {
                if src.contains("raise_exception") {
                    assert!(m.contains("no system prompt allowed"), "{m}");
                }
            }
            other => panic!("{src}: {other:?}"),
        }
    }
}

#[test]
fn python_string_methods_and_strftime() {
    let src = "{{ messages[0].content.strip().upper() }}|{{ messages[1].content.startswith('What') }}|\
               {{ messages[1].content.split(' ')[1] }}|{{ strftime_now('%Y') | length }}|{{ eos_token }}";
    let t = ChatTemplate::new(src, "", "</s>").unwrap();
    let msgs = [Message::system("  shout  "), Message::user("What is it")];
    assert_eq!(t.render(&msgs, false).unwrap(), "SHOUT|True|is|4|</s>");
}

// ---------------------------------------------------------------------------
// Templates from GGUF files.

/// A GGUF with a tiny SentencePiece vocabulary, `arch` and optionally a
/// template.
fn tiny_gguf(arch: &str, template: Option<&str>) -> GgufFile {
    let tokens: Vec<String> =
        ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>"]
            .iter()
            .map(|s| s.to_string())
            .chain((0..=255u8).map(|b| format!("<0x{b:02X}>")))
            .collect();
    let types: Vec<i32> = (0..tokens.len())
        .map(|i| {
            if i == 0 {
                2
            } else if i < 7 {
                3
            } else {
                6
            }
        })
        .collect();
    let mut w = GgufWriter::new();
    let mut kv: Vec<(&str, Value)> = vec![
        ("general.architecture", arch.into()),
        ("tokenizer.ggml.model", "llama".into()),
        ("tokenizer.ggml.tokens", tokens.into()),
        ("tokenizer.ggml.token_type", types.into()),
    ];
    if let Some(t) = template {
        kv.push(("tokenizer.chat_template", t.into()));
    }
    for (k, v) in kv {
        w.add_metadata(k, v).unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

#[test]
fn defaults_by_architecture() {
    let g = tiny_gguf("gemma3", None);
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let t = ChatTemplate::from_gguf(&g, &tok).unwrap();
    assert_eq!(t.source(), TemplateSource::DefaultGemma);
    assert!(t.source().to_string().contains("Gemma"));
    assert_eq!(
        t.render(&[Message::user("Hi")], true).unwrap(),
        "<s><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    // The template writes BOS and the tokenizer adds one: the prompt keeps one.
    let ids = t.encode(&tok, &[Message::user("Hi")], true).unwrap();
    assert_eq!(&ids[..2], &[1, 5]);

    let g = tiny_gguf("llama", None);
    let t = ChatTemplate::from_gguf(&g, &tok).unwrap();
    assert_eq!(t.source(), TemplateSource::DefaultChatMl);
    assert_eq!(
        t.render(&[Message::user("Hi")], true).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = t.encode(&tok, &[Message::user("Hi")], true).unwrap();
    assert_eq!(&ids[..2], &[1, 3]);

    let g = tiny_gguf("llama", Some("{{ bos_token }}[{{ messages[0].content }}]{{ eos_token }}"));
    let t = ChatTemplate::from_gguf(&g, &tok).unwrap();
    assert_eq!(t.source(), TemplateSource::Gguf);
    assert_eq!(t.render(&[Message::user("Hi")], true).unwrap(), "<s>[Hi]</s>");

    let g = tiny_gguf("llama", Some("{% if %}"));
    assert!(matches!(ChatTemplate::from_gguf(&g, &tok), Err(Error::ChatTemplate(_))));
}

/// SmolLM2's file (fetched and verified when absent).
fn smollm2_file() -> Option<PathBuf> {
    Some(infer_model::fetch::ensure_model("smollm2-135m").expect("SmolLM2"))
}

#[test]
fn smollm2_file_template_and_prompt_ids() {
    let Some(path) = smollm2_file() else { return };
    let g = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let t = ChatTemplate::from_gguf(&g, &tok).unwrap();
    assert_eq!(t.source(), TemplateSource::Gguf);
    assert_eq!(t.text(), SMOLLM2_TEMPLATE);
    // llama.cpp's ids for the same prompt (testdata smollm2-135m, logits/p01).
    let msgs = [Message::system("You are a helpful assistant."), Message::user("What is 2+2?")];
    let ids = t.encode(&tok, &msgs, true).unwrap();
    let want = [
        1, 9690, 198, 2683, 359, 253, 5356, 11173, 30, 2, 198, 1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1,
        520, 9531, 198,
    ];
    assert_eq!(ids, want);
    assert!(tok.is_eog(tok.token_id("<|im_end|>").unwrap()));
}

#[test]
fn gemma_file_gets_the_default_template() {
    let path = infer_model::fetch::default_model_path().unwrap_or_else(|e| panic!("default model: {e}"));
    let g = GgufFile::open(&path).unwrap();
    let arch = g.get_str("general.architecture").unwrap().to_owned();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let t = ChatTemplate::from_gguf(&g, &tok).unwrap();
    if g.get("tokenizer.chat_template").is_some() {
        assert_eq!(t.source(), TemplateSource::Gguf);
        return;
    }
    assert!(arch.starts_with("gemma"), "{arch}");
    assert_eq!(t.source(), TemplateSource::DefaultGemma);
    let ids = t.encode(&tok, &[Message::user("Hi")], true).unwrap();
    // <bos> <start_of_turn> user \n Hi <end_of_turn> \n <start_of_turn> model \n
    assert_eq!(ids, tok.encode("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", true));
    assert_eq!(ids.iter().filter(|&&i| Some(i) == tok.bos_id()).count(), 1);
    assert!(tok.is_eog(tok.token_id("<end_of_turn>").unwrap()));
}
