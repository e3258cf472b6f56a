//! Options shared by the subcommands: model path, backend, threads, and
//! the one rule for contexts longer than the model's training context.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::ComputeBackend;
use infer_model::gguf::GgufFile;

/// Where the model comes from and what runs it.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model: a GGUF file, or a known name (`infer models` lists them), fetched, verified and cached on first
    /// use [default: gemma3-270m, or $INFER_MODEL]
    #[arg(short, long, value_name = "NAME|FILE")]
    pub model: Option<PathBuf>,
    /// Compute backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    pub backend: BackendKind,
    /// CPU threads (default: all cores; at most 4 × the cores, larger values
    /// are capped with a warning).
    #[arg(short, long, value_name = "N")]
    pub threads: Option<usize>,
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

/// Backend choice.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The best device available.
    Auto,
    /// The CPU.
    Cpu,
    /// The first NVIDIA GPU (needs a build with `--features cuda`).
    Cuda,
}

/// CPU arithmetic.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrecisionArg {
    /// As ggml: 8-bit activations, integer dot products with the GGUF blocks.
    Quantized,
    /// Weights dequantized to f32 once, f32 activations.
    Exact,
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

/// The token limit of `-n N` (`run`, `chat`): `-1` means no limit (until
/// the end of generation or a full context).
///
/// # Errors
/// A value below -1.
pub fn n_predict_limit(n: i64) -> CliResult<usize> {
    match n {
        -1 => Ok(usize::MAX),
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
pub fn context_size(requested: Option<usize>, n_ctx_train: usize) -> usize {
    match requested {
        Some(c) => fit_context(c, n_ctx_train, "--ctx-size"),
        None => DEFAULT_CTX.min(n_ctx_train),
    }
}

pub type CliResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

impl ModelArgs {
    /// The model path: `--model` as a file (an existing path wins) or a known
    /// name (fetched and verified on first use), else `$INFER_MODEL`, else the
    /// default model.
    pub fn resolve_model(&self) -> CliResult<PathBuf> {
        match &self.model {
            Some(p) => match p.to_str() {
                Some(s) => Ok(infer_model::fetch::resolve_model(s)?),
                None if p.is_file() => Ok(p.clone()),
                None => Err(format!("model file {} does not exist", p.display()).into()),
            },
            None => Ok(infer_model::fetch::default_model_path()?),
        }
    }

    /// Opens the model file: memory-mapped, or read into memory with
    /// `--no-mmap`.
    pub fn open(&self) -> CliResult<GgufFile> {
        self.open_at(&self.resolve_model()?)
    }

    /// Opens the model file at `path` (resolved by [`Self::resolve_model`]):
    /// memory-mapped, or read into memory with `--no-mmap`.
    pub fn open_at(&self, path: &Path) -> CliResult<GgufFile> {
        // The reader's errors already name the file.
        Ok(if self.no_mmap { GgufFile::read(path)? } else { GgufFile::open(path)? })
    }

    /// The backend to run on.
    pub fn backend(&self) -> CliResult<Box<dyn ComputeBackend>> {
        let precision = match self.precision {
            PrecisionArg::Quantized => Precision::Quantized,
            PrecisionArg::Exact => Precision::Exact,
        };
        let threads = thread_count(self.threads)?;
        match self.backend {
            BackendKind::Auto if self.threads.is_none() && precision == Precision::Quantized => {
                warn_simd_env();
                return Ok(infer_compute::default_backend());
            }
            BackendKind::Cuda if precision == Precision::Exact => {
                return Err("--precision exact runs on the CPU only (use --backend cpu)".into());
            }
            BackendKind::Cuda => return cuda_backend(),
            _ => {}
        }
        warn_simd_env();
        Ok(Box::new(CpuBackend::with_options(threads, Kernels::detect(), precision)?))
    }
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

/// The error of `--backend cuda` on a machine without an NVIDIA driver,
/// the same in builds with and without the `cuda` feature.
const NO_CUDA_DRIVER: &str =
    "--backend cuda: no NVIDIA driver on this machine (libcuda.so could not be loaded); use --backend cpu or auto";

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
    Ok(Box::new(infer_compute::cuda::CudaBackend::new(0).map_err(|e| format!("--backend cuda: {e}"))?))
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend() -> CliResult<Box<dyn ComputeBackend>> {
    if !nvidia_driver_present() {
        return Err(NO_CUDA_DRIVER.into());
    }
    Err("--backend cuda: this build has no CUDA support (rebuild with `--features cuda`)".into())
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
