//! GGUF metadata values.

/// One metadata value.
///
/// The accessors convert between integer widths where the value fits (`U32(7).as_u64() ==
/// Some(7)`, `I32(-1).as_u64() == None`), since writers do not agree on which width a key uses.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    /// An array; GGUF arrays hold elements of one type (arrays of arrays are allowed).
    Array(Vec<Value>),
}

impl Value {
    /// The GGUF name of this value's type (`"u32"`, `"string"`, `"array"`, …), for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F32(_) => "f32",
            Self::F64(_) => "f64",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(_) => "array",
        }
    }

    /// Any integer value that is ≥ 0, as `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => i64::try_from(v).ok(),
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any numeric value, as `f64` (64-bit integers may round).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            Self::U64(v) => Some(v as f64),
            Self::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// A boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Self::Array(v) => Some(v),
            _ => None,
        }
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`); `None` if any element is not a string.
    pub fn as_str_array(&self) -> Option<Vec<&str>> {
        self.as_array()?.iter().map(Value::as_str).collect()
    }

    /// An array of integers that all fit in `i64` (e.g. `tokenizer.ggml.token_type`).
    pub fn as_i64_array(&self) -> Option<Vec<i64>> {
        self.as_array()?.iter().map(Value::as_i64).collect()
    }

    /// An array of non-negative integers.
    pub fn as_u64_array(&self) -> Option<Vec<u64>> {
        self.as_array()?.iter().map(Value::as_u64).collect()
    }

    /// An array of numbers, as `f64`.
    pub fn as_f64_array(&self) -> Option<Vec<f64>> {
        self.as_array()?.iter().map(Value::as_f64).collect()
    }

    /// An array of numbers, as `f32` (e.g. `tokenizer.ggml.scores`).
    pub fn as_f32_array(&self) -> Option<Vec<f32>> {
        self.as_array()?
            .iter()
            .map(|v| match *v {
                Self::F32(x) => Some(x),
                _ => v.as_f64().map(|x| x as f32),
            })
            .collect()
    }
}

/// GGUF's value type ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub(crate) fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::U8,
            1 => Self::I8,
            2 => Self::U16,
            3 => Self::I16,
            4 => Self::U32,
            5 => Self::I32,
            6 => Self::F32,
            7 => Self::Bool,
            8 => Self::String,
            9 => Self::Array,
            10 => Self::U64,
            11 => Self::I64,
            12 => Self::F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type takes in the file; used to reject absurd array
    /// lengths before allocating.
    pub(crate) fn min_encoded_size(self) -> u64 {
        match self {
            Self::U8 | Self::I8 | Self::Bool => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
            // a u64 length (string) or a u32 type + u64 count (array)
            Self::String => 8,
            Self::Array => 12,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_conversions_respect_range() {
        assert_eq!(Value::U32(7).as_u64(), Some(7));
        assert_eq!(Value::I32(-1).as_u64(), None);
        assert_eq!(Value::I32(-1).as_i64(), Some(-1));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::F32(1.5).as_u64(), None);
        assert_eq!(Value::F32(1.5).as_f64(), Some(1.5));
        assert_eq!(Value::U16(3).as_f64(), Some(3.0));
        assert_eq!(Value::Bool(true).as_u64(), None);
        assert_eq!(Value::String("x".into()).as_str(), Some("x"));
    }

    #[test]
    fn typed_arrays() {
        let a = Value::Array(vec![Value::String("a".into()), Value::String("b".into())]);
        assert_eq!(a.as_str_array(), Some(vec!["a", "b"]));
        assert_eq!(a.as_i64_array(), None);
        let n = Value::Array(vec![Value::I32(1), Value::I32(-2)]);
        assert_eq!(n.as_i64_array(), Some(vec![1, -2]));
        assert_eq!(n.as_u64_array(), None);
        assert_eq!(n.as_f32_array(), Some(vec![1.0, -2.0]));
        assert_eq!(Value::U8(1).as_array(), None);
    }
}
