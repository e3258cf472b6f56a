//! GGUF writer: layout as ggml's, atomic writes, generated tensors,
//! validation, element types of empty arrays, and a byte-for-byte rewrite
//! of the default model.

mod gguf_support;

use infer_compute::GgmlType;
use infer_model::gguf::{Array, GgufFile, GgufWriter, Value};
use infer_model::Error;

use gguf_support::*;

#[test]
fn writer_output_is_stable_through_a_read() {
    let bytes = sample_bytes();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let again = GgufWriter::from_gguf(&f).unwrap().to_bytes().unwrap();
    assert_eq!(bytes, again);
    assert_eq!(bytes.len() % 32, 0, "the last tensor is padded as ggml pads it");
}

#[test]
fn write_to_path_leaves_no_partial_file() {
    let tmp = tempfile::Builder::new().prefix("infer-model-gguf-write-").tempdir().unwrap();
    let dir = tmp.path();
    let path = dir.join("out.gguf");
    let mut w = sample_writer();
    w.add_tensor_with("bad", &[4], GgmlType::F32, |_| Err(Error::Gguf("fill failed".into()))).unwrap();
    assert!(w.write_to_path(&path).is_err());
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0, "partial file left behind");
    sample_writer().write_to_path(&path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), sample_bytes());
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 1);
    tmp.close().unwrap();
}

#[test]
fn generated_tensors_are_filled_at_write_time() {
    let mut w = GgufWriter::new();
    w.add_tensor_with("gen", &[4, 2], GgmlType::F32, |buf| {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = i as u8;
        }
        Ok(())
    })
    .unwrap();
    w.add_tensor_with("failing", &[4], GgmlType::F32, |_| Err(Error::Gguf("no data".into()))).unwrap();
    assert!(matches!(w.to_bytes(), Err(Error::Gguf(m)) if m == "no data"));
    w = GgufWriter::new();
    w.add_tensor_with("gen", &[4, 2], GgmlType::F32, |buf| {
        buf.fill(7);
        Ok(())
    })
    .unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.tensor_data(f.tensor("gen").unwrap()), &[7u8; 32][..]);
}

#[test]
fn writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", 1u32).unwrap();
    assert!(matches!(w.add_metadata("k", 2u32), Err(Error::Gguf(m)) if m.contains("duplicate")));
    w.set_metadata("k", 3u32).unwrap();
    assert_eq!(w.metadata()[0].1, Value::U32(3));
    // Arrays mixing element types cannot be built: `Array` holds one
    // typed vector.
    assert!(w.add_metadata("general.alignment", 48u32).is_err());
    assert!(w.add_metadata("general.alignment", 0u32).is_err());
    assert!(w.add_metadata("general.alignment", 64u64).is_err());

    let err = |r: infer_model::Result<&mut GgufWriter>, frag: &str| match r {
        Err(Error::Gguf(m)) => assert!(m.contains(frag), "{m:?} lacks {frag:?}"),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("accepted (expected {frag:?})"),
    };
    err(w.add_tensor("a", &[4], GgmlType::F32, vec![0u8; 15]), "needs 16 bytes, got 15");
    err(w.add_tensor("a", &[33], GgmlType::Q8_0, vec![0u8; 34]), "multiple");
    err(w.add_tensor("a", &[], GgmlType::F32, Vec::<u8>::new()), "0 dimensions");
    err(w.add_tensor("a", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0u8; 4]), "5 dimensions");
    err(w.add_tensor("a", &[1 << 32, 1 << 32], GgmlType::F32, Vec::<u8>::new()), "overflows");
    err(w.add_tensor("x".repeat(64), &[1], GgmlType::F32, vec![0u8; 4]), "longer than");
    w.add_tensor("a", &[4], GgmlType::F32, vec![0u8; 16]).unwrap();
    err(w.add_tensor("a", &[4], GgmlType::F32, vec![0u8; 16]), "duplicate tensor name");
}

#[test]
fn default_model_rewrites_byte_for_byte() {
    // Our writer lays files out as ggml does: copying every entry and
    // tensor reproduces the file exactly.
    let f = default_model();
    let copy = GgufWriter::from_gguf(&f).unwrap().to_bytes().unwrap();
    assert_eq!(copy.len(), f.bytes().len());
    assert!(copy == f.bytes(), "rewritten file differs");
}

#[test]
fn empty_arrays_keep_their_element_type() {
    // llama.cpp refuses an empty array<u8> where it reads strings or
    // integers: the element type is written as it was read.
    let cases: Vec<(Value, u32, &str)> = vec![
        (Value::from(Vec::<String>::new()), 8, "array of string"),
        (Value::from(Vec::<i32>::new()), 5, "array of i32"),
        (Value::from(Vec::<f32>::new()), 6, "array of f32"),
        (Value::from(Vec::<u8>::new()), 0, "array of u8"),
        (Value::from(Vec::<Array>::new()), 9, "array of array"),
        (Value::from(vec![Array::I64(vec![])]), 9, "array of array"),
    ];
    for (v, tag, desc) in cases {
        let mut w = GgufWriter::new();
        w.add_metadata("k", v.clone()).unwrap();
        let bytes = w.to_bytes().unwrap();
        let at = after_string(&bytes, "k") + 4;
        assert_eq!(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()), tag, "{desc}");
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        assert_eq!(f.get("k"), Some(&v));
        assert_eq!(f.get("k").unwrap().type_description(), desc);
        assert_eq!(GgufWriter::from_gguf(&f).unwrap().to_bytes().unwrap(), bytes, "{desc}");
    }
    let mut w = GgufWriter::new();
    w.add_metadata("tokens", Vec::<&str>::new()).unwrap();
    w.add_metadata("ids", Vec::<i32>::new()).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert!(f.get_str_array("tokens").unwrap().is_empty());
    assert!(f.get_i32_array("ids").unwrap().is_empty());
    assert!(matches!(f.get_str_array("ids"), Err(Error::KeyType { .. })));
}

/// Fuzzer findings (`fuzz/`, target `gguf_reader`), both in the target's
/// own checks rather than in the reader, kept as the writer's properties
/// they exposed: a NaN value is written back bit for bit (values compare
/// unequal, bytes do not), and tensors with gaps between them are packed,
/// so offsets change while names, shapes and data do not.
#[test]
fn rewrites_keep_nan_bits_and_pack_gapped_tensors() {
    let nan_value: &[u8] = &[
        71, 71, 85, 70, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 39, 0, 0, 0, 0, 0, 0, 0, 103, 101,
        110, 92, 114, 71, 71, 97, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 71, 71, 85, 70, 3, 0, 0, 0, 10, 0, 0, 0,
        0, 0, 0, 0, 6, 0, 0, 0, 172, 246, 255, 255, 255, 255, 255, 255, 255, 0, 0, 0, 97, 108, 0, 0, 0,
    ];
    let gapped: &[u8] = &[
        71, 71, 85, 70, 3, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0, 0, 103, 101,
        110, 101, 114, 97, 108, 46, 97, 108, 105, 103, 110, 109, 101, 110, 116, 4, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0,
        0, 0, 0, 97, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
        98, 1, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 13, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 253, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0,
    ];
    for (name, input) in [("NaN value", nan_value), ("gapped tensors", gapped)] {
        let f = GgufFile::from_bytes(input.to_vec()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let once = GgufWriter::from_gguf(&f).unwrap().to_bytes().unwrap();
        let again = GgufFile::from_bytes(once.clone()).unwrap();
        for ((ka, va), (kb, vb)) in again.metadata().iter().zip(f.metadata()) {
            assert_eq!(ka, kb);
            assert_eq!(format!("{va:?}"), format!("{vb:?}"), "{name}: `{ka}`");
            if let (Value::F32(a), Value::F32(b)) = (va, vb) {
                assert_eq!(a.to_bits(), b.to_bits(), "{name}: NaN bits");
            }
        }
        for (a, b) in again.tensors().iter().zip(f.tensors()) {
            assert_eq!((&a.name, &a.dims, a.ty), (&b.name, &b.dims, b.ty), "{name}");
            assert_eq!(again.tensor_data(a), f.tensor_data(b), "{name}: `{}`", a.name);
        }
        let twice = GgufWriter::from_gguf(&again).unwrap().to_bytes().unwrap();
        assert_eq!(twice, once, "{name}: a rewrite of a rewrite differs");
    }
    let f = GgufFile::from_bytes(gapped.to_vec()).unwrap();
    assert_eq!(f.tensor("b").unwrap().offset, 13);
    let packed = GgufFile::from_bytes(GgufWriter::from_gguf(&f).unwrap().to_bytes().unwrap()).unwrap();
    assert_eq!(packed.tensor("b").unwrap().offset, 6);
}
