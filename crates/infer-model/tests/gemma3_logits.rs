//! Gemma 3 270M against llama.cpp's logits, by teacher forcing (see
//! testdata/README.md and `infer_model::reference`).
//!
//! - `logits-f32/` (llama.cpp on F32 weights): our exact mode (weights
//!   dequantized to f32, f32 activations) must match tightly.
//! - `logits/` (llama.cpp's Q4_K_M arithmetic, 8-bit activations): our
//!   default quantized path, with the SIMD kernels this CPU selects.
//!
//! Needs the default model (fetched and cached on first use).

use std::path::PathBuf;

use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::ComputeBackend;
use infer_model::gguf::GgufFile;
use infer_model::reference::{teacher_force, ReferenceCase};

fn testdata() -> PathBuf {
    std::env::var_os("INFER_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata")))
}

fn load_model() -> GgufFile {
    let path = infer_model::fetch::default_model_path().expect("default model (fetched on first use)");
    GgufFile::open(&path).expect("open the default model")
}

fn backend(precision: Precision) -> CpuBackend {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    CpuBackend::with_options(threads, Kernels::detect(), precision).expect("CPU backend")
}

fn cases(sub: &str) -> Vec<ReferenceCase> {
    let dir = testdata().join("gemma3-270m").join(sub);
    let cases = ReferenceCase::load_dir(&dir).unwrap_or_else(|e| panic!("reference cases in {}: {e}", dir.display()));
    assert!(!cases.is_empty(), "no reference cases in {}", dir.display());
    cases
}

#[test]
fn exact_mode_matches_llama_cpp_f32_logits() {
    let gguf = load_model();
    let spec = infer_model::model::load_spec(&gguf).expect("spec");
    let cpu = backend(Precision::Exact);
    let mut model = cpu.prepare(&spec).expect("prepare");
    let mut failures = vec![];
    for case in cases("logits-f32") {
        let a = teacher_force(model.as_mut(), &case).expect("teacher forcing");
        println!("exact  {}: {}", case.name, a.summary());
        let ok = a.top1_agree == a.decisive
            && a.min_overlap >= 18
            && a.max_abs_diff <= 0.1
            && a.last_cosine.is_none_or(|c| c >= 0.99999);
        if !ok {
            failures.push(format!("{}: {}", case.name, a.summary()));
        }
    }
    assert!(failures.is_empty(), "exact mode out of bounds:\n{}", failures.join("\n"));
}

#[test]
fn quantized_path_matches_llama_cpp_q4_k_m_logits() {
    let gguf = load_model();
    let spec = infer_model::model::load_spec(&gguf).expect("spec");
    let cpu = backend(Precision::Quantized);
    println!("backend: {}", cpu.device_info());
    let mut model = cpu.prepare(&spec).expect("prepare");
    let mut failures = vec![];
    for case in cases("logits") {
        let a = teacher_force(model.as_mut(), &case).expect("teacher forcing");
        println!("quant  {}: {}", case.name, a.summary());
        let ok = a.top1_rate() >= 0.95
            && a.min_overlap >= 14
            && a.mean_overlap >= 18.0
            && a.max_abs_diff <= 2.5
            && a.median_mean_abs_diff() <= 0.3
            && a.last_cosine.is_none_or(|c| c >= 0.997);
        if !ok {
            failures.push(format!("{}: {}", case.name, a.summary()));
        }
    }
    assert!(failures.is_empty(), "quantized path out of bounds:\n{}", failures.join("\n"));
}

#[test]
fn prefill_equals_token_by_token_decode() {
    let gguf = load_model();
    let spec = infer_model::model::load_spec(&gguf).expect("spec");
    let cpu = backend(Precision::Quantized);
    let mut model = cpu.prepare(&spec).expect("prepare");
    for case in cases("logits") {
        let ids = &case.prompt_ids;
        let mut kv = model.new_kv_cache(ids.len() + 1).unwrap();
        let batched = model.prefill(kv.as_mut(), ids, 0).unwrap().to_vec();
        let mut kv = model.new_kv_cache(ids.len() + 1).unwrap();
        let mut stepped = vec![];
        for (pos, &t) in ids.iter().enumerate() {
            stepped = model.decode_token(kv.as_mut(), t, pos).unwrap().to_vec();
        }
        let scale = stepped.iter().fold(0f32, |m, x| m.max(x.abs()));
        let max_diff = batched.iter().zip(&stepped).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let diff: Vec<f32> = batched.iter().zip(&stepped).map(|(a, b)| a - b).collect();
        let rel = norm(&diff) / norm(&stepped);
        println!("prefill vs decode {}: relative L2 {rel:.2e}, max |d| {max_diff:.2e} (scale {scale:.2})", case.name);
        assert!(
            rel <= 1e-3 && max_diff <= 1e-3 * scale,
            "{}: prefill and decode differ (relative L2 {rel:.2e}, max |d| {max_diff})",
            case.name
        );
    }
}

#[test]
fn context_overflow_is_an_error_not_a_wrap() {
    let gguf = load_model();
    let spec = infer_model::model::load_spec(&gguf).expect("spec");
    let cpu = backend(Precision::Quantized);
    let mut model = cpu.prepare(&spec).expect("prepare");
    let mut kv = model.new_kv_cache(4).unwrap();
    model.prefill(kv.as_mut(), &[2, 818, 5279, 529], 0).unwrap();
    let err = model.decode_token(kv.as_mut(), 7001, 4).unwrap_err();
    assert!(matches!(err, infer_compute::Error::ContextOverflow { .. }), "{err}");
    let err = model.prefill(kv.as_mut(), &[2, 818, 5279, 529, 1], 0).unwrap_err();
    assert!(matches!(err, infer_compute::Error::ContextOverflow { .. }), "{err}");
    // A token id past the vocabulary is an error too.
    let mut kv = model.new_kv_cache(4).unwrap();
    assert!(model.decode_token(kv.as_mut(), u32::MAX, 0).is_err());
    // A cache from another model is rejected.
    let other = cpu.prepare(&spec).expect("prepare");
    let mut foreign = other.new_kv_cache(4).unwrap();
    assert!(model.decode_token(foreign.as_mut(), 2, 0).is_err());
    // A cache far beyond any memory is an error, not an abort.
    assert!(model.new_kv_cache(1 << 40).is_err());
    assert!(model.new_kv_cache(usize::MAX).is_err());
}
