//! The conformance suite ([`infer_compute::conformance`]) on every backend
//! this machine has: the CPU backend at each SIMD level the processor
//! supports, CUDA when built with `--features cuda` (with its tuned
//! fusions and, as `cuda_unfused`, without them), and wgpu when built
//! with `--features wgpu` (with subgroup reductions and, where the adapter
//! has those, again with the workgroup-memory fallback as `wgpu_shared`).
//!
//! A backend this machine lacks (no GPU, no driver) has its cases reported
//! as ignored with the reason, never as passed; with `INFER_REQUIRE_CUDA=1`
//! (`INFER_REQUIRE_WGPU=1`) they fail instead. A case that meets a feature the backend reports as
//! unsupported is ignored at run time with the backend's reason.
//!
//! Adding a backend: one entry in `backends()`.

use std::sync::Arc;

use infer_compute::conformance::{cases, Outcome};
use infer_compute::cpu::{CpuBackend, Kernels, Precision, SimdLevel};
use infer_compute::ComputeBackend;
use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// A backend to test, or why this machine cannot run it (and whether that
/// is a failure).
type Candidate = (String, Result<Arc<dyn ComputeBackend>, (String, bool)>);

fn backends() -> Vec<Candidate> {
    let mut v: Vec<Candidate> = Vec::new();
    for level in SimdLevel::all_available() {
        let b = CpuBackend::with_options(2, Kernels::for_level(level), Precision::Quantized)
            .map(|b| Arc::new(b) as Arc<dyn ComputeBackend>)
            .map_err(|e| (e.to_string(), true));
        v.push((format!("cpu_{}", level.name()), b));
    }
    v.extend(cuda());
    v.extend(wgpu());
    v
}

/// The wgpu backend on the best adapter (lavapipe in CI), with the
/// reductions the adapter offers and once more with the workgroup-memory
/// fallback.
#[cfg(feature = "wgpu")]
fn wgpu() -> Vec<Candidate> {
    use infer_compute::wgpu::{Options, WgpuBackend};
    let required = std::env::var("INFER_REQUIRE_WGPU").is_ok_and(|v| v == "1");
    let open =
        |opts: Options| WgpuBackend::with_options(opts).map_err(|e| (format!("no wgpu adapter here ({e})"), required));
    let first = open(Options::default());
    let subgroups = first.as_ref().is_ok_and(|b| b.uses_subgroups());
    let mut v = vec![("wgpu".to_string(), first)];
    if subgroups {
        // Passes of 8 tokens, so that its prompts run in several passes,
        // and weight matrices in row blocks of 64 KiB at most, so that
        // products run over several buffers.
        let opts = Options {
            no_subgroups: true,
            pass_tokens: Some(8),
            weight_part_bytes: Some(64 << 10),
            ..Default::default()
        };
        v.push(("wgpu_shared".to_string(), open(opts)));
    }
    v.into_iter().map(|(n, b)| (n, b.map(|b| Arc::new(b) as Arc<dyn ComputeBackend>))).collect()
}

#[cfg(not(feature = "wgpu"))]
fn wgpu() -> Vec<Candidate> {
    let required = std::env::var("INFER_REQUIRE_WGPU").is_ok_and(|v| v == "1");
    vec![("wgpu".into(), Err(("built without the `wgpu` feature".into(), required)))]
}

/// The CUDA backend with its tuned kernels and fusions (`cuda`; the
/// `INFER_CUDA_*` variables apply), and again
/// with every fusion and alternative layout off (`cuda_unfused`: GGUF rows,
/// separate norm, quantize and attention kernels, mat-vec prefill), and
/// with one decode-attention block per kv head, staged (`cuda_one_block`),
/// with the flat decode attention everywhere (`cuda_flat`; by default only
/// where the staged blocks would stream several spans), and with
/// the tensor-core products from 2 tokens in the narrow tile up to 32
/// (`cuda_mmq`), in the same process.
#[cfg(feature = "cuda")]
fn cuda() -> Vec<Candidate> {
    use infer_compute::cuda::{CudaBackend, CudaOptions};
    let required = std::env::var("INFER_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    let open = |opts: CudaOptions| {
        CudaBackend::with_options(0, opts)
            .map(|b| Arc::new(b) as Arc<dyn ComputeBackend>)
            .map_err(|e| (format!("no CUDA device here ({e})"), required))
    };
    // One decode-attention block per kv head: every span after the first
    // streamed through the online softmax, the token's own in a later one.
    let one_block = CudaOptions { attn_decode_blocks: Some(1), attn_flat: Some(false), ..CudaOptions::from_env() };
    let flat = CudaOptions { attn_flat: Some(true), ..CudaOptions::from_env() };
    let mmq = CudaOptions { mmq_min_tokens: Some(2), mmq_narrow: true, ..CudaOptions::from_env() };
    vec![
        ("cuda".into(), open(CudaOptions::from_env())),
        ("cuda_unfused".into(), open(CudaOptions::unfused())),
        ("cuda_one_block".into(), open(one_block)),
        ("cuda_flat".into(), open(flat)),
        ("cuda_mmq".into(), open(mmq)),
    ]
}

#[cfg(not(feature = "cuda"))]
fn cuda() -> Vec<Candidate> {
    let required = std::env::var("INFER_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    ["cuda", "cuda_unfused", "cuda_one_block", "cuda_flat", "cuda_mmq"]
        .map(|n| (n.into(), Err(("built without the `cuda` feature".into(), required))))
        .into()
}

/// Whether `backend` runs `case`: every case, except that the wgpu
/// workgroup-memory fallback (`wgpu_shared`, the same kernels with other
/// reductions, in passes of 8 tokens, weights in 64 KiB buffers) runs the
/// op cases and one model of each kind, since the whole suite on lavapipe
/// twice would take most of a CI run, and `cuda_one_block` and
/// `cuda_flat` and `cuda_mmq` only the cases their options change.
fn runs_on(backend: &str, case: &str) -> bool {
    match backend {
        "wgpu_shared" => {
            case.starts_with("ops::")
                || ["model::gemma2_caps::decode", "model::llama_bias::prefill", "batch::gemma3::mixed"]
                    .iter()
                    .any(|c| case.starts_with(c))
        }
        // The decode attention's other grid: the cases that decode past one span.
        "cuda_one_block" => case.ends_with("::long_decode") || case.starts_with("batch::"),
        // The flat decode attention kernel: the cases that decode.
        "cuda_flat" => case.contains("decode") || case.starts_with("batch::"),
        // Passes of 2 to 64 tokens: prompts and batches.
        "cuda_mmq" => case.contains("prefill") || case.starts_with("batch::") || case.starts_with("ops::matmul_quant"),
        _ => true,
    }
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for (name, backend) in backends() {
        match backend {
            Ok(b) => {
                for case in cases().into_iter().filter(|c| runs_on(&name, &c.name)) {
                    let b = b.clone();
                    trials.push(Trial::ignorable_test(format!("{name}::{}", case.name), move || {
                        match case.run(b.as_ref()) {
                            Ok(Outcome::Pass(_)) => Ok(Completion::Completed),
                            Ok(Outcome::Skip(why)) => Ok(Completion::ignored_with(why)),
                            Err(msg) => Err(Failed::from(msg)),
                        }
                    }));
                }
            }
            Err((why, required)) => {
                eprintln!("conformance: {name}: {why}{}", if required { " (required: failing)" } else { "" });
                for case in cases().into_iter().filter(|c| runs_on(&name, &c.name)) {
                    let why = why.clone();
                    trials.push(Trial::ignorable_test(format!("{name}::{}", case.name), move || {
                        if required {
                            Err(Failed::from(why))
                        } else {
                            Ok(Completion::ignored_with(why))
                        }
                    }));
                }
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
