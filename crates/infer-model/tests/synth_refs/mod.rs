//! The tiny synthetic models of `testdata/synth-<arch>/` and their
//! llama.cpp references (see testdata/README.md), shared by the tests that
//! check a backend against them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use infer_model::gguf::GgufFile;
use infer_model::model::Arch;
use infer_model::synth::{self, SynthOptions, SynthQuant, SynthShape, SynthVocab};

/// `INFER_TESTDATA`, or the repository's `testdata/`.
pub fn testdata() -> PathBuf {
    std::env::var_os("INFER_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata")))
}

/// Every `synth-<arch>` directory present, with its architecture.
pub fn synth_dirs() -> Vec<(Arch, PathBuf)> {
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

/// `key value` lines of `synth.txt`: seed, size, file type.
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

/// Writes the synthetic model of `dir` (a pure function of its recipe) to a
/// self-deleting temporary file and opens it.
pub fn regenerate(arch: Arch, dir: &Path) -> GgufFile {
    let (seed, size, quant) = recipe(dir);
    let shape = SynthShape::preset(arch, &size).expect("preset");
    let file = tempfile::Builder::new().prefix("infer-synth-ref-").suffix(".gguf").tempfile().expect("temp file");
    let opts = SynthOptions { shape, quant, seed, threads: 2, dequantized: false };
    synth::write_synthetic(file.path(), &opts, SynthVocab::Generated, Arc::new(|_| {})).expect("write");
    GgufFile::from_bytes(std::fs::read(file.path()).expect("read back")).expect("open")
}

/// The quantized path's bounds against llama.cpp on its Q4_K_M file: top-1 ≥
/// 95% of decisive positions, top-20 overlap ≥ 14 (mean ≥ 18), max |Δ| ≤
/// 2.5, median mean-|Δ| ≤ 0.3, last-position cosine ≥ 0.997.
pub fn within_quantized_bounds(a: &infer_model::reference::Agreement) -> bool {
    a.top1_rate() >= 0.95
        && a.min_overlap >= 14
        && a.mean_overlap >= 18.0
        && a.max_abs_diff <= 2.5
        && a.median_mean_abs_diff() <= 0.3
        && a.last_cosine.is_none_or(|c| c >= 0.997)
}

/// Largest |a − b| and the cosine of two logit vectors of equal length.
pub fn max_diff_and_cosine(ours: &[f32], reference: &[f32]) -> (f32, f64) {
    let d = ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in ours.iter().zip(reference) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    (d, ab / (aa.sqrt() * bb.sqrt()))
}
