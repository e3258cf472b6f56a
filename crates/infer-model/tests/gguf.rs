//! GGUF reader and writer: round trips, one test per kind of malformed
//! file, and the default model (Gemma 3 270M Q4_K_M).

use std::collections::BTreeSet;

use infer_compute::GgmlType;
use infer_model::gguf::{GgufFile, GgufWriter, TensorInfo, Value};
use infer_model::Error;

// ---------------------------------------------------------------------------
// Helpers

/// Deterministic filler bytes.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A small valid file: two metadata entries and three tensors.
fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "test").unwrap();
    w.add_metadata("test.block_count", 2u32).unwrap();
    w.add_tensor("norm.weight", &[8], GgmlType::F32, pattern(32, 1)).unwrap();
    w.add_tensor("blk.0.q.weight", &[64, 3], GgmlType::Q8_0, pattern(2 * 34 * 3, 2)).unwrap();
    w.add_tensor("blk.0.k.weight", &[256, 2], GgmlType::Q4_K, pattern(144 * 2, 3)).unwrap();
    w
}

fn sample_bytes() -> Vec<u8> {
    sample_writer().to_bytes().unwrap()
}

/// Position of the first occurrence of `needle`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).expect("needle present")
}

/// Position just after a GGUF string with this text (key or tensor name).
fn after_string(bytes: &[u8], s: &str) -> usize {
    find(bytes, s.as_bytes()) + s.len()
}

/// Position of the u64 length that precedes a GGUF string with this text.
fn string_len_pos(bytes: &[u8], s: &str) -> usize {
    find(bytes, s.as_bytes()) - 8
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// Field positions inside a tensor info, found by the tensor's name.
struct InfoPos {
    n_dims: usize,
    dims: usize,
    ty: usize,
    offset: usize,
}

fn info_pos(bytes: &[u8], name: &str, n_dims: usize) -> InfoPos {
    let n = after_string(bytes, name);
    InfoPos { n_dims: n, dims: n + 4, ty: n + 4 + 8 * n_dims, offset: n + 4 + 8 * n_dims + 4 }
}

/// Parses and expects an [`Error::Gguf`] whose message contains every
/// fragment.
fn expect_gguf_err(bytes: Vec<u8>, fragments: &[&str]) -> String {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("parsed a file that should be rejected (expected {fragments:?})"),
        Err(Error::Gguf(msg)) => {
            eprintln!("rejected: {msg}");
            for f in fragments {
                assert!(msg.contains(f), "message {msg:?} lacks {f:?}");
            }
            msg
        }
        Err(other) => panic!("expected Error::Gguf containing {fragments:?}, got {other:?}"),
    }
}

/// A hand-written file: header, then raw pieces.
struct Raw(Vec<u8>);

impl Raw {
    fn new(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn string(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A tensor info.
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.string(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to `align` and appends `n` data bytes.
    fn data(&mut self, align: usize, n: usize) -> Vec<u8> {
        let mut b = self.0.clone();
        b.resize(b.len().next_multiple_of(align), 0);
        b.extend(pattern(n, 9));
        b
    }
}

// ---------------------------------------------------------------------------
// Round trips

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
        ("v.arr_empty".into(), Value::Array(vec![])),
        (
            "v.nested".into(),
            Value::Array(vec![
                Value::from(vec![1u32, 2, 3]),
                Value::from(vec!["x", "y"]),
                Value::Array(vec![]),
                Value::Array(vec![Value::from(vec![true]), Value::from(vec![false, false])]),
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
fn writer_output_is_stable_through_a_read() {
    let bytes = sample_bytes();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let again = GgufWriter::from_gguf(&f).unwrap().to_bytes().unwrap();
    assert_eq!(bytes, again);
    assert_eq!(bytes.len() % 32, 0, "the last tensor is padded as ggml pads it");
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
    let dir = std::env::temp_dir().join(format!("infer-model-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
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
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_and_writers_are_shareable_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<GgufFile>();
    send_sync::<GgufWriter>();
    send_sync::<Value>();
}

#[test]
fn write_to_path_leaves_no_partial_file() {
    let dir = std::env::temp_dir().join(format!("infer-model-gguf-write-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("out.gguf");
    let mut w = sample_writer();
    w.add_tensor_with("bad", &[4], GgmlType::F32, |_| Err(Error::Gguf("fill failed".into()))).unwrap();
    assert!(w.write_to_path(&path).is_err());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "partial file left behind");
    sample_writer().write_to_path(&path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), sample_bytes());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
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

// ---------------------------------------------------------------------------
// Getters

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
    key_type(f.get_u32("i32_neg").map(drop), "u32", "i32");
    key_type(f.get_u32("u64_big").map(drop), "u32", "u64");
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

// ---------------------------------------------------------------------------
// Writer validation

#[test]
fn writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", 1u32).unwrap();
    assert!(matches!(w.add_metadata("k", 2u32), Err(Error::Gguf(m)) if m.contains("duplicate")));
    w.set_metadata("k", 3u32).unwrap();
    assert_eq!(w.metadata()[0].1, Value::U32(3));
    let mixed = Value::Array(vec![Value::U32(1), Value::String("x".into())]);
    assert!(matches!(w.add_metadata("mixed", mixed), Err(Error::Gguf(m)) if m.contains("mixes")));
    let nested_mixed = Value::Array(vec![Value::Array(vec![Value::U8(1), Value::I8(1)])]);
    assert!(matches!(w.add_metadata("nm", nested_mixed), Err(Error::Gguf(m)) if m.contains("element 0")));
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
    err(w.add_tensor("a", &[], GgmlType::F32, vec![]), "0 dimensions");
    err(w.add_tensor("a", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0u8; 4]), "5 dimensions");
    err(w.add_tensor("a", &[1 << 32, 1 << 32], GgmlType::F32, vec![]), "overflows");
    err(w.add_tensor("x".repeat(64), &[1], GgmlType::F32, vec![0u8; 4]), "longer than");
    w.add_tensor("a", &[4], GgmlType::F32, vec![0u8; 16]).unwrap();
    err(w.add_tensor("a", &[4], GgmlType::F32, vec![0u8; 16]), "duplicate tensor name");
}

// ---------------------------------------------------------------------------
// Malformed files: one test per kind

#[test]
fn bad_magic() {
    let mut b = sample_bytes();
    b[..4].copy_from_slice(b"GGML");
    expect_gguf_err(b, &["bad magic", "GGML"]);
}

#[test]
fn version_1_is_unsupported() {
    let mut b = sample_bytes();
    put_u32(&mut b, 4, 1);
    expect_gguf_err(b, &["version 1 is not supported"]);
}

#[test]
fn unknown_version() {
    let mut b = sample_bytes();
    put_u32(&mut b, 4, 4);
    expect_gguf_err(b, &["unsupported GGUF version 4"]);
}

#[test]
fn big_endian_file() {
    let mut b = sample_bytes();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    expect_gguf_err(b, &["big-endian"]);
}

#[test]
fn truncated_header() {
    expect_gguf_err(Vec::new(), &["header", "truncated", "magic"]);
    expect_gguf_err(sample_bytes()[..12].to_vec(), &["header", "truncated", "tensor count"]);
    expect_gguf_err(sample_bytes()[..20].to_vec(), &["header", "truncated", "metadata count"]);
}

#[test]
fn truncated_metadata() {
    let b = sample_bytes();
    // Cut inside the value of `test.block_count`.
    let cut = after_string(&b, "test.block_count") + 4 + 2;
    expect_gguf_err(b[..cut].to_vec(), &["metadata `test.block_count`", "truncated", "u32 value"]);
    // Cut inside a key.
    let cut = find(&b, b"test.block_count") + 3;
    expect_gguf_err(b[..cut].to_vec(), &["metadata entry 1", "key", "past the end"]);
}

#[test]
fn truncated_tensor_infos() {
    let b = sample_bytes();
    let p = info_pos(&b, "blk.0.q.weight", 2);
    expect_gguf_err(b[..p.dims + 5].to_vec(), &["tensor `blk.0.q.weight`", "truncated", "dimension"]);
    expect_gguf_err(b[..p.offset + 3].to_vec(), &["tensor `blk.0.q.weight`", "truncated", "data offset"]);
}

#[test]
fn truncated_data() {
    let b = sample_bytes();
    let f = GgufFile::from_bytes(b.clone()).unwrap();
    let k = f.tensor("blk.0.k.weight").unwrap();
    let cut = f.data_offset() + k.offset as usize + k.n_bytes - 1;
    expect_gguf_err(b[..cut].to_vec(), &["truncated", "tensor `blk.0.k.weight`", "past the end"]);
    // Cut before the data section starts at all.
    let cut = f.data_offset() - 1;
    expect_gguf_err(b[..cut].to_vec(), &["truncated", "data section"]);
}

#[test]
fn string_length_past_end() {
    let mut b = sample_bytes();
    let at = string_len_pos(&b, "general.architecture");
    put_u64(&mut b, at, 1 << 62);
    expect_gguf_err(b, &["metadata entry 0", "string length 4611686018427387904", "past the end"]);
    // A string value (not a key).
    let mut b = sample_bytes();
    let at = after_string(&b, "general.architecture") + 4;
    put_u64(&mut b, at, u64::MAX);
    expect_gguf_err(b, &["metadata `general.architecture`", "past the end"]);
    // A tensor name.
    let mut b = sample_bytes();
    let at = string_len_pos(&b, "norm.weight");
    put_u64(&mut b, at, 1 << 40);
    expect_gguf_err(b, &["tensor info 0", "name", "past the end"]);
}

#[test]
fn huge_array_count_does_not_allocate() {
    let mut w = GgufWriter::new();
    w.add_metadata("arr", vec![1u32, 2, 3]).unwrap();
    let mut b = w.to_bytes().unwrap();
    let count_at = after_string(&b, "arr") + 4 + 4;
    assert_eq!(get_u64(&b, count_at), 3);
    put_u64(&mut b, count_at, 1 << 60);
    expect_gguf_err(b.clone(), &["metadata `arr`", "array of 1152921504606846976 u32", "needs at least"]);
    // A count whose byte size overflows u64.
    put_u64(&mut b, count_at, u64::MAX);
    expect_gguf_err(b, &["metadata `arr`", "array of 18446744073709551615 u32"]);
}

#[test]
fn huge_nested_array_count() {
    let mut w = GgufWriter::new();
    w.add_metadata("nest", Value::Array(vec![Value::from(vec![5u8, 6])])).unwrap();
    let mut b = w.to_bytes().unwrap();
    // Outer: type 9, count 1; inner: type 0, count 2.
    let outer_count = after_string(&b, "nest") + 4 + 4;
    let inner_count = outer_count + 8 + 4;
    assert_eq!(get_u64(&b, inner_count), 2);
    put_u64(&mut b, inner_count, 1 << 60);
    expect_gguf_err(b.clone(), &["metadata `nest`", "element [0]: array of 1152921504606846976 u8"]);
    put_u64(&mut b, outer_count, 1 << 61);
    expect_gguf_err(b, &["metadata `nest`", "array of 2305843009213693952 array"]);
}

#[test]
fn deeply_nested_arrays() {
    let mut r = Raw::new(3, 0, 1);
    r.string("deep").u32(9); // value type: array
    for _ in 0..100 {
        r.u32(9).u64(1); // element type array, count 1
    }
    r.u32(0).u64(0);
    let msg = expect_gguf_err(r.0, &["metadata `deep`", "element [0][0][0]", "nested deeper than 32"]);
    assert!(msg.len() < 300, "{msg}");
}

#[test]
fn huge_counts_in_header() {
    let mut b = sample_bytes();
    put_u64(&mut b, 16, 1 << 60);
    expect_gguf_err(b, &["1152921504606846976 metadata entries"]);
    let mut b = sample_bytes();
    put_u64(&mut b, 8, u64::MAX);
    expect_gguf_err(b, &["18446744073709551615 tensors"]);
}

#[test]
fn unknown_value_types() {
    let mut b = sample_bytes();
    let at = after_string(&b, "test.block_count");
    put_u32(&mut b, at, 13);
    expect_gguf_err(b, &["metadata `test.block_count`", "unknown value type 13"]);

    let mut w = GgufWriter::new();
    w.add_metadata("arr", vec![1u32]).unwrap();
    let mut b = w.to_bytes().unwrap();
    let elem_at = after_string(&b, "arr") + 4;
    put_u32(&mut b, elem_at, 99);
    expect_gguf_err(b, &["metadata `arr`", "unknown array element type 99"]);
}

#[test]
fn invalid_bool() {
    let mut w = GgufWriter::new();
    w.add_metadata("flag", true).unwrap();
    let mut b = w.to_bytes().unwrap();
    let at = after_string(&b, "flag") + 4;
    b[at] = 2;
    expect_gguf_err(b, &["metadata `flag`", "bool value 2"]);
}

#[test]
fn invalid_utf8() {
    let mut b = sample_bytes();
    let at = after_string(&b, "general.architecture") + 4 + 8; // the value "test"
    b[at + 1] = 0xff;
    expect_gguf_err(b, &["metadata `general.architecture`", "not valid UTF-8"]);
}

#[test]
fn tensor_offset_past_end() {
    let mut b = sample_bytes();
    let p = info_pos(&b, "blk.0.k.weight", 2);
    put_u64(&mut b, p.offset, 1 << 20);
    expect_gguf_err(b.clone(), &["tensor `blk.0.k.weight`", "past the end of the data section"]);
    // Offset + size overflowing u64.
    put_u64(&mut b, p.offset, u64::MAX - 31);
    expect_gguf_err(b, &["tensor `blk.0.k.weight`", "past the end"]);
}

#[test]
fn tensor_size_past_end() {
    let mut b = sample_bytes();
    let p = info_pos(&b, "blk.0.k.weight", 2);
    put_u64(&mut b, p.dims + 8, 1000); // 1000 rows of Q4_K
    expect_gguf_err(b, &["tensor `blk.0.k.weight`", "144000 bytes", "past the end"]);
}

#[test]
fn overlapping_tensors() {
    let mut b = sample_bytes();
    let p = info_pos(&b, "blk.0.k.weight", 2);
    put_u64(&mut b, p.offset, 192); // q occupies 32..236
    expect_gguf_err(b, &["`blk.0.q.weight`", "`blk.0.k.weight`", "overlap"]);
}

#[test]
fn misaligned_tensor_offset() {
    let mut b = sample_bytes();
    let p = info_pos(&b, "blk.0.k.weight", 2);
    put_u64(&mut b, p.offset, 260);
    expect_gguf_err(b, &["tensor `blk.0.k.weight`", "offset 260", "alignment 32"]);
}

#[test]
fn dimension_product_overflows() {
    let mut b = sample_bytes();
    let p = info_pos(&b, "blk.0.q.weight", 2);
    put_u64(&mut b, p.dims + 8, 1 << 62); // 64 × 2^62 values
    expect_gguf_err(b, &["tensor `blk.0.q.weight`", "overflows"]);
    // A single dimension out of ggml's int64 range.
    let mut b = sample_bytes();
    let p = info_pos(&b, "norm.weight", 1);
    put_u64(&mut b, p.dims, u64::MAX);
    expect_gguf_err(b, &["tensor `norm.weight`", "out of range"]);
}

#[test]
fn too_many_or_zero_dimensions() {
    let mut r = Raw::new(3, 1, 0);
    r.tensor("t", &[1, 1, 1, 1, 1], 0, 0);
    expect_gguf_err(r.data(32, 32), &["tensor `t`", "5 dimensions"]);
    let mut r = Raw::new(3, 1, 0);
    r.tensor("t", &[], 0, 0);
    expect_gguf_err(r.data(32, 32), &["tensor `t`", "0 dimensions"]);
    let mut b = sample_bytes();
    let p = info_pos(&b, "blk.0.q.weight", 2);
    put_u32(&mut b, p.n_dims, 0);
    expect_gguf_err(b, &["tensor `blk.0.q.weight`", "0 dimensions"]);
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
fn unknown_tensor_type() {
    let mut b = sample_bytes();
    let p = info_pos(&b, "blk.0.q.weight", 2);
    put_u32(&mut b, p.ty, 4); // ggml's removed Q4_2
    expect_gguf_err(b.clone(), &["tensor `blk.0.q.weight`", "unknown", "type id 4"]);
    put_u32(&mut b, p.ty, 12345);
    expect_gguf_err(b, &["tensor `blk.0.q.weight`", "type id 12345"]);
}

#[test]
fn row_not_a_block_multiple() {
    let mut b = sample_bytes();
    let p = info_pos(&b, "blk.0.q.weight", 2);
    put_u64(&mut b, p.dims, 48);
    expect_gguf_err(b, &["tensor `blk.0.q.weight`", "48", "block size 32"]);
}

#[test]
fn bad_alignment_values() {
    let with_alignment = |v: Value| {
        let mut r = Raw::new(3, 1, 1);
        r.string("general.alignment").u32(v.type_id());
        match v {
            Value::U32(a) => {
                r.u32(a);
            }
            Value::String(s) => {
                r.string(&s);
            }
            _ => unreachable!(),
        }
        r.tensor("t", &[4], 0, 0);
        r.data(64, 16)
    };
    expect_gguf_err(with_alignment(Value::U32(0)), &["general.alignment", "0 is not a power of two"]);
    expect_gguf_err(with_alignment(Value::U32(48)), &["general.alignment", "48 is not a power of two"]);
    expect_gguf_err(with_alignment(Value::String("32".into())), &["general.alignment", "must be a u32"]);
    assert_eq!(GgufFile::from_bytes(with_alignment(Value::U32(64))).unwrap().alignment(), 64);
    assert_eq!(GgufFile::from_bytes(with_alignment(Value::U32(1))).unwrap().alignment(), 1);
}

#[test]
fn duplicate_keys() {
    let mut r = Raw::new(3, 0, 2);
    r.string("a.key").u32(4).u32(1).string("a.key").u32(4).u32(2);
    expect_gguf_err(r.0, &["duplicate metadata key `a.key`", "entry 1"]);
}

#[test]
fn duplicate_tensor_names() {
    let mut b = sample_bytes();
    // Both names are 14 bytes long: make the second equal to the first.
    let at = find(&b, b"blk.0.k.weight");
    b[at..at + 14].copy_from_slice(b"blk.0.q.weight");
    expect_gguf_err(b, &["duplicate tensor name `blk.0.q.weight`", "info 2"]);
}

// ---------------------------------------------------------------------------
// The default model

/// The cached default model, fetched when absent.
fn default_model() -> GgufFile {
    use infer_model::fetch::{cache_dir, fetch_default_model, DEFAULT_MODEL_FILE, DEFAULT_MODEL_SIZE};
    let dir = cache_dir();
    let path = dir.join(DEFAULT_MODEL_FILE);
    let present = std::fs::metadata(&path).is_ok_and(|m| m.len() == DEFAULT_MODEL_SIZE);
    let path = if present { path } else { fetch_default_model(&dir).expect("fetching the default model") };
    GgufFile::open(path).expect("opening the default model")
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
fn default_model_rewrites_byte_for_byte() {
    // Our writer lays files out as ggml does: copying every entry and
    // tensor reproduces the file exactly.
    let f = default_model();
    let copy = GgufWriter::from_gguf(&f).unwrap().to_bytes().unwrap();
    assert_eq!(copy.len(), f.bytes().len());
    assert!(copy == f.bytes(), "rewritten file differs");
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
