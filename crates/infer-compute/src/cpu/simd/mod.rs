//! SIMD row-dot kernels. Each submodule installs its kernels into a
//! [`Kernels`] table for the level it implements; types it does not cover
//! keep the scalar reference.

use super::kernels::Kernels;

/// Installs the kernels of `k.level()` over the scalar defaults.
pub(crate) fn install(k: &mut Kernels) {
    let _ = k;
}
