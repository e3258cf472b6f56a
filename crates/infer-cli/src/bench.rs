//! `infer bench`: prefill and decode speed in llama-bench's terms.
//!
//! - `ppP`: one prefill of P random valid token ids from position 0, as
//!   prompt tokens per second;
//! - `tgN`: N decode steps after an empty context (the first token is BOS,
//!   each next one the argmax of the logits, by the backend's
//!   `decode_greedy`: on the CUDA backend the argmax runs on the device and
//!   only the token comes back), as generated tokens per second; a NaN
//!   logit fails the test. With `--top-k K` each step is instead
//!   `forward_top_k` of K candidates, the best one taken (what `infer serve`
//!   runs for sampled requests: on CUDA the selection runs on the device
//!   and only the K candidates and the row's statistics come back).
//!
//! As llama-bench, `-p`, `-n` and `-t` take lists (`128,512`,
//! `64-512*2`): for each thread count in turn, every prefill test and then
//! every decode test is a row; `-o md|json|jsonl|csv` prints the rows as
//! tables or with llama-bench's field names (then this benchmark's own).
//! The model is loaded once per thread count, through the loading sequence
//! of `run` and `chat` ([`ModelArgs::load`]).
//!
//! Each test is warmed up once (a prefill of P tokens; one decode step) and
//! then repeated `-r` times with a fresh KV cache, created outside the
//! timed region; results are mean ± sample standard deviation over the
//! repetitions, as llama-bench reports them. Decode rows also give the
//! weight bytes read per token (every layer matrix and the output matrix;
//! the embedding table is only looked up; 4 bytes per weight with
//! `--precision exact`, whose weights are f32) and, with a bandwidth
//! figure, the fraction of it reached. Rows name what ran: the backend,
//! its kernels (SIMD level) and precision, and a synthetic model as
//! synthetic.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use infer_compute::backend::TopK;
use infer_compute::pipeline::ModelSpec;
use infer_compute::{Batch, DeviceModel, KvPool, KvTypes};
use infer_model::gguf::GgufFile;
use infer_model::synth::{file_type_name, SynthArch};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::common::{
    at_least, fit_context, positive, thread_count, with_spinner, CliResult, Loaded, ModelArgs, PrecisionArg,
};
use crate::output::Out;
use crate::synth::{human_bytes, human_params};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_value_name = "SERVE", subcommand_help_heading = "Servers")]
pub struct BenchArgs {
    /// `infer bench serve`: load an OpenAI-compatible server instead of a model.
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Benchmark a synthetic model instead of a file: a size of Gemma 3
    /// (270m, 1b, 4b, 12b) or `llama-1b`, `llama-8b` (also `gemma3-1b`...).
    /// It is generated with `infer synth` into the cache directory the
    /// first time (seed 0) and reused afterwards.
    #[arg(long, conflicts_with_all = ["model", "hf_repo", "hf_file"], value_name = "SIZE")]
    synth: Option<String>,
    /// File type of the synthetic model (q4_k_m, q5_k_m, q8_0, q4_0).
    #[arg(long, value_name = "TYPE", default_value = "q4_k_m", requires = "synth")]
    synth_quant: String,
    /// Prompt tokens of the prefill tests, as llama-bench: a comma list of values or ranges `FIRST-LAST[+STEP]`,
    /// `FIRST-LAST*FACTOR` (0: no prefill test).
    #[arg(short = 'p', long = "n-prompt", value_name = "N,...", default_value = "512", allow_hyphen_values = true)]
    n_prompt: String,
    /// Generated tokens of the decode tests, a list as -p (0: no decode test).
    #[arg(short = 'n', long = "n-gen", value_name = "N,...", default_value = "128", allow_hyphen_values = true)]
    n_gen: String,
    /// Positions already in the cache when each test starts, a list as -p (llama-bench's `-d`): the test runs after
    /// an untimed prefill of that many random tokens and is named `pp512 @ d4096`.
    #[arg(short = 'd', long = "n-depth", value_name = "N,...", default_value = "0", allow_hyphen_values = true)]
    n_depth: String,
    /// CPU threads, a list as -p: each count is a row of every test (default: all cores; at most 4 × the cores,
    /// larger values are capped with a warning).
    #[arg(short = 't', long = "threads", value_name = "N,...", allow_hyphen_values = true)]
    threads: Option<String>,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", value_name = "N", default_value_t = 5, allow_negative_numbers = true,
          value_parser = at_least::<usize>(1))]
    reps: usize,
    /// Output format, as llama-bench: `md` (tables), `json` (an array), `jsonl` (one object a line), `csv`
    /// (llama-bench's quoted values, with a header).
    #[arg(short = 'o', long = "output", value_enum, value_name = "FORMAT")]
    output: Option<OutputFormat>,
    /// The same as `-o json`.
    #[arg(long, conflicts_with = "output")]
    json: bool,
    /// Memory bandwidth in GB/s (10^9 bytes) to compare decode against.
    #[arg(long, value_name = "GBPS", conflicts_with = "measure_bandwidth", allow_negative_numbers = true,
          value_parser = positive)]
    bandwidth: Option<f64>,
    /// Measure the memory bandwidth: the best of 8 reads of a 1 GiB buffer
    /// by the benchmark's thread count.
    #[arg(long)]
    measure_bandwidth: bool,
    /// Also time each op of a decode step (the model's own decode path, op
    /// by op, over the decode test's positions after the last -d depth,
    /// with its cache types); with `--npl`, of 8 generation steps of each
    /// batch size.
    #[arg(long)]
    profile: bool,
    /// Decode tests step through `forward_top_k` with this many candidates
    /// (the server's path for sampled requests), taking the best, instead
    /// of the greedy argmax; the rows are named `tgN top-K`.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..=infer_compute::backend::TOP_K_MAX as u64))]
    top_k: Option<u64>,
    /// Seed of the prompt's random token ids.
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true, value_parser = at_least::<u64>(0))]
    seed: u64,
    /// Batched mode, as llama-batched-bench: for each count of this comma
    /// list, that many sequences prefill `--npp` tokens each, then
    /// generate `--ntg` tokens each in steps of one batch (aggregate
    /// tokens/s; `--json` prints its JSONL rows). The single-sequence
    /// tests' -p, -n and -d do not apply (--npp and --ntg size it).
    #[arg(long = "npl", value_name = "B,B,...", value_delimiter = ',', allow_negative_numbers = true,
          value_parser = at_least::<usize>(1), conflicts_with_all = ["n_prompt", "n_gen", "n_depth"])]
    npl: Vec<usize>,
    /// Batched mode: prompt tokens per sequence.
    #[arg(long = "npp", value_name = "N", default_value_t = 128, requires = "npl", allow_negative_numbers = true,
          value_parser = at_least::<usize>(1))]
    npp: usize,
    /// Batched mode: generated tokens per sequence.
    #[arg(long = "ntg", value_name = "N", default_value_t = 128, requires = "npl", allow_negative_numbers = true,
          value_parser = at_least::<usize>(0))]
    ntg: usize,
    #[command(flatten)]
    cache: crate::cache_type::CacheTypeArgs,
}

/// `infer bench`'s subcommands.
#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Load an OpenAI-compatible server (`infer serve`, llama-server) with
    /// concurrent streaming clients: generated tokens/s, requests/s, time to
    /// first token, inter-token and end-to-end latency per concurrency level.
    Serve(crate::bench_serve::ServeBenchArgs),
}

/// `-o`: llama-bench's output formats.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// Markdown tables.
    Md,
    /// A JSON array of results.
    Json,
    /// One JSON object per line.
    Jsonl,
    /// Comma-separated values, a header line first.
    Csv,
}

/// One test's result, as printed by `-o json`: llama-bench's field names
/// where it has the field, then this benchmark's own.
#[derive(Serialize, Clone, Debug, Default)]
pub struct TestResult {
    /// The processor (`model name` of `/proc/cpuinfo`; the backend's
    /// description on the CPU).
    pub cpu_info: String,
    /// The GPU, when the backend runs on one; empty otherwise.
    pub gpu_info: String,
    /// Backend name (`CPU`, `CUDA`).
    pub backends: String,
    /// Path of the GGUF file.
    pub model_filename: String,
    /// llama-bench's model description (`gemma3 270M Q4_K - Medium`).
    pub model_type: String,
    /// Bytes of tensor data.
    pub model_size: u64,
    /// Parameters (values in all tensors).
    pub model_n_params: u64,
    /// Threads the backend ran with.
    pub n_threads: usize,
    /// Layers on the GPU: all of them (the model's layer count) or 0.
    pub n_gpu_layers: usize,
    /// Whether the file was memory-mapped (not `--no-mmap`).
    pub use_mmap: bool,
    /// Prompt tokens (prefill tests).
    pub n_prompt: usize,
    /// Generated tokens (decode tests).
    pub n_gen: usize,
    /// Positions in the cache before the test (`-d`).
    pub n_depth: usize,
    /// When the test started, UTC (`2025-01-31T12:00:00Z`).
    pub test_time: String,
    /// Mean nanoseconds per repetition.
    pub avg_ns: u64,
    /// Sample standard deviation of the nanoseconds.
    pub stddev_ns: u64,
    /// Mean tokens per second.
    pub avg_ts: f64,
    /// Sample standard deviation of tokens per second.
    pub stddev_ts: f64,
    /// Nanoseconds of each repetition.
    pub samples_ns: Vec<u64>,
    /// Tokens per second of each repetition.
    pub samples_ts: Vec<f64>,
    /// `ppP` or `tgN`.
    pub test: String,
    /// The kernels that ran: the CPU's SIMD level (`avx512-vnni`, `avx2`,
    /// `scalar`...) or `cuda`.
    pub kernels: String,
    /// `quantized` (8-bit activations, integer dots) or `exact` (f32 weights
    /// and activations).
    pub precision: String,
    /// Whether the model is a synthetic one (random weights, `infer synth`).
    pub synthetic: bool,
    /// The backend's description of its device and kernels.
    pub device: String,
    /// Timed repetitions.
    pub repetitions: usize,
    /// Weight bytes read per decoded token (decode tests only).
    pub bytes_per_token: Option<u64>,
    /// `bytes_per_token · avg_ts` in GB/s (decode tests only).
    pub effective_gbps: Option<f64>,
    /// The bandwidth figure compared against (given or measured), GB/s.
    pub bandwidth_gbps: Option<f64>,
    /// `effective_gbps / bandwidth_gbps` (decode tests with a bandwidth).
    pub roofline_fraction: Option<f64>,
    /// KV cache type of the keys (llama-bench's `type_k`: `f16`, `q8_0`...).
    pub type_k: String,
    /// KV cache type of the values (llama-bench's `type_v`).
    pub type_v: String,
    /// KV cache bytes per position, keys and values of every layer.
    pub kv_bytes_per_token: u64,
}

/// Mean and sample standard deviation (0 for fewer than two values).
fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// [`infer_compute::greedy_token`] (the first on ties; an error for NaN
/// logits, which a benchmark must not time as if they were tokens), its
/// error naming the first NaN's index.
pub fn argmax(logits: &[f32]) -> Result<u32, String> {
    infer_compute::greedy_token(logits).map_err(|e| match logits.iter().position(|z| z.is_nan()) {
        Some(i) => format!("the model produced a NaN logit (index {i})"),
        None => format!("the model's logits: {e}"),
    })
}

/// Weight bytes one decode step reads: every layer matrix and the output
/// matrix (the embedding table is only looked up; norm weights, a few KB,
/// and the KV cache, which grows with the position, are not counted). With
/// `f32_weights` (`--precision exact`, weights dequantized at load) each
/// weight is 4 bytes; otherwise the GGUF's bytes.
pub fn decode_bytes_per_token(spec: &ModelSpec, f32_weights: bool) -> u64 {
    let size = |w: &infer_compute::QuantWeight| {
        if f32_weights {
            (w.rows as u64) * (w.cols as u64) * 4
        } else {
            w.data.as_bytes().len() as u64
        }
    };
    let mut b = size(&spec.output);
    for l in &spec.layers {
        b += l.matrices().map(size).sum::<u64>();
    }
    b
}

/// Whether `gguf` was written by `infer synth` (its `general.name` says
/// "synthetic, random weights").
pub fn is_synthetic(gguf: &GgufFile) -> bool {
    gguf.get_str("general.name").is_ok_and(|n| n.contains("synthetic"))
}

/// llama-bench's model description: architecture, size label, file type.
pub fn model_description(gguf: &GgufFile, params: u64) -> String {
    let arch = gguf.get_str("general.architecture").unwrap_or("?");
    let size = match gguf.get_str("general.size_label") {
        Ok(s) => s.to_string(),
        Err(_) if params >= 1_000_000_000 => format!("{:.0}B", params as f64 / 1e9),
        Err(_) => format!("{:.0}M", params as f64 / 1e6),
    };
    let ftype = match gguf.get_u32("general.file_type") {
        Ok(t) => file_type_name(t).map_or_else(|| format!("file type {t}"), str::to_string),
        Err(_) => "?".to_string(),
    };
    let synthetic = if is_synthetic(gguf) { " (synthetic)" } else { "" };
    format!("{arch} {size} {ftype}{synthetic}")
}

/// The path of a synthetic model for `--synth SIZE`, generating it into
/// `<cache>/synth/` when it is not there yet.
fn synth_model(size: &str, quant: &str, threads: usize) -> CliResult<PathBuf> {
    let (arch, sz) = match size.split_once('-') {
        Some((a, s)) => (a, s),
        None => ("gemma3", size),
    };
    let (shape, q) = crate::synth::parse_spec(arch, sz, quant)?;
    let dir = infer_model::fetch::cache_dir().join("synth");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let arch_name = shape.arch.name();
    let path = dir.join(format!("{arch_name}-{}-{}-seed0.gguf", sz.to_ascii_lowercase(), q.name()));
    if path.is_file() {
        return Ok(path);
    }
    eprintln!("generating {} (synthetic {} {}, once) ...", path.display(), shape.model_name, q.name());
    if shape.arch == SynthArch::Gemma3 && shape.n_vocab == 262_144 {
        // The tokenizer is copied from the default model.
        infer_model::fetch::default_model_path()?;
    }
    crate::synth::generate(&path, shape, q, 0, threads, None)?;
    Ok(path)
}

/// Sum of `s` read as four interleaved sequential streams (more memory
/// requests in flight than one stream, so closer to the core's bandwidth).
fn read_streams(s: &[u64]) -> u64 {
    let q = s.len() / 4;
    let (a, rest) = s.split_at(q);
    let (b, rest) = rest.split_at(q);
    let (c, d) = rest.split_at(q);
    let mut acc = [0u64; 8];
    let chunks = a.chunks_exact(8).zip(b.chunks_exact(8)).zip(c.chunks_exact(8)).zip(d.chunks_exact(8));
    for (((w, x), y), z) in chunks {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(w[i]).wrapping_add(x[i]).wrapping_add(y[i]).wrapping_add(z[i]);
        }
    }
    acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
}

/// Memory bandwidth in GB/s (10^9 bytes per second): the best of 8 reads
/// of a 1 GiB buffer, split among `threads` threads (each reading its part
/// as four sequential streams). The buffer is written first, so that its
/// pages are real memory, not the shared zero page.
pub fn measure_bandwidth(threads: usize) -> f64 {
    const BYTES: usize = 1 << 30;
    let n = BYTES / 8;
    let mut buf: Vec<u64> = Vec::with_capacity(n);
    buf.extend((0..n as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let part = n.div_ceil(threads.max(1));
    let mut best = f64::INFINITY;
    for _ in 0..8 {
        let t0 = Instant::now();
        let total = std::thread::scope(|s| {
            let handles: Vec<_> = buf.chunks(part).map(|c| s.spawn(move || read_streams(c))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    BYTES as f64 / best / 1e9
}

/// Runs the prefill test once after an untimed prefill of `depth`;
/// returns nanoseconds.
fn time_prefill(model: &mut dyn DeviceModel, depth: &[u32], tokens: &[u32], types: KvTypes) -> CliResult<u64> {
    let mut kv: Box<dyn KvPool> = model.new_kv_cache_typed(depth.len() + tokens.len(), types)?;
    fill_depth(model, kv.as_mut(), depth)?;
    let t0 = Instant::now();
    let logits = model.prefill(kv.as_mut(), tokens, depth.len())?;
    let ns = t0.elapsed().as_nanos() as u64;
    argmax(logits)?;
    Ok(ns)
}

/// Runs the decode test once (`n` steps from BOS, after an untimed
/// prefill of `depth`); returns nanoseconds.
fn time_decode(
    model: &mut dyn DeviceModel,
    depth: &[u32],
    bos: u32,
    n: usize,
    types: KvTypes,
    top_k: Option<usize>,
) -> CliResult<u64> {
    let mut kv: Box<dyn KvPool> = model.new_kv_cache_typed(depth.len() + n, types)?;
    fill_depth(model, kv.as_mut(), depth)?;
    let mut token = bos;
    let mut cands = TopK::new();
    let t0 = Instant::now();
    for pos in depth.len()..depth.len() + n {
        token = match top_k {
            None => model.decode_greedy(kv.as_mut(), token, pos)?,
            Some(k) => {
                model.forward_top_k(
                    kv.as_mut(),
                    &Batch::seq(0, pos, &[token], infer_compute::Out::Last),
                    k,
                    &mut cands,
                )?;
                let row = cands.row(0);
                if row.stats.first_nan.is_some() {
                    return Err("a NaN logit in the decode test".into());
                }
                row.ids[0]
            }
        };
    }
    Ok(t0.elapsed().as_nanos() as u64)
}

/// The untimed part of a test at depth: `depth` prefilled from position 0.
fn fill_depth(model: &mut dyn DeviceModel, kv: &mut dyn KvPool, depth: &[u32]) -> CliResult {
    if !depth.is_empty() {
        model.prefill(kv, depth, 0)?;
    }
    Ok(())
}

/// `n` random token ids below `n_vocab` from `seed` (the prompt and depth tokens).
fn random_tokens(seed: u64, n: usize, n_vocab: usize) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(0..n_vocab as u32)).collect()
}

/// A test of `n` tokens at depth `d` needs `d + n` positions of the
/// model's training context.
fn check_depth(d: usize, n: usize, n_ctx_train: usize) -> CliResult {
    if d > 0 && d + n > n_ctx_train {
        return Err(format!(
            "-d {d} with a test of {n} tokens needs {} positions; the model's context is {n_ctx_train}",
            d + n
        )
        .into());
    }
    Ok(())
}

/// llama-bench's test name: `pp512`, or `pp512 @ d4096` at depth.
fn test_name(kind: &str, n: usize, depth: usize) -> String {
    if depth == 0 {
        format!("{kind}{n}")
    } else {
        format!("{kind}{n} @ d{depth}")
    }
}

/// llama-bench's integer lists: comma-separated values or ranges
/// `FIRST-LAST` (step 1), `FIRST-LAST+STEP`, `FIRST-LAST*FACTOR`. `what`
/// names the option in errors.
///
/// # Errors
/// Anything else, an empty list, a range that does not grow.
pub fn parse_list(s: &str, what: &str) -> Result<Vec<usize>, String> {
    let bad = |why: &str| format!("{what} {s}: {why} (give values or ranges as llama-bench: 128,512 or 64-512*2)");
    let num = |t: &str| t.parse::<usize>().map_err(|_| bad(&format!("'{t}' is not a number >= 0")));
    let mut out = Vec::new();
    for item in s.split(',') {
        // A leading `-` is a minus sign, not a range's: named as written.
        if item.starts_with('-') {
            let least = if what == "-t" { 1 } else { 0 };
            return Err(bad(&format!("{item} is negative; the values are {least} or more")));
        }
        let Some((first, rest)) = item.split_once('-') else {
            out.push(num(item)?);
            continue;
        };
        let first = num(first)?;
        let (last, op, step) = match rest.find(['+', '*']) {
            Some(i) => (num(&rest[..i])?, &rest[i..i + 1], num(&rest[i + 1..])?),
            None => (num(rest)?, "+", 1),
        };
        let mut i = first;
        while i <= last {
            out.push(i);
            let next = if op == "+" { i.checked_add(step) } else { i.checked_mul(step) };
            match next {
                Some(n) if n > i => i = n,
                Some(_) => return Err(bad("a range must grow")),
                None => break,
            }
            if out.len() > 4096 {
                return Err(bad("more than 4096 values"));
            }
        }
    }
    if out.is_empty() {
        return Err(bad("no values"));
    }
    Ok(out)
}

/// The values of `-ngl LIST`: llama-bench's list of numbers and ranges,
/// or, for values it does not take (`all`, `auto`, `-1`), the items between
/// commas as written.
fn ngl_values(list: &str) -> Vec<String> {
    match parse_list(list, "-ngl") {
        Ok(v) => v.iter().map(usize::to_string).collect(),
        Err(_) => list.split(',').map(|n| n.trim().to_string()).collect(),
    }
}

/// The current time as RFC 3339 UTC, llama-bench's `test_time`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    infer_model::chat::strftime(secs, "%Y-%m-%dT%H:%M:%SZ")
}

/// The processor's name from `/proc/cpuinfo` (empty when unknown).
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default()
}

pub fn bench(a: BenchArgs) -> CliResult {
    // llama-bench skips the zeros of its lists.
    let tests = Tests {
        prompts: parse_list(&a.n_prompt, "-p")?.into_iter().filter(|&p| p > 0).collect(),
        gens: parse_list(&a.n_gen, "-n")?.into_iter().filter(|&n| n > 0).collect(),
        depths: parse_list(&a.n_depth, "-d")?,
    };
    if tests.prompts.is_empty() && tests.gens.is_empty() {
        return Err("-p and -n are both 0: nothing to measure".into());
    }
    if a.profile && a.npl.is_empty() && tests.gens.is_empty() {
        return Err("--profile times the steps of the decode test, and -n 0 has none (give -n N)".into());
    }
    let format = if a.json { OutputFormat::Json } else { a.output.unwrap_or(OutputFormat::Md) };
    if !a.npl.is_empty() && format == OutputFormat::Csv {
        return Err("batched mode (--npl) writes md, json or jsonl, as llama-batched-bench does: not -o csv".into());
    }
    // Each thread count given, as given (`None`: all cores).
    let thread_list: Vec<Option<usize>> = match &a.threads {
        Some(t) => parse_list(t, "-t")?.into_iter().map(Some).collect(),
        None => vec![None],
    };
    let counts: Vec<usize> = thread_list.iter().map(|&t| thread_count(t)).collect::<CliResult<_>>()?;
    // llama-bench's -ngl list: every test for each value in turn, each
    // value checked before anything runs.
    let placements: Vec<ModelArgs> = match &a.model.n_gpu_layers {
        Some(list) => ngl_values(list)
            .into_iter()
            .map(|n| {
                let m = ModelArgs { n_gpu_layers: Some(n), ..a.model.clone() };
                m.placement().map(|_| m)
            })
            .collect::<CliResult<_>>()?,
        None => vec![a.model.clone()],
    };
    let path = match &a.synth {
        Some(size) => synth_model(size, &a.synth_quant, counts[0])?,
        None => a.model.resolve_model()?,
    };
    let bandwidth = if a.measure_bandwidth {
        Some(with_spinner("measuring memory bandwidth", || measure_bandwidth(counts[0])))
    } else {
        a.bandwidth
    };
    let cpu = cpu_name();
    let mut results = Vec::new();
    let mut profile = None;
    let runs = placements.iter().flat_map(|m| thread_list.iter().zip(&counts).map(move |(&t, &n)| (m, t, n)));
    for (model_args, threads_given, threads) in runs {
        let (loaded, ()) = model_args.load(&path, threads_given, |_, _| Ok(()))?;
        let base = base_result(&a, &loaded, &path, threads, &cpu, bandwidth)?;
        let Loaded { gguf, spec, backend, mut model, .. } = loaded;
        let kv_types = a.cache.types_for(model.as_ref());
        if !a.npl.is_empty() {
            batched(&a, model.as_mut(), &base, &spec, format)?;
            continue;
        }
        let bos = gguf.get_u32("tokenizer.ggml.bos_token_id").unwrap_or(0).min(spec.n_vocab as u32 - 1);
        // The rule of `run -c` (warned once).
        let warn = results.is_empty();
        let last_tg_ms = run_tests(&a, &tests, model.as_mut(), &spec, &base, warn, bos, kv_types, &mut results)?;
        // The profile of the first thread count's model, at the last depth
        // (the decode test's own positions and cache types).
        if a.profile && profile.is_none() {
            let p = profile_step(&a, &tests, model.as_mut(), &spec, bos, kv_types)?;
            profile = Some((p, backend.device_info(), last_tg_ms));
        }
    }
    if !a.npl.is_empty() {
        return Ok(());
    }
    let mut out = Out::new();
    match format {
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(&results)?)?,
        OutputFormat::Jsonl => {
            for r in &results {
                writeln!(out, "{}", serde_json::to_string(r)?)?;
            }
        }
        OutputFormat::Csv => print_csv(&mut out, &results)?,
        OutputFormat::Md => {
            let ngl = a.model.n_gpu_layers.is_some() || results.iter().any(|r| !r.gpu_info.is_empty());
            print_tables(&mut out, &results, ngl)?;
            if let Some((p, device, tg_ms)) = profile {
                writeln!(out)?;
                crate::profile::print_profile(&mut out, &p, &device, tg_ms)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// The lists of `-p`, `-n` and `-d` (zeros of `-p` and `-n` skipped).
struct Tests {
    prompts: Vec<usize>,
    gens: Vec<usize>,
    depths: Vec<usize>,
}

impl Tests {
    /// The depth `--profile` runs at, and the decode row it compares with:
    /// the last of `-d`.
    fn profile_depth(&self) -> usize {
        self.depths.last().copied().unwrap_or(0)
    }
}

/// The fields of every row of one loaded model: what ran where, on
/// `threads` threads (`cpu`: the host's name, given beside a GPU's), and
/// the `bandwidth` figure (GB/s); the per-test fields are empty.
fn base_result(
    a: &BenchArgs,
    loaded: &Loaded,
    path: &std::path::Path,
    threads: usize,
    cpu: &str,
    bandwidth: Option<f64>,
) -> CliResult<TestResult> {
    let Loaded { gguf, spec, backend, model, .. } = loaded;
    let size_bytes: u64 = gguf.tensors().iter().map(|t| t.n_bytes as u64).sum();
    let params: u64 = gguf.tensors().iter().map(|t| t.n_elements()).sum();
    let kv_types = a.cache.types_for(model.as_ref());
    let on_cpu = backend.name() == "cpu";
    let kernels = if on_cpu {
        infer_compute::cpu::Kernels::detect().level().name().to_string()
    } else {
        backend.name().to_string()
    };
    Ok(TestResult {
        cpu_info: if on_cpu || cpu.is_empty() { backend.device_info() } else { cpu.to_string() },
        gpu_info: if on_cpu { String::new() } else { backend.device_info() },
        backends: backend.name().to_uppercase(),
        model_filename: path.display().to_string(),
        model_type: model_description(gguf, params),
        model_size: size_bytes,
        model_n_params: params,
        n_threads: threads,
        n_gpu_layers: if on_cpu { 0 } else { spec.layers.len() },
        use_mmap: !a.model.no_mmap,
        kernels,
        precision: a.model.precision.name().to_string(),
        synthetic: is_synthetic(gguf),
        device: backend.device_info(),
        repetitions: a.reps,
        bandwidth_gbps: bandwidth,
        type_k: kv_types.k.name().into(),
        type_v: kv_types.v.name().into(),
        kv_bytes_per_token: model.new_kv_cache_typed(1, kv_types)?.bytes_per_token(),
        // The test's fields.
        ..TestResult::default()
    })
}

/// `r` with the rates of `samples_ns` (each the time of `n_tokens`).
fn with_samples(mut r: TestResult, n_tokens: usize, samples_ns: Vec<u64>) -> TestResult {
    let ts: Vec<f64> = samples_ns.iter().map(|&ns| n_tokens as f64 * 1e9 / ns.max(1) as f64).collect();
    let ns: Vec<f64> = samples_ns.iter().map(|&n| n as f64).collect();
    (r.avg_ts, r.stddev_ts) = mean_std(&ts);
    let (avg_ns, stddev_ns) = mean_std(&ns);
    (r.avg_ns, r.stddev_ns) = (avg_ns.round() as u64, stddev_ns.round() as u64);
    r.samples_ts = ts;
    r.samples_ns = samples_ns;
    r
}

/// Every prefill and then every decode test at each depth, in
/// llama-bench's order, appended to `results`; returns the time of a
/// decode step at the last depth (ms), for the profile's comparison.
/// `warn`: say when a length is clamped to the training context.
#[allow(clippy::too_many_arguments)]
fn run_tests(
    a: &BenchArgs,
    tests: &Tests,
    model: &mut dyn DeviceModel,
    spec: &ModelSpec,
    base: &TestResult,
    warn: bool,
    bos: u32,
    kv_types: KvTypes,
    results: &mut Vec<TestResult>,
) -> CliResult<Option<f64>> {
    // The rule of `run -c`: more positions than the training context are
    // clamped to it.
    let fit =
        |n: usize, what: &str| if warn { fit_context(n, spec.n_ctx_train, what) } else { n.min(spec.n_ctx_train) };
    let bytes_per_token = decode_bytes_per_token(spec, a.model.precision == PrecisionArg::Exact);
    let top_k = a.top_k.map(|k| k as usize);
    let threads = base.n_threads;
    let mut last_tg_ms = None;
    let profile_depth = tests.profile_depth();
    for &d in &tests.depths {
        let depth = random_tokens(a.seed.wrapping_add(1), d, spec.n_vocab);
        for &p in &tests.prompts {
            let n_prompt = fit(p, "-p");
            check_depth(d, n_prompt, spec.n_ctx_train)?;
            let tokens = random_tokens(a.seed, n_prompt, spec.n_vocab);
            let test_time = utc_now();
            let name = test_name("pp", n_prompt, d);
            let samples = with_spinner(&format!("{name}, {threads} threads"), || -> CliResult<Vec<u64>> {
                time_prefill(model, &[], &tokens, kv_types)?; // warm-up
                (0..a.reps).map(|_| time_prefill(model, &depth, &tokens, kv_types)).collect()
            })?;
            let r = TestResult { test: name, n_prompt, n_depth: d, test_time, ..base.clone() };
            results.push(with_samples(r, n_prompt, samples));
        }
        for &g in &tests.gens {
            let n_gen = fit(g, "-n");
            check_depth(d, n_gen, spec.n_ctx_train)?;
            let test_time = utc_now();
            let mut name = test_name("tg", n_gen, d);
            if let Some(k) = top_k {
                name += &format!(" top-{k}");
            }
            let samples = with_spinner(&format!("{name}, {threads} threads"), || -> CliResult<Vec<u64>> {
                time_decode(model, &[], bos, 1, kv_types, top_k)?; // warm-up
                (0..a.reps).map(|_| time_decode(model, &depth, bos, n_gen, kv_types, top_k)).collect()
            })?;
            let r = TestResult { test: name, n_gen, n_depth: d, test_time, ..base.clone() };
            let mut r = with_samples(r, n_gen, samples);
            let eff = bytes_per_token as f64 * r.avg_ts / 1e9;
            r.bytes_per_token = Some(bytes_per_token);
            r.effective_gbps = Some(eff);
            r.roofline_fraction = base.bandwidth_gbps.map(|bw| eff / bw);
            if d == profile_depth {
                last_tg_ms = Some(1e3 / r.avg_ts);
            }
            results.push(r);
        }
    }
    Ok(last_tg_ms)
}

/// `--profile`: the first decode test's steps timed per kernel at the
/// last depth.
fn profile_step(
    a: &BenchArgs,
    tests: &Tests,
    model: &mut dyn DeviceModel,
    spec: &ModelSpec,
    bos: u32,
    kv_types: KvTypes,
) -> CliResult<crate::profile::Profile> {
    let profile_depth = tests.profile_depth();
    let steps = tests.gens.first().copied().unwrap_or(1).min(spec.n_ctx_train);
    let depth = random_tokens(a.seed.wrapping_add(1), profile_depth, spec.n_vocab);
    with_spinner("profiling decode", || -> CliResult<crate::profile::Profile> {
        let mut kv = model.new_kv_cache_typed(profile_depth + steps, kv_types)?;
        fill_depth(model, kv.as_mut(), &depth)?;
        crate::profile::profile_decode(model, kv.as_mut(), bos, profile_depth..profile_depth + steps)
    })
}

/// The batched mode (`--npl`) on `model`: llama-batched-bench's table, or
/// its JSONL rows for `-o json|jsonl`.
fn batched(
    a: &BenchArgs,
    model: &mut dyn DeviceModel,
    base: &TestResult,
    spec: &ModelSpec,
    format: OutputFormat,
) -> CliResult {
    let n_kv = a.npp.saturating_add(a.ntg);
    if n_kv > spec.n_ctx_train {
        return Err(format!("--npp + --ntg is {n_kv} positions, past the training context {}", spec.n_ctx_train).into());
    }
    let threads = base.n_threads;
    let types = a.cache.types_for(&*model);
    let rows = with_spinner(&format!("batched, {threads} threads"), || {
        crate::bench_batched::run(model, types, a.npp, a.ntg, &a.npl, threads, a.seed)
    })?;
    let what = format!(
        "{} ({}), backend {} ({}), {threads} threads, KV cache K {}, V {}",
        base.model_type,
        base.model_filename,
        base.backends,
        base.kernels,
        types.k.name(),
        types.v.name()
    );
    let mut out = Out::new();
    let json = matches!(format, OutputFormat::Json | OutputFormat::Jsonl);
    crate::bench_batched::print(&mut out, &rows, &what, json)?;
    if a.profile && !json {
        // One table per batch size: 8 steps after the prompts.
        for (&pl, r) in a.npl.iter().zip(&rows) {
            let p = with_spinner(&format!("profiling {pl} sequences"), || {
                crate::bench_batched::profile(model, types, a.npp, 8.min(a.ntg.max(1)), pl, a.seed)
            })?;
            let heading = format!(
                "step profile: {} steps of {pl} sequences after {}-token prompts on {}, each op timed as it runs",
                p.steps,
                a.npp,
                if base.gpu_info.is_empty() { &base.cpu_info } else { &base.gpu_info }
            );
            writeln!(out)?;
            crate::profile::print_table(&mut out, &p, &heading, "step")?;
            let tg_ms = (r.tg > 0).then(|| r.t_tg * 1e3 / r.tg as f64);
            crate::profile::print_total(&mut out, &p, "step", tg_ms)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// The CSV columns: [`TestResult`]'s fields in their order, without the
/// per-repetition samples (as llama-bench leaves them out).
const CSV_FIELDS: &[&str] = &[
    "cpu_info",
    "gpu_info",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_threads",
    "n_gpu_layers",
    "use_mmap",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
    "test",
    "kernels",
    "precision",
    "synthetic",
    "device",
    "repetitions",
    "bytes_per_token",
    "effective_gbps",
    "bandwidth_gbps",
    "roofline_fraction",
    "type_k",
    "type_v",
    "kv_bytes_per_token",
];

/// llama-bench's CSV: a header of the field names, then one line per test
/// with every value in double quotes (quotes doubled, booleans as 0 and 1,
/// an absent value empty).
fn print_csv(out: &mut Out, results: &[TestResult]) -> CliResult {
    writeln!(out, "{}", CSV_FIELDS.join(","))?;
    for r in results {
        let serde_json::Value::Object(row) = serde_json::to_value(r)? else {
            return Err("a result is not an object".into());
        };
        let values: Vec<String> = CSV_FIELDS
            .iter()
            .map(|f| {
                let v = match row.get(*f) {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(serde_json::Value::Bool(b)) => u8::from(*b).to_string(),
                    Some(serde_json::Value::Null) | None => String::new(),
                    Some(v) => v.to_string(),
                };
                format!("\"{}\"", v.replace('"', "\"\""))
            })
            .collect();
        writeln!(out, "{}", values.join(","))?;
    }
    Ok(())
}

/// The llama-bench table (with the kernels and precision that ran; an
/// `ngl` column, as llama-bench's, when `ngl` says so: an `-ngl` list or a
/// GPU), then the decode memory-traffic table.
fn print_tables(out: &mut Out, results: &[TestResult], ngl: bool) -> std::io::Result<()> {
    // The column after `backend`, or nothing.
    let ngl_cell = |v: &str| if ngl { format!(" {v:>3} |") } else { String::new() };
    writeln!(
        out,
        "| {:<42} | {:>10} | {:>10} | {:<7} |{} {:<11} | {:<9} | {:>7} | {:>15} | {:>20} |",
        "model",
        "size",
        "params",
        "backend",
        ngl_cell("ngl"),
        "kernels",
        "precision",
        "threads",
        "test",
        "t/s"
    )?;
    writeln!(
        out,
        "| {:-<42} | {:->9}: | {:->9}: | {:-<7} |{} {:-<11} | {:-<9} | {:->6}: | {:->14}: | {:->19}: |",
        "",
        "",
        "",
        "",
        ngl_cell("--:"),
        "",
        "",
        "",
        "",
        ""
    )?;
    for r in results {
        writeln!(
            out,
            "| {:<42} | {:>10} | {:>10} | {:<7} |{} {:<11} | {:<9} | {:>7} | {:>15} | {:>20} |",
            r.model_type,
            human_bytes(r.model_size),
            human_params(r.model_n_params),
            r.backends,
            ngl_cell(&r.n_gpu_layers.to_string()),
            r.kernels,
            r.precision,
            r.n_threads,
            r.test,
            format!("{:.2} ± {:.2}", r.avg_ts, r.stddev_ts)
        )?;
    }
    let decode: Vec<&TestResult> = results.iter().filter(|r| r.bytes_per_token.is_some()).collect();
    if decode.is_empty() {
        return out.flush();
    }
    writeln!(out)?;
    writeln!(
        out,
        "| {:>15} | {:>16} | {:>14} | {:>14} | {:>12} |",
        "test", "weight B/token", "eff. GB/s", "bandwidth GB/s", "% of BW"
    )?;
    writeln!(out, "| {:->14}: | {:->15}: | {:->13}: | {:->13}: | {:->11}: |", "", "", "", "", "")?;
    for r in &decode {
        let bw = r.bandwidth_gbps.map_or_else(|| "-".to_string(), |b| format!("{b:.1}"));
        let frac = r.roofline_fraction.map_or_else(|| "-".to_string(), |f| format!("{:.1} %", f * 100.0));
        writeln!(
            out,
            "| {:>15} | {:>16} | {:>14.2} | {:>14} | {:>12} |",
            r.test,
            human_bytes(r.bytes_per_token.unwrap_or(0)),
            r.effective_gbps.unwrap_or(0.0),
            bw,
            frac
        )?;
    }
    writeln!(out)?;
    let weights = if decode.iter().any(|r| r.precision == "exact") {
        "f32 weights (--precision exact: 4 bytes per weight)"
    } else {
        "the GGUF's quantized bytes"
    };
    writeln!(
        out,
        "weight B/token: every layer matrix and the output matrix, read once per decoded token, as {weights} \
         (the KV cache is not counted); eff. GB/s = weight B/token × t/s; bandwidth: {}",
        if results.iter().any(|r| r.bandwidth_gbps.is_some()) {
            "as given (--bandwidth) or measured (--measure-bandwidth: best 1 GiB read with the same threads)"
        } else {
            "none given (--bandwidth GBPS or --measure-bandwidth)"
        }
    )?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_first_of_ties_and_nan() {
        let mut v: Vec<f32> = (0..37).map(|i| (i % 7) as f32).collect();
        assert_eq!(argmax(&v), Ok(6));
        v[36] = 9.0; // in the tail after the 16-wide chunks
        assert_eq!(argmax(&v), Ok(36));
        v[20] = f32::NAN;
        assert!(argmax(&v).unwrap_err().contains("index 20"));
        assert_eq!(argmax(&[-3.0, -1.0, -1.0]), Ok(1));
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), Ok(0));
    }

    #[test]
    fn csv_fields_are_every_scalar_field() {
        // Every field, None and empty ones included, is serialized.
        let r = TestResult::default();
        let serde_json::Value::Object(m) = serde_json::to_value(&r).unwrap() else { panic!() };
        let mut scalar: Vec<&str> = m.iter().filter(|(_, v)| !v.is_array()).map(|(k, _)| k.as_str()).collect();
        let mut fields = CSV_FIELDS.to_vec();
        scalar.sort_unstable();
        fields.sort_unstable();
        assert_eq!(scalar, fields);
    }

    #[test]
    fn lists_and_ranges_as_llama_bench() {
        assert_eq!(parse_list("512", "-p").unwrap(), [512]);
        assert_eq!(parse_list("128,512", "-p").unwrap(), [128, 512]);
        assert_eq!(parse_list("1-4", "-t").unwrap(), [1, 2, 3, 4]);
        assert_eq!(parse_list("100-400+100,7", "-p").unwrap(), [100, 200, 300, 400, 7]);
        assert_eq!(parse_list("64-512*2", "-p").unwrap(), [64, 128, 256, 512]);
        assert!(parse_list("", "-p").unwrap_err().contains("'' is not a number"));
        assert!(parse_list("0-8*2", "-p").unwrap_err().contains("a range must grow"));
        assert!(parse_list("4-2", "-p").unwrap_err().contains("no values"));
        let e = parse_list("-8", "-p").unwrap_err();
        assert!(e.starts_with("-p -8: -8 is negative; the values are 0 or more"), "{e}");
        assert!(parse_list("128,-5", "-n").unwrap_err().contains("-5 is negative"));
        assert!(parse_list("-1", "-t").unwrap_err().contains("-1 is negative; the values are 1 or more"));
    }

    #[test]
    fn depth_tests_are_named_and_bounded_as_llama_bench() {
        assert_eq!(test_name("pp", 512, 0), "pp512");
        assert_eq!(test_name("tg", 128, 4096), "tg128 @ d4096");
        assert!(check_depth(0, 9000, 8192).is_ok(), "depth 0 keeps the -p rule (clamped elsewhere)");
        assert!(check_depth(4096, 4096, 8192).is_ok());
        let e = check_depth(4096, 4097, 8192).unwrap_err().to_string();
        assert!(e.contains("8193") && e.contains("8192"), "{e}");
        assert_eq!(random_tokens(7, 5, 10), random_tokens(7, 5, 10));
        assert!(random_tokens(7, 100, 10).iter().all(|&t| t < 10));
    }

    #[test]
    fn mean_and_sample_std() {
        assert_eq!(mean_std(&[]), (0.0, 0.0));
        assert_eq!(mean_std(&[5.0]), (5.0, 0.0));
        let (m, s) = mean_std(&[1.0, 2.0, 3.0, 4.0]);
        assert!((m - 2.5).abs() < 1e-12 && (s - 1.290_994_448_735_805_6).abs() < 1e-12);
    }
}
