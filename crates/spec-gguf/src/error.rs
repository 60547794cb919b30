//! The one error type of `spec-gguf`.

use std::path::PathBuf;

use crate::types::GgmlType;

/// Everything that can go wrong while reading a GGUF file or dequantizing its tensors.
///
/// A malformed file is always reported through one of these variants; nothing in this crate panics
/// or allocates more than the file could hold because of what a file says.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened or read.
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error(
        "not a GGUF file: the first four bytes are {found:02x?}, expected the magic \"GGUF\" (47 47 55 46)"
    )]
    BadMagic { found: [u8; 4] },
    /// A GGUF version this reader does not implement.
    #[error("unsupported GGUF version {version}: {hint}")]
    UnsupportedVersion { version: u32, hint: &'static str },
    /// The file ends before a field that must be there.
    #[error(
        "the file is truncated: {what} needs {needed} bytes at offset {offset}, but the file has {file_len} bytes"
    )]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    /// A count or length field is larger than the rest of the file could possibly hold.
    #[error(
        "corrupt file: {what} claims {count} entries (at least {min_bytes} bytes) at offset {offset}, \
         but only {remaining} bytes remain"
    )]
    ImplausibleLength {
        what: String,
        count: u64,
        min_bytes: u128,
        offset: u64,
        remaining: u64,
    },
    /// A string is not valid UTF-8.
    #[error("corrupt file: {what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },
    /// A metadata value has a type id that GGUF does not define.
    #[error("corrupt file: metadata key {key:?} has unknown value type id {id}")]
    UnknownValueType { key: String, id: u32 },
    /// A boolean stored as a byte other than 0 or 1.
    #[error("corrupt file: metadata key {key:?} holds a bool byte {byte}, expected 0 or 1")]
    InvalidBool { key: String, byte: u8 },
    /// Arrays nested deeper than any real file uses.
    #[error("corrupt file: metadata key {key:?} nests arrays more than {max} levels deep")]
    NestingTooDeep { key: String, max: usize },
    /// The same metadata key appears twice.
    #[error("corrupt file: metadata key {key:?} appears twice")]
    DuplicateKey { key: String },
    /// `general.alignment` is not a non-zero power of two stored as an unsigned integer.
    #[error("corrupt file: general.alignment must be a power of two u32, found {found}")]
    BadAlignment { found: String },
    /// A tensor has a ggml type id this crate does not know.
    #[error("tensor {tensor:?} has unknown ggml type id {id}; the file may need a newer reader")]
    UnknownGgmlType { tensor: String, id: u32 },
    /// The same tensor name appears twice in the tensor table.
    #[error("corrupt file: tensor {name:?} appears twice in the tensor table")]
    DuplicateTensor { name: String },
    /// A tensor's shape, type or offset is inconsistent.
    #[error("corrupt file: tensor {name:?}: {reason}")]
    InvalidTensor { name: String, reason: String },
    /// A tensor's data lies (partly) outside the file.
    #[error(
        "tensor {name:?} data [{start}, {end}) lies outside the file of {file_len} bytes (truncated download?)"
    )]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    /// A row range outside a tensor was requested.
    #[error("tensor {name:?} has {n_rows} rows; rows [{start}, {end}) were requested")]
    RowsOutOfRange {
        name: String,
        start: u64,
        end: u64,
        n_rows: u64,
    },
    /// Dequantization of this type is not implemented.
    #[error(
        "dequantization of ggml type {0} is not implemented (supported: F32, F16, BF16, F64, \
         Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K)"
    )]
    UnsupportedDequant(GgmlType),
    /// The byte or element counts handed to a dequantization function do not fit together.
    #[error("dequantize {ty}: {reason}")]
    SizeMismatch { ty: GgmlType, reason: String },
}
