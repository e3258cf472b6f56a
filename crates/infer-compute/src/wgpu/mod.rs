//! The portable GPU backend (feature `wgpu`): one set of WGSL kernels run
//! through wgpu on Vulkan (Linux, Windows, Android; here also Mesa's
//! lavapipe on the CPU), Metal (Apple) and DirectX 12.
//!
//! - [`WgpuBackend::new`] opens the best adapter once and reads its limits
//!   and features ([`Caps`]); no adapter is an [`Error::Device`], never a
//!   panic, and a limit a model passes is the contract's unsupported error
//!   naming it (`max_storage_buffer_binding_size`, ...).
//! - Kernels are the `.wgsl` files of `shaders/`, one per op family, the
//!   products and the embedding composed per weight type with the type's
//!   `load4` (four consecutive weights, `shaders/types/`), and with subgroup reductions where the
//!   adapter has them or workgroup-memory ones otherwise
//!   ([`shaders::compose`]). A naga test validates every composition and
//!   translates it to MSL and HLSL, so a shader Metal would reject fails CI.
//! - Products dequantize four weights at a time in the shader and dot
//!   them with f32 activations (no activation quantization), f32
//!   accumulation: a workgroup per row and tile of four tokens below eight
//!   tokens (neighbouring invocations on neighbouring words), and
//!   from eight on 16 rows × 16 tokens per workgroup (four invocations per
//!   row) with the activations staged in workgroup memory.
//! - Every result comes back through one checked function
//!   (`Gpu::read_back`: length and alignment checked, errors not
//!   panics); validation and out-of-memory reports of wgpu are caught by
//!   error scopes and returned as [`Error`]s.
//! - The pipeline ([`WgpuModel`]) uploads the weights once, allocates its
//!   scratch once per capacity, keeps a KV pool on the device (K and V
//!   each f32, f16 (the default), q8_0 or q4_0, the quantized ones rotated
//!   and quantized bit for bit as on the CPU; [`WgpuKvPool`]), and
//!   records each pass of a forward step into one command buffer with one
//!   submit; only the wanted logits come back.
//!
//! Weight types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL,
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (Q8_1 and Q8_K are activation formats:
//! [`Error::Unsupported`]).

pub(crate) mod context;
mod kv_pool;
mod kv_tq;
mod model;
pub mod shaders;
mod step;
mod weights;

use ndarray::{Array2, ArrayView2};

use context::Gpu;
pub use context::{Caps, Options};
pub use kv_pool::WgpuKvPool;
pub use model::WgpuModel;
use shaders::{Kernel, Variant};
use step::{Step, P};
use weights::{check_x, record_matvec, DevWeight, ProductIo};

use crate::backend::{ComputeBackend, DeviceModel};
use crate::error::{shape_err, Error, Result};
use crate::pipeline::ModelSpec;
use crate::weight::QuantWeight;

/// A wgpu adapter behind the [`ComputeBackend`] trait. Shareable between
/// threads: wgpu's device and queue are, and each call records and submits
/// its own command buffer.
pub struct WgpuBackend {
    gpu: std::sync::Arc<Gpu>,
}

impl WgpuBackend {
    /// Opens the best adapter with default options (subgroup reductions
    /// where the adapter has them; a software adapter when nothing else is
    /// found).
    ///
    /// # Errors
    /// As [`WgpuBackend::with_options`].
    pub fn new() -> Result<Self> {
        Self::with_options(Options::default())
    }

    /// Opens the best adapter with `opts`.
    ///
    /// # Errors
    /// [`Error::Device`] when no adapter is found (or only software ones
    /// and `opts.hardware_only`), or the device cannot be opened.
    pub fn with_options(opts: Options) -> Result<Self> {
        match std::panic::catch_unwind(|| Gpu::open(opts)) {
            Ok(r) => Ok(WgpuBackend { gpu: std::sync::Arc::new(r?) }),
            Err(_) => Err(Error::Device("wgpu initialization panicked".into())),
        }
    }

    /// The adapter's limits and features, as read when it was opened.
    pub fn caps(&self) -> &Caps {
        &self.gpu.caps
    }

    /// Whether the kernels use subgroup reductions.
    pub fn uses_subgroups(&self) -> bool {
        self.gpu.subgroups
    }

    /// [`ComputeBackend::prepare`] returning the concrete model.
    ///
    /// # Errors
    /// As [`ComputeBackend::prepare`].
    pub fn prepare_wgpu(&self, spec: &ModelSpec) -> Result<WgpuModel> {
        WgpuModel::new(self.gpu.clone(), spec)
    }

    /// `n_tok` rows of `x` times `wᵀ`, read back as `n_tok × w.rows`.
    fn product(&self, w: &QuantWeight, x: &[f32], n_tok: usize, out: &mut [f32]) -> Result<()> {
        let g = &*self.gpu;
        let dw = DevWeight::upload(g, w, "weight")?;
        if out.is_empty() {
            return Ok(());
        }
        let xb = g.upload_f32("activations", x)?;
        let yb = g.storage("results", (out.len() * 4) as u64)?;
        let mut step = Step::new(g);
        let io = ProductIo { x: &xb, x_off: 0, x_stride: w.cols, n_tok, y: &yb, y_off: 0, y_stride: w.rows, cap: 0.0 };
        record_matvec(&mut step, &dw, io)?;
        let enc = step.encode()?;
        g.scoped("product", || g.read_back(enc, &yb, 0, out))
    }

    /// Dense f32 GEMM, `b` n×k when `transb`, else k×n.
    fn gemm(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, transb: bool) -> Result<Array2<f32>> {
        let (m, k) = a.dim();
        let (n, kb) = if transb { b.dim() } else { (b.ncols(), b.nrows()) };
        let op = if transb { "wgpu matmul_transb" } else { "wgpu matmul" };
        if k != kb {
            return Err(shape_err(op, format!("a is {m}x{k}, b is {:?}", b.dim())));
        }
        let mut out = Array2::<f32>::zeros((m, n));
        if m == 0 || n == 0 || k == 0 {
            return Ok(out);
        }
        let g = &*self.gpu;
        let (a, b) = (a.as_standard_layout(), b.as_standard_layout());
        let ab = g.upload_f32("a", a.as_slice().ok_or_else(|| shape_err(op, "a not contiguous"))?)?;
        let bb = g.upload_f32("b", b.as_slice().ok_or_else(|| shape_err(op, "b not contiguous"))?)?;
        let cb = g.storage("c", (m * n * 4) as u64)?;
        let u = |v: usize| u32::try_from(v).map_err(|_| Error::Overflow("GEMM dimension"));
        let mut step = Step::new(g);
        let params = [P::U(u(m)?), P::U(u(k)?), P::U(u(n)?), P::U(transb as u32)];
        let groups = [u(n.div_ceil(16))?, u(m.div_ceil(16))?, 1];
        step.dispatch(Kernel::Gemm, Variant::Plain, &[(0, &ab), (1, &bb), (2, &cb)], 3, &params, groups)?;
        let enc = step.encode()?;
        let slice = out.as_slice_mut().ok_or_else(|| shape_err(op, "result not contiguous"))?;
        g.scoped(op, || g.read_back(enc, &cb, 0, slice))?;
        Ok(out)
    }
}

impl ComputeBackend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn device_info(&self) -> String {
        format!("wgpu: {}", self.gpu.describe())
    }

    fn matmul(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        self.gemm(a, b, false)
    }

    fn matmul_transb(&self, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        self.gemm(a, b, true)
    }

    fn matvec(&self, w: &QuantWeight, x: &[f32], y: &mut [f32]) -> Result<()> {
        weights::check_type(w.ty)?;
        w.check()?;
        check_x(w, x.len(), 1, "wgpu matvec")?;
        if y.len() != w.rows {
            return Err(shape_err("wgpu matvec", format!("y has {} values, want {}", y.len(), w.rows)));
        }
        self.product(w, x, 1, y)
    }

    fn matmul_quant(&self, w: &QuantWeight, x: ArrayView2<'_, f32>) -> Result<Array2<f32>> {
        weights::check_type(w.ty)?;
        w.check()?;
        let (n_tok, cols) = x.dim();
        if cols != w.cols {
            return Err(shape_err("wgpu matmul_quant", format!("x is {n_tok}x{cols}, weights {}x{}", w.rows, w.cols)));
        }
        let x = x.as_standard_layout();
        let xs = x.as_slice().ok_or_else(|| shape_err("wgpu matmul_quant", "x not contiguous"))?;
        let mut out = Array2::<f32>::zeros((n_tok, w.rows));
        let slice = out.as_slice_mut().ok_or_else(|| shape_err("wgpu matmul_quant", "result not contiguous"))?;
        self.product(w, xs, n_tok, slice)?;
        Ok(out)
    }

    fn supports(&self, spec: &ModelSpec) -> Result<()> {
        model::supports(&self.gpu, spec)
    }

    fn prepare(&self, spec: &ModelSpec) -> Result<Box<dyn DeviceModel>> {
        Ok(Box::new(self.prepare_wgpu(spec)?))
    }
}

#[cfg(test)]
mod kv_tests;
#[cfg(test)]
mod tests;
