//! `infer synth`: write a GGUF with random weights and a real model's
//! shapes, metadata and tensor types (see [`infer_model::synth`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use infer_model::gguf::GgufFile;
use infer_model::synth::{self, SynthArch, SynthOptions, SynthQuant, SynthShape, SynthSummary, SynthVocab};

use crate::common::{thread_count, CliResult};
use crate::output::Out;

#[derive(Args)]
pub struct SynthArgs {
    /// Architecture: gemma3, gemma2, llama, qwen2, qwen3 or phi3.
    #[arg(long, default_value = "gemma3")]
    arch: String,
    /// Model size: gemma3 270m, 1b, 4b, 12b; gemma2 2b; llama 1b (Llama 3.2
    /// 1B), 8b (Llama 3 8B), mistral-7b; qwen2 0.5b; qwen3 0.6b; phi3 mini;
    /// `tiny` (every architecture, a few MB, for tests).
    #[arg(long)]
    size: String,
    /// File type whose tensor type mix is copied: q4_k_m, q5_k_m, q8_0 or q4_0.
    #[arg(long, default_value = "q4_k_m")]
    quant: String,
    /// Seed of the random weights (the file is a function of the shape, the
    /// file type and the seed).
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true, value_parser = crate::common::at_least::<u64>(0))]
    seed: u64,
    /// Generator threads (default, and 0 or less as llama.cpp's -t -1: all cores; the output does not depend on
    /// it; at most 4 × the cores).
    #[arg(short, long, value_name = "N", allow_negative_numbers = true)]
    threads: Option<i64>,
    /// GGUF file to copy the tokenizer from (Gemma 3 sizes with the real
    /// 262144-token vocabulary; default: the default model, fetched if needed).
    #[arg(long, value_name = "FILE")]
    tokenizer_from: Option<PathBuf>,
    /// Store the same weights as F32: every matrix rounded through the type
    /// the file type gives it, then dequantized (the exact forward pass of
    /// the quantized file, for reference logits).
    #[arg(long)]
    dequantized: bool,
    /// Output file: a new file or a regular file to replace (never a
    /// device, FIFO, link or a file of the model cache).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
}

/// Parses `--arch`, `--size` and `--quant` into a shape and a file type.
pub fn parse_spec(arch: &str, size: &str, quant: &str) -> CliResult<(SynthShape, SynthQuant)> {
    let a = SynthArch::parse(arch).ok_or_else(|| {
        let names: Vec<&str> = SynthArch::ALL.iter().map(|a| a.name()).collect();
        format!("unknown architecture `{arch}` (known: {})", names.join(", "))
    })?;
    let shape = SynthShape::preset(a, size)?;
    let q = SynthQuant::parse(quant).ok_or_else(|| {
        let names: Vec<&str> = SynthQuant::ALL.iter().map(|q| q.name()).collect();
        format!("unknown file type `{quant}` (known: {})", names.join(", "))
    })?;
    Ok((shape, q))
}

/// Bytes as llama-bench prints model sizes: MiB below 1 GiB, else GiB.
pub fn human_bytes(b: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: f64 = (1u64 << 30) as f64;
    if (b as f64) < GIB {
        format!("{:.2} MiB", b as f64 / MIB)
    } else {
        format!("{:.2} GiB", b as f64 / GIB)
    }
}

/// Parameters as llama-bench prints them: millions below 1e9, else billions.
pub fn human_params(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

/// Writes a synthetic model to `path`, with a progress bar on stderr
/// (hidden when stderr is not a terminal). Gemma 3 shapes with the real
/// vocabulary size copy the tokenizer of `tokenizer_from` or of the default
/// model; other shapes get a generated vocabulary.
pub fn generate(
    path: &Path,
    shape: SynthShape,
    quant: SynthQuant,
    seed: u64,
    threads: usize,
    tokenizer_from: Option<&Path>,
) -> CliResult<SynthSummary> {
    generate_with(path, shape, quant, seed, threads, tokenizer_from, false)
}

/// [`generate`], optionally writing the weights dequantized to F32
/// ([`SynthOptions::dequantized`]).
pub fn generate_with(
    path: &Path,
    shape: SynthShape,
    quant: SynthQuant,
    seed: u64,
    threads: usize,
    tokenizer_from: Option<&Path>,
    dequantized: bool,
) -> CliResult<SynthSummary> {
    let copy_vocab = shape.arch == SynthArch::Gemma3 && shape.n_vocab == 262_144;
    if let (Some(p), false) = (tokenizer_from, copy_vocab) {
        return Err(format!(
            "--tokenizer-from {}: only Gemma 3 sizes with the real vocabulary (270m, 1b, 4b, 12b) copy a tokenizer; \
             this size generates its own",
            p.display()
        )
        .into());
    }
    let source = if copy_vocab {
        let p = match tokenizer_from {
            Some(p) => p.to_path_buf(),
            None => infer_model::fetch::default_model_path()?,
        };
        Some(GgufFile::open(&p).map_err(|e| format!("tokenizer source {}: {e}", p.display()))?)
    } else {
        None
    };
    let vocab = match &source {
        Some(f) => SynthVocab::CopyFrom(f),
        None => SynthVocab::Generated,
    };
    let mut plan = synth::plan_tensors(&shape, quant)?;
    if dequantized {
        plan = synth::dequantized_plan(plan);
    }
    let total = synth::summarize(&plan)?.tensor_bytes;
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(format!("synth {} {}", shape.model_name, quant.name()));
    let pb2 = pb.clone();
    let progress: Arc<dyn Fn(u64) + Send + Sync> = Arc::new(move |done| pb2.set_position(done));
    let opts = SynthOptions { shape, quant, seed, threads, dequantized };
    let result = synth::write_synthetic(path, &opts, vocab, progress);
    pb.finish_and_clear();
    Ok(result.map_err(|e| format!("{}: {e}", path.display()))?)
}

/// The temporary file the GGUF writer fills before renaming it over
/// `path`: `.NAME.partial-PID` beside it (`GgufWriter::write_to_path`).
fn partial_path(path: &Path, pid: u32) -> Option<PathBuf> {
    let name = path.file_name()?.to_string_lossy();
    Some(path.with_file_name(format!(".{name}.partial-{pid}")))
}

/// Removes the partial files of earlier runs for `path` whose process is
/// gone (killed before it could clean up), saying so on stderr.
fn remove_stale_partials(path: &Path) {
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else { return };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    let prefix = format!(".{name}.partial-");
    for e in entries.flatten() {
        let file_name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = file_name.strip_prefix(&prefix).and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid != std::process::id()
            && !infer_model::fetch::process_alive(pid)
            && e.file_type().is_ok_and(|t| t.is_file())
        {
            match std::fs::remove_file(e.path()) {
                Ok(()) => eprintln!("removed {}, left by an interrupted run", e.path().display()),
                Err(err) => eprintln!("warning: cannot remove {}: {err}", e.path().display()),
            }
        }
    }
}

/// Refuses outputs that must not be replaced: a directory, anything that
/// exists and is not a regular file (a device such as `/dev/null`, a FIFO,
/// a socket, a symbolic link: the rename would replace it), and a file of
/// the model cache.
fn check_output(path: &Path) -> CliResult {
    if path.is_dir() || path.as_os_str().to_string_lossy().ends_with('/') {
        return Err(format!("cannot write {}: it is a directory; give a file name", path.display()).into());
    }
    if let Ok(m) = std::fs::symlink_metadata(path) {
        let t = m.file_type();
        if t.is_symlink() {
            return Err(format!("refusing to replace {}: it is a symbolic link", path.display()).into());
        }
        if !t.is_file() {
            return Err(format!(
                "refusing to replace {}: it exists and is not a regular file (a device, FIFO or socket)",
                path.display()
            )
            .into());
        }
        let cache = infer_model::fetch::cache_dir();
        if let (Ok(p), Ok(c)) = (path.canonicalize(), cache.canonicalize()) {
            if p.starts_with(&c) {
                return Err(format!(
                    "refusing to overwrite {}: it is in the model cache ({}); choose another file",
                    path.display(),
                    c.display()
                )
                .into());
            }
        }
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(format!("output directory {} does not exist", dir.display()).into());
        }
        if std::fs::metadata(dir).map(|m| m.permissions().readonly()).unwrap_or(false) {
            return Err(format!("cannot write {}: {} is read-only", path.display(), dir.display()).into());
        }
    }
    Ok(())
}

/// Whether `a` and `b` name the same existing file (through links and
/// relative paths too).
fn same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

pub fn synth(a: SynthArgs) -> CliResult {
    let (shape, quant) = parse_spec(&a.arch, &a.size, &a.quant)?;
    let threads = thread_count(crate::common::threads_asked(a.threads))?;
    check_output(&a.output)?;
    if let Some(src) = &a.tokenizer_from {
        if same_file(src, &a.output) {
            return Err(format!(
                "refusing to overwrite {}: it is the --tokenizer-from input; choose another output file",
                a.output.display()
            )
            .into());
        }
    }
    remove_stale_partials(&a.output);
    // Ctrl-C or SIGTERM while writing removes the temporary file.
    let partial = partial_path(&a.output, std::process::id());
    if let Some(p) = &partial {
        crate::interrupt::remove_on_signal(p);
    }
    let name = shape.model_name.clone();
    let t0 = Instant::now();
    let s = generate_with(&a.output, shape, quant, a.seed, threads, a.tokenizer_from.as_deref(), a.dequantized);
    if let Some(p) = &partial {
        crate::interrupt::keep(p);
    }
    let s = s?;
    let mut out = Out::new();
    writeln!(
        out,
        "wrote {} ({} file, {} of tensors)",
        a.output.display(),
        human_bytes(s.file_bytes),
        human_bytes(s.tensor_bytes)
    )?;
    writeln!(out, "model:   {name}, random weights, {} type mix, seed {}", quant.name().to_uppercase(), a.seed)?;
    writeln!(out, "params:  {} in {} tensors", human_params(s.n_params), s.n_tensors)?;
    for (ty, n, b) in &s.types {
        writeln!(out, "  {:>7}: {n:4} tensors, {:>11}", ty.name().to_uppercase(), human_bytes(*b))?;
    }
    writeln!(out, "time:    {:.1} s with {threads} thread(s)", t0.elapsed().as_secs_f64())?;
    out.flush()?;
    Ok(())
}
