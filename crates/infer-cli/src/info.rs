//! `infer info`: what a model file holds and what would run it.

use std::collections::BTreeMap;
use std::io::Write;

use clap::Args;
use infer_model::Error;

use crate::common::{CliResult, ModelArgs};
use crate::output::Out;

#[derive(Args)]
pub struct InfoArgs {
    #[command(flatten)]
    model: ModelArgs,
}

pub fn info(a: InfoArgs) -> CliResult {
    let gguf = a.model.open()?;
    let path = a.model.resolve_model()?;
    let backend = a.model.backend()?;
    let arch = gguf.get_str("general.architecture").unwrap_or("?");
    let mut out = Out::new();
    writeln!(out, "path:         {}", path.display())?;
    writeln!(
        out,
        "file:         GGUF v{}, {} metadata keys, {} tensors",
        gguf.version(),
        gguf.metadata().len(),
        gguf.tensors().len()
    )?;
    if let Ok(name) = gguf.get_str("general.name") {
        writeln!(out, "name:         {name}")?;
    }
    writeln!(out, "architecture: {arch}")?;
    let mut counts: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let mut params = 0u64;
    for t in gguf.tensors() {
        // ggml's type names in upper case, as llama.cpp's tools and the
        // README print them (Q4_K, Q6_K, F32).
        let e = counts.entry(t.ty.name().to_uppercase()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes as u64;
        params += t.n_elements();
    }
    writeln!(out, "parameters:   {:.1} M", params as f64 / 1e6)?;
    writeln!(out, "tensor types:")?;
    for (ty, (n, bytes)) in &counts {
        writeln!(out, "  {ty:>7}: {n:4} tensors, {:8.2} MiB", *bytes as f64 / (1 << 20) as f64)?;
    }
    match infer_model::model::load_spec(&gguf).and_then(|s| s.validate().map(|()| s).map_err(Into::into)) {
        Ok(spec) => {
            let l = &spec.layers[0];
            writeln!(
                out,
                "shapes:       n_embd {}, n_layer {}, n_head {}, n_head_kv {}, head_dim {}, n_ff {}, n_vocab {}, n_ctx_train {}",
                spec.n_embd,
                spec.layers.len(),
                l.n_head,
                l.n_head_kv,
                l.head_dim,
                l.ffn_up.rows,
                spec.n_vocab,
                spec.n_ctx_train
            )?;
            let windows: Vec<String> = spec
                .layers
                .iter()
                .map(|l| match l.sliding_window {
                    Some(w) => format!("local({w}, rope {})", l.rope.base),
                    None => format!("global(rope {})", l.rope.base),
                })
                .collect();
            // Runs of equal layers as `N × kind`: 30 identical layers are one entry.
            let mut runs: Vec<(usize, &str)> = vec![];
            for w in &windows {
                match runs.last_mut() {
                    Some((n, last)) if *last == w.as_str() => *n += 1,
                    _ => runs.push((1, w)),
                }
            }
            let runs: Vec<String> =
                runs.iter().map(|&(n, w)| if n == 1 { w.to_string() } else { format!("{n} × {w}") }).collect();
            writeln!(out, "attention:    {} (layers in order)", runs.join(", "))?;
        }
        // A GGUF file that is not a model this build runs (no architecture,
        // another architecture, a feature it refuses) is still described.
        Err(e) if not_supported(&e) => writeln!(out, "pipeline:     not runnable here: {e}")?,
        // A model of a supported architecture whose metadata or tensors are
        // wrong is described as far as the file goes, then is an error.
        Err(e) => {
            out.flush()?;
            return Err(e.into());
        }
    }
    writeln!(out, "backend:      {}", backend.device_info())?;
    out.flush()?;
    Ok(())
}

/// Whether `e` says that the file is not a model this build runs, rather
/// than a model whose metadata or tensors are wrong.
fn not_supported(e: &Error) -> bool {
    match e {
        Error::UnsupportedArch(_) | Error::UnsupportedFeature { .. } => true,
        Error::MissingKey(k) => k == "general.architecture",
        _ => false,
    }
}
