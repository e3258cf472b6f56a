//! Chat templates: the real templates of SmolLM2 (ChatML) and Gemma 3
//! render the expected prompts, the defaults of files without a template,
//! the prompt ids, broken templates as errors, the filters and tags of
//! `transformers` (`tojson`, `fromjson`, `{% generation %}`), and the
//! render's memory budget.

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

fn render(src: &str, messages: &[Message]) -> Result<String, Error> {
    ChatTemplate::new(src, "<s>", "</s>")?.render(messages, false)
}

/// Issue 31 item 4: `tojson` (an unknown filter before) renders as
/// `transformers`' filter, Python's `json.dumps`: nothing escaped for HTML,
/// non-ASCII kept unless `ensure_ascii`, `indent`, Python's separators.
#[test]
fn tojson_renders_as_transformers_does() {
    let m = [Message::user("say \"hi\" <b>é</b> & 'bye'\n\\u003c")];
    assert_eq!(render("{{ messages[0].content | tojson }}", &m).unwrap(), r#""say \"hi\" <b>é</b> & 'bye'\n\\u003c""#);
    assert_eq!(
        render("{{ messages[0].content | tojson(ensure_ascii=true) }}", &m).unwrap(),
        r#""say \"hi\" <b>\u00e9</b> & 'bye'\n\\u003c""#
    );
    // A character outside the BMP is a surrogate pair, as in Python.
    assert_eq!(render("{{ '😀' | tojson(ensure_ascii=true) }}", &[]).unwrap(), r#""\ud83d\ude00""#);
    assert_eq!(
        render("{{ {'b': [1, 2.5, true], 'a': none, 'c': '<x>'} | tojson }}", &[]).unwrap(),
        r#"{"a": null, "b": [1, 2.5, true], "c": "<x>"}"#
    );
    assert_eq!(render("{{ {'a': [1, 2]} | tojson(indent=2) }}", &[]).unwrap(), "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
    // Whole messages, as tool-calling templates print them.
    assert_eq!(
        render("{{ messages | tojson(sort_keys=true) }}", &[Message::assistant("ok")]).unwrap(),
        r#"[{"content": "ok", "role": "assistant"}]"#
    );
    assert_eq!(render("{{ 'x' | tojson(separators=(', ', ': ')) }}", &[]).unwrap(), r#""x""#);
    let e = render("{{ 'x' | tojson(separators=(',', ':')) }}", &[]).unwrap_err();
    assert!(e.to_string().contains("separators"), "{e}");
}

/// Issue 31 item 4: `fromjson` (unknown before) parses JSON into values.
#[test]
fn fromjson_parses_json() {
    let src =
        r#"{% set d = messages[0].content | fromjson %}{{ d.x[1] }} {{ d.x | length }} {{ d.z is none }} {{ d.s }}"#;
    let m = [Message::user(r#"{"x": [1, 2.5, "y"], "z": null, "s": "é\n"}"#)];
    assert_eq!(render(src, &m).unwrap(), "2.5 3 True é\n");
    assert_eq!(render("{{ ('[1, [2, 3]]' | fromjson)[1][0] + 1 }}", &[]).unwrap(), "3");
    let e = render("{{ '{\"a\": ' | fromjson }}", &[]).unwrap_err();
    assert!(e.to_string().contains("fromjson: the text is not JSON"), "{e}");
}

/// Issue 31 item 4: SmolLM3's `{% generation %}…{% endgeneration %}` (an
/// unknown tag before) renders its content unchanged, with the whitespace
/// control of its tags; the same words elsewhere stay text.
#[test]
fn generation_tags_render_their_content() {
    let smollm3 = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}\
                   {% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\
                   <|im_end|>\n{% endfor %}";
    let conv = [Message::user("hi"), Message::assistant("hello")];
    assert_eq!(
        render(smollm3, &conv).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    );
    // As the template without the tags, with trim_blocks and lstrip_blocks
    // around them.
    let lines = "{% for m in messages %}\n  {% generation %}\n{{ m.content }}\n  {% endgeneration %}\n{% endfor %}";
    let without = "{% for m in messages %}\n{{ m.content }}\n{% endfor %}";
    assert_eq!(render(lines, &conv).unwrap(), render(without, &conv).unwrap());
    assert_eq!(render(lines, &conv).unwrap(), "hi\nhello\n");
    // Whitespace control on the tags trims as it would on any block tag.
    assert_eq!(render("a  {%- generation -%}  b  {%- endgeneration -%}  c", &[]).unwrap(), "abc");
    // Not block tags: a string, an expression, a comment, a raw block.
    assert_eq!(
        render(
            "{{ '{% generation %}' }}|{# {% generation %} #}|{% raw %}{% generation %}{% endraw %}|{{ 'generation' }}",
            &[]
        )
        .unwrap(),
        "{% generation %}||{% generation %}|generation"
    );
    // A tag that does not end, with text past a character of several bytes
    // (`tag_end` sliced the text inside the character: a panic, found by
    // the fuzzer).
    for src in ["generation{{é", "generation{%é", "[{\u{FFFD}\u{FFFD}generation{{\u{FFFD}"] {
        assert!(ChatTemplate::new(src, "", "").is_err(), "{src}");
    }
    // Unbalanced tags are an error, as in transformers.
    let e = ChatTemplate::new("{% generation %}x", "", "").unwrap_err();
    assert!(e.to_string().contains("parse"), "{e}");
    // The template's text is kept as written.
    let t = ChatTemplate::new(smollm3, "", "").unwrap();
    assert!(t.text().contains("{% generation %}"));
}

/// Two values that share themselves: `[d, d]` doubled 64 times, 2^64
/// items written out.
const SHARING: &str = "{% set ns = namespace(d=[1], e=[1]) %}{% for i in range(64) %}\
                       {% set ns.d = [ns.d, ns.d] %}{% set ns.e = [ns.e, ns.e] %}{% endfor %}";

/// Issue 31 item 2a: templates that build huge strings end in an error
/// within the render's memory budget, quickly, instead of growing until
/// the allocator aborts (a string doubled 40 times took 6-18 s and 2.6 GB
/// before the step limit stopped it).
#[test]
fn templates_that_grow_strings_stop_within_the_memory_budget() {
    let bombs: [&str; 45] = [
        "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
        "{% for i in range(1000) %}{{ messages[0].content * 10000000 }}{% endfor %}",
        "{% set ns = namespace(l=[messages[0].content]) %}{% for i in range(30) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | join }}",
        "{% for i in range(100000) %}{{ messages[0].content | replace('a', messages[0].content) }}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ messages[0].content }}{% endfor %}{% endfor %}",
        "{{ ([messages[0].content] * 100000000) | join }}",
        "{{ ([messages[0].content] * 100000000) | tojson }}",
        "{% set ns = namespace(l=[messages[0].content]) %}{% for i in range(30) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | tojson }}",
        // Past minijinja's 32 lazy concatenations, where the release built
        // the list in full (vendor/minijinja/PATCHED.md): `length` does not
        // iterate, so only the check before the concatenation stops it.
        "{% set ns = namespace(l=[messages[0].content]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
        "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
        // Methods and filters that build their whole result at once
        // (crate::chat_budget): widths, precisions, joins, splits,
        // escapes and indents far past the budget.
        "{{ '{:>99999999999}'.format('a') }}",
        "{{ '{:.999999999f}'.format(1.5) }}",
        "{% set s = 'x' * 1000000 %}{{ ''.join([s] * 100000) | length }}",
        "{{ ('a ' * 50000000).split() | length }}",
        "{{ ('\n' * 100000000).splitlines() | length }}",
        "{{ ('a ' * 50000000) | split | list | length }}",
        "{{ ('\n' * 100000000) | lines | list | length }}",
        "{{ ('\"' * 100000000) | escape }}",
        "{% set s = 'x' * 50000000 %}{{ '%s%s%s%s%s%s%s%s%s%s' | format(s, s, s, s, s, s, s, s, s, s) }}",
        "{{ [1, 2] | tojson(indent=99999999999) }}",
        "{{ ('x' * 100000000) | join(',') | length }}",
        // Work minijinja did without fuel: folding a search of 10^8 items
        // when compiling, comparing long strings (vendor/minijinja).
        "{{ 5 in ([1] * 100000000) }}",
        "{% set s = 'x' * 100000000 %}{% set t = 'x' * 100000000 %}{% for i in range(3000) %}{% if s == t %}{% endif %}{% endfor %}ok",
        // A value that shares itself: small in memory, 2^64 items written.
        "{% set ns = namespace(d=[1]) %}{% for i in range(64) %}{% set ns.d = [ns.d, ns.d] %}{% endfor %}{{ ns.d }}",
        "{% set ns = namespace(d={}) %}{% for i in range(64) %}{% set ns.d = {'a': ns.d, 'b': ns.d} %}{% endfor %}{{ ns.d | string | length }}",
        "{% set ns = namespace(d={}) %}{% for i in range(64) %}{% set ns.d = {'a': ns.d, 'b': ns.d} %}{% endfor %}{{ ns.d | pprint | length }}",
        // The same value turned into a string in other ways (built in full
        // until memory ran out), or compared with another such value (2^64
        // comparisons).
        &format!("{SHARING}{{{{ (ns.d ~ '') | length }}}}"),
        &format!("{SHARING}{{{{ ns.d | upper | length }}}}"),
        &format!("{SHARING}{{{{ ns.d | replace('a', 'b') | length }}}}"),
        &format!("{SHARING}{{{{ '%s' | format(ns.d) | length }}}}"),
        &format!("{SHARING}{{{{ '{{}}'.format(ns.d) | length }}}}"),
        &format!("{SHARING}{{{{ [ns.d] | join | length }}}}"),
        &format!("{SHARING}{{{{ ns.d | escape | length }}}}"),
        &format!("{SHARING}{{{{ 'x' in (ns.d | string) }}}}"),
        &format!("{SHARING}{{{{ ns.d | tojson | length }}}}"),
        &format!("{SHARING}{{{{ ns.d == ns.e }}}}"),
        &format!("{SHARING}{{{{ ns.d in [ns.e] }}}}"),
        &format!("{SHARING}{{{{ [ns.d, ns.e] | sort | length }}}}"),
        // Work on long strings that the budget did not see: sorting,
        // deduplicating, comparing lists of them, testing them.
        "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ ([s] * 1000) | sort | length }}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ ([s] * 1000) | unique | length }}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ ([s] * 1000) | max | length }}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ ([s] * 1000) | min | length }}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% set t = s ~ '' %}{% for i in range(1000) %}{{ [s] * 1000 == [t] * 1000 }}{% endfor %}",
        "{% set s = 'x' * 100000000 %}{% for i in range(100000) %}{% if s is lower %}{% endif %}{% endfor %}",
        // A list made per item (about 1 GB before the fuel of the items
        // ran out).
        "{{ ([1] * 100000000) | batch(1) | length }}",
    ];
    let m = [Message::user("a".repeat(1000))];
    for src in bombs {
        let t0 = std::time::Instant::now();
        let e = render(src, &m).unwrap_err();
        let msg = e.to_string();
        assert!(
            (msg.contains("did not finish") && msg.contains("MiB of data"))
                || msg.contains("more than the render's 256 MiB"),
            "{src}: {msg}"
        );
        assert!(t0.elapsed().as_secs_f64() < 5.0, "{src}: stopped after {:?}", t0.elapsed());
        eprintln!("{:.2} s: {src}", t0.elapsed().as_secs_f64());
    }
    // Values nested too deep to be written with indentation are refused.
    let deep = "{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% endfor %}";
    let e = render(&format!("{deep}{{{{ ns.l | tojson(indent=100) }}}}"), &m).unwrap_err();
    assert!(e.to_string().contains("nested more than 256 levels"), "{e}");
    // `loop.cycle()` without arguments (a division by zero in minijinja
    // 3.1.0, patched) is undefined.
    assert_eq!(render("{% for i in [1, 2] %}[{{ loop.cycle() }}]{% endfor %}", &m).unwrap(), "[][]");
    // A template source far larger than any model's is refused unparsed.
    let huge = "{{ messages[0].content }}".repeat(2_000_000);
    let e = ChatTemplate::new(&huge, "", "").unwrap_err();
    assert!(e.to_string().contains("more than the 1024 KiB accepted"), "{e}");
    // The checked methods and filters still do their work.
    assert_eq!(
        render(
            "{{ '{}-{:>3}'.format('a', 'b') }}|{{ ', '.join(['x', 'y']) }}|{{ 'a b'.split() | join('+') }}|\
             {{ 'p\nq'.splitlines() | length }}|{{ 'c d' | split | list | length }}|{{ 'a<b' | e }}|\
             {{ '%s=%d' | format('n', 3) }}|{{ [1] | tojson(indent=2) }}",
            &m
        )
        .unwrap(),
        "a-  b|x, y|a+b|2|2|a&lt;b|n=3|[\n  1\n]"
    );
    // `join` as Jinja's.
    assert_eq!(
        render(
            "{{ ['a', 1, none] | join('-') }}|{{ 'abc' | join(',') }}|{{ messages | join(attribute='role') }}",
            &[Message::user("x"), Message::assistant("y")]
        )
        .unwrap(),
        "a-1-None|a,b,c|userassistant"
    );
    // The budget is the documented one.
    assert_eq!(infer_model::chat::RENDER_MEMORY, 256 << 20);
}

/// Issue 31 item 2a: a walk over a value (printing, comparing, sorting,
/// serializing) goes at most 500 levels deep and fails the render past
/// that, so that values nested 200 000 levels (`{% set ns.l = [ns.l] %}` in
/// a loop, lists, tuples or maps) or a namespace that holds itself are an
/// error instead of a stack overflow (which aborted the process), on any
/// thread: these run on one of 1 MiB (a thread of tokio's has 2 MiB).
/// Freeing such a value does not recurse once per level.
#[test]
fn deeply_nested_values_are_an_error_not_a_stack_overflow() {
    fn on_small_stack(src: String) -> Result<String, Error> {
        std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(move || render(&src, &[Message::user("hi")]))
            .unwrap()
            .join()
            .unwrap()
    }
    let nest = |n: usize, wrap: &str| {
        format!(
            "{{% set ns = namespace(l=[], m=[]) %}}{{% for k in range({}) %}}{{% for i in range({}) %}}\
             {{% set ns.l = {} %}}{{% set ns.m = {} %}}{{% endfor %}}{{% endfor %}}",
            n.div_ceil(100_000),
            n.min(100_000),
            wrap.replace('X', "ns.l"),
            wrap.replace('X', "ns.m")
        )
    };
    let uses = [
        "{{ ns.l }}",
        "{{ ns.l == ns.m }}",
        "{{ ns.l < ns.m }}",
        "{{ ns.l in [ns.m] }}",
        "{{ [ns.l, ns.m] | sort | length }}",
        "{{ [ns.l, ns.m] | unique | length }}",
        "{{ [ns.l, ns.m] | max | length }}",
        "{{ {ns.l: 1, ns.m: 2} | length }}",
        "{{ ns.l | tojson | length }}",
        "{{ (ns.l ~ '') | length }}",
        "{{ ns.l | string | length }}",
        "{{ ns.l | pprint | length }}",
        "{{ ns.l | upper | length }}",
        "{{ '%s' | format(ns.l) | length }}",
    ];
    for wrap in ["[X]", "(X,)", "{'a': X}"] {
        let deep = nest(200_000, wrap);
        for u in uses {
            let e = on_small_stack(format!("{deep}{u}")).unwrap_err();
            assert!(e.to_string().contains("nested more than"), "{wrap} {u}: {e}");
        }
        // Built and freed, never walked.
        assert_eq!(on_small_stack(format!("{deep}ok")).unwrap(), "ok");
    }
    // A namespace that holds itself.
    let e = on_small_stack("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}".into()).unwrap_err();
    assert!(e.to_string().contains("nested more than 500 levels"), "{e}");
    // Recursion of the engine itself: macros (minijinja stops them 500
    // calls deep) and nested expressions and blocks (the parser stops them).
    let e = on_small_stack("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".into()).unwrap_err();
    assert!(e.to_string().contains("recursion"), "{e}");
    for (open, close) in [("(", ")"), ("[", "]"), ("{'a': ", "}"), ("-", ""), ("not ", "")] {
        let src = format!("{{{{ {}1{} }}}}", open.repeat(100_000), close.repeat(100_000));
        let e = on_small_stack(src).unwrap_err();
        assert!(e.to_string().contains("parse"), "{open}: {e}");
    }
    let e = on_small_stack(format!("{}x{}", "{% if true %}".repeat(40_000), "{% endif %}".repeat(40_000))).unwrap_err();
    assert!(e.to_string().contains("parse"), "{e}");
    let e = on_small_stack(format!("{{% if x %}}{}{{% endif %}}", "{% elif x %}".repeat(50_000))).unwrap_err();
    assert!(e.to_string().contains("parse"), "{e}");
    // Chains the parser builds in a loop, compiled and freed recursively:
    // 50 000 links are refused, 300 are compiled and rendered.
    // (`else` nests as parentheses do: at most 150.)
    let chains = [" + 1", " ~ 'a'", " or x", " and x", "|string", " is number", ".a", "[0]", "()", " if 1 else 1"];
    for chain in chains {
        let e = on_small_stack(format!("{{{{ 1{} }}}}", chain.repeat(50_000))).unwrap_err();
        assert!(e.to_string().contains("parse"), "{chain}: {e}");
        let short = format!("{{{{ 1{} }}}}", chain.repeat(if chain.contains("else") { 100 } else { 300 }));
        assert!(ChatTemplate::new(&short, "", "").is_ok(), "{chain}");
        let _ = on_small_stack(short);
    }
    assert_eq!(on_small_stack(format!("{{{{ 0{} }}}}", " + 1".repeat(300))).unwrap(), "300");
    // Within the limit, as before.
    let shallow = nest(400, "[X]");
    assert_eq!(on_small_stack(format!("{shallow}{{{{ ns.l }}}}")).unwrap().len(), 2 * 401);
    assert_eq!(on_small_stack(format!("{shallow}{{{{ ns.l == ns.m }}}}")).unwrap(), "True");
    assert_eq!(on_small_stack(format!("{shallow}{{{{ ns.l | tojson | length }}}}")).unwrap(), (2 * 401).to_string());
}
