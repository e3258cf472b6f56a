//! GGUF reader: round trips of every value type, tensor data without
//! copies, getters, reading into memory (`--no-mmap`), small alignments,
//! metadata arrays held at their size, and the default model (Gemma 3 270M
//! Q4_K_M). Malformed files are in `gguf_corpus.rs`, the writer in
//! `gguf_writer.rs`.

mod gguf_support;

use std::collections::BTreeSet;

use infer_compute::GgmlType;
use infer_model::gguf::{Array, GgufFile, GgufWriter, TensorInfo, Value};
use infer_model::Error;

use gguf_support::*;

fn every_value() -> Vec<(String, Value)> {
    vec![
        ("v.u8".into(), Value::U8(255)),
        ("v.i8".into(), Value::I8(-128)),
        ("v.u16".into(), Value::U16(65535)),
        ("v.i16".into(), Value::I16(-32768)),
        ("v.u32".into(), Value::U32(u32::MAX)),
        ("v.i32".into(), Value::I32(i32::MIN)),
        ("v.f32".into(), Value::F32(-1.5e-7)),
        ("v.bool_true".into(), Value::Bool(true)),
        ("v.bool_false".into(), Value::Bool(false)),
        ("v.string".into(), Value::String("héllo ▁wörld 🙂".into())),
        ("v.empty_string".into(), Value::String(String::new())),
        ("v.u64".into(), Value::U64(u64::MAX)),
        ("v.i64".into(), Value::I64(i64::MIN)),
        ("v.f64".into(), Value::F64(std::f64::consts::PI)),
        ("v.arr_u8".into(), Value::from(vec![0u8, 1, 255])),
        ("v.arr_i8".into(), Value::from(vec![-1i8, 0, 127])),
        ("v.arr_u16".into(), Value::from(vec![1u16, 65535])),
        ("v.arr_i16".into(), Value::from(vec![-2i16, 300])),
        ("v.arr_u32".into(), Value::from(vec![7u32])),
        ("v.arr_i32".into(), Value::from(vec![-5i32, 5, i32::MAX])),
        ("v.arr_f32".into(), Value::from(vec![0.0f32, -0.0, f32::INFINITY, 1e30])),
        ("v.arr_bool".into(), Value::from(vec![true, false, true])),
        ("v.arr_string".into(), Value::from(vec!["a", "", "<0x0A>", "▁the"])),
        ("v.arr_u64".into(), Value::from(vec![u64::MAX, 0])),
        ("v.arr_i64".into(), Value::from(vec![i64::MAX, -1])),
        ("v.arr_f64".into(), Value::from(vec![f64::MIN_POSITIVE, 2.5])),
        ("v.arr_empty_u8".into(), Value::from(Vec::<u8>::new())),
        ("v.arr_empty_string".into(), Value::from(Vec::<String>::new())),
        ("v.arr_empty_i32".into(), Value::from(Vec::<i32>::new())),
        (
            "v.nested".into(),
            Value::from(vec![
                Array::from(vec![1u32, 2, 3]),
                Array::from(vec!["x", "y"]),
                Array::F64(vec![]),
                Array::from(vec![Array::from(vec![true]), Array::from(vec![false, false])]),
            ]),
        ),
    ]
}

#[test]
fn round_trip_every_value_type() {
    let values = every_value();
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.add_metadata(k.clone(), v.clone()).unwrap();
    }
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.metadata(), &values[..]);
    assert!(f.tensors().is_empty());
    for (k, v) in &values {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    // Every type id 0..=12 is present at top level.
    let ids: BTreeSet<u32> = values.iter().map(|(_, v)| v.type_id()).collect();
    assert_eq!(ids, (0..=12).collect());
    assert_eq!(f.get("v.nested").unwrap().type_name(), "array");
    assert_eq!(f.get("v.arr_string").unwrap().type_description(), "array of string");
}

#[test]
fn round_trip_tensors_zero_copy() {
    let w = sample_writer();
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["norm.weight", "blk.0.q.weight", "blk.0.k.weight"]);

    let norm = f.tensor("norm.weight").unwrap();
    assert_eq!(
        norm,
        &TensorInfo { name: "norm.weight".into(), dims: vec![8], ty: GgmlType::F32, offset: 0, n_bytes: 32 }
    );
    assert_eq!(f.tensor_data(norm), &pattern(32, 1)[..]);
    let q = f.tensor("blk.0.q.weight").unwrap();
    assert_eq!(q.offset, 32);
    assert_eq!(q.n_bytes, 204);
    assert_eq!(f.tensor_data(q), &pattern(204, 2)[..]);
    let k = f.tensor("blk.0.k.weight").unwrap();
    assert_eq!(k.offset, 256); // 32 + 204 rounded up to 32
    assert_eq!(f.tensor_data(k), &pattern(288, 3)[..]);
    for t in f.tensors() {
        assert_eq!((f.data_offset() + t.offset as usize) % 32, 0);
    }

    let wq = f.weight("blk.0.q.weight").unwrap();
    assert_eq!((wq.ty, wq.rows, wq.cols), (GgmlType::Q8_0, 3, 64));
    // Zero copy: the weight's bytes are the file's bytes.
    assert_eq!(wq.data.as_bytes().as_ptr(), f.tensor_data(q).as_ptr());
    let wn = f.weight("norm.weight").unwrap();
    assert_eq!((wn.rows, wn.cols), (1, 8));
    assert!(matches!(f.weight("nope"), Err(Error::MissingTensor(n)) if n == "nope"));
    assert!(f.tensor("nope").is_none());
}

#[test]
fn weight_shapes_of_3d_and_4d_tensors() {
    let mut w = GgufWriter::new();
    w.add_tensor("t3", &[32, 2, 3], GgmlType::F16, vec![0u8; 32 * 6 * 2]).unwrap();
    w.add_tensor("t4", &[32, 2, 3, 4], GgmlType::Q8_0, vec![0u8; 34 * 24]).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let t3 = f.weight("t3").unwrap();
    assert_eq!((t3.rows, t3.cols), (6, 32));
    let t4 = f.weight("t4").unwrap();
    assert_eq!((t4.rows, t4.cols), (24, 32));
    assert_eq!(f.tensor("t4").unwrap().n_elements(), 768);
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = sample_writer();
    w.add_metadata("general.alignment", 64u32).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    let offsets: Vec<u64> = f.tensors().iter().map(|t| t.offset).collect();
    assert_eq!(offsets, [0, 64, 320]);
    assert_eq!(f.tensor_data(f.tensor("blk.0.k.weight").unwrap()), &pattern(288, 3)[..]);
}

#[test]
fn version_2_is_read() {
    let mut bytes = sample_bytes();
    put_u32(&mut bytes, 4, 2);
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensors().len(), 3);
}

#[test]
fn open_memory_maps_a_file() {
    let tmp = tempfile::Builder::new().prefix("infer-model-gguf-test-").tempdir().unwrap();
    let dir = tmp.path();
    let path = dir.join("sample.gguf");
    sample_writer().write_to_path(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "test");
    assert_eq!(f.tensor_data(f.tensor("norm.weight").unwrap()), &pattern(32, 1)[..]);
    let w = f.weight("blk.0.k.weight").unwrap();
    drop(f); // the weight keeps the mapping alive
    assert_eq!(w.data.as_bytes(), &pattern(288, 3)[..]);

    // Errors name the path.
    std::fs::write(&path, b"GGUF").unwrap();
    match GgufFile::open(&path) {
        Err(Error::Gguf(msg)) => assert!(msg.contains("sample.gguf") && msg.contains("truncated"), "{msg}"),
        other => panic!("{other:?}"),
    }
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(GgufFile::open(&path), Err(Error::Gguf(_))));
    assert!(matches!(GgufFile::open(dir.join("missing.gguf")), Err(Error::Io { .. })));
    tmp.close().unwrap();
}

#[test]
fn files_and_writers_are_shareable_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<GgufFile>();
    send_sync::<GgufWriter>();
    send_sync::<Value>();
}

#[test]
fn unaligned_input_buffer_is_realigned() {
    // A Vec whose data starts at an odd address: parse must still give
    // tensor data at addresses aligned like the file offsets.
    let bytes = sample_bytes();
    let mut big = vec![0u8; bytes.len() + 1];
    big[1..].copy_from_slice(&bytes);
    let shifted: Vec<u8> = big[1..].to_vec();
    let f = GgufFile::from_bytes(shifted).unwrap();
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).as_ptr() as usize % 16, 0);
    }
}

#[test]
fn getters_convert_losslessly_and_report_types() {
    let mut w = GgufWriter::new();
    w.add_metadata("u8", 7u8).unwrap();
    w.add_metadata("i64_small", 40i64).unwrap();
    w.add_metadata("i32_neg", -3i32).unwrap();
    w.add_metadata("u64_big", 1u64 << 40).unwrap();
    w.add_metadata("f32", 0.5f32).unwrap();
    w.add_metadata("f64", 0.25f64).unwrap();
    w.add_metadata("flag", true).unwrap();
    w.add_metadata("name", "gemma").unwrap();
    w.add_metadata("tokens", vec!["a", "b"]).unwrap();
    w.add_metadata("scores", vec![0.5f32, -1.0]).unwrap();
    w.add_metadata("types", vec![1i32, 2, 3]).unwrap();
    w.add_metadata("types_u8", vec![1u8, 6]).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();

    assert_eq!(f.get_u32("u8").unwrap(), 7);
    assert_eq!(f.get_u64("u8").unwrap(), 7);
    assert_eq!(f.get_i32("u8").unwrap(), 7);
    assert_eq!(f.get_u32("i64_small").unwrap(), 40);
    assert_eq!(f.get_i32("i32_neg").unwrap(), -3);
    assert_eq!(f.get_i64("i32_neg").unwrap(), -3);
    assert_eq!(f.get_u64("u64_big").unwrap(), 1 << 40);
    assert_eq!(f.get_f32("f32").unwrap(), 0.5);
    assert_eq!(f.get_f32("f64").unwrap(), 0.25);
    assert_eq!(f.get_f64("f32").unwrap(), 0.5);
    assert!(f.get_bool("flag").unwrap());
    assert_eq!(f.get_str("name").unwrap(), "gemma");
    assert_eq!(f.get_array("tokens").unwrap().len(), 2);
    assert_eq!(f.get_str_array("tokens").unwrap(), ["a", "b"]);
    assert_eq!(f.get_f32_array("scores").unwrap(), [0.5, -1.0]);
    assert_eq!(f.get_i32_array("types").unwrap(), [1, 2, 3]);
    assert_eq!(f.get_i32_array("types_u8").unwrap(), [1, 6]);

    let key_type = |r: infer_model::Result<_>, exp: &str, fnd: &str| match r {
        Err(Error::KeyType { expected, found, .. }) => {
            assert_eq!((expected, found), (exp, fnd));
        }
        Err(e) => panic!("{e:?}"),
        Ok(()) => panic!("accepted"),
    };
    // Integers of any kind are read when their value fits; one that does
    // not is named with its value.
    let out_of_range = |r: infer_model::Result<_>, want: &str| match r {
        Err(e @ Error::HyperParameter { .. }) => assert_eq!(e.to_string(), want),
        Err(e) => panic!("{e:?}"),
        Ok(()) => panic!("accepted"),
    };
    out_of_range(f.get_u32("i32_neg").map(drop), "metadata `i32_neg` = -3: out of the range of a u32");
    out_of_range(f.get_u32("u64_big").map(drop), "metadata `u64_big` = 1099511627776: out of the range of a u32");
    key_type(f.get_i32("name").map(drop), "i32", "string");
    key_type(f.get_u32("flag").map(drop), "u32", "bool");
    key_type(f.get_f32("u8").map(drop), "f32", "u8");
    key_type(f.get_bool("u8").map(drop), "bool", "u8");
    key_type(f.get_str("tokens").map(drop), "string", "array of string");
    key_type(f.get_array("name").map(drop), "array", "string");
    key_type(f.get_str_array("scores").map(drop), "array of string", "array of f32");
    key_type(f.get_f32_array("tokens").map(drop), "array of f32", "array of string");
    key_type(f.get_i32_array("scores").map(drop), "array of i32", "array of f32");
    assert!(matches!(f.get_u32("absent"), Err(Error::MissingKey(k)) if k == "absent"));
    assert!(matches!(f.get_str_array("absent"), Err(Error::MissingKey(_))));
    assert!(f.get("absent").is_none());
}

#[test]
fn zero_sized_dimension_is_an_empty_tensor() {
    // ggml accepts extents of 0; such a tensor has no bytes.
    let mut r = Raw::new(3, 2, 0);
    r.tensor("empty", &[32, 0], 8, 0).tensor("t", &[4], 0, 0);
    let f = GgufFile::from_bytes(r.data(32, 16)).unwrap();
    assert_eq!(f.tensor("empty").unwrap().n_bytes, 0);
    let w = f.weight("empty").unwrap();
    assert_eq!((w.rows, w.cols), (0, 32));
}

#[test]
fn default_model_header() {
    let f = default_model();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.tensors().len(), 236);
    // The header's key/value count; no synthetic entries.
    assert_eq!(f.metadata().len(), 33);
    assert_eq!(f.get_str("general.architecture").unwrap(), "gemma3");
    let types: BTreeSet<u32> = f.tensors().iter().map(|t| t.ty.id()).collect();
    let expected: BTreeSet<u32> = [GgmlType::F32, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K]
        .iter()
        .map(|t| t.id())
        .collect();
    assert_eq!(types, expected);
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).len(), t.n_bytes, "{}", t.name);
        let w = f.tensor_weight(t).unwrap();
        assert_eq!(w.rows as u64 * w.cols as u64, t.n_elements(), "{}", t.name);
    }
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert!(tokens.len() > 200_000);
    assert_eq!(f.get_f32_array("tokenizer.ggml.scores").unwrap().len(), tokens.len());
    assert_eq!(f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(), tokens.len());
    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.dims.len(), 2);
    assert_eq!(f.get_u32("gemma3.embedding_length").unwrap() as u64, q.dims[0]);
}

#[test]
fn default_model_dequantizes_attn_q() {
    let f = default_model();
    let w = f.weight("blk.0.attn_q.weight").unwrap();
    let mut row = vec![0f32; w.cols];
    let mut nonzero = 0usize;
    for r in 0..w.rows {
        infer_compute::quant::dequantize_row(w.ty, w.row(r), &mut row).unwrap();
        assert!(row.iter().all(|v| v.is_finite()), "row {r} has non-finite values");
        nonzero += row.iter().filter(|v| **v != 0.0).count();
    }
    assert!(nonzero > w.rows * w.cols / 2, "mostly zeros: {nonzero}");
}

#[test]
fn alignment_one_gives_aligned_copies_of_misaligned_tensors() {
    // ggml accepts `general.alignment = 1`: tensors then sit at any offset,
    // including ones not a multiple of their element size.
    let build = |pad: &str| {
        let mut w = GgufWriter::new();
        w.add_metadata("general.alignment", 1u32).unwrap();
        w.add_metadata("pad", pad).unwrap(); // sets the parity of the data section's start
        w.add_tensor("f16", &[3], GgmlType::F16, pattern(6, 1)).unwrap();
        w.add_tensor("f32", &[4], GgmlType::F32, pattern(16, 2)).unwrap();
        w.add_tensor("q8", &[32], GgmlType::Q8_0, pattern(34, 3)).unwrap();
        w.add_tensor("q4k", &[256], GgmlType::Q4_K, pattern(144, 4)).unwrap();
        w
    };
    let mut w = build("x");
    if GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap().data_offset().is_multiple_of(2) {
        w = build("xy");
    }
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.alignment(), 1);
    let mut misaligned = 0;
    for (t, seed) in f.tensors().iter().zip(1u8..) {
        let start = f.data_offset() + t.offset as usize;
        if !start.is_multiple_of(2) || (t.ty == GgmlType::F32 && !start.is_multiple_of(4)) {
            misaligned += 1;
        }
        let data = f.tensor_data(t);
        assert_eq!(data, &pattern(t.n_bytes, seed)[..], "{}", t.name);
        let w = f.weight(&t.name).unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert_eq!(w.data.as_bytes(), data);
        let mut out = vec![0f32; w.cols];
        infer_compute::quant::dequantize_row(w.ty, w.row(0), &mut out).unwrap();
    }
    assert_eq!(misaligned, 4, "every tensor of the case starts at an odd offset");
    // The copies are what a rewrite writes back.
    assert_eq!(GgufWriter::from_gguf(&f).unwrap().to_bytes().unwrap(), bytes);
    // Through a file too, mapped and read.
    let tmp = tempfile::Builder::new().prefix("infer-model-gguf-align1-").tempdir().unwrap();
    let dir = tmp.path();
    let path = dir.join("a1.gguf");
    std::fs::write(&path, &bytes).unwrap();
    for f in [GgufFile::open(&path).unwrap(), GgufFile::read(&path).unwrap()] {
        assert_eq!(f.weight("f32").unwrap().data.as_bytes(), &pattern(16, 2)[..]);
        assert_eq!(f.weight("q4k").unwrap().data.as_bytes(), &pattern(144, 4)[..]);
    }
    tmp.close().unwrap();
}

#[test]
fn read_into_memory_matches_the_mapping() {
    let tmp = tempfile::Builder::new().prefix("infer-model-gguf-read-").tempdir().unwrap();
    let dir = tmp.path();
    let path = dir.join("sample.gguf");
    sample_writer().write_to_path(&path).unwrap();
    let mapped = GgufFile::open(&path).unwrap();
    let read = GgufFile::read(&path).unwrap();
    assert_eq!(mapped.bytes(), read.bytes());
    assert_eq!(mapped.metadata(), read.metadata());
    assert_eq!(mapped.tensors(), read.tensors());
    let w = read.weight("blk.0.k.weight").unwrap();
    drop(read);
    assert_eq!(w.data.as_bytes(), &pattern(288, 3)[..]);
    // The file can change once read: the copy does not.
    std::fs::write(&path, b"GGUF").unwrap();
    assert_eq!(w.data.as_bytes(), &pattern(288, 3)[..]);
    match GgufFile::read(&path) {
        Err(Error::Gguf(msg)) => assert!(msg.contains("sample.gguf") && msg.contains("truncated"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(GgufFile::read(dir.join("missing.gguf")), Err(Error::Io { .. })));
    assert!(matches!(GgufFile::read(dir), Err(Error::Io { .. })), "a directory");
    tmp.close().unwrap();
}

#[test]
fn alignments_that_are_powers_of_two_are_accepted() {
    for a in [1u32, 2, 8, 64, 4096] {
        let mut w = sample_writer();
        w.add_metadata("general.alignment", a).unwrap();
        let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        assert_eq!(f.alignment(), a as usize);
        assert_eq!(f.tensor_data(f.tensor("blk.0.k.weight").unwrap()), &pattern(288, 3)[..]);
    }
}

#[test]
fn metadata_arrays_are_held_at_their_size() {
    // A value is small, and an array of u8 is one byte per element (it was
    // a 32-byte enum per element: a 50 M-element array cost 1.6 GB).
    assert!(std::mem::size_of::<Value>() <= 40, "{}", std::mem::size_of::<Value>());
    let n = 3_000_000;
    let mut w = GgufWriter::new();
    w.add_metadata("big", vec![7u8; n]).unwrap();
    w.add_metadata("strings", vec!["a", "bc", ""]).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    match f.get_array("big").unwrap() {
        Array::U8(v) => assert!(v.len() == n && v.capacity() == n && v.iter().all(|&b| b == 7)),
        other => panic!("{}", other.elem_type_name()),
    }
    let s = f.get_array("strings").unwrap().as_strings().unwrap();
    assert_eq!((s.len(), s.text_len()), (3, 3));
    assert_eq!(s.iter().collect::<Vec<_>>(), ["a", "bc", ""]);
    assert_eq!(f.get_array("strings").unwrap().encoded_len(), 3 * 8 + 3);
}
