//! Options shared by the subcommands: model path, backend, threads.

use std::path::PathBuf;
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
    /// CPU threads (default: all cores).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// CPU arithmetic: `quantized` (as ggml, fast) or `exact` (weights
    /// dequantized to f32, f32 activations).
    #[arg(long, value_enum, default_value_t = PrecisionArg::Quantized)]
    pub precision: PrecisionArg,
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
    Quantized,
    Exact,
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

    /// Opens the model file (memory-mapped).
    pub fn open(&self) -> CliResult<GgufFile> {
        let path = self.resolve_model()?;
        // The reader's errors already name the file.
        Ok(GgufFile::open(&path)?)
    }

    /// The backend to run on.
    pub fn backend(&self) -> CliResult<Box<dyn ComputeBackend>> {
        let precision = match self.precision {
            PrecisionArg::Quantized => Precision::Quantized,
            PrecisionArg::Exact => Precision::Exact,
        };
        match self.backend {
            BackendKind::Auto if self.threads.is_none() && precision == Precision::Quantized => {
                warn_simd_env();
                return Ok(infer_compute::default_backend());
            }
            BackendKind::Cuda => return cuda_backend(),
            _ => {}
        }
        let threads =
            self.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        if threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        if threads > cores {
            eprintln!(
                "warning: --threads {threads} is more than the {cores} core(s) of this machine; expect it to be slower"
            );
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

#[cfg(feature = "cuda")]
fn cuda_backend() -> CliResult<Box<dyn ComputeBackend>> {
    Ok(Box::new(infer_compute::cuda::CudaBackend::new(0)?))
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend() -> CliResult<Box<dyn ComputeBackend>> {
    Err("this build has no CUDA support (rebuild with `--features cuda`)".into())
}

/// A spinner on stderr while `f` runs (hidden when stderr is not a terminal).
pub fn with_spinner<T>(msg: &str, f: impl FnOnce() -> T) -> T {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}").unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(100));
    let out = f();
    pb.finish_and_clear();
    out
}
