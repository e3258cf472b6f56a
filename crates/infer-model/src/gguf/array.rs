//! GGUF metadata arrays, held at their size in the file.
//!
//! An array in a GGUF file is a u32 element type, a u64 count and the
//! elements (ggml's `gguf.cpp`). [`Array`] keeps one typed vector per
//! element type rather than one [`Value`] per element: a 50 M-element `u8`
//! array costs 50 MB, not 32 bytes per element. A string array keeps its
//! text in one buffer plus one end offset per string, which is the 8 bytes
//! per string that its lengths take in the file. Nested arrays are the only
//! kind that costs more than its bytes on disk (an [`Array`] of 32 bytes
//! for the 12 bytes of an empty nested array); real files do not use them.
//!
//! Because the element type is part of the value, an empty array keeps it
//! through a read and a write (llama.cpp refuses an empty `array<u8>` where
//! it reads strings or integers), and a mixed-type array cannot be built.

use super::value::{tag, tag_name, Value};

/// The strings of a string array: one UTF-8 buffer and the end offset of
/// each string in it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StringArray {
    text: String,
    ends: Vec<usize>,
}

impl StringArray {
    /// An empty array.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty array with room for `n` strings of `text_bytes` bytes in all.
    ///
    /// # Errors
    /// When that much memory cannot be reserved.
    pub fn try_with_capacity(n: usize, text_bytes: usize) -> Result<Self, std::collections::TryReserveError> {
        let mut s = Self::new();
        s.ends.try_reserve_exact(n)?;
        s.text.try_reserve_exact(text_bytes)?;
        Ok(s)
    }

    /// Number of strings.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there is no string.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Appends a string.
    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.ends.push(self.text.len());
    }

    /// [`StringArray::push`] that reports a failed allocation.
    pub(crate) fn try_push(&mut self, s: &str) -> Result<(), std::collections::TryReserveError> {
        self.text.try_reserve(s.len())?;
        self.ends.try_reserve(1)?;
        self.push(s);
        Ok(())
    }

    /// The string at `i`.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.text[start..end])
    }

    /// The strings in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }

    /// Total bytes of text.
    pub fn text_len(&self) -> usize {
        self.text.len()
    }
}

impl<S: AsRef<str>> FromIterator<S> for StringArray {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut a = Self::new();
        for s in iter {
            a.push(s.as_ref());
        }
        a
    }
}

/// A GGUF metadata array: its element type and its elements.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// Elements of type 0.
    U8(Vec<u8>),
    /// Elements of type 1.
    I8(Vec<i8>),
    /// Elements of type 2.
    U16(Vec<u16>),
    /// Elements of type 3.
    I16(Vec<i16>),
    /// Elements of type 4.
    U32(Vec<u32>),
    /// Elements of type 5.
    I32(Vec<i32>),
    /// Elements of type 6.
    F32(Vec<f32>),
    /// Elements of type 7 (one byte each, 0 or 1).
    Bool(Vec<bool>),
    /// Elements of type 8 (boxed, so that the enum stays small for nested
    /// arrays).
    String(Box<StringArray>),
    /// Elements of type 9: arrays, each with its own element type.
    Array(Vec<Array>),
    /// Elements of type 10.
    U64(Vec<u64>),
    /// Elements of type 11.
    I64(Vec<i64>),
    /// Elements of type 12.
    F64(Vec<f64>),
}

/// Applies `$f` to the vector of any variant but `String` and `Array`, or
/// evaluates the given arms for those two.
macro_rules! numeric {
    ($self:expr, $v:ident => $f:expr, $s:ident => $str:expr, $a:ident => $arr:expr) => {
        match $self {
            Array::U8($v) => $f,
            Array::I8($v) => $f,
            Array::U16($v) => $f,
            Array::I16($v) => $f,
            Array::U32($v) => $f,
            Array::I32($v) => $f,
            Array::F32($v) => $f,
            Array::Bool($v) => $f,
            Array::U64($v) => $f,
            Array::I64($v) => $f,
            Array::F64($v) => $f,
            Array::String($s) => $str,
            Array::Array($a) => $arr,
        }
    };
}

impl Array {
    /// An empty array of element type `tag` (GGUF's type number), or
    /// `None` for an unknown tag.
    pub fn empty(tag: u32) -> Option<Self> {
        Some(match tag {
            tag::U8 => Array::U8(Vec::new()),
            tag::I8 => Array::I8(Vec::new()),
            tag::U16 => Array::U16(Vec::new()),
            tag::I16 => Array::I16(Vec::new()),
            tag::U32 => Array::U32(Vec::new()),
            tag::I32 => Array::I32(Vec::new()),
            tag::F32 => Array::F32(Vec::new()),
            tag::BOOL => Array::Bool(Vec::new()),
            tag::STRING => Array::String(Box::default()),
            tag::ARRAY => Array::Array(Vec::new()),
            tag::U64 => Array::U64(Vec::new()),
            tag::I64 => Array::I64(Vec::new()),
            tag::F64 => Array::F64(Vec::new()),
            _ => return None,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        numeric!(self, v => v.len(), s => s.len(), a => a.len())
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// GGUF's type number of the elements.
    pub fn elem_type_id(&self) -> u32 {
        match self {
            Array::U8(_) => tag::U8,
            Array::I8(_) => tag::I8,
            Array::U16(_) => tag::U16,
            Array::I16(_) => tag::I16,
            Array::U32(_) => tag::U32,
            Array::I32(_) => tag::I32,
            Array::F32(_) => tag::F32,
            Array::Bool(_) => tag::BOOL,
            Array::String(_) => tag::STRING,
            Array::Array(_) => tag::ARRAY,
            Array::U64(_) => tag::U64,
            Array::I64(_) => tag::I64,
            Array::F64(_) => tag::F64,
        }
    }

    /// The element type's name (`"u8"`, `"string"`, `"array"`, ...).
    pub fn elem_type_name(&self) -> &'static str {
        tag_name(self.elem_type_id()).unwrap_or("unknown")
    }

    /// The element at `i` as a [`Value`] (a string or nested array is
    /// copied).
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::String(v) => Value::String(v.get(i)?.to_owned()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
        })
    }

    /// The strings of a string array.
    pub fn as_strings(&self) -> Option<&StringArray> {
        match self {
            Array::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an array of integers as `i128` (every GGUF integer
    /// fits); `None` for other element types (bool is not an integer).
    pub fn to_i128_vec(&self) -> Option<Vec<i128>> {
        fn conv<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => conv(v),
            Array::I8(v) => conv(v),
            Array::U16(v) => conv(v),
            Array::I16(v) => conv(v),
            Array::U32(v) => conv(v),
            Array::I32(v) => conv(v),
            Array::U64(v) => conv(v),
            Array::I64(v) => conv(v),
            _ => return None,
        })
    }

    /// The elements of an array of floats as `f32` (`f64` elements are
    /// rounded to the nearest `f32`); `None` for other element types.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        match self {
            Array::F32(v) => Some(v.clone()),
            Array::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => None,
        }
    }

    /// Bytes of the elements in a GGUF file (without the array's own
    /// 12-byte element type and count).
    pub fn encoded_len(&self) -> u64 {
        fn sized<T>(v: &[T]) -> u64 {
            (std::mem::size_of_val(v)) as u64
        }
        match self {
            Array::Bool(v) => v.len() as u64,
            Array::String(s) => 8 * s.len() as u64 + s.text_len() as u64,
            Array::Array(a) => a.iter().map(|x| 12 + x.encoded_len()).sum(),
            Array::U8(v) => sized(v),
            Array::I8(v) => sized(v),
            Array::U16(v) => sized(v),
            Array::I16(v) => sized(v),
            Array::U32(v) => sized(v),
            Array::I32(v) => sized(v),
            Array::F32(v) => sized(v),
            Array::U64(v) => sized(v),
            Array::I64(v) => sized(v),
            Array::F64(v) => sized(v),
        }
    }
}

impl std::fmt::Display for Array {
    /// The first few elements and the length.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 6;
        f.write_str("[")?;
        for i in 0..self.len().min(SHOWN) {
            if i > 0 {
                f.write_str(", ")?;
            }
            match self.get(i) {
                Some(v) => write!(f, "{v}")?,
                None => break,
            }
        }
        if self.len() > SHOWN {
            write!(f, ", ... ({} items)", self.len())?;
        }
        f.write_str("]")
    }
}

macro_rules! array_from {
    ($($t:ty => $variant:ident),* $(,)?) => {
        $(impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Self {
                Array::$variant(v)
            }
        })*
    };
}

array_from!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    f32 => F32, bool => Bool, u64 => U64, i64 => I64, f64 => F64, Array => Array,
);

impl From<Vec<String>> for Array {
    fn from(v: Vec<String>) -> Self {
        Array::String(Box::new(v.iter().collect()))
    }
}

impl From<Vec<&str>> for Array {
    fn from(v: Vec<&str>) -> Self {
        Array::String(Box::new(v.into_iter().collect()))
    }
}

impl From<StringArray> for Array {
    fn from(v: StringArray) -> Self {
        Array::String(Box::new(v))
    }
}
