//! The chat template renderer on arbitrary input, in two ways chosen by the
//! first byte: the models' own templates (the cached models' and ChatML)
//! rendering messages of arbitrary text and roles, and arbitrary template
//! text (as a hostile GGUF file would carry) rendering a fixed
//! conversation. Parsing and rendering never panic; failures are errors.

#![no_main]

use std::sync::OnceLock;

use infer_model::chat::{ChatTemplate, Message, Role, CHATML_TEMPLATE};
use infer_model::gguf::GgufFile;
use infer_model::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fn templates() -> &'static [ChatTemplate] {
    static T: OnceLock<Vec<ChatTemplate>> = OnceLock::new();
    T.get_or_init(|| {
        let cache = infer_model::fetch::cache_dir();
        let mut out = vec![ChatTemplate::new(CHATML_TEMPLATE, "<s>", "</s>").expect("ChatML")];
        for name in [infer_model::fetch::DEFAULT_MODEL_FILE, "SmolLM2-135M-Instruct.Q4_1.gguf"] {
            let Ok(file) = GgufFile::open(cache.join(name)) else { continue };
            let tok = Tokenizer::from_gguf(&file).expect("the model's tokenizer");
            if let Ok(t) = ChatTemplate::from_gguf(&file, &tok) {
                eprintln!("template of {name}");
                out.push(t);
            }
        }
        out
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    if mode & 1 == 0 {
        // A model's template, arbitrary messages: split the text on NUL,
        // each piece a message whose role comes from its first character.
        let ts = templates();
        let t = &ts[(mode as usize >> 1) % ts.len()];
        let messages: Vec<Message> = text
            .split('\0')
            .map(|m| {
                let role = match m.bytes().next().unwrap_or(0) % 3 {
                    0 => Role::System,
                    1 => Role::User,
                    _ => Role::Assistant,
                };
                Message::new(role, m)
            })
            .collect();
        let _ = t.render(&messages, mode & 2 == 0);
    } else {
        // Arbitrary template text.
        if let Ok(t) = ChatTemplate::new(&text, "<bos>", "<eos>") {
            let messages = [Message::system("sys"), Message::user("hello"), Message::assistant("hi"), Message::user("?")];
            let _ = t.render(&messages, true);
            let _ = t.render(&[], false);
        }
    }
});
