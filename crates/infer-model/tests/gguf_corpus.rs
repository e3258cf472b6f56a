//! The malformed-file corpus: every kind of bad GGUF file the reader
//! rejects, generated here from a small valid file (no binaries are
//! committed), plus 16 truncation points of that file; and every kind of
//! model file that the reader accepts but the loader refuses (hyper-
//! parameters zero, out of range or contradicting each other, counts that
//! disagree with the tensors, missing or misshapen tensors), generated from
//! the tiny synthetic models. Each must give an error whose message names
//! the problem; the test prints how many kinds and files it checked.

mod gguf_support;

use std::sync::Arc;

use infer_compute::GgmlType;
use infer_model::gguf::{Array, GgufFile, GgufWriter, Value};
use infer_model::model::{load_spec, Arch};
use infer_model::synth::{self, SynthOptions, SynthQuant, SynthShape, SynthVocab};
use infer_model::Error;

use gguf_support::*;

/// One malformed file and the fragments its error message must contain.
struct Bad {
    kind: &'static str,
    bytes: Vec<u8>,
    fragments: Vec<&'static str>,
}

fn bad(kind: &'static str, bytes: Vec<u8>, fragments: &[&'static str]) -> Bad {
    Bad { kind, bytes, fragments: fragments.to_vec() }
}

/// `sample_bytes()` with one patch applied.
fn patched(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = sample_bytes();
    f(&mut b);
    b
}

/// `sample_bytes()` with the u64 at `pos(bytes)` set to `v`.
fn set_u64(pos: impl FnOnce(&[u8]) -> usize, v: u64) -> Vec<u8> {
    let mut b = sample_bytes();
    let at = pos(&b);
    put_u64(&mut b, at, v);
    b
}

/// `sample_bytes()` with the u32 at `pos(bytes)` set to `v`.
fn set_u32(pos: impl FnOnce(&[u8]) -> usize, v: u32) -> Vec<u8> {
    let mut b = sample_bytes();
    let at = pos(&b);
    put_u32(&mut b, at, v);
    b
}

/// `sample_bytes()` with the byte at `pos(bytes)` set to `v`.
fn set_byte(pos: impl FnOnce(&[u8]) -> usize, v: u8) -> Vec<u8> {
    let mut b = sample_bytes();
    let at = pos(&b);
    b[at] = v;
    b
}

/// A file with one metadata entry `key` of value `v`, then patched.
fn one_value(key: &str, v: impl Into<Value>, f: impl FnOnce(&mut Vec<u8>, usize)) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata(key, v).unwrap();
    let mut b = w.to_bytes().unwrap();
    let after_key = after_string(&b, key);
    f(&mut b, after_key);
    b
}

// One push per kind, grouped under comments, reads better than one literal.
#[allow(clippy::vec_init_then_push)]
fn corpus() -> Vec<Bad> {
    let mut c = Vec::new();
    // Header.
    c.push(bad("empty file", Vec::new(), &["truncated", "magic"]));
    c.push(bad("bad magic", set_u32(|_| 0, u32::from_le_bytes(*b"GGML")), &["bad magic", "GGML"]));
    c.push(bad("version 1", set_u32(|_| 4, 1), &["version 1 is not supported"]));
    c.push(bad("unknown version", set_u32(|_| 4, 7), &["unsupported GGUF version 7"]));
    c.push(bad("big-endian file", set_u32(|_| 4, 3u32.swap_bytes()), &["big-endian"]));
    c.push(bad("huge metadata count", set_u64(|_| 16, 1 << 60), &["1152921504606846976 metadata entries"]));
    c.push(bad("huge tensor count", set_u64(|_| 8, u64::MAX), &["18446744073709551615 tensors"]));

    // Strings.
    c.push(bad(
        "key length past the end",
        set_u64(|b| string_len_pos(b, "general.architecture"), 1 << 62),
        &["metadata entry 0", "string length 4611686018427387904", "past the end"],
    ));
    c.push(bad(
        "string value length past the end",
        set_u64(|b| after_string(b, "general.architecture") + 4, u64::MAX),
        &["metadata `general.architecture`", "past the end"],
    ));
    c.push(bad(
        "tensor name length past the end",
        set_u64(|b| string_len_pos(b, "norm.weight"), 1 << 40),
        &["tensor info 0", "name", "past the end"],
    ));
    c.push(bad(
        "invalid UTF-8 in a value",
        set_byte(|b| after_string(b, "general.architecture") + 4 + 8 + 1, 0xff),
        &["metadata `general.architecture`", "not valid UTF-8"],
    ));
    c.push(bad(
        "invalid UTF-8 in a key",
        set_byte(|b| find(b, b"general.architecture") + 2, 0xc0),
        &["metadata entry 0", "key", "not valid UTF-8"],
    ));
    c.push(bad(
        "invalid UTF-8 in a string array",
        one_value("tokens", vec!["ab", "cd"], |b, at| b[at + 4 + 4 + 8 + 8 + 2 + 8] = 0xff),
        &["metadata `tokens`", "element [1]", "not valid UTF-8"],
    ));

    // Values.
    c.push(bad(
        "unknown value type",
        set_u32(|b| after_string(b, "test.block_count"), 13),
        &["metadata `test.block_count`", "unknown value type 13"],
    ));
    c.push(bad(
        "unknown array element type",
        one_value("arr", vec![1u32], |b, at| put_u32(b, at + 4, 99)),
        &["metadata `arr`", "unknown array element type 99"],
    ));
    c.push(bad("invalid bool", one_value("flag", true, |b, at| b[at + 4] = 2), &["metadata `flag`", "bool value 2"]));
    c.push(bad(
        "invalid bool in an array",
        one_value("flags", vec![true, false, true], |b, at| b[at + 4 + 4 + 8 + 2] = 7),
        &["metadata `flags`", "element [2]", "bool value 7"],
    ));
    c.push(bad(
        "huge array count",
        one_value("arr", vec![1u32, 2, 3], |b, at| put_u64(b, at + 8, 1 << 60)),
        &["metadata `arr`", "array of 1152921504606846976 u32", "needs at least"],
    ));
    c.push(bad(
        "array count whose size overflows",
        one_value("arr", vec![1u32, 2, 3], |b, at| put_u64(b, at + 8, u64::MAX)),
        &["metadata `arr`", "array of 18446744073709551615 u32"],
    ));
    let nested = || Array::Array(vec![Array::from(vec![5u8, 6])]);
    c.push(bad(
        "huge nested array count",
        one_value("nest", nested(), |b, at| put_u64(b, at + 8 + 8 + 4, 1 << 60)),
        &["metadata `nest`", "element [0]: array of 1152921504606846976 u8"],
    ));
    c.push(bad(
        "huge outer array count",
        one_value("nest", nested(), |b, at| put_u64(b, at + 8, 1 << 61)),
        &["metadata `nest`", "array of 2305843009213693952 array"],
    ));
    let mut r = Raw::new(3, 0, 1);
    r.string("deep").u32(9);
    for _ in 0..100 {
        r.u32(9).u64(1);
    }
    r.u32(0).u64(0);
    c.push(bad("arrays nested 100 deep", r.0, &["metadata `deep`", "element [0][0][0]", "nested deeper than 32"]));
    let mut r = Raw::new(3, 0, 2);
    r.string("a.key").u32(4).u32(1).string("a.key").u32(4).u32(2);
    c.push(bad("duplicate metadata key", r.0, &["duplicate metadata key `a.key`", "entry 1"]));

    // Alignment.
    let with_alignment = |ty: u32, v: &[u8]| {
        let mut r = Raw::new(3, 1, 1);
        r.string("general.alignment").u32(ty).bytes(v);
        r.tensor("t", &[4], 0, 0);
        r.data(64, 16)
    };
    c.push(bad(
        "alignment 0",
        with_alignment(4, &0u32.to_le_bytes()),
        &["general.alignment", "0 is not a power of two"],
    ));
    c.push(bad(
        "alignment 48",
        with_alignment(4, &48u32.to_le_bytes()),
        &["general.alignment", "48 is not a power of two"],
    ));
    let mut s = 2u64.to_le_bytes().to_vec();
    s.extend(b"32");
    c.push(bad("alignment as a string", with_alignment(8, &s), &["general.alignment", "must be a u32"]));

    // Tensor infos.
    c.push(bad(
        "five dimensions",
        Raw::new(3, 1, 0).tensor("t", &[1, 1, 1, 1, 1], 0, 0).data(32, 32),
        &["tensor `t`", "5 dimensions"],
    ));
    c.push(bad(
        "zero dimensions",
        set_u32(|b| info_pos(b, "blk.0.q.weight", 2).n_dims, 0),
        &["tensor `blk.0.q.weight`", "0 dimensions"],
    ));
    c.push(bad(
        "element count overflows",
        set_u64(|b| info_pos(b, "blk.0.q.weight", 2).dims + 8, 1 << 62),
        &["tensor `blk.0.q.weight`", "overflows"],
    ));
    c.push(bad(
        "dimension out of int64 range",
        set_u64(|b| info_pos(b, "norm.weight", 1).dims, u64::MAX),
        &["tensor `norm.weight`", "out of range"],
    ));
    c.push(bad(
        "removed tensor type (Q4_2)",
        set_u32(|b| info_pos(b, "blk.0.q.weight", 2).ty, 4),
        &["tensor `blk.0.q.weight`", "unknown", "type id 4"],
    ));
    c.push(bad(
        "unknown tensor type",
        set_u32(|b| info_pos(b, "blk.0.q.weight", 2).ty, 12345),
        &["tensor `blk.0.q.weight`", "type id 12345"],
    ));
    c.push(bad(
        "row not a whole number of blocks",
        set_u64(|b| info_pos(b, "blk.0.q.weight", 2).dims, 48),
        &["tensor `blk.0.q.weight`", "48", "block size 32"],
    ));
    c.push(bad(
        "duplicate tensor name",
        patched(|b| {
            let at = find(b, b"blk.0.k.weight");
            b[at..at + 14].copy_from_slice(b"blk.0.q.weight");
        }),
        &["duplicate tensor name `blk.0.q.weight`", "info 2"],
    ));

    // Tensor data.
    c.push(bad(
        "tensor offset past the end",
        set_u64(|b| info_pos(b, "blk.0.k.weight", 2).offset, 1 << 20),
        &["tensor `blk.0.k.weight`", "past the end of the data section"],
    ));
    c.push(bad(
        "tensor offset + size overflows",
        set_u64(|b| info_pos(b, "blk.0.k.weight", 2).offset, u64::MAX - 31),
        &["tensor `blk.0.k.weight`", "past the end"],
    ));
    c.push(bad(
        "tensor size past the end",
        set_u64(|b| info_pos(b, "blk.0.k.weight", 2).dims + 8, 1000),
        &["tensor `blk.0.k.weight`", "144000 bytes", "past the end"],
    ));
    c.push(bad(
        "overlapping tensors",
        set_u64(|b| info_pos(b, "blk.0.k.weight", 2).offset, 192),
        &["`blk.0.q.weight`", "`blk.0.k.weight`", "overlap"],
    ));
    c.push(bad(
        "tensor offset not a multiple of the alignment",
        set_u64(|b| info_pos(b, "blk.0.k.weight", 2).offset, 260),
        &["tensor `blk.0.k.weight`", "offset 260", "alignment 32"],
    ));
    c.push(bad(
        "data section past the end",
        {
            let mut b = sample_bytes();
            let data_start = b.len() - (32 + 204 + 20 + 288);
            b.truncate(data_start - 5);
            b
        },
        &["truncated"],
    ));
    c
}

/// 16 cuts of the valid sample file, spread over its header and data: each
/// must be reported as truncated (or as a length that runs past the end).
fn truncations() -> Vec<(usize, Vec<u8>)> {
    let full = sample_bytes();
    let n = full.len();
    (0..16).map(|i| i * (n - 1) / 15).map(|cut| (cut, full[..cut].to_vec())).collect()
}

/// The tiny Q8_0 synthetic model of `arch`, read into memory.
fn tiny(arch: Arch) -> GgufFile {
    let dir = tempfile::Builder::new().prefix("infer-gguf-corpus-").tempdir().unwrap();
    let path = dir.path().join(format!("{arch}.gguf"));
    let shape = SynthShape::preset(arch, "tiny").unwrap();
    let opts = SynthOptions { shape, quant: SynthQuant::Q8_0, seed: 11, threads: 1, dequantized: false };
    synth::write_synthetic(&path, &opts, SynthVocab::Generated, Arc::new(|_| {})).unwrap();
    GgufFile::from_bytes(std::fs::read(&path).unwrap()).unwrap()
}

/// The bytes of `g` with `edit` applied to its metadata, without the tensor
/// named `without`, and with the tensor named in `replace` replaced.
fn rebuilt(
    g: &GgufFile,
    edit: impl FnOnce(&mut GgufWriter),
    without: Option<&str>,
    replace: Option<(&str, &[u64], GgmlType, Vec<u8>)>,
) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add_metadata(k.clone(), v.clone()).unwrap();
    }
    edit(&mut w);
    for t in g.tensors() {
        match &replace {
            _ if without == Some(t.name.as_str()) => {}
            Some((name, dims, ty, bytes)) if *name == t.name => {
                w.add_tensor(t.name.clone(), dims, *ty, bytes.clone()).unwrap();
            }
            _ => {
                w.add_tensor(t.name.clone(), &t.dims, t.ty, g.tensor_data(t).to_vec()).unwrap();
            }
        }
    }
    w.to_bytes().unwrap()
}

/// The bytes of `g` with metadata `key` set to `v`.
fn with(g: &GgufFile, key: &str, v: impl Into<Value>) -> Vec<u8> {
    let v = v.into();
    rebuilt(
        g,
        |w| {
            w.set_metadata(key, v).unwrap();
        },
        None,
        None,
    )
}

/// Model files the reader accepts and the loader must refuse: every kind
/// of issue 14 items 1, 2 and 7 and the loader's other checks.
#[allow(clippy::vec_init_then_push)]
fn model_corpus() -> Vec<Bad> {
    let g = tiny(Arch::Gemma3);
    let gl = tiny(Arch::Llama);
    let gq = tiny(Arch::Qwen2);
    let n_layer = g.get_u32("gemma3.block_count").unwrap();
    let mut c = Vec::new();

    // Hyper-parameters zero or out of range (item 1; a zero head count
    // divided by zero).
    c.push(bad(
        "hyper-parameter zero: head_count (62 layers)",
        rebuilt(
            &g,
            |w| {
                w.set_metadata("gemma3.block_count", 62u32).unwrap();
                w.set_metadata("gemma3.attention.head_count", 0u32).unwrap();
            },
            None,
            None,
        ),
        &["metadata `gemma3.attention.head_count` = 0"],
    ));
    for (kind, key) in [
        ("hyper-parameter zero: embedding_length", "gemma3.embedding_length"),
        ("hyper-parameter zero: head_count_kv", "gemma3.attention.head_count_kv"),
        ("hyper-parameter zero: key_length", "gemma3.attention.key_length"),
        ("hyper-parameter zero: context_length", "gemma3.context_length"),
        ("hyper-parameter zero: sliding_window", "gemma3.attention.sliding_window"),
        ("hyper-parameter zero: feed_forward_length", "gemma3.feed_forward_length"),
    ] {
        c.push(Bad { kind, bytes: with(&g, key, 0u32), fragments: vec![leak(format!("metadata `{key}` = 0"))] });
    }
    c.push(bad(
        "hyper-parameter out of range: head_count",
        with(&g, "gemma3.attention.head_count", 100_000u32),
        &["metadata `gemma3.attention.head_count` = 100000"],
    ));
    c.push(bad(
        "hyper-parameter out of range: key_length",
        with(&g, "gemma3.attention.key_length", 1u32 << 20),
        &["metadata `gemma3.attention.key_length` = 1048576"],
    ));
    // Item 2: a layer count that allocated before any tensor was looked up.
    c.push(bad(
        "hyper-parameter out of range: block_count 2^32-1",
        with(&g, "gemma3.block_count", u32::MAX),
        &["metadata `gemma3.block_count` = 4294967295"],
    ));
    c.push(bad(
        "hyper-parameter out of range: block_count 2^26",
        with(&g, "gemma3.block_count", 1u32 << 26),
        &["metadata `gemma3.block_count` = 67108864"],
    ));
    c.push(bad(
        "hyper-parameter not finite: rms epsilon NaN",
        with(&g, "gemma3.attention.layer_norm_rms_epsilon", f32::NAN),
        &["metadata `gemma3.attention.layer_norm_rms_epsilon` = NaN"],
    ));
    c.push(bad(
        "hyper-parameter out of range: rms epsilon negative",
        with(&g, "gemma3.attention.layer_norm_rms_epsilon", -1e-6f32),
        &["metadata `gemma3.attention.layer_norm_rms_epsilon`"],
    ));
    c.push(bad(
        "hyper-parameter zero: rope freq_base",
        with(&g, "gemma3.rope.freq_base", 0f32),
        &["metadata `gemma3.rope.freq_base` = 0"],
    ));
    c.push(bad(
        "hyper-parameter not finite: rope freq_base",
        with(&g, "gemma3.rope.freq_base", f32::INFINITY),
        &["metadata `gemma3.rope.freq_base` = inf"],
    ));
    c.push(bad(
        "hyper-parameter out of range: rope scaling factor",
        with(&g, "gemma3.rope.scaling.factor", -8f32),
        &["metadata `gemma3.rope.scaling.factor` = -8"],
    ));
    c.push(bad(
        "hyper-parameter of the wrong type",
        with(&g, "gemma3.block_count", "6"),
        &["gemma3.block_count", "string"],
    ));
    c.push(bad(
        "required hyper-parameter missing",
        rebuilt(
            &g,
            |w| {
                w.remove_metadata("gemma3.embedding_length");
            },
            None,
            None,
        ),
        &["missing metadata key `gemma3.embedding_length`"],
    ));

    // Hyper-parameters that contradict each other.
    c.push(bad(
        "head_count not a multiple of head_count_kv",
        with(&gl, "llama.attention.head_count_kv", 3u32),
        &["llama.attention.head_count", "head_count_kv", "4 / 3"],
    ));
    c.push(bad(
        "rope dimension_count odd",
        with(&gl, "llama.rope.dimension_count", 63u32),
        &["metadata `llama.rope.dimension_count` = 63"],
    ));
    c.push(bad(
        "rope dimension_count above head_dim",
        with(&gl, "llama.rope.dimension_count", 128u32),
        &["metadata `llama.rope.dimension_count` = 128"],
    ));
    c.push(bad(
        "embedding_length not a multiple of head_count",
        rebuilt(
            &gl,
            |w| {
                w.remove_metadata("llama.attention.key_length");
                w.set_metadata("llama.attention.head_count", 3u32).unwrap();
                w.set_metadata("llama.attention.head_count_kv", 3u32).unwrap();
            },
            None,
            None,
        ),
        &["metadata `llama.attention.head_count` = 3"],
    ));
    c.push(bad(
        "head_count x key_length not embedding_length (qwen2)",
        rebuilt(
            &gq,
            |w| {
                w.set_metadata("qwen2.attention.key_length", 32u32).unwrap();
                w.set_metadata("qwen2.attention.value_length", 32u32).unwrap();
            },
            None,
            None,
        ),
        &["qwen2.attention.head_count", "embedding_length"],
    ));

    // Counts against the tensors (item 7).
    c.push(Bad {
        kind: "block_count below the blk.N tensors",
        bytes: with(&g, "gemma3.block_count", n_layer - 1),
        fragments: vec![
            leak(format!("metadata `gemma3.block_count` = {} disagrees with the tensors", n_layer - 1)),
            leak(format!("{n_layer} layers")),
        ],
    });
    c.push(Bad {
        kind: "block_count above the blk.N tensors",
        bytes: with(&g, "gemma3.block_count", n_layer + 1),
        fragments: vec![leak(format!("metadata `gemma3.block_count` = {} disagrees with the tensors", n_layer + 1))],
    });
    let mut tokens: Vec<String> =
        g.get_str_array("tokenizer.ggml.tokens").unwrap().into_iter().map(str::to_string).collect();
    let n_vocab = tokens.len();
    tokens.push("<extra>".into());
    c.push(Bad {
        kind: "vocabulary larger than token_embd",
        bytes: with(&g, "tokenizer.ggml.tokens", Value::from(tokens)),
        fragments: vec![
            leak(format!("metadata `tokenizer.ggml.tokens` = {} disagrees with the tensors", n_vocab + 1)),
            "token_embd.weight",
        ],
    });
    c.push(bad(
        "vocab_size against token_embd",
        with(&gl, "llama.vocab_size", 1000u32),
        &["metadata `llama.vocab_size` = 1000 disagrees with the tensors"],
    ));
    c.push(bad(
        "feed_forward_length against ffn_up",
        with(&gl, "llama.feed_forward_length", 1024u32),
        &["metadata `llama.feed_forward_length` = 1024 disagrees", "blk.0.ffn_up.weight"],
    ));
    c.push(bad(
        "head_count against attn_q",
        with(&gl, "llama.attention.head_count", 8u32),
        &["tensor `blk.0.attn_q.weight` has shape [256, 256], expected [256, 512]", "llama.attention.head_count"],
    ));
    c.push(bad(
        "expert_count (experts are refused, not ignored)",
        with(&gl, "llama.expert_count", 8u32),
        &["llama", "experts", "not supported"],
    ));

    // Tensors.
    c.push(bad(
        "missing tensor",
        rebuilt(&g, |_| {}, Some("blk.1.attn_q.weight"), None),
        &["missing tensor `blk.1.attn_q.weight`"],
    ));
    c.push(bad(
        "norm of the wrong length",
        rebuilt(&g, |_| {}, None, Some(("blk.0.ffn_norm.weight", &[128], GgmlType::F32, vec![0u8; 512]))),
        &["tensor `blk.0.ffn_norm.weight` has shape [128]"],
    ));
    c
}

/// A message fragment built at run time, for [`Bad`]'s static fragments.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[test]
fn every_malformed_kind_is_rejected_with_a_message_naming_it() {
    let corpus = corpus();
    let mut failures = Vec::new();
    for case in &corpus {
        match GgufFile::from_bytes(case.bytes.clone()) {
            Ok(_) => failures.push(format!("{}: accepted", case.kind)),
            Err(Error::Gguf(msg)) => {
                println!("{:<52} {msg}", case.kind);
                let missing: Vec<_> = case.fragments.iter().filter(|f| !msg.contains(*f)).collect();
                if !missing.is_empty() {
                    failures.push(format!("{}: message {msg:?} lacks {missing:?}", case.kind));
                }
            }
            Err(other) => failures.push(format!("{}: not a GGUF error: {other:?}", case.kind)),
        }
    }
    let cuts = truncations();
    for (cut, bytes) in &cuts {
        match GgufFile::from_bytes(bytes.clone()) {
            Ok(_) => failures.push(format!("cut at {cut}: accepted")),
            Err(Error::Gguf(msg)) => {
                println!("{:<52} {msg}", format!("truncated at byte {cut}"));
                if !msg.contains("truncated") && !msg.contains("past the end") {
                    failures.push(format!("cut at {cut}: {msg:?} does not say truncated"));
                }
            }
            Err(other) => failures.push(format!("cut at {cut}: {other:?}")),
        }
    }
    // Model files: read, then refused by the loader.
    let models = model_corpus();
    for case in &models {
        match GgufFile::from_bytes(case.bytes.clone()).map(|g| load_spec(&g)) {
            Err(e) => failures.push(format!("{}: the reader refused it: {e}", case.kind)),
            Ok(Ok(_)) => failures.push(format!("{}: loaded", case.kind)),
            Ok(Err(e)) => {
                let msg = e.to_string();
                println!("{:<52} {msg}", case.kind);
                let missing: Vec<_> = case.fragments.iter().filter(|f| !msg.contains(*f)).collect();
                if !missing.is_empty() {
                    failures.push(format!("{}: message {msg:?} lacks {missing:?}", case.kind));
                }
            }
        }
    }
    println!(
        "malformed-file corpus: {} kinds ({} refused by the reader, {} by the loader), {} truncation points, {} files",
        corpus.len() + models.len(),
        corpus.len(),
        models.len(),
        cuts.len(),
        corpus.len() + models.len() + cuts.len()
    );
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
    assert!(corpus.len() >= 40, "the corpus lost reader kinds: {}", corpus.len());
    assert!(models.len() >= 30, "the corpus lost loader kinds: {}", models.len());
}

#[test]
fn truncations_cover_header_infos_and_data() {
    let f = GgufFile::from_bytes(sample_bytes()).unwrap();
    let cuts: Vec<usize> = truncations().iter().map(|(c, _)| *c).collect();
    assert!(cuts.iter().any(|&c| c < 24), "header");
    assert!(cuts.iter().any(|&c| c > 24 && c < f.data_offset()), "metadata and infos");
    assert!(cuts.iter().any(|&c| c > f.data_offset()), "data");
}
