//! `infer info`: what a model file holds and what would run it: the file
//! type, tensor types, tokenizer, chat template, shapes and the backend;
//! `--json` prints the same as one object.

use std::collections::BTreeMap;
use std::io::Write;

use clap::Args;
use infer_model::chat::ChatTemplate;
use infer_model::synth::file_type_name;
use infer_model::tokenizer::{Tokenizer, TokenizerKind};
use infer_model::Error;
use serde::Serialize;

use crate::common::{CliResult, ModelArgs, ThreadArgs};
use crate::output::Out;

#[derive(Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    threads: ThreadArgs,
    /// Print everything as one JSON object (the chat template in full).
    #[arg(long)]
    json: bool,
}

/// Lines of the chat template that the text output shows.
const TEMPLATE_LINES: usize = 4;

/// llama.cpp's `llama-quantize` name of a GGUF file type
/// (`general.file_type`, ggml's `LLAMA_FTYPE_*`).
pub fn file_type_short_name(file_type: u32) -> Option<&'static str> {
    Some(match file_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

/// The file type of `info`.
#[derive(Serialize)]
struct FileType {
    /// `general.file_type`.
    id: u32,
    /// `llama-quantize`'s name (`Q4_K_M`), when known.
    name: Option<&'static str>,
    /// llama.cpp's description (`Q4_K - Medium`), when known.
    description: Option<&'static str>,
}

/// One tensor type's count and bytes.
#[derive(Serialize)]
struct TypeCount {
    #[serde(rename = "type")]
    ty: String,
    tensors: usize,
    bytes: u64,
}

/// The tokenizer of `info`.
#[derive(Serialize)]
struct TokenizerInfo {
    /// `SentencePiece` or `byte-level BPE`.
    #[serde(rename = "type")]
    kind: String,
    /// `tokenizer.ggml.model`.
    model: Option<String>,
    /// The pre-tokenizer (byte-level BPE).
    pre: Option<String>,
    n_vocab: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    end_of_generation: Vec<u32>,
}

/// The chat template of `info`.
#[derive(Serialize)]
struct TemplateInfo {
    /// Where it comes from (the file, or a default).
    source: String,
    text: String,
}

/// The shapes of a runnable model.
#[derive(Serialize)]
struct Shapes {
    n_embd: usize,
    n_layer: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    n_ff: usize,
    n_vocab: usize,
    n_ctx_train: usize,
}

/// Everything `info` prints.
#[derive(Serialize)]
struct Info {
    path: String,
    gguf_version: u32,
    metadata_keys: usize,
    tensors: usize,
    name: Option<String>,
    architecture: String,
    file_type: Option<FileType>,
    parameters: u64,
    tensor_types: Vec<TypeCount>,
    tokenizer: Option<TokenizerInfo>,
    /// Why the tokenizer cannot be used here, when it cannot.
    tokenizer_error: Option<String>,
    chat_template: Option<TemplateInfo>,
    shapes: Option<Shapes>,
    /// Runs of equal layers: `N × local(W, rope B)` or `global(rope B)`.
    attention: Vec<String>,
    /// KV cache bytes per position (keys and values of every layer) for
    /// each cache type, f32 to q4_0.
    kv_bytes_per_token: Vec<(String, u64)>,
    /// Why the file does not run here, when it does not.
    not_runnable: Option<String>,
    backend: String,
}

pub fn info(a: InfoArgs) -> CliResult {
    let path = a.model.resolve_model()?;
    let gguf = a.model.open_at(&path)?;
    let backend = a.model.backend(a.threads.get())?;
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
    let tokenizer = Tokenizer::from_gguf(&gguf);
    let tokenizer_info = match &tokenizer {
        Ok(t) => Ok(TokenizerInfo {
            kind: match t.kind() {
                TokenizerKind::SentencePiece => "SentencePiece".to_string(),
                TokenizerKind::ByteLevelBpe(_) => "byte-level BPE".to_string(),
            },
            model: gguf.get_str("tokenizer.ggml.model").ok().map(str::to_string),
            pre: match t.kind() {
                TokenizerKind::ByteLevelBpe(p) => Some(p.name().to_string()),
                TokenizerKind::SentencePiece => None,
            },
            n_vocab: t.n_vocab(),
            bos: t.bos_id(),
            eos: t.eos_id(),
            end_of_generation: t.eog_ids().to_vec(),
        }),
        Err(e) => Err(e.to_string()),
    };
    let chat_template = tokenizer
        .as_ref()
        .ok()
        .and_then(|t| ChatTemplate::from_gguf(&gguf, t).ok())
        .map(|c| TemplateInfo { source: c.source().to_string(), text: c.text().to_string() });
    let mut info = Info {
        path: path.display().to_string(),
        gguf_version: gguf.version(),
        metadata_keys: gguf.metadata().len(),
        tensors: gguf.tensors().len(),
        name: gguf.get_str("general.name").ok().map(str::to_string),
        architecture: gguf.get_str("general.architecture").unwrap_or("?").to_string(),
        file_type: gguf.get_u32("general.file_type").ok().map(|id| FileType {
            id,
            name: file_type_short_name(id),
            description: file_type_name(id),
        }),
        parameters: params,
        tensor_types: counts.into_iter().map(|(ty, (tensors, bytes))| TypeCount { ty, tensors, bytes }).collect(),
        tokenizer_error: tokenizer_info.as_ref().err().cloned(),
        tokenizer: tokenizer_info.ok(),
        chat_template,
        shapes: None,
        attention: Vec::new(),
        kv_bytes_per_token: Vec::new(),
        not_runnable: None,
        backend: backend.device_info(),
    };
    let pipeline = infer_model::model::load_spec(&gguf).and_then(|s| s.validate().map(|()| s).map_err(Into::into));
    let mut failure = None;
    match pipeline {
        Ok(spec) => {
            let l = &spec.layers[0];
            info.shapes = Some(Shapes {
                n_embd: spec.n_embd,
                n_layer: spec.layers.len(),
                n_head: l.n_head,
                n_head_kv: l.n_head_kv,
                head_dim: l.head_dim,
                n_ff: l.ffn_up.rows,
                n_vocab: spec.n_vocab,
                n_ctx_train: spec.n_ctx_train,
            });
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
            info.attention =
                runs.iter().map(|&(n, w)| if n == 1 { w.to_string() } else { format!("{n} × {w}") }).collect();
            let heads: Vec<(usize, usize)> = spec.layers.iter().map(|l| (l.n_head_kv, l.head_dim)).collect();
            info.kv_bytes_per_token = infer_compute::KvCacheType::ALL
                .into_iter()
                .filter_map(|t| {
                    let b = infer_compute::KvTypes::both(t).bytes_per_token(heads.iter().copied()).ok()?;
                    Some((t.name().to_string(), b))
                })
                .collect();
        }
        // A GGUF file that is not a model this build runs (no architecture,
        // another architecture, a feature it refuses) is still described.
        Err(e) if not_supported(&e) => info.not_runnable = Some(e.to_string()),
        // A model of a supported architecture whose metadata or tensors are
        // wrong is described as far as the file goes, then is an error.
        Err(e) => failure = Some(e),
    }
    let mut out = Out::new();
    if a.json {
        if let Some(e) = failure {
            return Err(e.into());
        }
        writeln!(out, "{}", serde_json::to_string_pretty(&info)?)?;
        out.flush()?;
        return Ok(());
    }
    print_text(&mut out, &info, failure.is_some())?;
    out.flush()?;
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// The text output of `info`; with `failed`, only the part that the file
/// describes without a valid architecture.
fn print_text(out: &mut Out, info: &Info, failed: bool) -> std::io::Result<()> {
    writeln!(out, "path:         {}", info.path)?;
    writeln!(
        out,
        "file:         GGUF v{}, {} metadata keys, {} tensors",
        info.gguf_version, info.metadata_keys, info.tensors
    )?;
    if let Some(name) = &info.name {
        writeln!(out, "name:         {name}")?;
    }
    writeln!(out, "architecture: {}", info.architecture)?;
    if let Some(ft) = &info.file_type {
        match (ft.name, ft.description) {
            (Some(n), Some(d)) => writeln!(out, "file type:    {n} ({d}; general.file_type {})", ft.id)?,
            (Some(n), None) => writeln!(out, "file type:    {n} (general.file_type {})", ft.id)?,
            _ => writeln!(out, "file type:    unknown (general.file_type {})", ft.id)?,
        }
    }
    writeln!(out, "parameters:   {:.1} M", info.parameters as f64 / 1e6)?;
    writeln!(out, "tensor types:")?;
    for t in &info.tensor_types {
        writeln!(out, "  {:>7}: {:4} tensors, {:8.2} MiB", t.ty, t.tensors, t.bytes as f64 / (1 << 20) as f64)?;
    }
    match (&info.tokenizer, &info.tokenizer_error) {
        (Some(t), _) => {
            let pre = t.pre.as_ref().map(|p| format!(", pre-tokenizer {p}")).unwrap_or_default();
            let model = t.model.as_ref().map(|m| format!(" (tokenizer.ggml.model {m})")).unwrap_or_default();
            writeln!(out, "tokenizer:    {}{model}{pre}, {} tokens", t.kind, t.n_vocab)?;
        }
        (None, Some(e)) => writeln!(out, "tokenizer:    not usable here: {e}")?,
        (None, None) => {}
    }
    if let Some(c) = &info.chat_template {
        let lines: Vec<&str> = c.text.lines().collect();
        writeln!(out, "chat template: {} ({} lines; `--json` prints it whole)", c.source, lines.len())?;
        for l in lines.iter().take(TEMPLATE_LINES) {
            writeln!(out, "  | {l}")?;
        }
        if lines.len() > TEMPLATE_LINES {
            writeln!(out, "  | ...")?;
        }
    }
    if failed {
        return Ok(());
    }
    if let Some(s) = &info.shapes {
        writeln!(
            out,
            "shapes:       n_embd {}, n_layer {}, n_head {}, n_head_kv {}, head_dim {}, n_ff {}, n_vocab {}, n_ctx_train {}",
            s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, s.n_vocab, s.n_ctx_train
        )?;
        writeln!(out, "attention:    {} (layers in order)", info.attention.join(", "))?;
        let kv: Vec<String> = info.kv_bytes_per_token.iter().map(|(t, b)| format!("{t} {b}")).collect();
        if !kv.is_empty() {
            writeln!(out, "KV cache:     bytes per token (K and V, all layers): {}", kv.join(", "))?;
        }
    }
    if let Some(e) = &info.not_runnable {
        writeln!(out, "pipeline:     not runnable here: {e}")?;
    }
    writeln!(out, "backend:      {}", info.backend)
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
