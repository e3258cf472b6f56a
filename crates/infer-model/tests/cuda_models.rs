//! Every architecture of the registry on the CUDA backend against
//! llama.cpp: the tiny synthetic models of `testdata/synth-<arch>/` (see
//! `arch_logits.rs`, which holds the CPU backend to the same references),
//! decoded token by token by teacher forcing and prefilled in one batch,
//! under the quantized path's bounds of the real models; and the real
//! models of `testdata/<model>/` (see `model_logits.rs`): teacher forcing
//! and greedy generation.
//!
//! Without a CUDA device every test is reported as ignored, with the
//! reason; `INFER_REQUIRE_CUDA=1` turns that into a failure.

mod real_refs;
mod synth_refs;

use infer_compute::cuda::CudaBackend;
use infer_compute::{ComputeBackend, DeviceModel};
use infer_model::model::Arch;
use infer_model::reference::{teacher_force, ReferenceCase};
use synth_refs::{max_diff_and_cosine, regenerate, synth_dirs, testdata, within_quantized_bounds};

/// Every architecture's synthetic model, prepared on the CUDA backend,
/// with its llama.cpp reference cases (`logits/`).
fn prepared() -> Vec<(Arch, Box<dyn DeviceModel>, Vec<ReferenceCase>)> {
    let dirs = synth_dirs();
    assert!(!dirs.is_empty(), "no testdata/synth-* directories in {}", testdata().display());
    let backend = CudaBackend::new(0).expect("CUDA backend");
    dirs.into_iter()
        .map(|(arch, dir)| {
            let spec = infer_model::model::load_spec(&regenerate(arch, &dir)).unwrap_or_else(|e| panic!("{arch}: {e}"));
            let model = backend.prepare(&spec).unwrap_or_else(|e| panic!("{arch}: prepare: {e}"));
            let cases = ReferenceCase::load_dir(&dir.join("logits")).expect("reference cases");
            (arch, model, cases)
        })
        .collect()
}

/// Teacher forcing, one decode step per position, against `logits/`.
fn decode_matches_llama_cpp_logits_on_every_architecture() {
    let mut failures = vec![];
    for (arch, mut model, cases) in prepared() {
        for case in cases {
            let a = teacher_force(model.as_mut(), &case).expect("teacher forcing");
            println!("{arch:7} cuda decode {}: {}", case.name, a.summary());
            if !within_quantized_bounds(&a) {
                failures.push(format!("{arch} {}: {}", case.name, a.summary()));
            }
        }
    }
    assert!(failures.is_empty(), "out of bounds:\n{}", failures.join("\n"));
}

/// One batched prefill of each prompt against llama.cpp's last-position
/// logits: max |Δ| ≤ 2.5, cosine ≥ 0.997.
fn prefill_matches_llama_cpp_last_logits_on_every_architecture() {
    let mut failures = vec![];
    for (arch, mut model, cases) in prepared() {
        for case in cases {
            let reference = case.last_logits.as_ref().expect("pNN.last_logits.f32");
            let mut kv = model.new_kv_cache(case.prompt_ids.len()).expect("kv");
            let ours = model.prefill(kv.as_mut(), &case.prompt_ids, 0).expect("prefill").to_vec();
            assert_eq!(ours.len(), reference.len(), "{arch}: vocabulary");
            let (d, cos) = max_diff_and_cosine(&ours, reference);
            println!("{arch:7} cuda prefill {}: max|d| {d:.4} cosine {cos:.6}", case.name);
            if !(d <= 2.5 && cos >= 0.997) {
                failures.push(format!("{arch} {}: max|d| {d} cosine {cos}", case.name));
            }
        }
    }
    assert!(failures.is_empty(), "prefill out of bounds:\n{}", failures.join("\n"));
}

/// The real models of `testdata/<model>/logits/` (fetched and cached on
/// first use) on CUDA.
fn prepare_real(backend: &CudaBackend, name: &str) -> Box<dyn DeviceModel> {
    backend.prepare(&real_refs::load_spec(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The real models against llama.cpp on the quantized file, by teacher
/// forcing, under the CPU quantized path's bounds (`model_logits.rs`).
fn real_models_match_llama_cpp_logits() {
    let backend = CudaBackend::new(0).expect("CUDA backend");
    let (checked, failures) = real_refs::teacher_force_all(
        "logits",
        None,
        "cuda",
        |name| prepare_real(&backend, name),
        real_refs::within_quantized_bounds,
        real_refs::QUANTIZED_POOLED_TOP1,
    );
    assert!(checked > 0, "no quantized reference cases");
    assert!(failures.is_empty(), "out of bounds:\n{}", failures.join("\n"));
}

/// Greedy generation of the real models reproduces llama.cpp's greedy
/// tokens up to the first near-tie: a margin within 0.5 in llama.cpp's
/// quantized run or, where it saw the same tokens, in its F32 run, the CPU
/// quantized path's bound (`model_logits.rs` says why).
fn real_models_greedy_matches_llama_cpp_up_to_the_first_near_tie() {
    let backend = CudaBackend::new(0).expect("CUDA backend");
    let compared =
        real_refs::greedy_all("logits", None, Some("logits-f32"), "cuda", 0.5, |name| prepare_real(&backend, name));
    assert!(compared > 0, "no greedy tokens compared");
}

#[path = "../../infer-compute/tests/support/gpu_tests.rs"]
mod gpu_tests;

fn main() {
    let tests: Vec<(&'static str, fn())> = vec![
        (
            "decode_matches_llama_cpp_logits_on_every_architecture",
            decode_matches_llama_cpp_logits_on_every_architecture,
        ),
        ("real_models_match_llama_cpp_logits", real_models_match_llama_cpp_logits),
        (
            "real_models_greedy_matches_llama_cpp_up_to_the_first_near_tie",
            real_models_greedy_matches_llama_cpp_up_to_the_first_near_tie,
        ),
        (
            "prefill_matches_llama_cpp_last_logits_on_every_architecture",
            prefill_matches_llama_cpp_last_logits_on_every_architecture,
        ),
    ];
    let unavailable = CudaBackend::new(0).err().map(|e| format!("no CUDA device here ({e})"));
    gpu_tests::run(tests, unavailable, "INFER_REQUIRE_CUDA")
}
