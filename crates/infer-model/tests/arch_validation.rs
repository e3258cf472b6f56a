//! Loader validation on the tiny synthetic model of every architecture:
//! each hyper-parameter out of range, each count that disagrees with the
//! tensors, each missing or misshapen tensor is a typed error naming the
//! key or tensor (never a panic, an abort or a silently wrong model).

use std::sync::Arc;

use infer_compute::GgmlType;
use infer_model::gguf::{GgufFile, GgufWriter, Value};
use infer_model::model::{load_spec, Arch};
use infer_model::synth::{self, SynthOptions, SynthQuant, SynthShape, SynthVocab};
use infer_model::Error;

/// The tiny Q8_0 model of `arch` (small and quick to write).
fn tiny(arch: Arch) -> GgufFile {
    let dir = tempfile::Builder::new().prefix("infer-arch-validation-").tempdir().unwrap();
    let path = dir.path().join(format!("{arch}.gguf"));
    let shape = SynthShape::preset(arch, "tiny").unwrap();
    let opts = SynthOptions { shape, quant: SynthQuant::Q8_0, seed: 7, threads: 1, dequantized: false };
    synth::write_synthetic(&path, &opts, SynthVocab::Generated, Arc::new(|_| {})).unwrap();
    GgufFile::from_bytes(std::fs::read(&path).unwrap()).unwrap()
}

/// `g` rewritten with `edit` applied to its metadata and the tensors that
/// `keep` accepts (a tensor may also be replaced: `keep` returns its new
/// dims, type and bytes).
fn rewrite(
    g: &GgufFile,
    edit: impl FnOnce(&mut GgufWriter),
    keep: impl Fn(&str) -> bool,
    replace: Option<(&str, Vec<u64>, GgmlType, Vec<u8>)>,
) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add_metadata(k.clone(), v.clone()).unwrap();
    }
    edit(&mut w);
    for t in g.tensors() {
        if !keep(&t.name) {
            continue;
        }
        match &replace {
            Some((name, dims, ty, bytes)) if *name == t.name => {
                w.add_tensor(t.name.clone(), dims, *ty, bytes.clone()).unwrap();
            }
            _ => {
                w.add_tensor(t.name.clone(), &t.dims, t.ty, g.tensor_data(t).to_vec()).unwrap();
            }
        }
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn with_key(g: &GgufFile, key: &str, v: impl Into<Value>) -> GgufFile {
    let v = v.into();
    rewrite(
        g,
        |w| {
            w.set_metadata(key, v).unwrap();
        },
        |_| true,
        None,
    )
}

fn hp_err(g: &GgufFile) -> (String, String, String) {
    match load_spec(g) {
        Err(Error::HyperParameter { key, value, reason }) => (key, value, reason),
        other => panic!("expected HyperParameter, got {other:?}"),
    }
}

#[test]
fn every_tiny_architecture_loads_with_its_structure() {
    for arch in Arch::ALL {
        let spec = load_spec(&tiny(arch)).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let l = &spec.layers[0];
        let shape = SynthShape::preset(arch, "tiny").unwrap();
        assert_eq!((spec.n_embd, spec.n_vocab, spec.layers.len()), (shape.n_embd, 1024, shape.n_layer), "{arch}");
        assert_eq!(
            (l.n_head, l.n_head_kv, l.head_dim, l.rope.n_rot),
            (shape.n_head, shape.n_head_kv, shape.head_dim, shape.n_rot)
        );
        assert_eq!(l.bq.is_some(), arch == Arch::Qwen2, "{arch}: q bias");
        assert_eq!(l.q_norm.is_some(), matches!(arch, Arch::Gemma3 | Arch::Qwen3), "{arch}: q norm");
        assert_eq!(l.post_ffn_norm.is_some(), matches!(arch, Arch::Gemma3 | Arch::Gemma2), "{arch}: sandwich");
        assert_eq!(spec.final_logit_softcap, shape.final_softcap, "{arch}");
        assert_eq!(l.attn_softcap, shape.attn_softcap, "{arch}");
        let windows: Vec<Option<usize>> = spec.layers.iter().map(|l| l.sliding_window).collect();
        match arch {
            // Gemma 2: even layers slide.
            Arch::Gemma2 => assert_eq!(windows, [Some(8), None, Some(8), None]),
            Arch::Gemma3 => assert_eq!(windows, [Some(16), Some(16), Some(16), Some(16), Some(16), None]),
            _ => assert!(windows.iter().all(Option::is_none), "{arch}"),
        }
    }
}

#[test]
fn phi3_fused_tensors_split_into_row_ranges_of_the_file() {
    let g = tiny(Arch::Phi3);
    let spec = load_spec(&g).unwrap();
    let l = &spec.layers[1];
    let qkv = g.tensor("blk.1.attn_qkv.weight").unwrap();
    let bytes = g.tensor_data(qkv);
    let rb = qkv.ty.row_bytes(256).unwrap();
    // q: rows 0..256, k: 256..384, v: 384..512 of the fused tensor, no copy.
    assert_eq!((l.wq.rows, l.wk.rows, l.wv.rows), (256, 128, 128));
    assert_eq!(l.wq.data.as_bytes(), &bytes[..256 * rb]);
    assert_eq!(l.wk.data.as_bytes(), &bytes[256 * rb..384 * rb]);
    assert_eq!(l.wv.data.as_bytes().as_ptr(), bytes[384 * rb..].as_ptr());
    let up = g.tensor("blk.1.ffn_up.weight").unwrap();
    let ub = g.tensor_data(up);
    let gate = l.ffn_gate.as_ref().unwrap();
    assert_eq!((gate.rows, l.ffn_up.rows), (512, 512));
    assert_eq!(gate.data.as_bytes().as_ptr(), ub.as_ptr(), "gate is the first half");
    assert_eq!(l.ffn_up.data.as_bytes().as_ptr(), ub[512 * rb..].as_ptr(), "up is the second half");
}

#[test]
fn zero_or_absurd_hyper_parameters_are_named_errors() {
    let g = tiny(Arch::Gemma3);
    // Issue 14 item 1: block_count 62 with head_count 0 divided by zero.
    let g0 = rewrite(
        &g,
        |w| {
            w.set_metadata("gemma3.block_count", 62u32).unwrap();
            w.set_metadata("gemma3.attention.head_count", 0u32).unwrap();
        },
        |_| true,
        None,
    );
    let (key, value, reason) = hp_err(&g0);
    assert_eq!((key.as_str(), value.as_str()), ("gemma3.attention.head_count", "0"), "{reason}");
    for (key, v) in [
        ("gemma3.embedding_length", 0u32),
        ("gemma3.attention.head_count_kv", 0),
        ("gemma3.attention.key_length", 0),
        ("gemma3.context_length", 0),
        ("gemma3.attention.sliding_window", 0),
        ("gemma3.attention.head_count", 100_000),
        ("gemma3.attention.key_length", 1 << 20),
    ] {
        let (k, value, _) = hp_err(&with_key(&g, key, v));
        assert_eq!((k.as_str(), value), (key, v.to_string()));
    }
    // Allocation from an unchecked count: block_count 2^32-1 and 2^26.
    for n in [u32::MAX, 1 << 26] {
        let (k, _, _) = hp_err(&with_key(&g, "gemma3.block_count", n));
        assert_eq!(k, "gemma3.block_count");
    }
    for (key, v) in [
        ("gemma3.attention.layer_norm_rms_epsilon", f32::NAN),
        ("gemma3.attention.layer_norm_rms_epsilon", -1e-6),
        ("gemma3.rope.freq_base", 0.0),
        ("gemma3.rope.freq_base", f32::INFINITY),
        ("gemma3.rope.scaling.factor", -8.0),
    ] {
        let (k, _, _) = hp_err(&with_key(&g, key, v));
        assert_eq!(k, key);
    }
}

#[test]
fn inconsistent_hyper_parameters_are_named_errors() {
    let g = tiny(Arch::Llama);
    // n_head % n_head_kv != 0.
    let (k, v, _) = hp_err(&with_key(&g, "llama.attention.head_count_kv", 3u32));
    assert!(k.contains("llama.attention.head_count") && k.contains("head_count_kv"), "{k}");
    assert_eq!(v, "4 / 3");
    // n_rot odd, or larger than head_dim.
    for n in [63u32, 66, 128] {
        let (k, _, _) = hp_err(&with_key(&g, "llama.rope.dimension_count", n));
        assert_eq!(k, "llama.rope.dimension_count");
    }
    // No key_length and n_embd not a multiple of n_head.
    let g5 = rewrite(
        &g,
        |w| {
            w.remove_metadata("llama.attention.key_length");
            w.set_metadata("llama.attention.head_count", 3u32).unwrap();
            w.set_metadata("llama.attention.head_count_kv", 3u32).unwrap();
        },
        |_| true,
        None,
    );
    let (k, _, reason) = hp_err(&g5);
    assert_eq!(k, "llama.attention.head_count", "{reason}");
    // Qwen 2 and Phi-3 need n_head · head_dim = n_embd.
    for arch in [Arch::Qwen2, Arch::Phi3] {
        let g32 = rewrite(
            &tiny(arch),
            |w| {
                w.set_metadata(format!("{arch}.attention.key_length"), 32u32).unwrap();
                w.set_metadata(format!("{arch}.attention.value_length"), 32u32).unwrap();
            },
            |_| true,
            None,
        );
        let (k, _, reason) = hp_err(&g32);
        assert!(k.contains("head_count") && reason.contains("embedding_length"), "{arch}: {k}: {reason}");
    }
}

#[test]
fn counts_are_checked_against_the_tensors() {
    let g = tiny(Arch::Qwen3);
    // Fewer layers in the metadata than in the file, and more.
    for n in [2u32, 4] {
        match load_spec(&with_key(&g, "qwen3.block_count", n)) {
            Err(Error::CountMismatch { key, value, detail }) => {
                assert_eq!((key.as_str(), value), ("qwen3.block_count", u64::from(n)));
                assert!(detail.contains("3 layers"), "{detail}");
            }
            other => panic!("block_count {n}: expected CountMismatch, got {other:?}"),
        }
    }
    // Vocabulary: one token more in the tokenizer than embedding rows.
    let mut tokens: Vec<String> =
        g.get_str_array("tokenizer.ggml.tokens").unwrap().into_iter().map(str::to_string).collect();
    tokens.push("<extra>".into());
    match load_spec(&with_key(&g, "tokenizer.ggml.tokens", Value::from(tokens))) {
        Err(Error::CountMismatch { key, value, detail }) => {
            assert_eq!((key.as_str(), value), ("tokenizer.ggml.tokens", 1025));
            assert!(detail.contains("token_embd.weight") && detail.contains("1024"), "{detail}");
        }
        other => panic!("expected CountMismatch, got {other:?}"),
    }
    let gl = tiny(Arch::Llama);
    match load_spec(&with_key(&gl, "llama.vocab_size", 1000u32)) {
        Err(Error::CountMismatch { key, value, .. }) => assert_eq!((key.as_str(), value), ("llama.vocab_size", 1000)),
        other => panic!("expected CountMismatch, got {other:?}"),
    }
    // feed_forward_length against ffn_up.
    match load_spec(&with_key(&gl, "llama.feed_forward_length", 1024u32)) {
        Err(Error::CountMismatch { key, detail, .. }) => {
            assert_eq!(key, "llama.feed_forward_length");
            assert!(detail.contains("blk.0.ffn_up.weight"), "{detail}");
        }
        other => panic!("expected CountMismatch, got {other:?}"),
    }
    // Head counts against attn_q: 8 heads of 64 need 512 rows, the file has 256.
    let gq = rewrite(
        &gl,
        |w| {
            w.set_metadata("llama.attention.head_count", 8u32).unwrap();
        },
        |_| true,
        None,
    );
    match load_spec(&gq) {
        Err(Error::TensorShape { tensor, found, expected, because }) => {
            assert_eq!(tensor, "blk.0.attn_q.weight");
            assert_eq!((found, expected), (vec![256, 256], vec![256, 512]));
            assert!(because.contains("llama.attention.head_count"), "{because}");
        }
        other => panic!("expected TensorShape, got {other:?}"),
    }
    // Experts are refused, not ignored.
    match load_spec(&with_key(&gl, "llama.expert_count", 8u32)) {
        Err(Error::UnsupportedFeature { feature, .. }) => assert!(feature.contains("experts"), "{feature}"),
        other => panic!("expected UnsupportedFeature, got {other:?}"),
    }
}

#[test]
fn missing_misshapen_and_unsupported_tensors_are_named() {
    for arch in Arch::ALL {
        let g = tiny(arch);
        let first_q = if arch == Arch::Phi3 { "blk.1.attn_qkv.weight" } else { "blk.1.attn_q.weight" };
        match load_spec(&rewrite(&g, |_| {}, |n| n != first_q, None)) {
            // Without a fused or separate q, the separate one is asked for.
            Err(Error::MissingTensor(t)) => assert_eq!(t, "blk.1.attn_q.weight", "{arch}"),
            other => panic!("{arch}: expected MissingTensor, got {other:?}"),
        }
        // A norm of the wrong length.
        let bad = (("blk.0.ffn_norm.weight"), vec![128u64], GgmlType::F32, vec![0u8; 512]);
        match load_spec(&rewrite(&g, |_| {}, |_| true, Some(bad))) {
            Err(Error::TensorShape { tensor, found, .. }) => {
                assert_eq!((tensor.as_str(), found), ("blk.0.ffn_norm.weight", vec![128]), "{arch}");
            }
            other => panic!("{arch}: expected TensorShape, got {other:?}"),
        }
    }
    // Qwen 3 requires its q/k norms; Qwen 2 refuses an attn_output bias.
    let g = tiny(Arch::Qwen3);
    match load_spec(&rewrite(&g, |_| {}, |n| n != "blk.2.attn_k_norm.weight", None)) {
        Err(Error::MissingTensor(t)) => assert_eq!(t, "blk.2.attn_k_norm.weight"),
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    let g = tiny(Arch::Qwen2);
    let mut w = GgufWriter::from_gguf(&g).unwrap();
    w.add_tensor("blk.0.attn_output.bias", &[256], GgmlType::F32, vec![0u8; 1024]).unwrap();
    let g = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    match load_spec(&g) {
        Err(Error::UnsupportedFeature { arch, feature }) => {
            assert_eq!(arch, "qwen2");
            assert!(feature.contains("blk.0.attn_output.bias"), "{feature}");
        }
        other => panic!("expected UnsupportedFeature, got {other:?}"),
    }
}

#[test]
fn registry_is_the_one_list() {
    for arch in Arch::ALL {
        assert_eq!(Arch::from_gguf_name(arch.name()), Some(arch));
        assert!(arch.sizes().contains(&"tiny"), "{arch}");
        for size in arch.sizes() {
            let shape = SynthShape::preset(arch, size).unwrap_or_else(|e| panic!("{arch} {size}: {e}"));
            synth::plan_tensors(&shape, SynthQuant::Q4KM).unwrap_or_else(|e| panic!("{arch} {size}: {e}"));
        }
        let gemma = matches!(arch, Arch::Gemma3 | Arch::Gemma2);
        assert_eq!(arch.info().chat == infer_model::model::ChatFormat::Gemma, gemma, "{arch}");
    }
}

/// Mistral 7B GGUFs are `llama` files; llama.cpp's `llama` graph applies no
/// sliding window, so a window key is validated and then not applied.
#[test]
fn llama_files_run_without_a_window_as_llama_cpp_runs_them() {
    let g = with_key(&tiny(Arch::Llama), "llama.attention.sliding_window", 4u32);
    let spec = load_spec(&g).unwrap();
    assert!(spec.layers.iter().all(|l| l.sliding_window.is_none()));
    let (k, _, _) = hp_err(&with_key(&tiny(Arch::Llama), "llama.attention.sliding_window", 0u32));
    assert_eq!(k, "llama.attention.sliding_window");
    let shape = SynthShape::preset(Arch::Llama, "mistral-7b").unwrap();
    assert_eq!((shape.n_vocab, shape.n_head_kv, shape.head_dim), (32_768, 8, 128));
}
