//! Parsing and validation of a GGUF file held in memory.
//!
//! Layout (little-endian, versions 2 and 3; ggml's `gguf.cpp`):
//!
//! ```text
//! magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv × (key: string, value type: u32, value)
//! n_tensors × (name: string, n_dims: u32, dims: n_dims × u64, type: u32, offset: u64)
//! zero padding to `general.alignment` (default 32)
//! tensor data; each tensor's offset is relative to the start of this section
//! ```
//!
//! A string is a u64 byte length followed by UTF-8 bytes; an array is a u32
//! element type, a u64 count and the elements.
//!
//! Every length and count is checked against the bytes that remain before
//! anything is allocated for it, so a corrupt count cannot trigger a huge
//! allocation; every size computation is checked for overflow.

use std::collections::HashMap;

use infer_compute::GgmlType;

use super::array::{Array, StringArray};
use super::value::{min_encoded_size, tag, tag_name, Value};
use super::{TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::error::{Error, Result};

/// Deepest array nesting accepted (arrays of arrays of ...). Real files use
/// at most one level; the limit keeps recursion bounded on hostile input.
const MAX_ARRAY_DEPTH: usize = 32;

/// The least bytes a metadata entry occupies: key length (8), value type
/// (4) and a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;

/// The least bytes a tensor info occupies: name length (8), n_dims (4), one
/// dimension (8), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// Everything the header describes, validated.
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: usize,
    pub data_offset: usize,
    pub metadata: Vec<(String, Value)>,
    pub key_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
}

/// A read that ran past the end of the input.
struct Short {
    pos: usize,
    need: u64,
    left: usize,
    item: &'static str,
}

impl Short {
    fn message(&self) -> String {
        format!("truncated: {} needs {} byte(s) at offset {}, only {} left", self.item, self.need, self.pos, self.left)
    }
}

/// Adds context to a [`Short`] read, building the message only on error.
trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, String>;
}

impl<T> Context<T> for std::result::Result<T, Short> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, String> {
        self.map_err(|s| format!("{}: {}", what(), s.message()))
    }
}

/// A bounds-checked little-endian reader over a byte slice.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64, item: &'static str) -> Result<&'a [u8], Short> {
        if n > self.left() as u64 {
            return Err(Short { pos: self.pos, need: n, left: self.left(), item });
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, item: &'static str) -> Result<[u8; N], Short> {
        let s = self.take(N as u64, item)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, item: &'static str) -> Result<u32, Short> {
        self.array(item).map(u32::from_le_bytes)
    }

    fn u64(&mut self, item: &'static str) -> Result<u64, Short> {
        self.array(item).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 length, then that many UTF-8 bytes.
    fn string(&mut self) -> Result<String, String> {
        self.str().map(str::to_owned)
    }

    /// [`Cursor::string`], borrowed from the input.
    fn str(&mut self) -> Result<&'a str, String> {
        let len_pos = self.pos;
        let len = self.u64("string length").map_err(|s| s.message())?;
        if len > self.left() as u64 {
            return Err(format!(
                "string length {len} at offset {len_pos} runs past the end of the file ({} bytes left)",
                self.left()
            ));
        }
        let start = self.pos;
        let bytes = self.take(len, "string").map_err(|s| s.message())?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s),
            Err(e) => Err(format!(
                "string at offset {start} is not valid UTF-8 (invalid byte at offset {})",
                start + e.valid_up_to()
            )),
        }
    }

    /// One metadata value of type tag `ty`; `depth` counts enclosing arrays.
    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, String> {
        let pos = self.pos;
        let value = match ty {
            tag::U8 => Value::U8(u8::from_le_bytes(self.array("u8 value").map_err(|s| s.message())?)),
            tag::I8 => Value::I8(i8::from_le_bytes(self.array("i8 value").map_err(|s| s.message())?)),
            tag::U16 => Value::U16(u16::from_le_bytes(self.array("u16 value").map_err(|s| s.message())?)),
            tag::I16 => Value::I16(i16::from_le_bytes(self.array("i16 value").map_err(|s| s.message())?)),
            tag::U32 => Value::U32(u32::from_le_bytes(self.array("u32 value").map_err(|s| s.message())?)),
            tag::I32 => Value::I32(i32::from_le_bytes(self.array("i32 value").map_err(|s| s.message())?)),
            tag::F32 => Value::F32(f32::from_le_bytes(self.array("f32 value").map_err(|s| s.message())?)),
            tag::U64 => Value::U64(u64::from_le_bytes(self.array("u64 value").map_err(|s| s.message())?)),
            tag::I64 => Value::I64(i64::from_le_bytes(self.array("i64 value").map_err(|s| s.message())?)),
            tag::F64 => Value::F64(f64::from_le_bytes(self.array("f64 value").map_err(|s| s.message())?)),
            tag::BOOL => match self.array::<1>("bool value").map_err(|s| s.message())?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("bool value {b} at offset {pos} is neither 0 nor 1")),
            },
            tag::STRING => Value::String(self.string()?),
            tag::ARRAY => Value::Array(self.array_value(depth)?),
            other => return Err(format!("unknown value type {other} at offset {pos}")),
        };
        Ok(value)
    }

    /// An array (after its type tag): element type, count, elements.
    fn array_value(&mut self, depth: usize) -> Result<Array, String> {
        let pos = self.pos;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(format!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels at offset {pos}"));
        }
        let elem = self.u32("array element type").map_err(|s| s.message())?;
        let (Some(elem_name), Some(min_size)) = (tag_name(elem), min_encoded_size(elem)) else {
            return Err(format!("unknown array element type {elem} at offset {pos}"));
        };
        let count_pos = self.pos;
        let count = self.u64("array length").map_err(|s| s.message())?;
        let left = self.left();
        match count.checked_mul(min_size) {
            Some(need) if need <= left as u64 => {}
            _ => {
                return Err(format!(
                    "array of {count} {elem_name} element(s) at offset {count_pos} needs at least {} bytes, only \
                     {left} left",
                    count as u128 * min_size as u128
                ))
            }
        }
        // From here on `count` elements are known to fit in the bytes left,
        // so every reservation below is bounded by the file's size.
        let n = count as usize;
        let no_memory = |e: std::collections::TryReserveError| {
            format!("array of {count} {elem_name} element(s) at offset {count_pos}: out of memory ({e})")
        };
        Ok(match elem {
            tag::U8 => Array::U8(self.numbers(n, "u8 array", u8::from_le_bytes).map_err(no_memory)?),
            tag::I8 => Array::I8(self.numbers(n, "i8 array", i8::from_le_bytes).map_err(no_memory)?),
            tag::U16 => Array::U16(self.numbers(n, "u16 array", u16::from_le_bytes).map_err(no_memory)?),
            tag::I16 => Array::I16(self.numbers(n, "i16 array", i16::from_le_bytes).map_err(no_memory)?),
            tag::U32 => Array::U32(self.numbers(n, "u32 array", u32::from_le_bytes).map_err(no_memory)?),
            tag::I32 => Array::I32(self.numbers(n, "i32 array", i32::from_le_bytes).map_err(no_memory)?),
            tag::F32 => Array::F32(self.numbers(n, "f32 array", f32::from_le_bytes).map_err(no_memory)?),
            tag::U64 => Array::U64(self.numbers(n, "u64 array", u64::from_le_bytes).map_err(no_memory)?),
            tag::I64 => Array::I64(self.numbers(n, "i64 array", i64::from_le_bytes).map_err(no_memory)?),
            tag::F64 => Array::F64(self.numbers(n, "f64 array", f64::from_le_bytes).map_err(no_memory)?),
            tag::BOOL => {
                let start = self.pos;
                let bytes = self.numbers(n, "bool array", |[b]: [u8; 1]| b).map_err(no_memory)?;
                if let Some(i) = bytes.iter().position(|&b| b > 1) {
                    return Err(format!(
                        "element [{i}]: bool value {} at offset {} is neither 0 nor 1",
                        bytes[i],
                        start + i
                    ));
                }
                Array::Bool(bytes.into_iter().map(|b| b == 1).collect())
            }
            tag::STRING => {
                let mut strings = StringArray::try_with_capacity(n, 0).map_err(no_memory)?;
                for i in 0..n {
                    let s = self.str().map_err(|e| format!("element [{i}]: {e}"))?;
                    strings.try_push(s).map_err(no_memory)?;
                }
                Array::String(Box::new(strings))
            }
            _ => {
                let mut items = Vec::new();
                items.try_reserve_exact(n).map_err(no_memory)?;
                for i in 0..n {
                    let item = self.array_value(depth + 1).map_err(|e| match e.strip_prefix("element ") {
                        // Nested arrays: one path, `element [2][0]: ...`.
                        Some(inner) => format!("element [{i}]{inner}"),
                        None => format!("element [{i}]: {e}"),
                    })?;
                    items.push(item);
                }
                Array::Array(items)
            }
        })
    }

    /// `n` fixed-size little-endian numbers. The caller has checked that
    /// their bytes are present.
    fn numbers<T, const N: usize>(
        &mut self,
        n: usize,
        item: &'static str,
        conv: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, std::collections::TryReserveError> {
        let bytes = self.take((n * N) as u64, item).unwrap_or_default();
        let mut out = Vec::new();
        out.try_reserve_exact(n)?;
        out.extend(bytes.chunks_exact(N).map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            conv(a)
        }));
        Ok(out)
    }
}

/// Parses and validates a whole GGUF file.
pub(crate) fn parse(buf: &[u8]) -> Result<Parsed> {
    parse_inner(buf).map_err(Error::Gguf)
}

fn parse_inner(buf: &[u8]) -> Result<Parsed, String> {
    let mut cur = Cursor { buf, pos: 0 };

    // Header.
    let magic = cur.take(4, "magic").context(|| "header".into())?;
    if magic != MAGIC {
        // Escaped once: `"\x7fELF"`, not Debug's `"\\x7fELF"`.
        return Err(format!("bad magic \"{}\" (expected \"GGUF\")", magic.escape_ascii()));
    }
    let version = cur.u32("version").context(|| "header".into())?;
    match version {
        2 | 3 => {}
        1 => return Err("GGUF version 1 is not supported (versions 2 and 3 are)".into()),
        v if matches!(v.swap_bytes(), 2 | 3) => {
            return Err(format!(
                "big-endian GGUF (version {}) is not supported; only little-endian files are",
                v.swap_bytes()
            ))
        }
        v => return Err(format!("unsupported GGUF version {v} (versions 2 and 3 are supported)")),
    }
    let n_tensors = cur.u64("tensor count").context(|| "header".into())?;
    let n_kv = cur.u64("metadata count").context(|| "header".into())?;
    // Counts that the rest of the file cannot possibly hold. They are not
    // rejected outright, so that a truncated file is reported where it
    // ends; the reading loops fail within the file and the hint is added.
    let left = cur.left() as u64;
    let kv_hint = impossible_count(n_kv, MIN_KV_BYTES, left, "metadata entries");
    let tensor_hint = impossible_count(n_tensors, MIN_TENSOR_INFO_BYTES, left, "tensors");
    let hinted = |hint: &Option<String>, e: String| match hint {
        Some(h) => format!("{e}; {h}"),
        None => e,
    };

    let (metadata, key_index) = read_metadata(&mut cur, n_kv).map_err(|e| hinted(&kv_hint, e))?;

    let alignment = match key_index.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => {
            let v = &metadata[i].1;
            let Some(a) = v.as_u32() else {
                return Err(format!("`{ALIGNMENT_KEY}` must be a u32, found {} {v}", v.type_name()));
            };
            if !a.is_power_of_two() {
                return Err(format!("`{ALIGNMENT_KEY}` = {a} is not a power of two"));
            }
            a as usize
        }
    };

    let (tensors, tensor_index) = read_tensor_infos(&mut cur, n_tensors).map_err(|e| hinted(&tensor_hint, e))?;

    // Data section.
    let data_offset = cur.pos.checked_next_multiple_of(alignment).ok_or("data offset overflows")?;
    if !tensors.is_empty() && data_offset > buf.len() {
        return Err(format!(
            "truncated: the data section would start at offset {data_offset}, past the end of the file ({} bytes)",
            buf.len()
        ));
    }
    let data_len = buf.len().saturating_sub(data_offset) as u64;
    for t in &tensors {
        if t.offset % alignment as u64 != 0 {
            return Err(format!(
                "tensor `{}`: data offset {} is not a multiple of the alignment {alignment}",
                t.name, t.offset
            ));
        }
        match t.offset.checked_add(t.n_bytes as u64) {
            Some(end) if end <= data_len => {}
            _ => {
                return Err(format!(
                    "truncated: tensor `{}` ({} bytes at data offset {}) runs past the end of the data section ({data_len} bytes)",
                    t.name, t.n_bytes, t.offset
                ))
            }
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let a_end = a.offset + a.n_bytes as u64;
        if b.offset < a_end {
            return Err(format!(
                "tensors `{}` (data bytes {}..{a_end}) and `{}` (data bytes {}..{}) overlap",
                a.name,
                a.offset,
                b.name,
                b.offset,
                b.offset + b.n_bytes as u64
            ));
        }
    }

    Ok(Parsed { version, alignment, data_offset, metadata, key_index, tensors, tensor_index })
}

/// A note for a header count that cannot fit in the `left` bytes after the
/// header (each item needs at least `min_bytes`).
fn impossible_count(count: u64, min_bytes: u64, left: u64, what: &str) -> Option<String> {
    match count.checked_mul(min_bytes) {
        Some(need) if need <= left => None,
        _ => Some(format!("the header declares {count} {what}, more than the {left} bytes after it can hold")),
    }
}

type Metadata = (Vec<(String, Value)>, HashMap<String, usize>);

/// Reads `n_kv` metadata entries.
fn read_metadata(cur: &mut Cursor<'_>, n_kv: u64) -> Result<Metadata, String> {
    // Capacity bounded by what the file can hold, whatever the header says.
    let cap = n_kv.min(cur.left() as u64 / MIN_KV_BYTES) as usize;
    let mut metadata = Vec::with_capacity(cap);
    let mut key_index = HashMap::with_capacity(cap);
    for i in 0..n_kv {
        let entry_pos = cur.pos;
        let key = cur.string().map_err(|e| format!("metadata entry {i} (offset {entry_pos}): key: {e}"))?;
        let ty = cur.u32("value type").context(|| format!("metadata `{key}` (entry {i})"))?;
        let value = cur.value(ty, 0).map_err(|e| format!("metadata `{key}` (entry {i}): {e}"))?;
        if key_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(format!("duplicate metadata key `{key}` (entry {i}, offset {entry_pos})"));
        }
        metadata.push((key, value));
    }
    Ok((metadata, key_index))
}

type TensorInfos = (Vec<TensorInfo>, HashMap<String, usize>);

/// Reads `n_tensors` tensor infos, checking each one's shape and type.
fn read_tensor_infos(cur: &mut Cursor<'_>, n_tensors: u64) -> Result<TensorInfos, String> {
    let cap = n_tensors.min(cur.left() as u64 / MIN_TENSOR_INFO_BYTES) as usize;
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(cap);
    let mut tensor_index = HashMap::with_capacity(cap);
    for i in 0..n_tensors {
        let info_pos = cur.pos;
        let name = cur.string().map_err(|e| format!("tensor info {i} (offset {info_pos}): name: {e}"))?;
        let what = || format!("tensor `{name}` (info {i})");
        let n_dims = cur.u32("dimension count").context(what)?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(format!("{}: {n_dims} dimensions (1 to {MAX_DIMS} are allowed)", what()));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(cur.u64("dimension").context(what)?);
        }
        let type_id = cur.u32("type").context(what)?;
        let offset = cur.u64("data offset").context(what)?;
        let ty = GgmlType::from_id(type_id).map_err(|e| format!("{}: {e}", what()))?;
        let n_bytes = tensor_bytes(&dims, ty).map_err(|e| format!("{}: {e}", what()))?;
        if tensor_index.insert(name.clone(), tensors.len()).is_some() {
            return Err(format!("duplicate tensor name `{name}` (info {i}, offset {info_pos})"));
        }
        tensors.push(TensorInfo { name, dims, ty, offset, n_bytes });
    }
    Ok((tensors, tensor_index))
}

/// Bytes of a tensor of `dims` (ggml order) and type `ty`, with ggml's
/// checks: every dimension fits `i64`, the element count does not overflow
/// `i64`, and rows are whole blocks.
pub(crate) fn tensor_bytes(dims: &[u64], ty: GgmlType) -> Result<usize, String> {
    let mut n_elements: u64 = 1;
    for (j, &d) in dims.iter().enumerate() {
        if d > i64::MAX as u64 {
            return Err(format!("dimension {j} = {d} is out of range"));
        }
        n_elements = n_elements
            .checked_mul(d)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| format!("element count of dimensions {dims:?} overflows"))?;
    }
    let cols = usize::try_from(dims.first().copied().unwrap_or(1))
        .map_err(|_| format!("row length {} does not fit in memory", dims[0]))?;
    let row_bytes = ty.row_bytes(cols).map_err(|e| e.to_string())?;
    let rows = n_elements.checked_div(cols as u64).unwrap_or(0);
    usize::try_from(rows)
        .ok()
        .and_then(|r| r.checked_mul(row_bytes))
        .ok_or_else(|| format!("byte size of dimensions {dims:?} overflows"))
}
