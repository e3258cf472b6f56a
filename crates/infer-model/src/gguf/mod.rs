//! GGUF reader and writer.
//!
//! GGUF is ggml's model file format: a header of typed key/value metadata
//! and tensor descriptions, followed by an aligned section of tensor data in
//! ggml's block formats. The format is specified in ggml's `docs/gguf.md`
//! and implemented in `ggml/src/gguf.cpp`; versions 2 and 3 are supported
//! (they share one layout; version 1 used 32-bit counts and is rejected).
//!
//! [`GgufFile::open`] memory-maps a file ([`GgufFile::read`] reads it into
//! memory instead) and validates the whole header up front (every length,
//! offset, size and count is checked before use, and nothing is reserved
//! for a count before the bytes it describes are known to exist); tensor
//! data is then handed out without copying, as slices
//! ([`GgufFile::tensor_data`]) or as [`QuantWeight`]s sharing the mapping
//! ([`GgufFile::weight`]). The one exception: a tensor whose data is not
//! aligned for its block type (possible when `general.alignment` is smaller
//! than ggml's default) is copied once, at open, to an aligned buffer.
//! [`GgufWriter`] builds files (version 3).

mod array;
mod reader;
mod value;
mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use infer_compute::GgmlType;
use infer_compute::{QuantWeight, WeightBytes};

use crate::error::{Error, Result};
use crate::memory::{self, out_of_memory};

pub use array::{Array, StringArray};
pub use value::Value;
pub use writer::GgufWriter;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// One tensor's description from the file header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name (`"blk.0.attn_q.weight"`).
    pub name: String,
    /// Extents in ggml order: `dims[0]` is the number of values per row
    /// (the fastest-varying index), `dims[1]` the number of rows, and so
    /// on. Between 1 and [`MAX_DIMS`] entries.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Byte offset of the data, relative to the start of the data section
    /// (a multiple of the file's alignment).
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: usize,
}

impl TensorInfo {
    /// Number of values (the product of `dims`).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Values per row (`dims[0]`).
    pub fn cols(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of every dimension after the first (1
    /// for a 1-D tensor).
    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// The bytes of a GGUF file: a read-only memory map or an owned buffer.
enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
    /// A copy of a buffer whose address was not 16-byte aligned (or a
    /// file read into memory), kept in 16-byte words so that block structs
    /// can be viewed in place.
    Aligned {
        words: Vec<u128>,
        len: usize,
    },
}

impl Storage {
    /// A zeroed 16-byte aligned buffer of `len` bytes, or an error saying
    /// how much memory was needed.
    fn try_aligned(len: usize, what: impl FnOnce() -> String) -> Result<Self> {
        let mut words = Vec::new();
        words.try_reserve_exact(len.div_ceil(BUFFER_ALIGN)).map_err(|_| out_of_memory(what(), len as u64))?;
        words.resize(len.div_ceil(BUFFER_ALIGN), 0);
        Ok(Storage::Aligned { words, len })
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Storage::Mapped(_) => &mut [],
            Storage::Owned(v) => v,
            Storage::Aligned { words, len } => &mut bytemuck::cast_slice_mut(words)[..*len],
        }
    }
}

impl AsRef<[u8]> for Storage {
    fn as_ref(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
            Storage::Aligned { words, len } => &bytemuck::cast_slice(words)[..*len],
        }
    }
}

/// Alignment guaranteed for the start of an in-memory file, so that tensor
/// data at aligned offsets can be viewed as block structs.
const BUFFER_ALIGN: usize = 16;

/// A parsed GGUF file. The header is decoded and validated when the file is
/// opened; tensor data stays in the memory map (or buffer) and is shared
/// without copying.
pub struct GgufFile {
    storage: Arc<Storage>,
    version: u32,
    alignment: usize,
    data_offset: usize,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// Aligned copies of the tensors whose bytes in `storage` are not
    /// aligned for their block type, by tensor index.
    copies: HashMap<usize, Arc<Storage>>,
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`. Tensor data is not read
    /// until used.
    ///
    /// The file must not be modified while it is open (as for every
    /// memory-mapped file).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be opened or mapped;
    /// [`Error::Gguf`] (prefixed with the path) when it is not a valid GGUF
    /// file of version 2 or 3.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io_err = |source| Error::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        let storage = if len == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the mapping is read-only; like every mmap-based model
            // loader we require that the file is not truncated or modified
            // while it is open (documented above).
            Storage::Mapped(unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?)
        };
        Self::from_storage(storage).map_err(|e| with_path(e, path))
    }

    /// Reads the whole file at `path` into memory and parses it: the
    /// alternative to [`GgufFile::open`] for files on network or removable
    /// storage, where a memory-mapped file that shrinks or disappears while
    /// in use kills the process with `SIGBUS`. Costs the file's size in
    /// memory.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read; [`infer_compute::Error::OutOfMemory`] (as [`Error::Compute`])
    /// when its size cannot be allocated; [`Error::Gguf`] (prefixed with
    /// the path) as for [`GgufFile::open`].
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        use std::io::Read;
        let path = path.as_ref();
        let io_err = |source| Error::Io { path: path.to_path_buf(), source };
        let mut file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        let len =
            usize::try_from(len).map_err(|_| out_of_memory(format!("reading {} into memory", path.display()), len))?;
        let mut storage = Storage::try_aligned(len, || format!("reading {} into memory", path.display()))?;
        file.read_exact(storage.bytes_mut()).map_err(io_err)?;
        // A file that grew since its size was taken: the extra bytes are
        // not read, and the parse sees the file as it was.
        Self::from_storage(storage).map_err(|e| with_path(e, path))
    }

    /// Parses a file held in memory. The buffer is kept (not copied, unless
    /// its address is not 16-byte aligned) and tensors borrow from it.
    ///
    /// # Errors
    /// [`Error::Gguf`] when `bytes` is not a valid GGUF file of version 2
    /// or 3; [`infer_compute::Error::OutOfMemory`] (as [`Error::Compute`]) when an aligned copy cannot be made.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        let storage = if bytes.as_ptr() as usize & (BUFFER_ALIGN - 1) == 0 {
            Storage::Owned(bytes)
        } else {
            let mut s = Storage::try_aligned(bytes.len(), || "an aligned copy of a GGUF buffer".into())?;
            s.bytes_mut().copy_from_slice(&bytes);
            s
        };
        Self::from_storage(storage)
    }

    fn from_storage(storage: Storage) -> Result<Self> {
        let p = reader::parse(storage.as_ref())?;
        let copies = aligned_copies(storage.as_ref(), p.data_offset, &p.tensors)?;
        Ok(Self {
            storage: Arc::new(storage),
            version: p.version,
            alignment: p.alignment,
            data_offset: p.data_offset,
            metadata: p.metadata,
            key_index: p.key_index,
            tensors: p.tensors,
            tensor_index: p.tensor_index,
            copies,
        })
    }

    /// The file's GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and of every tensor's offset
    /// (`general.alignment`, 32 when absent).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Byte offset of the data section from the start of the file.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        (*self.storage).as_ref()
    }

    /// Every metadata entry, in file order. Its length is the key/value
    /// count of the file header (no synthetic entries are added).
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| Error::MissingKey(key.to_owned()))
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        conv: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<T> {
        let v = self.require(key)?;
        let integer = matches!(expected, "u32" | "u64" | "i32" | "i64");
        conv(v).ok_or_else(|| match v.as_i128().filter(|_| integer) {
            // An integer key whose value does not fit the type asked for.
            Some(n) => Error::HyperParameter {
                key: key.to_owned(),
                value: n.to_string(),
                reason: format!("out of the range of a {expected}"),
            },
            None => Error::KeyType { key: key.to_owned(), expected, found: v.type_description() },
        })
    }

    /// An integer key as `u32`. Any integer type is accepted when its
    /// value fits losslessly.
    ///
    /// # Errors
    /// [`Error::MissingKey`]; [`Error::KeyType`] for non-integers;
    /// [`Error::HyperParameter`] naming the value when it is out of range.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.typed(key, "u32", Value::as_u32)
    }

    /// An integer key as `u64` (any integer type that fits losslessly).
    ///
    /// # Errors
    /// As [`GgufFile::get_u32`].
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.typed(key, "u64", Value::as_u64)
    }

    /// An integer key as `i32` (any integer type that fits losslessly).
    ///
    /// # Errors
    /// As [`GgufFile::get_u32`].
    pub fn get_i32(&self, key: &str) -> Result<i32> {
        self.typed(key, "i32", Value::as_i32)
    }

    /// An integer key as `i64` (any integer type that fits losslessly).
    ///
    /// # Errors
    /// As [`GgufFile::get_u32`].
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.typed(key, "i64", Value::as_i64)
    }

    /// A float key as `f32` (`f64` values are rounded to the nearest
    /// `f32`; integers are not accepted).
    ///
    /// # Errors
    /// [`Error::MissingKey`]; [`Error::KeyType`] for non-floats.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.typed(key, "f32", Value::as_f32)
    }

    /// A float key as `f64`.
    ///
    /// # Errors
    /// [`Error::MissingKey`]; [`Error::KeyType`] for non-floats.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        self.typed(key, "f64", Value::as_f64)
    }

    /// A bool key.
    ///
    /// # Errors
    /// [`Error::MissingKey`]; [`Error::KeyType`] for other types.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.typed(key, "bool", Value::as_bool)
    }

    /// A string key.
    ///
    /// # Errors
    /// [`Error::MissingKey`]; [`Error::KeyType`] for other types.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.typed(key, "string", Value::as_str)
    }

    /// An array key's elements.
    ///
    /// # Errors
    /// [`Error::MissingKey`]; [`Error::KeyType`] for non-arrays.
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        self.typed(key, "array", Value::as_array)
    }

    /// An array of strings, borrowed from the file's metadata.
    ///
    /// # Errors
    /// [`Error::MissingKey`]; [`Error::KeyType`] for anything but an array
    /// of strings; out of memory ([`Error::Compute`]) when the list of
    /// borrowed strings cannot be allocated.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let strings = self.get_strings(key)?;
        let mut out = memory::vec_with_capacity(strings.len(), || format!("the strings of `{key}`"))?;
        out.extend(strings.iter());
        Ok(out)
    }

    /// An array of strings as stored: one text buffer, no copy.
    ///
    /// # Errors
    /// [`Error::MissingKey`]; [`Error::KeyType`] for anything but an array
    /// of strings.
    pub fn get_strings(&self, key: &str) -> Result<&StringArray> {
        self.typed(key, "array of string", |v| v.as_array()?.as_strings())
    }

    /// An array of floats as `f32` (`f64` elements are rounded).
    ///
    /// # Errors
    /// [`Error::MissingKey`]; [`Error::KeyType`] for anything but an array
    /// of floats; out of memory ([`Error::Compute`]) when the copy cannot
    /// be allocated.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.typed(key, "array of f32", |v| float_array(v, key)).and_then(|r| r)
    }

    /// An array of integers as `i32`; elements of any integer type are
    /// accepted when they fit losslessly.
    ///
    /// # Errors
    /// [`Error::MissingKey`]; [`Error::KeyType`] for anything but an array
    /// of integers in range; out of memory ([`Error::Compute`]) when the
    /// copy cannot be allocated.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.typed(key, "array of i32", |v| int_array(v, key)).and_then(|r| r)
    }

    /// An array of integers as `u32` (elements of any integer type that fit
    /// losslessly).
    ///
    /// # Errors
    /// As [`GgufFile::get_i32_array`].
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>> {
        self.typed(key, "array of u32", |v| int_array(v, key)).and_then(|r| r)
    }

    /// Every tensor description, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The description of a tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's bytes (validated to lie inside the file when it was
    /// opened), aligned for its block type. An info that does not belong to
    /// this file and points past its end gives an empty slice.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        if let Some(copy) = self.copy_of(t) {
            return (**copy).as_ref();
        }
        self.data_range(t).and_then(|(start, len)| self.bytes().get(start..start + len)).unwrap_or(&[])
    }

    /// The aligned copy of `t`'s data, when it has one.
    fn copy_of(&self, t: &TensorInfo) -> Option<&Arc<Storage>> {
        if self.copies.is_empty() {
            return None;
        }
        let &i = self.tensor_index.get(&t.name)?;
        (self.tensors[i] == *t).then(|| self.copies.get(&i)).flatten()
    }

    fn data_range(&self, t: &TensorInfo) -> Option<(usize, usize)> {
        let start = self.data_offset.checked_add(usize::try_from(t.offset).ok()?)?;
        start.checked_add(t.n_bytes)?;
        Some((start, t.n_bytes))
    }

    /// A tensor as a [`QuantWeight`] sharing the file's memory (no copy).
    ///
    /// Shape: a 1-D tensor gives `rows = 1, cols = dims[0]`; a 2-D tensor
    /// `cols = dims[0], rows = dims[1]`; higher dimensions are flattened
    /// into rows (`rows = dims[1] · dims[2] · ...`).
    ///
    /// # Errors
    /// [`Error::MissingTensor`] when there is no tensor of that name.
    pub fn weight(&self, name: &str) -> Result<QuantWeight> {
        let t = self.tensor(name).ok_or_else(|| Error::MissingTensor(name.to_owned()))?;
        self.tensor_weight(t)
    }

    /// [`GgufFile::weight`] for a tensor description of this file.
    ///
    /// # Errors
    /// [`Error::Gguf`] when `t` does not describe a range of this file
    /// (an info taken from another file).
    pub fn tensor_weight(&self, t: &TensorInfo) -> Result<QuantWeight> {
        let bad = || Error::Gguf(format!("tensor `{}` does not lie inside this file", t.name));
        let (start, len) = self.data_range(t).ok_or_else(bad)?;
        let cols = usize::try_from(t.cols()).map_err(|_| bad())?;
        let rows = usize::try_from(t.rows()).map_err(|_| bad())?;
        let data = match self.copy_of(t) {
            Some(copy) => WeightBytes::new(copy.clone()),
            None => {
                let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = self.storage.clone();
                WeightBytes::range(owner, start, len).map_err(|_| bad())?
            }
        };
        Ok(QuantWeight::new(t.ty, rows, cols, data)?)
    }
}

impl GgufFile {
    /// Rows `row0 .. row0 + n_rows` of tensor `t` as a weight sharing the
    /// file's bytes (no copy): the rows of a 2-D tensor are contiguous, so a
    /// fused projection (Phi-3's `attn_qkv`, gate‖up `ffn_up`) splits into
    /// its parts by row ranges.
    ///
    /// # Errors
    /// [`Error::Gguf`] when the rows lie outside the tensor or the tensor
    /// outside this file.
    pub fn tensor_rows(&self, t: &TensorInfo, row0: usize, n_rows: usize) -> Result<QuantWeight> {
        let bad = || Error::Gguf(format!("rows {row0}+{n_rows} of tensor `{}` do not lie inside it", t.name));
        let (start, _) = self.data_range(t).ok_or_else(bad)?;
        let cols = usize::try_from(t.cols()).map_err(|_| bad())?;
        let rows = usize::try_from(t.rows()).map_err(|_| bad())?;
        if row0.checked_add(n_rows).is_none_or(|end| end > rows) {
            return Err(bad());
        }
        let row_bytes = t.ty.row_bytes(cols)?;
        let (owner, start): (Arc<dyn AsRef<[u8]> + Send + Sync>, usize) = match self.copy_of(t) {
            Some(copy) => (copy.clone(), 0),
            None => (self.storage.clone(), start),
        };
        let data = WeightBytes::range(owner, start + row0 * row_bytes, n_rows * row_bytes).map_err(|_| bad())?;
        Ok(QuantWeight::new(t.ty, n_rows, cols, data)?)
    }
}

/// The elements of an integer array converted losslessly to `T`; `None`
/// for other arrays or when an element does not fit, out of memory when the
/// copy of array `key` cannot be allocated.
fn int_array<T: TryFrom<i128>>(v: &Value, key: &str) -> Option<Result<Vec<T>>> {
    fn conv<S: Copy + Into<i128>, T: TryFrom<i128>>(v: &[S], key: &str) -> Option<Result<Vec<T>>> {
        let mut out = match memory::vec_with_capacity(v.len(), || format!("the elements of `{key}`")) {
            Ok(out) => out,
            Err(e) => return Some(Err(e)),
        };
        for &x in v {
            out.push(T::try_from(x.into()).ok()?);
        }
        Some(Ok(out))
    }
    match v.as_array()? {
        Array::U8(a) => conv(a, key),
        Array::I8(a) => conv(a, key),
        Array::U16(a) => conv(a, key),
        Array::I16(a) => conv(a, key),
        Array::U32(a) => conv(a, key),
        Array::I32(a) => conv(a, key),
        Array::U64(a) => conv(a, key),
        Array::I64(a) => conv(a, key),
        _ => None,
    }
}

/// The elements of a float array as `f32`; `None` for other arrays, out
/// of memory when the copy of array `key` cannot be allocated.
fn float_array(v: &Value, key: &str) -> Option<Result<Vec<f32>>> {
    let what = || format!("the elements of `{key}`");
    Some(match v.as_array()? {
        Array::F32(a) => memory::vec_with_capacity(a.len(), what).map(|mut out| {
            out.extend_from_slice(a);
            out
        }),
        Array::F64(a) => memory::vec_with_capacity(a.len(), what).map(|mut out| {
            out.extend(a.iter().map(|&x| x as f32));
            out
        }),
        _ => return None,
    })
}

/// Prefixes a format error with the file's path.
fn with_path(e: Error, path: &Path) -> Error {
    match e {
        Error::Gguf(msg) => Error::Gguf(format!("{}: {msg}", path.display())),
        other => other,
    }
}

/// Aligned copies of the tensors of `bytes` whose data is not aligned for
/// their block type (ggml's block structs need 2 or 4 bytes; a file with
/// `general.alignment` = 1 may place a tensor at any offset).
fn aligned_copies(bytes: &[u8], data_offset: usize, tensors: &[TensorInfo]) -> Result<HashMap<usize, Arc<Storage>>> {
    let mut copies = HashMap::new();
    for (i, t) in tensors.iter().enumerate() {
        let align = infer_compute::with_block_type!(t.ty, B => std::mem::align_of::<B>());
        // Validated by the parse: the range lies inside `bytes`.
        let Some(data) = usize::try_from(t.offset)
            .ok()
            .and_then(|o| data_offset.checked_add(o))
            .and_then(|start| bytes.get(start..start.checked_add(t.n_bytes)?))
        else {
            continue;
        };
        if (data.as_ptr() as usize).is_multiple_of(align) {
            continue;
        }
        let mut copy = Storage::try_aligned(data.len(), || format!("an aligned copy of tensor `{}`", t.name))?;
        copy.bytes_mut().copy_from_slice(data);
        copies.insert(i, Arc::new(copy));
    }
    Ok(copies)
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("size", &self.bytes().len())
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}
