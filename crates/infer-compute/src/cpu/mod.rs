//! The CPU backend: quantized GEMV with run-time-selected SIMD kernels
//! ([`matvec`], [`simd`]), weights repacked for the AVX-512 VNNI and AVX2 products
//! ([`packed`], `weight.rs`), f32 GEMM through faer and the `gemm` crate
//! ([`gemm`]), and the decode pipeline (`model.rs`, `CpuModel`).

pub mod gemm;
pub mod kernels;
pub mod kv_cache;
pub mod kv_rotation;
pub mod matvec;
pub(crate) mod model;
pub mod ops;
// Public for this crate's benchmarks and tests of the SIMD kernels only;
// not part of the API (the prepared model uses them through `weight`).
#[doc(hidden)]
pub mod packed;
#[doc(hidden)]
pub mod simd;
pub mod team;
pub mod tq;
mod tq_window;
pub(crate) mod weight;

use std::sync::Arc;

use ndarray::{Array2, ArrayView2};

use crate::backend::{ComputeBackend, DeviceModel};
use crate::error::{Error, Result};
use crate::pipeline::{LayerSpec, ModelSpec};
use crate::weight::QuantWeight;
pub use kernels::{Kernels, SimdLevel};

/// How the CPU backend computes the quantized products of a prepared model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// As ggml: activations quantized to the weight type's `vec_dot_type`,
    /// integer dot products (fast).
    #[default]
    Quantized,
    /// Weights dequantized to f32 once at `prepare`, f32 activations: the
    /// exact forward pass (slow; for checking against references).
    Exact,
}

/// The CPU backend.
pub struct CpuBackend {
    kernels: Kernels,
    pool: Arc<rayon::ThreadPool>,
    team: Arc<team::Team>,
    threads: usize,
    precision: Precision,
}

impl CpuBackend {
    /// A backend with the best SIMD level of this processor (see
    /// [`Kernels::detect`]) and one thread per available core.
    pub fn new() -> Self {
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Self::with_options(threads, Kernels::detect(), Precision::Quantized).unwrap_or_else(|_| Self::single_threaded())
    }

    fn single_threaded() -> Self {
        // Building a 1-thread pool only fails if the OS refuses a thread.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap_or_else(|_| {
            rayon::ThreadPoolBuilder::new().use_current_thread().num_threads(1).build().expect("current-thread pool")
        });
        let team = Arc::new(team::Team::new(1).expect("a team of one starts no thread"));
        CpuBackend {
            kernels: Kernels::detect(),
            pool: Arc::new(pool),
            team,
            threads: 1,
            precision: Precision::Quantized,
        }
    }

    /// A backend with `threads` worker threads (≥ 1), the given kernel table
    /// and precision.
    ///
    /// # Errors
    /// [`Error::Device`] when the thread pool cannot be created.
    pub fn with_options(threads: usize, kernels: Kernels, precision: Precision) -> Result<Self> {
        let threads = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("infer-cpu-{i}"))
            .build()
            .map_err(|e| Error::Device(format!("cannot start {threads} CPU threads: {e}")))?;
        let team = Arc::new(team::Team::new(threads)?);
        Ok(CpuBackend { kernels, pool: Arc::new(pool), team, threads, precision })
    }

    /// The kernel table in use.
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` inside this backend's thread pool.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl ComputeBackend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device_info(&self) -> String {
        format!(
            "CPU ({}), {} thread(s), kernels: {}, precision: {:?}",
            std::env::consts::ARCH,
            self.threads,
            self.kernels.level().name(),
            self.precision
        )
    }

    fn matmul(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        self.install(|| gemm::matmul(a, b, self.threads))
    }

    fn matmul_transb(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        self.install(|| gemm::matmul_transb(a, b, self.threads))
    }

    fn matvec(&self, w: &QuantWeight, x: &[f32], y: &mut [f32]) -> Result<()> {
        let mut scratch = kernels::AlignedBytes::default();
        self.install(|| matvec::matvec(&self.kernels, w, x, y, &mut scratch))
    }

    fn matmul_quant(&self, w: &QuantWeight, x: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        let n_tokens = x.nrows();
        let x = x.as_standard_layout();
        let xs = x.as_slice().ok_or_else(|| crate::error::shape_err("matmul_quant", "x is not contiguous"))?;
        let mut y = Array2::<f32>::zeros((n_tokens, w.rows));
        let mut scratch = kernels::AlignedBytes::default();
        let ys = y.as_slice_mut().ok_or_else(|| crate::error::shape_err("matmul_quant", "y is not contiguous"))?;
        self.install(|| matvec::matmul_quant(&self.kernels, w, xs, n_tokens, ys, &mut scratch))?;
        Ok(y)
    }

    fn prepare(&self, spec: &ModelSpec) -> Result<Box<dyn DeviceModel>> {
        spec.validate()?;
        let model =
            model::CpuModel::new(spec, self.kernels, self.team.clone(), self.precision).map_err(|e| match e {
                // Say what the whole model needs, not only the failed matrix.
                crate::Error::OutOfMemory { what, bytes } if self.precision == Precision::Exact => {
                    let all: u64 = spec
                        .layers
                        .iter()
                        .flat_map(LayerSpec::matrices)
                        .chain([&spec.output])
                        .map(|w| 4 * w.rows as u64 * w.cols as u64)
                        .sum();
                    let what = format!(
                        "{what} (one of {:.0} MiB of f32 matrices in the exact precision)",
                        all as f64 / (1u64 << 20) as f64
                    );
                    crate::Error::OutOfMemory { what, bytes }
                }
                other => other,
            })?;
        Ok(Box::new(model))
    }
}
