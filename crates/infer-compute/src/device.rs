//! Choosing a backend at run time: [`default_backend`] picks the best device
//! here, [`backend_by_name`] the one a user names. This is the only module
//! that knows every backend; adding one is a line in [`BACKENDS`] and one in
//! [`backend_by_name`].

use crate::backend::ComputeBackend;
use crate::cpu::CpuBackend;
use crate::error::{Error, Result};

/// Names of the backends this build has, best first.
pub const BACKENDS: &[&str] = &[
    #[cfg(feature = "cuda")]
    "cuda",
    #[cfg(feature = "wgpu")]
    "wgpu",
    "cpu",
];

/// The best backend available here: CUDA when built with the `cuda` feature
/// and a device and driver are found, then wgpu when built with the `wgpu`
/// feature and a hardware adapter is found (a software adapter such as
/// lavapipe is never picked here, only by name), otherwise the CPU backend
/// with the best SIMD path of this processor. Never panics: a missing
/// driver falls back to the next.
pub fn default_backend() -> Box<dyn ComputeBackend> {
    #[cfg(feature = "cuda")]
    {
        // `CudaBackend::new` checks for the driver library first and catches
        // the loader's panics, so a machine without CUDA lands here.
        if let Ok(b) = crate::cuda::CudaBackend::new(0) {
            return Box::new(b);
        }
    }
    #[cfg(feature = "wgpu")]
    {
        let opts = crate::wgpu::Options { hardware_only: true, ..Default::default() };
        if let Ok(b) = crate::wgpu::WgpuBackend::with_options(opts) {
            return Box::new(b);
        }
    }
    Box::new(CpuBackend::new())
}

/// The backend called `name` (`"cpu"`, `"cuda"`, `"wgpu"`) with its default
/// options (`"wgpu"` takes the best adapter, a software one when there is no
/// other).
///
/// # Errors
/// [`Error::Device`] when this build lacks it (naming the feature to build
/// with) or the device cannot be opened (naming why).
pub fn backend_by_name(name: &str) -> Result<Box<dyn ComputeBackend>> {
    match name {
        "cpu" => Ok(Box::new(CpuBackend::new())),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Box::new(crate::cuda::CudaBackend::new(0)?)),
        #[cfg(not(feature = "cuda"))]
        "cuda" => Err(Error::Device("this build has no CUDA backend (build with `--features cuda`)".into())),
        #[cfg(feature = "wgpu")]
        "wgpu" => Ok(Box::new(crate::wgpu::WgpuBackend::new()?)),
        #[cfg(not(feature = "wgpu"))]
        "wgpu" => Err(Error::Device("this build has no wgpu backend (build with `--features wgpu`)".into())),
        other => Err(Error::Device(format!("unknown backend `{other}` (this build has: {})", BACKENDS.join(", ")))),
    }
}
