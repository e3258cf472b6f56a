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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::ComputeBackend;
use infer_model::gguf::GgufFile;
use infer_model::model::Arch;
use infer_model::reference::{teacher_force, ReferenceCase};
use infer_model::synth::{self, SynthOptions, SynthQuant, SynthShape, SynthVocab};

fn testdata() -> PathBuf {
    std::env::var_os("INFER_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata")))
}

/// Every `synth-<arch>` directory present, with its architecture.
fn synth_dirs() -> Vec<(Arch, PathBuf)> {
    let root = testdata();
    let mut out: Vec<(Arch, PathBuf)> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.strip_prefix("synth-")?.to_string();
            let arch = Arch::from_gguf_name(&name).unwrap_or_else(|| panic!("{}: unknown architecture", p.display()));
            Some((arch, p))
        })
        .collect();
    out.sort_by_key(|(a, _)| a.name());
    out
}

/// `key value` lines of `synth.txt`.
fn recipe(dir: &Path) -> (u64, String, SynthQuant) {
    let text = std::fs::read_to_string(dir.join("synth.txt")).expect("synth.txt");
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("{}: no `{k}` in synth.txt", dir.display()))
    };
    let quant = SynthQuant::parse(&get("quant")).expect("quant");
    (get("seed").parse().expect("seed"), get("size"), quant)
}

/// Writes the synthetic model of `dir` and opens it.
fn regenerate(arch: Arch, dir: &Path, tag: &str) -> GgufFile {
    let (seed, size, quant) = recipe(dir);
    let shape = SynthShape::preset(arch, &size).expect("preset");
    let tmp = tempfile::Builder::new().prefix("infer-arch-logits-").tempdir().expect("temporary directory");
    let path = tmp.path().join(format!("{arch}-{tag}.gguf"));
    let opts = SynthOptions { shape, quant, seed, threads: 2, dequantized: false };
    synth::write_synthetic(&path, &opts, SynthVocab::Generated, Arc::new(|_| {})).expect("write");
    GgufFile::from_bytes(std::fs::read(&path).expect("read back")).expect("open")
}

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
        let g = regenerate(arch, &dir, sub);
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
    run(Precision::Quantized, "logits", |a| {
        a.top1_rate() >= 0.95
            && a.min_overlap >= 14
            && a.mean_overlap >= 18.0
            && a.max_abs_diff <= 2.5
            && a.median_mean_abs_diff() <= 0.3
            && a.last_cosine.is_none_or(|c| c >= 0.997)
    });
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
        let g = regenerate(arch, &dir, "prefill");
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
                let d = ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
                for (&x, &y) in ours.iter().zip(reference) {
                    ab += x as f64 * y as f64;
                    aa += x as f64 * x as f64;
                    bb += y as f64 * y as f64;
                }
                let cos = ab / (aa.sqrt() * bb.sqrt());
                println!("{arch:7} prefill {sub:10} {}: max|d| {d:.4} cosine {cos:.6}", case.name);
                if !(d <= max_d && cos >= min_cos) {
                    failures.push(format!("{arch} {sub} {}: max|d| {d} cosine {cos}", case.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "prefill out of bounds:\n{}", failures.join("\n"));
}
