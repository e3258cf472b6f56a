//! `infer models`: the models known by name, and which are in the cache.

use std::io::Write;

use clap::Args;
use infer_model::fetch::{cache_dir, verify, DEFAULT_MODEL_NAME, KNOWN_MODELS};

use crate::common::CliResult;
use crate::output::Out;

/// Options of `infer models` (none yet).
#[derive(Args, Debug)]
pub struct ModelsArgs {}

/// Prints one row per known model: name, file size, family, quantization,
/// and whether a verified copy is in the cache (with its path).
pub fn models(_a: ModelsArgs) -> CliResult {
    let dir = cache_dir();
    let mut out = Out::new();
    writeln!(out, "{:<14} {:>9}  {:<7} {:<7} cached", "name", "size", "family", "quant")?;
    for m in KNOWN_MODELS {
        let path = dir.join(m.file);
        let cached = if verify::is_vouched(&path, m) {
            format!("yes  {}", path.display())
        } else if path.exists() {
            format!("unverified (checked on first use)  {}", path.display())
        } else {
            "no (fetched on first use)".to_string()
        };
        let name = if m.name == DEFAULT_MODEL_NAME { format!("{} *", m.name) } else { m.name.to_string() };
        writeln!(out, "{name:<14} {:>6.1} MB  {:<7} {:<7} {cached}", m.size as f64 / 1e6, m.family, m.quantization)?;
    }
    writeln!(out, "\n* default. Use a name with `--model NAME`; cache: {}", dir.display())?;
    out.flush()?;
    Ok(())
}
