//! `infer models`: the models known by name, which are in the cache, and
//! the models from Hugging Face in the cache.

use std::io::Write;

use clap::Args;
use infer_model::fetch::{cache_dir, hub, verify, DEFAULT_CHAT_MODEL_NAME, DEFAULT_MODEL_NAME, KNOWN_MODELS};

use crate::common::CliResult;
use crate::output::Out;

/// Options of `infer models` (none yet).
#[derive(Args, Debug)]
pub struct ModelsArgs {}

/// Prints one row per known model: name, file size, family, quantization,
/// base or instruct, and whether a verified copy is in the cache (with its
/// path); then a line saying what the model is.
pub fn models(_a: ModelsArgs) -> CliResult {
    let dir = cache_dir();
    let mut out = Out::new();
    writeln!(out, "{:<15} {:>9}  {:<7} {:<7} {:<9} cached", "name", "size", "family", "quant", "kind")?;
    for m in KNOWN_MODELS {
        let path = dir.join(m.file);
        let cached = if verify::is_vouched(&path, m) {
            format!("yes  {}", path.display())
        } else if path.exists() {
            format!("unverified (checked on first use)  {}", path.display())
        } else {
            "no (fetched on first use)".to_string()
        };
        let mark = match m.name {
            DEFAULT_MODEL_NAME => " *",
            DEFAULT_CHAT_MODEL_NAME => " **",
            _ => "",
        };
        let name = format!("{}{mark}", m.name);
        writeln!(
            out,
            "{name:<15} {:>6.1} MB  {:<7} {:<7} {:<9} {cached}",
            m.size as f64 / 1e6,
            m.family,
            m.quantization,
            m.kind()
        )?;
        writeln!(out, "    {}", m.description)?;
    }
    writeln!(
        out,
        "\n* default of run, info and bench; ** default of chat. Use a name (any case) with `--model NAME`; cache: {}",
        dir.display()
    )?;
    let hub = hub::cached_models(&dir);
    if hub.is_empty() {
        writeln!(
            out,
            "\nNo models from Hugging Face in the cache (`infer pull user/repo[:QUANT]` or `-hf` adds one)."
        )?;
    } else {
        writeln!(out, "\nFrom Hugging Face (use with `-hf user/repo:QUANT`; `infer rm` removes):")?;
        for m in hub {
            let state = if m.partial {
                "  (partial: an incomplete download, resumed by the next `infer pull` or -hf of it; `infer rm` removes \
                 it)"
            } else if m.verified {
                ""
            } else {
                "  (unverified: checked on next use)"
            };
            writeln!(
                out,
                "{:<50} {:>8.1} MB  {}{state}",
                format!("{}  {}", m.repo, m.file),
                m.size as f64 / 1e6,
                m.path.display()
            )?;
        }
    }
    out.flush()?;
    Ok(())
}
