//! Synthetic models: shapes, llama.cpp's type mix, determinism, and that
//! the files load, tokenize and decode to finite logits.

use std::path::PathBuf;
use std::sync::Arc;

use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::{ComputeBackend, GgmlType};
use infer_model::gguf::{GgufFile, Value};
use infer_model::synth::{
    self, fallback_type, generated_vocab, plan_tensors, use_more_bits, SynthArch, SynthOptions, SynthQuant, SynthShape,
    SynthVocab,
};
use infer_model::tokenizer::Tokenizer;

/// A temporary directory, removed with its files when dropped.
fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("infer-synth-test-").tempdir().unwrap()
}

/// Writes a synthetic model as `dir/name` and returns its path.
fn write(
    dir: &tempfile::TempDir,
    arch: SynthArch,
    size: &str,
    quant: SynthQuant,
    seed: u64,
    threads: usize,
    name: &str,
) -> PathBuf {
    let path = dir.path().join(name);
    let opts =
        SynthOptions { shape: SynthShape::preset(arch, size).unwrap(), quant, seed, threads, dequantized: false };
    synth::write_synthetic(&path, &opts, SynthVocab::Generated, Arc::new(|_| {})).unwrap();
    path
}

/// The default model (`INFER_MODEL`, else fetched and verified when absent).
fn default_model() -> GgufFile {
    let path = infer_model::fetch::default_model_path().expect("the default model");
    GgufFile::open(&path).unwrap()
}

#[test]
fn preset_parameter_counts_match_the_real_models() {
    // Parameter counts of the real models' weights (Gemma 3 text models as
    // llama.cpp converts them, 262144-token embeddings; Llama without the
    // 32/64-value rope_freqs tensor, which synthetic files leave out).
    let cases = [
        (SynthArch::Gemma3, "270m", 268_098_176u64),
        (SynthArch::Gemma3, "1b", 999_885_952),
        (SynthArch::Gemma3, "4b", 3_880_099_328),
        (SynthArch::Gemma3, "12b", 11_765_788_416),
        (SynthArch::Llama, "1b", 1_235_814_400),
        (SynthArch::Llama, "8b", 8_030_261_248),
        // Published parameter counts of the other architectures' models.
        (SynthArch::Gemma2, "2b", 2_614_341_888),
        (SynthArch::Llama, "mistral-7b", 7_248_023_552),
        (SynthArch::Qwen2, "0.5b", 494_032_768),
        (SynthArch::Qwen3, "0.6b", 596_049_920),
        (SynthArch::Phi3, "mini", 3_821_079_552),
    ];
    for (arch, size, want) in cases {
        let shape = SynthShape::preset(arch, size).unwrap();
        let plan = plan_tensors(&shape, SynthQuant::Q4KM).unwrap();
        let got = synth::summarize(&plan).unwrap().n_params;
        assert_eq!(got, want, "{arch} {size}");
    }
}

#[test]
fn unknown_presets_are_errors_naming_the_sizes() {
    let e = SynthShape::preset(SynthArch::Llama, "70b").unwrap_err().to_string();
    assert!(e.contains("1b, 8b"), "{e}");
    assert!(SynthShape::preset(SynthArch::Gemma3, "1B").is_ok(), "sizes are case-insensitive");
    assert_eq!(SynthArch::parse("GEMMA3"), Some(SynthArch::Gemma3));
    assert_eq!(SynthQuant::parse("Q4_K_M"), Some(SynthQuant::Q4KM));
    assert!(generated_vocab(100).is_err());
    let mut bad = SynthShape::preset(SynthArch::Llama, "tiny").unwrap();
    bad.n_head_kv = 3;
    assert!(plan_tensors(&bad, SynthQuant::Q4KM).is_err());
}

#[test]
fn use_more_bits_matches_llama_cpp() {
    // The layers whose attn_v / ffn_down are promoted in Gemma 3 270M's Q4_K_M file.
    let more: Vec<usize> = (0..18).filter(|&i| use_more_bits(i, 18)).collect();
    assert_eq!(more, [0, 1, 4, 7, 10, 13, 15, 16, 17]);
    assert_eq!(fallback_type(GgmlType::Q4_K, 640), GgmlType::Q5_0);
    assert_eq!(fallback_type(GgmlType::Q6_K, 1152), GgmlType::Q8_0);
    assert_eq!(fallback_type(GgmlType::Q4_K, 2048), GgmlType::Q4_K);
    assert_eq!(fallback_type(GgmlType::Q4_0, 48), GgmlType::F16);
}

#[test]
fn q4_k_m_mix_of_larger_models() {
    let plan = |arch, size| plan_tensors(&SynthShape::preset(arch, size).unwrap(), SynthQuant::Q4KM).unwrap();
    let ty = |p: &[synth::TensorPlan], name: &str| p.iter().find(|t| t.name == name).unwrap().ty;
    // Llama 3 8B: untied, rows of 4096 and 14336 (multiples of 256).
    let p = plan(SynthArch::Llama, "8b");
    assert_eq!(ty(&p, "token_embd.weight"), GgmlType::Q4_K);
    assert_eq!(ty(&p, "output.weight"), GgmlType::Q6_K);
    // use_more_bits(i, 32): layers 0-3, 6, 9, ..., 27, and 28-31.
    assert_eq!(ty(&p, "blk.3.attn_v.weight"), GgmlType::Q6_K);
    assert_eq!(ty(&p, "blk.5.attn_v.weight"), GgmlType::Q4_K);
    assert_eq!(ty(&p, "blk.6.attn_v.weight"), GgmlType::Q6_K);
    assert_eq!(ty(&p, "blk.7.ffn_down.weight"), GgmlType::Q4_K);
    assert_eq!(ty(&p, "blk.31.ffn_down.weight"), GgmlType::Q6_K);
    assert_eq!(ty(&p, "blk.6.ffn_up.weight"), GgmlType::Q4_K);
    // Llama 3.2 1B: tied, so the embeddings take the output's Q6_K.
    let p = plan(SynthArch::Llama, "1b");
    assert_eq!(ty(&p, "token_embd.weight"), GgmlType::Q6_K);
    assert!(p.iter().all(|t| t.name != "output.weight"));
    // Gemma 3 1B: 1152-value rows fall back to 32-blocks.
    let p = plan(SynthArch::Gemma3, "1b");
    assert_eq!(ty(&p, "token_embd.weight"), GgmlType::Q8_0);
    assert_eq!(ty(&p, "blk.0.attn_q.weight"), GgmlType::Q5_0);
    assert_eq!(ty(&p, "blk.0.attn_v.weight"), GgmlType::Q8_0);
    assert_eq!(ty(&p, "blk.3.attn_v.weight"), GgmlType::Q5_0);
    assert_eq!(ty(&p, "blk.0.attn_output.weight"), GgmlType::Q4_K);
    assert_eq!(ty(&p, "blk.0.ffn_down.weight"), GgmlType::Q6_K);
    // Gemma 3 4B: 2560 = 10·256, so no fallback.
    let p = plan(SynthArch::Gemma3, "4b");
    assert_eq!(ty(&p, "token_embd.weight"), GgmlType::Q6_K);
    assert_eq!(ty(&p, "blk.10.ffn_gate.weight"), GgmlType::Q4_K);
    // Q8_0 and Q4_0 files.
    let p = plan_tensors(&SynthShape::preset(SynthArch::Llama, "8b").unwrap(), SynthQuant::Q8_0).unwrap();
    assert!(p.iter().filter(|t| !t.role.is_norm()).all(|t| t.ty == GgmlType::Q8_0));
    let p = plan_tensors(&SynthShape::preset(SynthArch::Llama, "8b").unwrap(), SynthQuant::Q4_0).unwrap();
    assert_eq!(ty(&p, "output.weight"), GgmlType::Q6_K);
    assert_eq!(ty(&p, "token_embd.weight"), GgmlType::Q4_0);
    assert_eq!(ty(&p, "blk.0.attn_v.weight"), GgmlType::Q4_0);
}

/// Q5_K_M: Q4_K_M's rules with Q5_K for Q4_K. Llama 3.2 1B's tensor bytes
/// equal those of the file llama.cpp's `llama-quantize` made from the same
/// shape (861.81 MiB as llama-bench prints it, build 11434, 2026-12-08).
#[test]
fn q5_k_m_mix_as_llama_quantize() {
    let p = plan_tensors(&SynthShape::preset(SynthArch::Llama, "1b").unwrap(), SynthQuant::Q5KM).unwrap();
    let ty = |name: &str| p.iter().find(|t| t.name == name).unwrap().ty;
    assert_eq!(SynthQuant::parse("q5_k_m"), Some(SynthQuant::Q5KM));
    assert_eq!(SynthQuant::Q5KM.file_type(), 17);
    assert_eq!(ty("token_embd.weight"), GgmlType::Q6_K);
    // use_more_bits(i, 16): layers 0, 1, 4, 7, 10, 13, 14, 15.
    assert_eq!(ty("blk.4.attn_v.weight"), GgmlType::Q6_K);
    assert_eq!(ty("blk.5.attn_v.weight"), GgmlType::Q5_K);
    assert_eq!(ty("blk.15.ffn_down.weight"), GgmlType::Q6_K);
    assert_eq!(ty("blk.5.ffn_down.weight"), GgmlType::Q5_K);
    assert_eq!(ty("blk.5.ffn_gate.weight"), GgmlType::Q5_K);
    let bytes: u64 = p
        .iter()
        .map(|t| t.ty.row_bytes(t.dims[0] as usize).unwrap() as u64 * t.dims[1..].iter().product::<u64>())
        .sum();
    assert_eq!((bytes as f64 / (1u64 << 20) as f64 * 100.0).round() / 100.0, 861.81);
}

#[test]
fn gemma3_270m_plan_reproduces_the_default_model() {
    let real = default_model();
    let shape = SynthShape::preset(SynthArch::Gemma3, "270m").unwrap();
    let plan = plan_tensors(&shape, SynthQuant::Q4KM).unwrap();
    assert_eq!(plan.len(), real.tensors().len());
    for t in &plan {
        let r = real.tensor(&t.name).unwrap_or_else(|| panic!("{} not in the real file", t.name));
        assert_eq!((t.ty, &t.dims), (r.ty, &r.dims), "{}", t.name);
    }
    // The hyper-parameter keys of the real file, with the same values.
    let meta = synth::metadata(&shape, SynthQuant::Q4KM, 0, SynthVocab::CopyFrom(&real)).unwrap();
    for (k, v) in real.metadata() {
        if k.starts_with("gemma3.")
            || k.starts_with("tokenizer.")
            || k == "general.file_type"
            || k == "general.architecture"
        {
            let ours = meta.iter().find(|(mk, _)| mk == k).map(|(_, v)| v);
            assert_eq!(ours, Some(v), "{k}");
        }
    }
}

#[test]
fn writing_is_deterministic_and_independent_of_threads() {
    let dir = tmpdir();
    let a = write(&dir, SynthArch::Llama, "tiny", SynthQuant::Q4KM, 7, 1, "det-a.gguf");
    let b = write(&dir, SynthArch::Llama, "tiny", SynthQuant::Q4KM, 7, 3, "det-b.gguf");
    let c = write(&dir, SynthArch::Llama, "tiny", SynthQuant::Q4KM, 8, 2, "det-c.gguf");
    let (a, b, c) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap(), std::fs::read(c).unwrap());
    assert_eq!(a, b);
    assert_eq!(a.len(), c.len());
    assert_ne!(a, c);
}

#[test]
fn tiny_models_load_tokenize_and_decode() {
    let dir = tmpdir();
    for (arch, quant) in [
        (SynthArch::Gemma3, SynthQuant::Q4KM),
        (SynthArch::Llama, SynthQuant::Q4KM),
        (SynthArch::Gemma3, SynthQuant::Q8_0),
        (SynthArch::Llama, SynthQuant::Q4_0),
    ] {
        let path = write(&dir, arch, "tiny", quant, 0, 2, &format!("run-{arch}-{}.gguf", quant.name()));
        let g = GgufFile::open(&path).unwrap();
        let shape = SynthShape::preset(arch, "tiny").unwrap();
        assert_eq!(g.get_str("general.architecture").unwrap(), arch.name());
        assert_eq!(g.get_u32("general.file_type").unwrap(), quant.file_type());
        assert_eq!(g.get("infer.synth.seed"), Some(&Value::U64(0)));

        // Every value is finite and small; norm weights are near 1.
        for t in g.tensors() {
            let w = g.tensor_weight(t).unwrap().to_f32().unwrap();
            let max = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(w.iter().all(|v| v.is_finite()), "{}", t.name);
            if t.name.contains("norm") {
                assert!(w.iter().all(|v| (0.89..=1.11).contains(v)), "{}", t.name);
            } else {
                assert!(max < 1.0, "{}: max |w| = {max}", t.name);
            }
        }

        let tok = Tokenizer::from_gguf(&g).unwrap();
        assert_eq!(tok.n_vocab(), shape.n_vocab);
        let ids = tok.encode("hello world\n", true);
        assert_eq!(ids[0], 1);
        assert_eq!(tok.decode(&ids[1..]), "hello world\n");

        let spec = infer_model::model::load_spec(&g).unwrap();
        assert_eq!(spec.layers.len(), shape.n_layer);
        let backend = CpuBackend::with_options(2, Kernels::detect(), Precision::Quantized).unwrap();
        let mut model = backend.prepare(&spec).unwrap();
        let mut kv = model.new_kv_cache(16).unwrap();
        let logits = model.prefill(kv.as_mut(), &ids, 0).unwrap();
        assert!(logits.iter().all(|z| z.is_finite()));
        let mut next = 3u32;
        for pos in ids.len()..16 {
            let logits = model.decode_token(kv.as_mut(), next, pos).unwrap();
            assert!(logits.iter().all(|z| z.is_finite() && z.abs() < 100.0), "{arch} pos {pos}");
            next = logits.iter().enumerate().fold(0, |b, (i, z)| if *z > logits[b] { i } else { b }) as u32;
        }
    }
}
