//! Building GGUF files (version 3, little-endian), laid out as ggml's
//! `gguf_write_to_buf` does: header, metadata, tensor infos, zero padding to
//! the alignment, then each tensor's data padded to the alignment.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use infer_compute::GgmlType;
use infer_compute::WeightBytes;

use super::array::Array;
use super::reader::tensor_bytes;
use super::value::Value;
use super::{GgufFile, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::error::{Error, Result};

/// The GGUF version written.
const VERSION: u32 = 3;

/// Longest tensor name ggml accepts (`GGML_MAX_NAME` is 64 including the
/// terminating NUL).
const MAX_TENSOR_NAME: usize = 63;

/// A function that fills a tensor's bytes when the file is written.
type Fill = Box<dyn Fn(&mut [u8]) -> Result<()> + Send + Sync>;

/// Where a tensor's bytes come from.
enum Data {
    Bytes(WeightBytes),
    Fill(Fill),
}

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    n_bytes: usize,
    data: Data,
}

/// A GGUF file under construction.
///
/// Metadata and tensors are written in the order they were added. Each
/// addition is validated at once (duplicate keys or names, shapes, data
/// sizes), so writing can only fail on I/O or in a fill
/// function. The data alignment is `general.alignment` when that key is set
/// (a `u32` power of two, as ggml requires), 32 otherwise.
///
/// ```
/// use infer_model::gguf::{GgufFile, GgufWriter, Value};
/// use infer_compute::GgmlType;
///
/// let mut w = GgufWriter::new();
/// w.add_metadata("general.architecture", "gemma3")?;
/// w.add_metadata("gemma3.block_count", 18u32)?;
/// w.add_tensor("output_norm.weight", &[4], GgmlType::F32, vec![0u8; 16])?;
/// let file = GgufFile::from_bytes(w.to_bytes()?)?;
/// assert_eq!(file.get_u32("gemma3.block_count")?, 18);
/// # Ok::<(), infer_model::Error>(())
/// ```
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<PendingTensor>,
    tensor_index: HashMap<String, usize>,
}

impl GgufWriter {
    /// An empty file: no metadata, no tensors.
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer holding every metadata entry and tensor of `file`, in file
    /// order. Tensor data is shared with `file`'s memory, not copied.
    ///
    /// # Errors
    /// Only if `file` holds something this writer refuses: a tensor name
    /// longer than ggml allows, or a `general.alignment` stored as another
    /// integer type than `u32`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let mut w = Self::new();
        for (k, v) in file.metadata() {
            w.add_metadata(k.clone(), v.clone())?;
        }
        for t in file.tensors() {
            let data = file.tensor_weight(t)?.data;
            w.add_tensor(t.name.clone(), &t.dims, t.ty, data)?;
        }
        Ok(w)
    }

    /// Appends a metadata entry.
    ///
    /// # Errors
    /// [`Error::Gguf`] when the key already exists, or for a `general.alignment` that is not a `u32`
    /// power of two.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: impl Into<Value>) -> Result<&mut Self> {
        let key = key.into();
        if self.key_index.contains_key(&key) {
            return Err(Error::Gguf(format!("duplicate metadata key `{key}`")));
        }
        let value = value.into();
        check_value(&key, &value)?;
        self.key_index.insert(key.clone(), self.metadata.len());
        self.metadata.push((key, value));
        Ok(self)
    }

    /// Sets a metadata entry: replaces the value of an existing key in
    /// place, or appends a new one.
    ///
    /// # Errors
    /// As [`GgufWriter::add_metadata`], except for duplicates.
    pub fn set_metadata(&mut self, key: impl Into<String>, value: impl Into<Value>) -> Result<&mut Self> {
        let key = key.into();
        let value = value.into();
        check_value(&key, &value)?;
        match self.key_index.get(&key) {
            Some(&i) => self.metadata[i].1 = value,
            None => {
                self.key_index.insert(key.clone(), self.metadata.len());
                self.metadata.push((key, value));
            }
        }
        Ok(self)
    }

    /// Removes a metadata entry, returning its value.
    pub fn remove_metadata(&mut self, key: &str) -> Option<Value> {
        let i = self.key_index.remove(key)?;
        let (_, v) = self.metadata.remove(i);
        for idx in self.key_index.values_mut() {
            if *idx > i {
                *idx -= 1;
            }
        }
        Some(v)
    }

    /// The metadata entries added so far, in order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// Appends a tensor. `dims` are in ggml order (`dims[0]` values per
    /// row); `data` holds exactly the tensor's bytes (a `Vec<u8>` or the
    /// shared bytes of another file's weight).
    ///
    /// # Errors
    /// [`Error::Gguf`] for a duplicate or over-long name (ggml allows 63
    /// bytes), 0 or more than 4 dimensions, rows that are not whole blocks
    /// of `ty`, a size that overflows, or data of the wrong length.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: impl Into<WeightBytes>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let n_bytes = self.check_tensor(&name, dims, ty)?;
        let data = data.into();
        if data.as_bytes().len() != n_bytes {
            return Err(Error::Gguf(format!(
                "tensor `{name}`: {dims:?} {ty} needs {n_bytes} bytes, got {}",
                data.as_bytes().len()
            )));
        }
        self.push_tensor(name, dims, ty, n_bytes, Data::Bytes(data));
        Ok(self)
    }

    /// Appends a tensor whose bytes are produced when the file is written:
    /// `fill` receives a zeroed buffer of the tensor's size. Use it for
    /// large generated tensors, so that only one is in memory at a time.
    ///
    /// # Errors
    /// As [`GgufWriter::add_tensor`] (except the data length).
    pub fn add_tensor_with(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        fill: impl Fn(&mut [u8]) -> Result<()> + Send + Sync + 'static,
    ) -> Result<&mut Self> {
        let name = name.into();
        let n_bytes = self.check_tensor(&name, dims, ty)?;
        self.push_tensor(name, dims, ty, n_bytes, Data::Fill(Box::new(fill)));
        Ok(self)
    }

    fn check_tensor(&self, name: &str, dims: &[u64], ty: GgmlType) -> Result<usize> {
        if self.tensor_index.contains_key(name) {
            return Err(Error::Gguf(format!("duplicate tensor name `{name}`")));
        }
        if name.len() > MAX_TENSOR_NAME {
            return Err(Error::Gguf(format!(
                "tensor name `{name}` is {} bytes, longer than ggml's limit of {MAX_TENSOR_NAME}",
                name.len()
            )));
        }
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(Error::Gguf(format!(
                "tensor `{name}`: {} dimensions (1 to {MAX_DIMS} are allowed)",
                dims.len()
            )));
        }
        tensor_bytes(dims, ty).map_err(|e| Error::Gguf(format!("tensor `{name}`: {e}")))
    }

    fn push_tensor(&mut self, name: String, dims: &[u64], ty: GgmlType, n_bytes: usize, data: Data) {
        self.tensor_index.insert(name.clone(), self.tensors.len());
        self.tensors.push(PendingTensor { name, dims: dims.to_vec(), ty, n_bytes, data });
    }

    /// The data alignment the file will use.
    pub fn alignment(&self) -> usize {
        self.key_index
            .get(ALIGNMENT_KEY)
            .and_then(|&i| self.metadata[i].1.as_u32())
            .map_or(DEFAULT_ALIGNMENT, |a| a as usize)
    }

    /// The whole file in memory.
    ///
    /// # Errors
    /// Errors of fill functions.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_impl(&mut out).map_err(|e| e.into_error(Path::new("<memory>")))?;
        Ok(out)
    }

    /// Writes the file to `path`. The bytes go to a temporary file in the
    /// same directory that is renamed over `path` once complete, so `path`
    /// never holds a partial file.
    ///
    /// # Errors
    /// [`Error::Io`] naming the path; errors of fill functions.
    pub fn write_to_path(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let Some(file_name) = path.file_name() else {
            return Err(Error::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"),
            });
        };
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(file_name);
        tmp_name.push(format!(".partial-{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let result = self.write_file(&tmp).and_then(|()| {
            std::fs::rename(&tmp, path).map_err(|source| Error::Io { path: path.to_path_buf(), source })
        });
        if result.is_err() {
            // Best effort: the partial file is of no use.
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    fn write_file(&self, path: &Path) -> Result<()> {
        let io_err = |source| Error::Io { path: path.to_path_buf(), source };
        let file = File::create(path).map_err(io_err)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        self.write_impl(&mut w).map_err(|e| e.into_error(path))?;
        w.into_inner().map_err(|e| io_err(e.into_error()))?.sync_all().map_err(io_err)
    }

    /// Writes the file to any byte sink.
    ///
    /// # Errors
    /// [`Error::Io`] (with the path `<stream>`) on write errors; errors of
    /// fill functions.
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        self.write_impl(w).map_err(|e| e.into_error(Path::new("<stream>")))
    }

    fn write_impl(&self, w: &mut impl Write) -> std::result::Result<(), WriteError> {
        let alignment = self.alignment();
        let mut out = Counting { inner: w, written: 0 };

        out.put(&MAGIC)?;
        out.put(&VERSION.to_le_bytes())?;
        out.put(&(self.tensors.len() as u64).to_le_bytes())?;
        out.put(&(self.metadata.len() as u64).to_le_bytes())?;
        for (key, value) in &self.metadata {
            put_string(&mut out, key)?;
            out.put(&value.type_id().to_le_bytes())?;
            put_value(&mut out, value)?;
        }

        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_string(&mut out, &t.name)?;
            out.put(&(t.dims.len() as u32).to_le_bytes())?;
            for d in &t.dims {
                out.put(&d.to_le_bytes())?;
            }
            out.put(&t.ty.id().to_le_bytes())?;
            out.put(&offset.to_le_bytes())?;
            offsets.push(offset);
            offset = (offset + t.n_bytes as u64).next_multiple_of(alignment as u64);
        }
        out.pad(alignment)?;

        let mut buf = Vec::new();
        for t in &self.tensors {
            match &t.data {
                Data::Bytes(b) => out.put(b.as_bytes())?,
                Data::Fill(fill) => {
                    buf.clear();
                    buf.resize(t.n_bytes, 0);
                    fill(&mut buf).map_err(WriteError::Fill)?;
                    out.put(&buf)?;
                }
            }
            out.pad(alignment)?;
        }
        out.inner.flush()?;
        Ok(())
    }
}

/// Checks a metadata value before it is accepted.
fn check_value(key: &str, value: &Value) -> Result<()> {
    if key == ALIGNMENT_KEY {
        match value {
            Value::U32(a) if a.is_power_of_two() => {}
            Value::U32(a) => return Err(Error::Gguf(format!("`{ALIGNMENT_KEY}` = {a} is not a power of two"))),
            other => {
                return Err(Error::Gguf(format!(
                    "`{ALIGNMENT_KEY}` must be a u32 (as ggml reads it), got {}",
                    other.type_name()
                )))
            }
        }
    }
    Ok(())
}

/// A failure while writing: I/O or a fill function.
enum WriteError {
    Io(std::io::Error),
    Fill(Error),
}

impl From<std::io::Error> for WriteError {
    fn from(e: std::io::Error) -> Self {
        WriteError::Io(e)
    }
}

impl WriteError {
    fn into_error(self, path: &Path) -> Error {
        match self {
            WriteError::Io(source) => Error::Io { path: PathBuf::from(path), source },
            WriteError::Fill(e) => e,
        }
    }
}

/// A writer that counts the bytes written, for padding.
struct Counting<'a, W: Write> {
    inner: &'a mut W,
    written: u64,
}

impl<W: Write> Counting<'_, W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self, alignment: usize) -> std::io::Result<()> {
        const ZEROS: [u8; 64] = [0; 64];
        let mut n = (self.written.next_multiple_of(alignment as u64) - self.written) as usize;
        while n > 0 {
            let k = n.min(ZEROS.len());
            self.put(&ZEROS[..k])?;
            n -= k;
        }
        Ok(())
    }
}

fn put_string<W: Write>(out: &mut Counting<'_, W>, s: &str) -> std::io::Result<()> {
    out.put(&(s.len() as u64).to_le_bytes())?;
    out.put(s.as_bytes())
}

fn put_value<W: Write>(out: &mut Counting<'_, W>, value: &Value) -> std::io::Result<()> {
    match value {
        Value::U8(v) => out.put(&v.to_le_bytes()),
        Value::I8(v) => out.put(&v.to_le_bytes()),
        Value::U16(v) => out.put(&v.to_le_bytes()),
        Value::I16(v) => out.put(&v.to_le_bytes()),
        Value::U32(v) => out.put(&v.to_le_bytes()),
        Value::I32(v) => out.put(&v.to_le_bytes()),
        Value::F32(v) => out.put(&v.to_le_bytes()),
        Value::Bool(v) => out.put(&[u8::from(*v)]),
        Value::String(s) => put_string(out, s),
        Value::U64(v) => out.put(&v.to_le_bytes()),
        Value::I64(v) => out.put(&v.to_le_bytes()),
        Value::F64(v) => out.put(&v.to_le_bytes()),
        Value::Array(a) => put_array(out, a),
    }
}

/// An array: element type (kept for empty arrays too), count, elements.
fn put_array<W: Write>(out: &mut Counting<'_, W>, a: &Array) -> std::io::Result<()> {
    fn each<W: Write, T: Copy, const N: usize>(
        out: &mut Counting<'_, W>,
        v: &[T],
        bytes: fn(T) -> [u8; N],
    ) -> std::io::Result<()> {
        v.iter().try_for_each(|&x| out.put(&bytes(x)))
    }
    out.put(&a.elem_type_id().to_le_bytes())?;
    out.put(&(a.len() as u64).to_le_bytes())?;
    match a {
        Array::U8(v) => out.put(v),
        Array::I8(v) => each(out, v, i8::to_le_bytes),
        Array::U16(v) => each(out, v, u16::to_le_bytes),
        Array::I16(v) => each(out, v, i16::to_le_bytes),
        Array::U32(v) => each(out, v, u32::to_le_bytes),
        Array::I32(v) => each(out, v, i32::to_le_bytes),
        Array::F32(v) => each(out, v, f32::to_le_bytes),
        Array::Bool(v) => each(out, v, |b| [u8::from(b)]),
        Array::String(v) => v.iter().try_for_each(|s| put_string(out, s)),
        Array::Array(v) => v.iter().try_for_each(|x| put_array(out, x)),
        Array::U64(v) => each(out, v, u64::to_le_bytes),
        Array::I64(v) => each(out, v, i64::to_le_bytes),
        Array::F64(v) => each(out, v, f64::to_le_bytes),
    }
}
