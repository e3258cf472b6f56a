//! Helpers shared by the GGUF tests: a small valid file, byte-level
//! patching by field, a raw file builder and the default model.

#![allow(dead_code)]

use infer_compute::GgmlType;
use infer_model::gguf::{GgufFile, GgufWriter};
use infer_model::Error;

/// Deterministic filler bytes.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A small valid file: two metadata entries and three tensors.
pub fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "test").unwrap();
    w.add_metadata("test.block_count", 2u32).unwrap();
    w.add_tensor("norm.weight", &[8], GgmlType::F32, pattern(32, 1)).unwrap();
    w.add_tensor("blk.0.q.weight", &[64, 3], GgmlType::Q8_0, pattern(2 * 34 * 3, 2)).unwrap();
    w.add_tensor("blk.0.k.weight", &[256, 2], GgmlType::Q4_K, pattern(144 * 2, 3)).unwrap();
    w
}

pub fn sample_bytes() -> Vec<u8> {
    sample_writer().to_bytes().unwrap()
}

/// Position of the first occurrence of `needle`.
pub fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).expect("needle present")
}

/// Position just after a GGUF string with this text (key or tensor name).
pub fn after_string(bytes: &[u8], s: &str) -> usize {
    find(bytes, s.as_bytes()) + s.len()
}

/// Position of the u64 length that precedes a GGUF string with this text.
pub fn string_len_pos(bytes: &[u8], s: &str) -> usize {
    find(bytes, s.as_bytes()) - 8
}

pub fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

pub fn get_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// Field positions inside a tensor info, found by the tensor's name.
pub struct InfoPos {
    pub n_dims: usize,
    pub dims: usize,
    pub ty: usize,
    pub offset: usize,
}

pub fn info_pos(bytes: &[u8], name: &str, n_dims: usize) -> InfoPos {
    let n = after_string(bytes, name);
    InfoPos { n_dims: n, dims: n + 4, ty: n + 4 + 8 * n_dims, offset: n + 4 + 8 * n_dims + 4 }
}

/// Parses and expects an [`Error::Gguf`] whose message contains every
/// fragment.
pub fn expect_gguf_err(bytes: Vec<u8>, fragments: &[&str]) -> String {
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
pub struct Raw(pub Vec<u8>);

impl Raw {
    pub fn new(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn string(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A tensor info.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.string(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to `align` and appends `n` data bytes.
    pub fn data(&mut self, align: usize, n: usize) -> Vec<u8> {
        let mut b = self.0.clone();
        b.resize(b.len().next_multiple_of(align), 0);
        b.extend(pattern(n, 9));
        b
    }
}

/// The cached default model, fetched when absent.
pub fn default_model() -> GgufFile {
    use infer_model::fetch::{cache_dir, fetch_default_model, DEFAULT_MODEL_FILE, DEFAULT_MODEL_SIZE};
    let dir = cache_dir();
    let path = dir.join(DEFAULT_MODEL_FILE);
    let present = std::fs::metadata(&path).is_ok_and(|m| m.len() == DEFAULT_MODEL_SIZE);
    let path = if present { path } else { fetch_default_model(&dir).expect("fetching the default model") };
    GgufFile::open(path).expect("opening the default model")
}
