//! Every architecture of the registry against llama.cpp, by teacher forcing
//! on its tiny synthetic model (testdata/synth-<arch>/, made by
//! bench/llama-logits/synth-reference.sh; see testdata/README.md).
//!
//! The test regenerates the model from the seed recorded in `synth.txt`
//! (the synthetic file is a pure function of shape, file type and seed),
//! then holds:
//! - the exact mode to `logits-f32/` (llama.cpp on the same weights stored
//!   as F32): max |Δlogit| ≤ 0.1, last-position cosine ≥ 0.99999, top-1
//!   equal where the reference's margin > 0.1;
//! - the quantized path to `logits/` (llama.cpp on the Q4_K_M file): top-1 ≥
//!   95% of decisive positions, top-20 overlap ≥ 14 (mean ≥ 18), max |Δ| ≤
//!   2.5, median mean-|Δ| ≤ 0.3, cosine ≥ 0.997.

mod synth_refs;

use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::ComputeBackend;
use infer_model::model::Arch;
use infer_model::reference::{teacher_force, ReferenceCase};
use synth_refs::{max_diff_and_cosine, regenerate, synth_dirs, testdata, within_quantized_bounds};

fn backend(precision: Precision) -> CpuBackend {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    CpuBackend::with_options(threads, Kernels::detect(), precision).expect("CPU backend")
}

fn run(precision: Precision, sub: &str, ok: impl Fn(&infer_model::reference::Agreement) -> bool) {
    let dirs = synth_dirs();
    assert!(!dirs.is_empty(), "no testdata/synth-* directories in {}", testdata().display());
    let mut failures = vec![];
    let mut checked = vec![];
    for (arch, dir) in dirs {
        let g = regenerate(arch, &dir);
        let spec = infer_model::model::load_spec(&g).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let mut model = backend(precision).prepare(&spec).expect("prepare");
        let cases = ReferenceCase::load_dir(&dir.join(sub)).expect("reference cases");
        assert!(!cases.is_empty(), "no cases in {}", dir.join(sub).display());
        for case in cases {
            let a = teacher_force(model.as_mut(), &case).expect("teacher forcing");
            println!("{arch:7} {sub:10} {}: {}", case.name, a.summary());
            if !ok(&a) {
                failures.push(format!("{arch} {}: {}", case.name, a.summary()));
            }
        }
        checked.push(arch.name());
    }
    println!("architectures checked: {}", checked.join(", "));
    for a in Arch::ALL {
        if !checked.contains(&a.name()) {
            println!("note: no testdata/synth-{a} (architecture not checked against llama.cpp here)");
        }
    }
    assert!(failures.is_empty(), "out of bounds:\n{}", failures.join("\n"));
}

#[test]
fn exact_mode_matches_llama_cpp_f32_logits_on_every_architecture() {
    run(Precision::Exact, "logits-f32", |a| {
        a.top1_agree == a.decisive && a.max_abs_diff <= 0.1 && a.last_cosine.is_none_or(|c| c >= 0.99999)
    });
}

#[test]
fn quantized_path_matches_llama_cpp_logits_on_every_architecture() {
    run(Precision::Quantized, "logits", within_quantized_bounds);
}

/// The batched prefill path (a different code path from one-token decode:
/// batched projections, biases and norms over many rows, masked attention
/// of many queries) against llama.cpp's full last-position logits.
#[test]
fn prefill_matches_llama_cpp_last_logits_on_every_architecture() {
    let dirs = synth_dirs();
    assert!(!dirs.is_empty(), "no testdata/synth-* directories in {}", testdata().display());
    let mut failures = vec![];
    for (arch, dir) in dirs {
        let g = regenerate(arch, &dir);
        let spec = infer_model::model::load_spec(&g).unwrap_or_else(|e| panic!("{arch}: {e}"));
        for (precision, sub, max_d, min_cos) in
            [(Precision::Exact, "logits-f32", 0.1f32, 0.99999f64), (Precision::Quantized, "logits", 2.5, 0.997)]
        {
            let mut model = backend(precision).prepare(&spec).expect("prepare");
            for case in ReferenceCase::load_dir(&dir.join(sub)).expect("reference cases") {
                let reference = case.last_logits.as_ref().expect("pNN.last_logits.f32");
                let mut kv = model.new_kv_cache(case.prompt_ids.len()).expect("kv");
                let ours = model.prefill(kv.as_mut(), &case.prompt_ids, 0).expect("prefill").to_vec();
                assert_eq!(ours.len(), reference.len(), "{arch}: vocabulary");
                let (d, cos) = max_diff_and_cosine(&ours, reference);
                println!("{arch:7} prefill {sub:10} {}: max|d| {d:.4} cosine {cos:.6}", case.name);
                if !(d <= max_d && cos >= min_cos) {
                    failures.push(format!("{arch} {sub} {}: max|d| {d} cosine {cos}", case.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "prefill out of bounds:\n{}", failures.join("\n"));
}
