//! `infer info`: what a model file holds and what would run it.

use std::collections::BTreeMap;

use clap::Args;

use crate::common::{CliResult, ModelArgs};

#[derive(Args)]
pub struct InfoArgs {
    #[command(flatten)]
    model: ModelArgs,
}

pub fn info(a: InfoArgs) -> CliResult {
    let gguf = a.model.open()?;
    let backend = a.model.backend()?;
    let arch = gguf.get_str("general.architecture").unwrap_or("?");
    println!(
        "file:         GGUF v{}, {} metadata keys, {} tensors",
        gguf.version(),
        gguf.metadata().len(),
        gguf.tensors().len()
    );
    if let Ok(name) = gguf.get_str("general.name") {
        println!("name:         {name}");
    }
    println!("architecture: {arch}");
    let mut counts: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let mut params = 0u64;
    for t in gguf.tensors() {
        let e = counts.entry(t.ty.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes as u64;
        params += t.n_elements();
    }
    println!("parameters:   {:.1} M", params as f64 / 1e6);
    println!("tensor types:");
    for (ty, (n, bytes)) in &counts {
        println!("  {ty:>7}: {n:4} tensors, {:8.2} MiB", *bytes as f64 / (1 << 20) as f64);
    }
    match infer_model::model::load_spec(&gguf).and_then(|s| s.validate().map(|()| s).map_err(Into::into)) {
        Ok(spec) => {
            let l = &spec.layers[0];
            println!(
                "shapes:       n_embd {}, n_layer {}, n_head {}, n_head_kv {}, head_dim {}, n_ff {}, n_vocab {}, n_ctx_train {}",
                spec.n_embd,
                spec.layers.len(),
                l.n_head,
                l.n_head_kv,
                l.head_dim,
                l.ffn_up.rows,
                spec.n_vocab,
                spec.n_ctx_train
            );
            let windows: Vec<String> = spec
                .layers
                .iter()
                .map(|l| match l.sliding_window {
                    Some(w) => format!("local({w}, rope {})", l.rope.base),
                    None => format!("global(rope {})", l.rope.base),
                })
                .collect();
            println!("attention:    {}", windows.join(", "));
        }
        Err(e) => println!("pipeline:     not runnable here: {e}"),
    }
    println!("backend:      {}", backend.device_info());
    Ok(())
}
