//! The CUDA backend of the CUDA test binaries (`cuda_backend`,
//! `cuda_top_k`, which include this file by path, with `#[macro_use]`).

use infer_compute::cuda::CudaBackend;

/// The backend on device 0, or `None` after saying on stderr why there is
/// none; a panic instead when `INFER_REQUIRE_CUDA=1`.
pub fn backend() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            if std::env::var("INFER_REQUIRE_CUDA").as_deref() == Ok("1") {
                panic!("INFER_REQUIRE_CUDA=1 but the CUDA backend is unavailable: {e}");
            }
            // Written to the stderr handle rather than with eprintln!, which
            // the test harness captures: a skip must be visible in CI logs.
            use std::io::Write;
            let _ =
                writeln!(std::io::stderr(), "skipped (no CUDA device: {e}); set INFER_REQUIRE_CUDA=1 to fail instead");
            None
        }
    }
}

/// The backend, or a return from the test when there is none.
macro_rules! cuda_or_skip {
    () => {
        match cuda_support::backend() {
            Some(b) => b,
            None => return,
        }
    };
}
