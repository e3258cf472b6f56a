//! Loading architectures from GGUF metadata: defaults for optional keys,
//! errors naming missing required keys and tensors.

use infer_model::gguf::{GgufFile, GgufWriter};
use infer_model::model::load_spec;
use infer_model::Error;

fn default_model() -> GgufFile {
    GgufFile::open(infer_model::fetch::default_model_path().expect("default model")).expect("open")
}

/// The default model with `edit` applied to a writer copy of it.
fn edited(edit: impl FnOnce(&mut GgufWriter)) -> GgufFile {
    let mut w = GgufWriter::from_gguf(&default_model()).expect("copy");
    edit(&mut w);
    GgufFile::from_bytes(w.to_bytes().expect("write")).expect("reread")
}

#[test]
fn gemma3_spec_of_the_default_model() {
    let spec = load_spec(&default_model()).expect("spec");
    assert_eq!((spec.n_embd, spec.n_vocab, spec.layers.len()), (640, 262_144, 18));
    assert!((spec.embd_scale - 640f32.sqrt()).abs() < 1e-6);
    for (i, l) in spec.layers.iter().enumerate() {
        let global = i % 6 == 5;
        assert_eq!(l.sliding_window, if global { None } else { Some(512) }, "layer {i}");
        assert_eq!(l.rope.base, if global { 1_000_000.0 } else { 10_000.0 }, "layer {i}");
        assert_eq!((l.n_head, l.n_head_kv, l.head_dim, l.rope.n_rot), (4, 1, 256, 256));
        assert!((l.attn_scale - 1.0 / 16.0).abs() < 1e-7);
        assert!(l.q_norm.is_some() && l.k_norm.is_some() && l.post_attn_norm.is_some() && l.post_ffn_norm.is_some());
    }
    // Tied output: the embedding bytes themselves.
    assert_eq!(spec.output.data.as_bytes().as_ptr(), spec.token_embd.data.as_bytes().as_ptr());
}

#[test]
fn missing_required_key_is_named() {
    for key in
        ["gemma3.block_count", "gemma3.embedding_length", "gemma3.attention.sliding_window", "gemma3.context_length"]
    {
        let g = edited(|w| {
            w.remove_metadata(key).expect("key present");
        });
        match load_spec(&g) {
            Err(Error::MissingKey(k)) => assert_eq!(k, key),
            other => panic!("removing {key}: expected MissingKey, got {other:?}"),
        }
    }
}

#[test]
fn missing_optional_keys_take_documented_defaults() {
    let g = edited(|w| {
        w.remove_metadata("gemma3.rope.freq_base").unwrap();
        w.remove_metadata("gemma3.attention.layer_norm_rms_epsilon").unwrap();
    });
    let spec = load_spec(&g).expect("spec with defaults");
    assert_eq!(spec.layers[5].rope.base, 1_000_000.0);
    assert_eq!(spec.layers[0].attn_norm.eps, 1e-6);
    // head_count_kv defaults to head_count (4, multi-head attention), which
    // disagrees with this GQA model's 256-row attn_k: the shape check names
    // the tensor instead of running a wrong model.
    let g = edited(|w| {
        w.remove_metadata("gemma3.attention.head_count_kv").unwrap();
    });
    match load_spec(&g) {
        Err(Error::TensorShape { tensor, found, expected, because }) => {
            assert_eq!(tensor, "blk.0.attn_k.weight");
            assert_eq!((found, expected), (vec![640, 256], vec![640, 1024]));
            assert!(because.contains("gemma3.attention.head_count_kv"), "{because}");
        }
        other => panic!("expected TensorShape, got {other:?}"),
    }
}

#[test]
fn wrong_key_type_and_missing_tensor_are_errors() {
    let g = edited(|w| {
        w.set_metadata("gemma3.block_count", "eighteen").unwrap();
    });
    assert!(matches!(load_spec(&g), Err(Error::KeyType { .. })));
    let g = edited(|w| {
        w.set_metadata("gemma3.block_count", 19u32).unwrap();
    });
    // A layer count beyond the blk.N tensors is named with both.
    match load_spec(&g) {
        Err(Error::CountMismatch { key, value, detail }) => {
            assert_eq!((key.as_str(), value), ("gemma3.block_count", 19));
            assert!(detail.contains("18 layers"), "{detail}");
        }
        other => panic!("expected CountMismatch, got {other:?}"),
    }
}

#[test]
fn unsupported_architecture_is_named() {
    let g = edited(|w| {
        w.set_metadata("general.architecture", "rwkv7").unwrap();
    });
    match load_spec(&g) {
        Err(Error::UnsupportedArch(a)) => assert_eq!(a, "rwkv7"),
        other => panic!("expected UnsupportedArch, got {other:?}"),
    }
}
