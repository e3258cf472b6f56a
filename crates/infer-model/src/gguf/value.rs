//! GGUF metadata values.
//!
//! GGUF stores each metadata value with a 32-bit type tag (`gguf_type` in
//! ggml's `gguf.h`): 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool,
//! 8 string, 9 array, 10 u64, 11 i64, 12 f64. Arrays carry one element type
//! and a count; their elements may themselves be arrays ([`Array`]).

use super::array::Array;

/// A GGUF metadata value.
///
/// Arrays are homogeneous in the file format: every element has the same
/// type (nested arrays may differ in length and element type). [`Array`]
/// holds one typed vector, so a mixed array cannot be built and an empty
/// array keeps its element type.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7 (one byte, 0 or 1).
    Bool(bool),
    /// Type 8: a UTF-8 string (u64 byte length, then the bytes).
    String(String),
    /// Type 9: u32 element type, u64 count, then the elements.
    Array(Array),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

/// GGUF's numeric type tags.
pub(crate) mod tag {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// The name of a GGUF type tag, or `None` for an unknown tag.
pub(crate) fn tag_name(t: u32) -> Option<&'static str> {
    Some(match t {
        tag::U8 => "u8",
        tag::I8 => "i8",
        tag::U16 => "u16",
        tag::I16 => "i16",
        tag::U32 => "u32",
        tag::I32 => "i32",
        tag::F32 => "f32",
        tag::BOOL => "bool",
        tag::STRING => "string",
        tag::ARRAY => "array",
        tag::U64 => "u64",
        tag::I64 => "i64",
        tag::F64 => "f64",
        _ => return None,
    })
}

/// The least number of bytes one value of type tag `t` occupies in a file
/// (a string needs its 8-byte length, an array its 4-byte element type and
/// 8-byte count). `None` for unknown tags.
pub(crate) fn min_encoded_size(t: u32) -> Option<u64> {
    Some(match t {
        tag::U8 | tag::I8 | tag::BOOL => 1,
        tag::U16 | tag::I16 => 2,
        tag::U32 | tag::I32 | tag::F32 => 4,
        tag::U64 | tag::I64 | tag::F64 | tag::STRING => 8,
        tag::ARRAY => 12,
        _ => return None,
    })
}

impl Value {
    /// GGUF's type tag of this value.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => tag::U8,
            Value::I8(_) => tag::I8,
            Value::U16(_) => tag::U16,
            Value::I16(_) => tag::I16,
            Value::U32(_) => tag::U32,
            Value::I32(_) => tag::I32,
            Value::F32(_) => tag::F32,
            Value::Bool(_) => tag::BOOL,
            Value::String(_) => tag::STRING,
            Value::Array(_) => tag::ARRAY,
            Value::U64(_) => tag::U64,
            Value::I64(_) => tag::I64,
            Value::F64(_) => tag::F64,
        }
    }

    /// The type's name as GGUF tools print it (`"u32"`, `"string"`,
    /// `"array"`, ...).
    pub fn type_name(&self) -> &'static str {
        tag_name(self.type_id()).unwrap_or("unknown")
    }

    /// A description of the type including an array's element type
    /// (`"array of string"`); for nested arrays only the outer element
    /// type is named (`"array of array"`).
    pub fn type_description(&self) -> &'static str {
        let Value::Array(a) = self else {
            return self.type_name();
        };
        match a.elem_type_id() {
            tag::U8 => "array of u8",
            tag::I8 => "array of i8",
            tag::U16 => "array of u16",
            tag::I16 => "array of i16",
            tag::U32 => "array of u32",
            tag::I32 => "array of i32",
            tag::F32 => "array of f32",
            tag::BOOL => "array of bool",
            tag::STRING => "array of string",
            tag::ARRAY => "array of array",
            tag::U64 => "array of u64",
            tag::I64 => "array of i64",
            _ => "array of f64",
        }
    }

    /// The value of an integer variant as `i128` (every GGUF integer fits);
    /// `None` for non-integers (bool is not an integer here).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An integer value as `u32` when it fits losslessly.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| u32::try_from(v).ok())
    }

    /// An integer value as `u64` when it fits losslessly.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// An integer value as `i32` when it fits losslessly.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_i128().and_then(|v| i32::try_from(v).ok())
    }

    /// An integer value as `i64` when it fits losslessly.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// A float value as `f32`: `F32` as is, `F64` rounded to the nearest
    /// `f32`. Integers are not converted.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// A float value as `f64` (`F32` widened exactly).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The value of a `Bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The text of a `String`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an `Array`.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}

impl std::fmt::Display for Value {
    /// Scalars print their value, strings in quotes, arrays their first
    /// few elements and their length.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => write!(f, "{s:?}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Array(a) => write!(f, "{a}"),
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $variant:ident),* $(,)?) => {
        $(impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$variant(v)
            }
        })*
    };
}

value_from!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    f32 => F32, bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64,
);

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.to_owned())
    }
}

impl From<Array> for Value {
    fn from(v: Array) -> Self {
        Value::Array(v)
    }
}

impl<T> From<Vec<T>> for Value
where
    Array: From<Vec<T>>,
{
    fn from(v: Vec<T>) -> Self {
        Value::Array(v.into())
    }
}

impl<T: Clone> From<&[T]> for Value
where
    Array: From<Vec<T>>,
{
    fn from(v: &[T]) -> Self {
        Value::Array(v.to_vec().into())
    }
}
