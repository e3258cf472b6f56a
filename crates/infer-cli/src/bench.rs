//! `infer bench`: prefill and decode speed in llama-bench's terms.
//!
//! - `ppP`: one prefill of P random valid token ids from position 0, as
//!   prompt tokens per second;
//! - `tgN`: N decode steps after an empty context (the first token is BOS,
//!   each next one the argmax of the logits, by the backend's
//!   `decode_greedy`: on the CUDA backend the argmax runs on the device and
//!   only the token comes back), as generated tokens per second; a NaN
//!   logit fails the test.
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

use clap::Args;
use infer_compute::pipeline::ModelSpec;
use infer_compute::{DeviceModel, KvPool};
use infer_model::gguf::GgufFile;
use infer_model::synth::{file_type_name, SynthArch};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::common::{fit_context, thread_count, with_spinner, CliResult, ModelArgs, PrecisionArg};
use crate::output::Out;
use crate::synth::{human_bytes, human_params};

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Benchmark a synthetic model instead of a file: a size of Gemma 3
    /// (270m, 1b, 4b, 12b) or `llama-1b`, `llama-8b` (also `gemma3-1b`...).
    /// It is generated with `infer synth` into the cache directory the
    /// first time (seed 0) and reused afterwards.
    #[arg(long, conflicts_with = "model", value_name = "SIZE")]
    synth: Option<String>,
    /// File type of the synthetic model (q4_k_m, q8_0, q4_0).
    #[arg(long, value_name = "TYPE", default_value = "q4_k_m", requires = "synth")]
    synth_quant: String,
    /// Prompt tokens of the prefill test (0: no prefill test).
    #[arg(short = 'p', long = "n-prompt", value_name = "N", default_value_t = 512)]
    n_prompt: usize,
    /// Generated tokens of the decode test (0: no decode test).
    #[arg(short = 'n', long = "n-gen", value_name = "N", default_value_t = 128)]
    n_gen: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", value_name = "N", default_value_t = 5)]
    reps: usize,
    /// Print a JSON array of results instead of tables.
    #[arg(long)]
    json: bool,
    /// Memory bandwidth in GB/s (10^9 bytes) to compare decode against.
    #[arg(long, value_name = "GBPS", conflicts_with = "measure_bandwidth")]
    bandwidth: Option<f64>,
    /// Measure the memory bandwidth: the best of 8 reads of a 1 GiB buffer
    /// by the benchmark's thread count.
    #[arg(long)]
    measure_bandwidth: bool,
    /// Also time each op of a decode step (the model's own decode path, op
    /// by op, over the decode test's positions).
    #[arg(long)]
    profile: bool,
    /// Seed of the prompt's random token ids.
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
    /// Batched mode, as llama-batched-bench: for each count of this comma
    /// list, that many sequences prefill `--npp` tokens each, then
    /// generate `--ntg` tokens each in steps of one batch (aggregate
    /// tokens/s; `--json` prints its JSONL rows).
    #[arg(long = "npl", value_name = "B,B,...", value_delimiter = ',', conflicts_with = "profile")]
    npl: Vec<usize>,
    /// Batched mode: prompt tokens per sequence.
    #[arg(long = "npp", value_name = "N", default_value_t = 128, requires = "npl")]
    npp: usize,
    /// Batched mode: generated tokens per sequence.
    #[arg(long = "ntg", value_name = "N", default_value_t = 128, requires = "npl")]
    ntg: usize,
}

/// One test's result, as printed by `--json`.
#[derive(Serialize, Clone, Debug)]
pub struct TestResult {
    /// llama-bench's model description (`gemma3 270M Q4_K - Medium`).
    pub model: String,
    /// Path of the GGUF file.
    pub model_filename: String,
    /// Bytes of tensor data (llama-bench's `model_size`).
    pub size_bytes: u64,
    /// Parameters (values in all tensors).
    pub params: u64,
    /// Backend name (`CPU`, `CUDA`).
    pub backend: String,
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
    /// Threads the backend ran with.
    pub threads: usize,
    /// `ppP` or `tgN`.
    pub test: String,
    /// Prompt tokens (prefill tests).
    pub n_prompt: usize,
    /// Generated tokens (decode tests).
    pub n_gen: usize,
    /// Timed repetitions.
    pub repetitions: usize,
    /// Mean tokens per second.
    pub avg_ts: f64,
    /// Sample standard deviation of tokens per second.
    pub stddev_ts: f64,
    /// Tokens per second of each repetition.
    pub samples_ts: Vec<f64>,
    /// Mean nanoseconds per repetition.
    pub avg_ns: f64,
    /// Sample standard deviation of the nanoseconds.
    pub stddev_ns: f64,
    /// Nanoseconds of each repetition.
    pub samples_ns: Vec<u64>,
    /// Weight bytes read per decoded token (decode tests only).
    pub bytes_per_token: Option<u64>,
    /// `bytes_per_token · avg_ts` in GB/s (decode tests only).
    pub effective_gbps: Option<f64>,
    /// The bandwidth figure compared against (given or measured), GB/s.
    pub bandwidth_gbps: Option<f64>,
    /// `effective_gbps / bandwidth_gbps` (decode tests with a bandwidth).
    pub roofline_fraction: Option<f64>,
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

/// Index of the largest logit (the first on ties, [`infer_model::sampling::argmax`]);
/// an error for NaN logits, which a benchmark must not time as if they were
/// tokens.
pub fn argmax(logits: &[f32]) -> Result<u32, String> {
    if let Some(i) = logits.iter().position(|z| z.is_nan()) {
        return Err(format!("the model produced a NaN logit (index {i})"));
    }
    infer_model::sampling::argmax(logits).ok_or_else(|| "the model produced no logits".to_string())
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
        for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_up, &l.ffn_down].into_iter().chain(l.ffn_gate.as_ref()) {
            b += size(w);
        }
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

/// Runs the prefill test once; returns nanoseconds.
fn time_prefill(model: &mut dyn DeviceModel, tokens: &[u32]) -> CliResult<u64> {
    let mut kv: Box<dyn KvPool> = model.new_kv_cache(tokens.len())?;
    let t0 = Instant::now();
    let logits = model.prefill(kv.as_mut(), tokens, 0)?;
    let ns = t0.elapsed().as_nanos() as u64;
    argmax(logits)?;
    Ok(ns)
}

/// Runs the decode test once (`n` steps from BOS); returns nanoseconds.
fn time_decode(model: &mut dyn DeviceModel, bos: u32, n: usize) -> CliResult<u64> {
    let mut kv: Box<dyn KvPool> = model.new_kv_cache(n)?;
    let mut token = bos;
    let t0 = Instant::now();
    for pos in 0..n {
        token = model.decode_greedy(kv.as_mut(), token, pos)?;
    }
    Ok(t0.elapsed().as_nanos() as u64)
}

pub fn bench(a: BenchArgs) -> CliResult {
    if a.n_prompt == 0 && a.n_gen == 0 {
        return Err("-p and -n are both 0: nothing to measure".into());
    }
    if a.reps == 0 {
        return Err("--repetitions must be at least 1".into());
    }
    if let Some(bw) = a.bandwidth {
        if !(bw.is_finite() && bw > 0.0) {
            return Err(format!("--bandwidth must be a positive number of GB/s, got {bw}").into());
        }
    }
    let threads = thread_count(a.model.threads)?;
    let path = match &a.synth {
        Some(size) => synth_model(size, &a.synth_quant, threads)?,
        None => a.model.resolve_model()?,
    };
    // The reader's errors name the file already.
    let gguf =
        if a.model.no_mmap { GgufFile::read(&path) } else { GgufFile::open(&path) }.map_err(|e| e.to_string())?;
    let spec = infer_model::model::load_spec(&gguf).map_err(|e| format!("{}: {e}", path.display()))?;
    // The rule of `run -c`: more positions than the training context are
    // clamped to it, with a warning.
    let n_prompt = if a.n_prompt > 0 { fit_context(a.n_prompt, spec.n_ctx_train, "-p") } else { 0 };
    let n_gen = if a.n_gen > 0 { fit_context(a.n_gen, spec.n_ctx_train, "-n") } else { 0 };
    let threads_given = a.model.threads.map(|_| threads);
    let margs = ModelArgs { model: Some(path.clone()), threads: threads_given, ..a.model.clone() };
    let backend = margs.backend()?;
    let mut model = with_spinner("loading model", || backend.prepare(&spec))?;

    let size_bytes: u64 = gguf.tensors().iter().map(|t| t.n_bytes as u64).sum();
    let params: u64 = gguf.tensors().iter().map(|t| t.n_elements()).sum();
    let desc = model_description(&gguf, params);
    let bos = gguf.get_u32("tokenizer.ggml.bos_token_id").unwrap_or(0).min(spec.n_vocab as u32 - 1);
    let exact = a.model.precision == PrecisionArg::Exact;
    let bytes_per_token = decode_bytes_per_token(&spec, exact);
    let kernels = if backend.name() == "cpu" {
        infer_compute::cpu::Kernels::detect().level().name().to_string()
    } else {
        backend.name().to_string()
    };
    let bandwidth = if a.measure_bandwidth {
        Some(with_spinner("measuring memory bandwidth", || measure_bandwidth(threads)))
    } else {
        a.bandwidth
    };
    let base = TestResult {
        model: desc,
        model_filename: path.display().to_string(),
        size_bytes,
        params,
        backend: backend.name().to_uppercase(),
        kernels,
        precision: a.model.precision.name().to_string(),
        synthetic: is_synthetic(&gguf),
        device: backend.device_info(),
        threads,
        test: String::new(),
        n_prompt: 0,
        n_gen: 0,
        repetitions: a.reps,
        avg_ts: 0.0,
        stddev_ts: 0.0,
        samples_ts: Vec::new(),
        avg_ns: 0.0,
        stddev_ns: 0.0,
        samples_ns: Vec::new(),
        bytes_per_token: None,
        effective_gbps: None,
        bandwidth_gbps: bandwidth,
        roofline_fraction: None,
    };
    let finish = |mut r: TestResult, n_tokens: usize, samples_ns: Vec<u64>| -> TestResult {
        let ts: Vec<f64> = samples_ns.iter().map(|&ns| n_tokens as f64 * 1e9 / ns.max(1) as f64).collect();
        let ns: Vec<f64> = samples_ns.iter().map(|&n| n as f64).collect();
        (r.avg_ts, r.stddev_ts) = mean_std(&ts);
        (r.avg_ns, r.stddev_ns) = mean_std(&ns);
        r.samples_ts = ts;
        r.samples_ns = samples_ns;
        r
    };

    if !a.npl.is_empty() {
        let n_kv = a.npp.saturating_add(a.ntg);
        if n_kv > spec.n_ctx_train {
            return Err(
                format!("--npp + --ntg is {n_kv} positions, past the training context {}", spec.n_ctx_train).into()
            );
        }
        let rows = with_spinner("batched", || {
            crate::bench_batched::run(model.as_mut(), a.npp, a.ntg, &a.npl, threads, a.seed)
        })?;
        let what = format!(
            "{} ({}), backend {} ({}), {} threads",
            base.model,
            path.display(),
            base.backend,
            base.kernels,
            threads
        );
        let mut out = Out::new();
        crate::bench_batched::print(&mut out, &rows, &what, a.json)?;
        out.flush()?;
        return Ok(());
    }

    let mut results = Vec::new();
    if n_prompt > 0 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
        let tokens: Vec<u32> = (0..n_prompt).map(|_| rng.gen_range(0..spec.n_vocab as u32)).collect();
        let samples = with_spinner(&format!("pp{}", n_prompt), || -> CliResult<Vec<u64>> {
            time_prefill(model.as_mut(), &tokens)?; // warm-up
            (0..a.reps).map(|_| time_prefill(model.as_mut(), &tokens)).collect()
        })?;
        let r = TestResult { test: format!("pp{}", n_prompt), n_prompt, ..base.clone() };
        results.push(finish(r, n_prompt, samples));
    }
    if n_gen > 0 {
        let samples = with_spinner(&format!("tg{}", n_gen), || -> CliResult<Vec<u64>> {
            time_decode(model.as_mut(), bos, 1)?; // warm-up
            (0..a.reps).map(|_| time_decode(model.as_mut(), bos, n_gen)).collect()
        })?;
        let r = TestResult { test: format!("tg{}", n_gen), n_gen, ..base.clone() };
        let mut r = finish(r, n_gen, samples);
        let eff = bytes_per_token as f64 * r.avg_ts / 1e9;
        r.bytes_per_token = Some(bytes_per_token);
        r.effective_gbps = Some(eff);
        r.roofline_fraction = bandwidth.map(|bw| eff / bw);
        results.push(r);
    }

    let profile = if a.profile {
        let steps = if n_gen > 0 { n_gen } else { 128 }.min(spec.n_ctx_train);
        Some(with_spinner("profiling decode", || crate::profile::profile_decode(model.as_mut(), bos, steps))?)
    } else {
        None
    };

    let mut out = Out::new();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&results)?)?;
        out.flush()?;
        return Ok(());
    }
    print_tables(&mut out, &results)?;
    if let Some(p) = profile {
        let tg_ms = results.iter().find(|r| r.n_gen > 0).map(|r| 1e3 / r.avg_ts);
        writeln!(out)?;
        crate::profile::print_profile(&mut out, &p, &backend.device_info(), tg_ms)?;
    }
    out.flush()?;
    Ok(())
}

/// The llama-bench table (with the kernels and precision that ran), then
/// the decode memory-traffic table.
fn print_tables(out: &mut Out, results: &[TestResult]) -> std::io::Result<()> {
    writeln!(
        out,
        "| {:<42} | {:>10} | {:>10} | {:<7} | {:<11} | {:<9} | {:>7} | {:>15} | {:>20} |",
        "model", "size", "params", "backend", "kernels", "precision", "threads", "test", "t/s"
    )?;
    writeln!(
        out,
        "| {:-<42} | {:->9}: | {:->9}: | {:-<7} | {:-<11} | {:-<9} | {:->6}: | {:->14}: | {:->19}: |",
        "", "", "", "", "", "", "", "", ""
    )?;
    for r in results {
        writeln!(
            out,
            "| {:<42} | {:>10} | {:>10} | {:<7} | {:<11} | {:<9} | {:>7} | {:>15} | {:>20} |",
            r.model,
            human_bytes(r.size_bytes),
            human_params(r.params),
            r.backend,
            r.kernels,
            r.precision,
            r.threads,
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
    fn mean_and_sample_std() {
        assert_eq!(mean_std(&[]), (0.0, 0.0));
        assert_eq!(mean_std(&[5.0]), (5.0, 0.0));
        let (m, s) = mean_std(&[1.0, 2.0, 3.0, 4.0]);
        assert!((m - 2.5).abs() < 1e-12 && (s - 1.290_994_448_735_805_6).abs() < 1e-12);
    }
}
