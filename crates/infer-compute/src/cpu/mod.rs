//! The CPU backend.
pub mod ops;

/// The CPU backend (work in progress).
pub struct CpuBackend;

impl CpuBackend {
    /// Creates the backend.
    pub fn new() -> Self {
        CpuBackend
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}
