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
    "cpu",
];

/// The best backend available here: CUDA when built with the `cuda` feature
/// and a device and driver are found, otherwise the CPU backend with the
/// best SIMD path of this processor. Never panics: a missing driver falls
/// back to the CPU.
pub fn default_backend() -> Box<dyn ComputeBackend> {
    #[cfg(feature = "cuda")]
    {
        // `CudaBackend::new` checks for the driver library first and catches
        // the loader's panics, so a machine without CUDA lands here.
        if let Ok(b) = crate::cuda::CudaBackend::new(0) {
            return Box::new(b);
        }
    }
    Box::new(CpuBackend::new())
}

/// The backend called `name` (`"cpu"`, `"cuda"`) with its default options.
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
        other => Err(Error::Device(format!("unknown backend `{other}` (this build has: {})", BACKENDS.join(", ")))),
    }
}
