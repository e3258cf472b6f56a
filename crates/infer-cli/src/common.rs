//! Options shared by the subcommands: model path, backend (with llama.cpp's
//! `-ngl` and `-dev`), threads, the one loading sequence of `run`, `chat`
//! and `bench`, and the one rule for contexts longer than the model's
//! training context.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::pipeline::ModelSpec;
use infer_compute::{ComputeBackend, DeviceModel};
use infer_model::fetch::find_model;
use infer_model::fetch::hub::HubRef;
use infer_model::gguf::GgufFile;

/// Where the model comes from and what runs it.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model: a GGUF file, or a known name (`infer models` lists them; any case), fetched, verified and cached on
    /// first use [default: gemma3-270m (chat and serve: smollm2-135m), or $INFER_MODEL]
    #[arg(short, long, value_name = "NAME|FILE|USER/REPO[:QUANT]")]
    pub model: Option<PathBuf>,
    /// A model from Hugging Face, as llama.cpp's -hf: `user/repo[:QUANT]` (default quantization Q4_K_M), downloaded
    /// into the cache on first use (resumable, SHA-256 checked; hub address $HF_ENDPOINT, token $HF_TOKEN).
    #[arg(long = "hf-repo", visible_alias = "hf", value_name = "USER/REPO[:QUANT]", conflicts_with = "model")]
    pub hf_repo: Option<String>,
    /// The file of the Hugging Face repository to take, by name or path in it (llama.cpp's -hff), instead of the
    /// quantization's file; with -hf USER/REPO or -m USER/REPO.
    #[arg(long = "hf-file", value_name = "FILE")]
    pub hf_file: Option<String>,
    /// Compute backend [default: auto].
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// llama.cpp's GPU layers (also -ngl), all or nothing (a model runs wholly on one device): 0 runs on the CPU, any other
    /// number (or `all`, or -1) on the GPU, `auto` as --backend says; without a usable GPU, a warning and the CPU
    /// (bench: a list as llama-bench's, every test for each value).
    #[arg(long = "n-gpu-layers", visible_alias = "gpu-layers", value_name = "N", allow_negative_numbers = true)]
    pub n_gpu_layers: Option<String>,
    /// llama.cpp's devices, a comma list of one backend's (also -dev): `none` or `cpu` runs on the CPU, `cuda` or
    /// `CUDA0` on the first NVIDIA GPU, `auto` as --backend says; --list-devices shows them.
    #[arg(long, value_name = "NAME,...")]
    pub device: Option<String>,
    /// Print the devices the backends of this build can open, one a line with its -dev name, and exit (as
    /// llama.cpp).
    #[arg(long)]
    pub list_devices: bool,
    /// CPU arithmetic: `quantized` (as ggml: 8-bit activations, integer dot
    /// products with the GGUF blocks) or `exact` (weights dequantized to f32
    /// once, f32 activations).
    #[arg(long, value_enum, default_value_t = PrecisionArg::Quantized)]
    pub precision: PrecisionArg,
    /// Read the model file into memory instead of mapping it (for files on
    /// network or removable storage, where a mapped file that shrinks while
    /// in use ends the process with SIGBUS).
    #[arg(long)]
    pub no_mmap: bool,
}

/// The CPU thread count of `run`, `chat` and `info` (`bench` takes a list).
#[derive(Args, Clone, Debug, Default)]
pub struct ThreadArgs {
    /// CPU threads (default, and 0 or less as llama.cpp's -t -1: all cores; at most 4 × the cores, larger values
    /// are capped with a warning).
    #[arg(short, long, value_name = "N", allow_negative_numbers = true)]
    threads: Option<i64>,
}

impl ThreadArgs {
    /// The thread count asked for; `None`: all cores.
    pub fn get(&self) -> Option<usize> {
        threads_asked(self.threads)
    }
}

/// `-t N` as llama.cpp reads it: `N <= 0` means all cores (`None`, as
/// without `-t`).
pub fn threads_asked(n: Option<i64>) -> Option<usize> {
    n.and_then(|n| usize::try_from(n).ok()).filter(|&n| n > 0)
}

/// A clap value parser of a whole number of at least `min`, for options
/// that llama.cpp gives no meaning below it: with `allow_negative_numbers`
/// a negative value is read as a number (not as a flag) and refused with
/// the range, on one line as `invalid value '-1' for '-r <N>': must be at
/// least 1`.
pub fn at_least<T>(min: i128) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<i128>,
{
    move |s: &str| {
        let n: i128 = s.trim().parse().map_err(|_| format!("not a whole number (give {min} or more)"))?;
        if n < min {
            return Err(format!("must be at least {min}"));
        }
        T::try_from(n).map_err(|_| "too large".to_string())
    }
}

/// A clap value parser of a finite number above 0 (`--bandwidth`), a
/// negative one refused with the range.
pub fn positive(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        Ok(_) => Err("must be a number above 0".into()),
        Err(_) => Err("not a number (give a number above 0)".into()),
    }
}

/// Where a model runs, as asked by `--backend`, `-ngl` and `-dev` together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Nothing asked: the best device (`--backend auto`).
    Auto,
    /// The CPU.
    Cpu,
    /// The GPU, required (`--backend cuda`, `-dev cuda`).
    Gpu,
    /// The GPU when there is a usable one, else the CPU with a warning
    /// (llama.cpp's `-ngl N` without a GPU).
    GpuIfAny,
}

/// Backend choice.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The best device available.
    Auto,
    /// The CPU.
    Cpu,
    /// The first NVIDIA GPU (needs a build with `--features cuda`).
    Cuda,
    /// The best Vulkan, Metal or DirectX 12 adapter through wgpu, a software
    /// one (lavapipe) when there is no other (needs `--features wgpu`).
    Wgpu,
}

/// CPU arithmetic.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrecisionArg {
    /// As ggml: 8-bit activations, integer dot products with the GGUF blocks.
    Quantized,
    /// Weights dequantized to f32 once, f32 activations.
    Exact,
}

impl BackendKind {
    /// `auto`, `cpu`, `cuda` or `wgpu`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
        }
    }
}

impl PrecisionArg {
    /// `quantized` or `exact`.
    pub fn name(self) -> &'static str {
        match self {
            PrecisionArg::Quantized => "quantized",
            PrecisionArg::Exact => "exact",
        }
    }
}

/// Most threads per core that `--threads` may ask for: more only adds
/// scheduling overhead (1000 threads on 2 cores made decode 100× slower).
pub const MAX_THREADS_PER_CORE: usize = 4;

/// The cores of this machine (1 when unknown).
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The thread count for `--threads`: all cores by default; 0 is an error;
/// more than the cores warns, more than [`MAX_THREADS_PER_CORE`] × the
/// cores is capped with a warning.
///
/// # Errors
/// `--threads 0`.
pub fn thread_count(requested: Option<usize>) -> CliResult<usize> {
    let cores = cores();
    let Some(threads) = requested else { return Ok(cores) };
    if threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    let max = MAX_THREADS_PER_CORE * cores;
    // Subcommands may ask twice (bench, then its backend): warn once.
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let first = !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed);
    if threads > max {
        if first {
            eprintln!(
                "warning: --threads {threads} is capped at {max} ({MAX_THREADS_PER_CORE} × the {cores} core(s) of this machine)"
            );
        }
        return Ok(max);
    }
    if threads > cores && first {
        eprintln!(
            "warning: --threads {threads} is more than the {cores} core(s) of this machine; expect it to be slower"
        );
    }
    Ok(threads)
}

/// The token limit of `-n N` (`run`, `chat`): `-1` (and llama.cpp's `-2`)
/// means no limit (until the end of generation or a full context).
///
/// # Errors
/// A value below -1.
pub fn n_predict_limit(n: i64) -> CliResult<usize> {
    match n {
        // llama.cpp's -2, "until the context is filled", is the same here:
        // generation ends at a full context either way.
        -1 | -2 => Ok(usize::MAX),
        n if n >= 0 => Ok(n as usize),
        n => Err(format!("-n {n}: give a number of tokens, or -1 for no limit").into()),
    }
}

/// The one rule for context lengths, used by `run` (`-c`) and `bench`
/// (`-p`/`-n`): `requested` positions, 0 meaning the training context;
/// more than the model's training context `n_ctx_train` is clamped to it
/// with a warning naming both (`what` names the option).
pub fn fit_context(requested: usize, n_ctx_train: usize, what: &str) -> usize {
    if requested == 0 {
        return n_ctx_train;
    }
    if requested > n_ctx_train {
        eprintln!(
            "warning: {what} {requested} is more than the model's training context of {n_ctx_train} positions; \
             using {n_ctx_train}"
        );
        return n_ctx_train;
    }
    requested
}

/// The KV cache of `run` and `chat` when `-c` is not given: 4096
/// positions, or the training context when shorter (silently: the user
/// asked for nothing).
const DEFAULT_CTX: usize = 4096;

/// The context length of `run` and `chat` from `-c` (see [`fit_context`])
/// or, without it, [`DEFAULT_CTX`].
///
/// # Errors
/// A negative `-c`: llama.cpp gives negative sizes no meaning either.
pub fn context_size(requested: Option<i64>, n_ctx_train: usize) -> CliResult<usize> {
    Ok(match requested {
        Some(c) if c < 0 => {
            return Err(format!(
                "-c {c}: give a number of positions, or 0 for the model's training context ({n_ctx_train})"
            )
            .into())
        }
        Some(c) => fit_context(usize::try_from(c).unwrap_or(usize::MAX), n_ctx_train, "--ctx-size"),
        None => DEFAULT_CTX.min(n_ctx_train),
    })
}

pub type CliResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

impl ModelArgs {
    /// The model path: `--hf-repo`, or `--model` as a file (an existing path
    /// wins), a known name (fetched and verified on first use) or a Hugging
    /// Face `user/repo[:quant]`, else `$INFER_MODEL`, else the default model.
    pub fn resolve_model(&self) -> CliResult<PathBuf> {
        // `-hff` picks the repository's file instead of the quantization's.
        let hub = |s: &str| -> CliResult<HubRef> {
            let r = HubRef::parse(s)?;
            Ok(match &self.hf_file {
                Some(f) => r.with_file(f),
                None => r,
            })
        };
        if let Some(r) = &self.hf_repo {
            return crate::pull::fetch(&hub(r)?);
        }
        // `$INFER_MODEL` is `-m`'s default and takes what `-m` takes (its
        // files and names through `default_model_path`).
        let env_model = std::env::var_os(infer_model::fetch::MODEL_ENV).filter(|v| !v.is_empty()).map(PathBuf::from);
        let hub_model = self
            .model
            .as_ref()
            .or(env_model.as_ref())
            .and_then(|p| p.to_str())
            .filter(|s| !Path::new(s).exists() && find_model(s).is_none() && HubRef::looks_like(s));
        if let (Some(f), None) = (&self.hf_file, hub_model) {
            return Err(format!(
                "--hf-file {f} names a file of a Hugging Face repository: give the repository with -hf USER/REPO"
            )
            .into());
        }
        match (&self.model, hub_model) {
            // `-m user/repo[:quant]`, when no such file exists: the hub.
            (_, Some(s)) => crate::pull::fetch(&hub(s)?)
                .map_err(|e| format!("no model file {s}; as a Hugging Face model: {e}").into()),
            (Some(p), None) => match p.to_str() {
                Some(s) => Ok(infer_model::fetch::resolve_model(s)?),
                None if p.is_file() => Ok(p.clone()),
                None => Err(format!("model file {} does not exist", p.display()).into()),
            },
            (None, None) => Ok(infer_model::fetch::default_model_path()?),
        }
    }

    /// As [`Self::resolve_model`], with the known model `default` instead
    /// of the default model when neither `--model` nor `$INFER_MODEL` is
    /// given (`chat` defaults to an instruction-tuned model).
    pub fn resolve_model_or(&self, default: &str) -> CliResult<PathBuf> {
        let env_set = std::env::var_os(infer_model::fetch::MODEL_ENV).is_some_and(|v| !v.is_empty());
        if self.model.is_none() && self.hf_repo.is_none() && self.hf_file.is_none() && !env_set {
            return Ok(infer_model::fetch::ensure_model(default)?);
        }
        self.resolve_model()
    }

    /// Opens the model file at `path` (resolved by [`Self::resolve_model`]):
    /// memory-mapped, or read into memory with `--no-mmap`.
    pub fn open_at(&self, path: &Path) -> CliResult<GgufFile> {
        // The reader's errors already name the file.
        Ok(if self.no_mmap { GgufFile::read(path)? } else { GgufFile::open(path)? })
    }

    /// Where the model runs: `--backend`, `-ngl` and `-dev` combined.
    ///
    /// # Errors
    /// A value none of them takes; two of them that disagree (`--backend cpu
    /// -ngl 99`), named with their values.
    pub fn placement(&self) -> CliResult<Placement> {
        // (what the user wrote, what it asks for); `None`: no preference.
        let mut asks: Vec<(String, Option<bool>)> = Vec::new();
        if let Some(b) = self.backend {
            let gpu = match b {
                BackendKind::Auto => None,
                BackendKind::Cpu => Some(false),
                BackendKind::Cuda | BackendKind::Wgpu => Some(true),
            };
            asks.push((format!("--backend {}", b.name()), gpu));
        }
        if let Some(n) = &self.n_gpu_layers {
            let gpu = match n.to_ascii_lowercase().as_str() {
                "auto" => None,
                "all" => Some(true),
                v => match v.parse::<i64>() {
                    Ok(0) => Some(false),
                    Ok(_) => Some(true),
                    Err(_) => {
                        let list = if n.contains(',') { " (a list is for `infer bench`)" } else { "" };
                        return Err(format!(
                            "-ngl {n}: give a number of layers (0: the CPU, any other: the GPU), `all` or `auto`{list}"
                        )
                        .into());
                    }
                },
            };
            asks.push((format!("-ngl {n}"), gpu));
        }
        if let Some(d) = &self.device {
            asks.push((format!("-dev {d}"), devices_are_gpu(d)?));
        }
        let decided: Vec<&(String, Option<bool>)> = asks.iter().filter(|(_, g)| g.is_some()).collect();
        if let Some(w) = decided.windows(2).find(|w| w[0].1 != w[1].1) {
            let (a, b) = (&w[0].0, &w[1].0);
            return Err(format!(
                "{a} and {b} disagree: one asks for the CPU, the other for the GPU (-ngl 0, -dev none and --backend \
                 cpu mean the CPU; any other -ngl, -dev cuda and --backend cuda the GPU)"
            )
            .into());
        }
        Ok(match decided.first() {
            None => Placement::Auto,
            Some((_, Some(false))) => Placement::Cpu,
            // Only -ngl asked for the GPU: as llama.cpp, the CPU when there is none.
            Some(_) if decided.iter().all(|(what, _)| what.starts_with("-ngl")) => Placement::GpuIfAny,
            Some(_) => Placement::Gpu,
        })
    }

    /// The error of a GPU that cannot be opened (`why`), naming the flag
    /// that asked for it (`--backend cuda` or `-dev cuda`) and the CPU in
    /// the same flag's words.
    fn no_gpu(&self, why: &str) -> String {
        match &self.device {
            Some(d) if self.backend != Some(BackendKind::Cuda) => {
                format!("-dev {d}: {why}; use -dev cpu or auto (or leave -dev out)")
            }
            _ => format!("--backend cuda: {why}; use --backend cpu or auto"),
        }
    }

    /// The backend to run on, with `threads` CPU threads (`None`: all
    /// cores).
    pub fn backend(&self, threads: Option<usize>) -> CliResult<Box<dyn ComputeBackend>> {
        let precision = match self.precision {
            PrecisionArg::Quantized => Precision::Quantized,
            PrecisionArg::Exact => Precision::Exact,
        };
        let placement = self.placement()?;
        let count = thread_count(threads)?;
        match placement {
            Placement::Auto if threads.is_none() && precision == Precision::Quantized => {
                warn_simd_env();
                return Ok(infer_compute::default_backend());
            }
            Placement::Gpu | Placement::GpuIfAny if precision == Precision::Exact => {
                return Err("--precision exact runs on the CPU only (use --backend cpu)".into());
            }
            Placement::Gpu if self.backend == Some(BackendKind::Wgpu) => {
                return Ok(infer_compute::backend_by_name("wgpu").map_err(|e| format!("--backend wgpu: {e}"))?);
            }
            Placement::Gpu => return cuda_backend().map_err(|e| self.no_gpu(&e.to_string()).into()),
            Placement::GpuIfAny => match cuda_backend() {
                Ok(b) => return Ok(b),
                Err(e) => {
                    let n = self.n_gpu_layers.as_deref().unwrap_or("");
                    eprintln!("warning: -ngl {n}: no usable GPU ({e}); running on the CPU");
                }
            },
            _ => {}
        }
        warn_simd_env();
        Ok(Box::new(CpuBackend::with_options(count, Kernels::detect(), precision)?))
    }

    /// Opens the model at `path` (resolved by [`Self::resolve_model`]),
    /// reads its architecture, runs `check` on it (the tokenizer, the
    /// prompt: what can fail before the weights are prepared), creates the
    /// backend and prepares the model on it, with a spinner. `run`, `chat`
    /// and `bench` all load through here.
    ///
    /// # Errors
    /// The file's, the architecture's, `check`'s and the backend's errors.
    pub fn load<T>(
        &self,
        path: &Path,
        threads: Option<usize>,
        check: impl FnOnce(&GgufFile, &ModelSpec) -> CliResult<T>,
    ) -> CliResult<(Loaded, T)> {
        let t0 = Instant::now();
        let gguf = self.open_at(path)?;
        let spec = infer_model::model::load_spec(&gguf).map_err(|e| format!("{}: {e}", path.display()))?;
        let backend = self.backend(threads)?;
        let checked = check(&gguf, &spec)?;
        let model = with_spinner("loading model", || backend.prepare(&spec))?;
        let loaded = Loaded { gguf, spec, backend, model, load_time: t0.elapsed() };
        Ok((loaded, checked))
    }
}

/// A model prepared on its backend ([`ModelArgs::load`]).
pub struct Loaded {
    /// The open file (metadata, tokenizer).
    pub gguf: GgufFile,
    /// The architecture read from it.
    pub spec: ModelSpec,
    /// The backend it runs on.
    pub backend: Box<dyn ComputeBackend>,
    /// The prepared model.
    pub model: Box<dyn DeviceModel>,
    /// Opening, checking and preparing, without a download.
    pub load_time: Duration,
}

/// What `-dev NAME,...` asks for, as [`device_is_gpu`] for each name.
///
/// # Errors
/// A name [`device_is_gpu`] refuses; names of different backends (a model
/// runs wholly on one device until partial offload exists).
fn devices_are_gpu(list: &str) -> CliResult<Option<bool>> {
    let names: Vec<&str> = list.split(',').map(str::trim).collect();
    if names.iter().any(|n| n.is_empty()) {
        return Err(format!("-dev {list}: an empty device name (give names separated by commas)").into());
    }
    let asks = names.iter().map(|n| device_is_gpu(n)).collect::<CliResult<Vec<_>>>()?;
    if asks.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!(
            "-dev {list}: these devices are of different backends, and a model runs wholly on one device (no \
             partial offload yet); name devices of one backend (--list-devices shows them)"
        )
        .into());
    }
    Ok(asks[0])
}

/// llama.cpp's `--list-devices`: the devices the backends of this build
/// can open, one a line with the name `-dev` takes (and the CPU, which
/// llama.cpp leaves out but `-dev cpu` selects here).
///
/// # Errors
/// A failed write to standard output.
pub fn list_devices() -> CliResult {
    use std::io::Write;
    // The description without its `CUDA device 0: ` or `wgpu: ` head and
    // the kernels after the first `;`.
    let short = |info: String| {
        let rest = info.split_once(": ").map_or(info.as_str(), |(_, r)| r);
        rest.split(';').next().unwrap_or(rest).trim().to_string()
    };
    let mut lines = Vec::new();
    if let Ok(b) = cuda_backend() {
        lines.push(format!("CUDA0: {}", short(b.device_info())));
    }
    #[cfg(feature = "wgpu")]
    if let Ok(b) = infer_compute::backend_by_name("wgpu") {
        lines.push(format!("wgpu: {} (--backend wgpu)", short(b.device_info())));
    }
    let cpu = crate::bench::cpu_name();
    let cpu = if cpu.is_empty() { std::env::consts::ARCH.to_string() } else { cpu };
    lines.push(format!("CPU: {cpu} ({} cores, {} kernels)", cores(), Kernels::detect().level().name()));
    let mut out = crate::output::Out::new();
    writeln!(out, "Available devices:")?;
    for l in lines {
        writeln!(out, "  {l}")?;
    }
    out.flush()?;
    Ok(())
}

/// What `-dev NAME` asks for: `Some(true)` the GPU, `Some(false)` the CPU,
/// `None` no preference (`auto`).
///
/// # Errors
/// A device this build has no name for, or a GPU other than the first.
fn device_is_gpu(name: &str) -> CliResult<Option<bool>> {
    let lower = name.trim().to_ascii_lowercase();
    match lower.as_str() {
        "auto" => return Ok(None),
        "none" | "cpu" => return Ok(Some(false)),
        "cuda" | "cuda0" | "gpu" => return Ok(Some(true)),
        _ => {}
    }
    if lower.strip_prefix("cuda").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
        return Err(format!("-dev {name}: only the first NVIDIA GPU (CUDA0) can run a model").into());
    }
    Err(format!("-dev {name}: unknown device (choose from none, cpu, cuda, CUDA0, auto)").into())
}

/// Warns when `INFER_CPU_SIMD` names a level this processor lacks (the
/// kernels then fall back to the best level).
fn warn_simd_env() {
    if let Ok(want) = std::env::var("INFER_CPU_SIMD") {
        let levels = infer_compute::cpu::SimdLevel::all_available();
        if !levels.iter().any(|l| l.name() == want) {
            let names: Vec<&str> = levels.iter().map(|l| l.name()).collect();
            eprintln!(
                "warning: INFER_CPU_SIMD={want} is not available here (choose from {}); using the best level",
                names.join(", ")
            );
        }
    }
}

/// Why the GPU cannot run a model on a machine without an NVIDIA driver,
/// the same in builds with and without the `cuda` feature.
const NO_CUDA_DRIVER: &str = "no NVIDIA driver on this machine (libcuda.so could not be loaded)";

/// Whether the NVIDIA driver library can be loaded.
#[cfg(unix)]
fn nvidia_driver_present() -> bool {
    ["libcuda.so.1", "libcuda.so"].iter().any(|name| {
        let Ok(c) = std::ffi::CString::new(*name) else { return false };
        // SAFETY: `c` is a valid C string; a library that loads is closed
        // again at once (loading libcuda runs no user-visible code).
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if h.is_null() {
                false
            } else {
                libc::dlclose(h);
                true
            }
        }
    })
}

#[cfg(not(unix))]
fn nvidia_driver_present() -> bool {
    cfg!(feature = "cuda")
}

#[cfg(feature = "cuda")]
fn cuda_backend() -> CliResult<Box<dyn ComputeBackend>> {
    if !nvidia_driver_present() {
        return Err(NO_CUDA_DRIVER.into());
    }
    Ok(Box::new(infer_compute::cuda::CudaBackend::new(0)?))
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend() -> CliResult<Box<dyn ComputeBackend>> {
    if !nvidia_driver_present() {
        return Err(NO_CUDA_DRIVER.into());
    }
    Err("this build has no CUDA support (rebuild with `--features cuda`)".into())
}

/// A spinner on stderr while `f` runs (hidden when stderr is not a terminal).
///
/// The spinner is advanced by a thread of its own, started only when it is
/// shown; when that thread cannot be started (a process at its memory or
/// thread limit) the spinner stands still and `f` runs all the same.
pub fn with_spinner<T>(msg: &str, f: impl FnOnce() -> T) -> T {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}").unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg.to_string());
    if pb.is_hidden() {
        return f();
    }
    pb.tick();
    let out = std::thread::scope(|s| {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let ticker = pb.clone();
        // Not indicatif's `enable_steady_tick`, whose thread start panics
        // when it fails.
        let _ = std::thread::Builder::new().name("spinner".into()).spawn_scoped(s, move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(Duration::from_millis(100))
            {
                ticker.tick();
            }
        });
        let out = f();
        drop(stop);
        out
    });
    pb.finish_and_clear();
    out
}
