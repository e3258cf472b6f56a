//! A guided tour of a model's decode pipeline: what runs for one token, op
//! by op, with the shapes, weight types and bytes each step touches.
//!
//! It reads the model's GGUF header, builds the device-independent
//! pipeline description (`infer_model::model::load_spec` →
//! `infer_compute::pipeline::ModelSpec`) and prints:
//! 1. the model's hyper-parameters;
//! 2. the embedding step;
//! 3. the first layer in full, op by op (ops, input → output shapes, weight
//!    types and bytes), as the CPU decode path runs it;
//! 4. one line per layer (attention kind, RoPE, the weight types of its
//!    seven matrices, bytes);
//! 5. the output step and the total bytes of weights read per token.
//!
//! Run: `cargo run --release --example demo_architecture [-- MODEL.gguf]`
//! (default: the default model, Gemma 3 270M Q4_K_M, fetched if needed).

use std::path::PathBuf;

use infer_compute::pipeline::{Activation, FfnType, LayerSpec, ModelSpec, Norm, NormType, RopeType};
use infer_compute::QuantWeight;
use infer_model::gguf::GgufFile;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn mib(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{:.2} MiB", b as f64 / (1 << 20) as f64)
    } else {
        format!("{:.1} KiB", b as f64 / 1024.0)
    }
}

fn weight(w: &QuantWeight) -> String {
    format!("{} {}x{} ({})", w.ty.name(), w.rows, w.cols, mib(w.data.as_bytes().len()))
}

fn norm(n: &Norm) -> String {
    let kind = match n.kind {
        NormType::RmsNorm => "RMSNorm",
        NormType::LayerNorm => "LayerNorm",
    };
    format!("{kind}({}), eps {:e}", n.weight.cols, n.eps)
}

fn attention_kind(l: &LayerSpec) -> String {
    match l.sliding_window {
        Some(w) => format!("local (window {w})"),
        None => "global".to_string(),
    }
}

fn rope(l: &LayerSpec) -> String {
    let kind = match l.rope.kind {
        RopeType::Normal => "adjacent pairs",
        RopeType::NeoX => "NeoX halves",
    };
    let scale = if l.rope.freq_scale != 1.0 { format!(", positions × {}", l.rope.freq_scale) } else { String::new() };
    format!("base {}, {} of {} dims rotated, {kind}{scale}", l.rope.base, l.rope.n_rot, l.head_dim)
}

fn layer_matrices(l: &LayerSpec) -> Vec<(&'static str, &QuantWeight)> {
    let mut v = vec![("attn_q", &l.wq), ("attn_k", &l.wk), ("attn_v", &l.wv), ("attn_output", &l.wo)];
    if let Some(g) = &l.ffn_gate {
        v.push(("ffn_gate", g));
    }
    v.push(("ffn_up", &l.ffn_up));
    v.push(("ffn_down", &l.ffn_down));
    v
}

fn layer_bytes(l: &LayerSpec) -> usize {
    layer_matrices(l).iter().map(|(_, w)| w.data.as_bytes().len()).sum()
}

fn print_layer(i: usize, l: &LayerSpec, e: usize) {
    let (qd, kvd, hd) = (l.n_head * l.head_dim, l.n_head_kv * l.head_dim, l.head_dim);
    let n_ff = l.ffn_up.rows;
    let act_ty = |w: &QuantWeight| w.ty.vec_dot_type().map_or("?", |t| t.name());
    let mut step = 0;
    let mut op = |what: &str, detail: String, shapes: String| {
        step += 1;
        println!("  {step:>2}. {what:<22} {detail:<48} {shapes}");
    };
    println!(
        "layer {i}: {} attention, {} query heads sharing {} kv head(s) of {hd}",
        attention_kind(l),
        l.n_head,
        l.n_head_kv
    );
    op("attn_norm", norm(&l.attn_norm), format!("x[{e}] → h[{e}]"));
    op("quantize activation", format!("h to {} blocks (each mat-vec: its type's pair)", act_ty(&l.wq)), String::new());
    op("attn_q", weight(&l.wq), format!("h[{e}] → q[{}×{hd}]", l.n_head));
    op("attn_k", weight(&l.wk), format!("h[{e}] → k[{}×{hd}]", l.n_head_kv));
    op("attn_v", weight(&l.wv), format!("h[{e}] → v[{}×{hd}]", l.n_head_kv));
    if let Some(n) = &l.q_norm {
        op("attn_q_norm", format!("{} per head", norm(n)), format!("q[{}×{hd}]", l.n_head));
    }
    if let Some(n) = &l.k_norm {
        op("attn_k_norm", format!("{} per head", norm(n)), format!("k[{}×{hd}]", l.n_head_kv));
    }
    op("rope", rope(l), "q, k".to_string());
    op("kv append", format!("k, v into the cache at pos ({} B f32 per position)", 2 * kvd * 4), String::new());
    let softcap = l.attn_softcap.map_or(String::new(), |c| format!(", softcap {c}"));
    op(
        "attention",
        format!("softmax(q·kᵀ·{:.4}{softcap})·v over {}", l.attn_scale, attention_kind(l)),
        format!("q[{qd}], cache → a[{qd}]"),
    );
    op("attn_output", weight(&l.wo), format!("a[{qd}] → o[{e}]"));
    if let Some(n) = &l.post_attn_norm {
        op("post_attention_norm", norm(n), format!("o[{e}]"));
    }
    op("residual add", String::new(), format!("x += o [{e}]"));
    op("ffn_norm", norm(&l.ffn_norm), format!("x[{e}] → h[{e}]"));
    if let Some(g) = &l.ffn_gate {
        op("ffn_gate", weight(g), format!("h[{e}] → g[{n_ff}]"));
    }
    op("ffn_up", weight(&l.ffn_up), format!("h[{e}] → u[{n_ff}]"));
    let act = match (l.ffn, l.activation) {
        (FfnType::Gated, Activation::GeluTanh) => "GEGLU: gelu_tanh(g) · u",
        (FfnType::Gated, Activation::Silu) => "SwiGLU: silu(g) · u",
        (FfnType::Plain, Activation::GeluTanh) => "gelu_tanh(u)",
        (FfnType::Plain, Activation::Silu) => "silu(u)",
    };
    op("activation", act.to_string(), format!("→ m[{n_ff}]"));
    op("ffn_down", weight(&l.ffn_down), format!("m[{n_ff}] → o[{e}]"));
    if let Some(n) = &l.post_ffn_norm {
        op("post_ffw_norm", norm(n), format!("o[{e}]"));
    }
    op("residual add", String::new(), format!("x += o [{e}]"));
    println!("  weights read by this layer: {}", mib(layer_bytes(l)));
}

fn main() -> Result<()> {
    let path = match std::env::args().nth(1) {
        Some(p) => PathBuf::from(p),
        None => infer_model::fetch::default_model_path()?,
    };
    let gguf = GgufFile::open(&path)?;
    let spec: ModelSpec = infer_model::model::load_spec(&gguf)?;
    let name = gguf.get_str("general.name").unwrap_or("(unnamed)");
    let e = spec.n_embd;
    let l0 = &spec.layers[0];

    println!("== {name} ({}), {} ==", spec.arch, path.display());
    println!(
        "n_embd {e}, {} layers, {} heads / {} kv heads of {}, n_ff {}, vocab {}, trained context {}",
        spec.layers.len(),
        l0.n_head,
        l0.n_head_kv,
        l0.head_dim,
        l0.ffn_up.rows,
        spec.n_vocab,
        spec.n_ctx_train
    );
    println!("The decode of one token runs, in order:");
    println!();
    println!("embedding: look up row `token` of token_embd {}", weight(&spec.token_embd));
    let row = spec.token_embd.row_bytes();
    if spec.embd_scale != 1.0 {
        println!("  dequantize {row} B to x[{e}], scale by {:.3} (sqrt(n_embd))", spec.embd_scale);
    } else {
        println!("  dequantize {row} B to x[{e}]");
    }
    println!();
    print_layer(0, l0, e);

    println!();
    println!("every layer (types of attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down):");
    println!("| layer | attention | RoPE base | RoPE position scale | matrix types | bytes |");
    println!("| ---: | --- | ---: | ---: | --- | ---: |");
    for (i, l) in spec.layers.iter().enumerate() {
        let types: Vec<&str> = layer_matrices(l).iter().map(|(_, w)| w.ty.name()).collect();
        println!(
            "| {i} | {} | {} | {} | {} | {} |",
            attention_kind(l),
            l.rope.base,
            l.rope.freq_scale,
            types.join(" "),
            mib(layer_bytes(l))
        );
    }

    println!();
    println!("output:");
    println!("  output_norm {}: x[{e}] → h[{e}]", norm(&spec.output_norm));
    let tied = std::ptr::eq(spec.output.data.as_bytes().as_ptr(), spec.token_embd.data.as_bytes().as_ptr());
    println!(
        "  output {}{}: h[{e}] → logits[{}]",
        weight(&spec.output),
        if tied { ", tied to token_embd" } else { "" },
        spec.n_vocab
    );
    if let Some(c) = spec.final_logit_softcap {
        println!("  softcap {c} on the logits");
    }
    let layers: usize = spec.layers.iter().map(layer_bytes).sum();
    let out = spec.output.data.as_bytes().len();
    println!();
    println!(
        "weights read per token: layers {} + output {} = {} (the embedding table, {}, is only looked up: {row} B)",
        mib(layers),
        mib(out),
        mib(layers + out),
        mib(spec.token_embd.data.as_bytes().len())
    );
    Ok(())
}
