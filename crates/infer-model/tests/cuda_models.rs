//! Every architecture of the registry on the CUDA backend against
//! llama.cpp: the tiny synthetic models of `testdata/synth-<arch>/` (see
//! `arch_logits.rs`, which holds the CPU backend to the same references),
//! decoded token by token by teacher forcing and prefilled in one batch,
//! under the quantized path's bounds of the real models.
//!
//! Without a CUDA device every test is reported as ignored, with the
//! reason; `INFER_REQUIRE_CUDA=1` turns that into a failure.

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

#[path = "../../infer-compute/tests/support/gpu_tests.rs"]
mod gpu_tests;

fn main() {
    let tests: Vec<(&'static str, fn())> = vec![
        (
            "decode_matches_llama_cpp_logits_on_every_architecture",
            decode_matches_llama_cpp_logits_on_every_architecture,
        ),
        (
            "prefill_matches_llama_cpp_last_logits_on_every_architecture",
            prefill_matches_llama_cpp_last_logits_on_every_architecture,
        ),
    ];
    let unavailable = CudaBackend::new(0).err().map(|e| format!("no CUDA device here ({e})"));
    gpu_tests::run(tests, unavailable)
}
